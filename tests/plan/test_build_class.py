"""The llama.cpp build selects the compute rule; with none found, the pinned build's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conformance_model import rpc_machine, write_conformance_gguf
from hypothesis import given
from hypothesis import strategies as st

from quantpick.model.gguf import layout_from_header, read_gguf_file
from quantpick.model.layout import ModelLayout
from quantpick.plan.build_class import (
    CAPPED,
    CAPPED_FROM_BUILD,
    PINNED,
    PINNED_BUILD,
    UNCAPPED,
    apply_rule,
    compute_rule,
)
from quantpick.plan.memory import RunConfig, estimate

MiB = 1024**2


@pytest.mark.parametrize(
    ("version", "build", "rule"),
    [
        ("0.5.0-dev", 11312, CAPPED),  # the pinned tree
        ("0.5.0-dev", 1, CAPPED),  # a shallow clone of a semver-era tree
        (None, CAPPED_FROM_BUILD, CAPPED),
        (None, CAPPED_FROM_BUILD - 1, UNCAPPED),  # b9460-b9463 may have it: not assumed
        (None, 7988, UNCAPPED),  # qwen35moe's first release
        (None, 1, CAPPED),  # a shallow clone of unknown age: not known to be older
        (None, None, CAPPED),
    ],
)
def test_rule_per_build(version: str | None, build: int | None, rule: str) -> None:
    got = compute_rule(version, build, "abc1234" if build else None)
    assert got.name == rule
    assert (got.build is None) == (build is None)
    assert got.reason and got.describe()


def test_no_build_found_plans_for_the_pinned_build() -> None:
    assert PINNED.name == CAPPED and PINNED.build is None
    assert f"b{PINNED_BUILD}" in PINNED.describe()
    pin = (Path(__file__).resolve().parents[2] / "scripts" / "llamacpp.pin").read_text()
    assert f"LLAMACPP_BUILD_NUMBER={PINNED_BUILD}\n" in pin


@given(st.integers(2, 20000))
def test_newer_builds_never_get_a_larger_rule(build: int) -> None:
    assert compute_rule(None, build, "x").capped == (build >= CAPPED_FROM_BUILD)


@pytest.fixture(scope="module")
def q4km(tmp_path_factory: pytest.TempPathFactory) -> ModelLayout:
    path = tmp_path_factory.mktemp("gguf") / "q4km.gguf"
    size = write_conformance_gguf(path)
    return layout_from_header(read_gguf_file(path), basis=str(path), file_bytes=size)


def test_the_uncapped_rule_adds_the_logits_and_the_hosts_f32_mask_only_to_compute(
    q4km: ModelLayout,
) -> None:
    base = RunConfig(ctx_size=262144, n_parallel=4, kv_unified=True, tensor_split=(24.0, 18.0))
    new = estimate(q4km, rpc_machine(2), apply_rule(base, compute_rule("0.5.0-dev", 11312, "x")))
    old = estimate(q4km, rpc_machine(2), apply_rule(base, compute_rule(None, 9000, None)))
    ub, kv = 512, 262144
    copies = 4  # two devices, full offload, no overrides: pipeline parallelism
    for n, o in zip(new.devices, old.devices, strict=True):
        assert (n.weights_bytes, n.kv_bytes, n.recurrent_bytes) == (
            o.weights_bytes, o.kv_bytes, o.recurrent_bytes,
        )  # fmt: skip
    # the host keeps the f32 mask input (4 B) where the f16 one is 2 B: a pre-cap CUDA log's
    # CUDA_Host buffer is the f32 mask + 2E (tests/data/cuda-logs.json); the devices hold f16
    host_extra = copies * kv * ub * 2
    logits_extra = 248320 * (ub - 4) * 4
    cuda0, cuda1, host = (
        o.compute_bytes - n.compute_bytes for n, o in zip(new.devices, old.devices, strict=True)
    )
    assert cuda0 == 0
    # the output layer's device: the whole ubatch of logits is its peak under the old rule, a layer
    # is under the new one (plan/compute.py: a max over phases, not a sum)
    assert 0 < cuda1 <= logits_extra
    assert host == host_extra
    assert replace(
        apply_rule(base, compute_rule(None, 9000, None)), logits_rows="server", fa_mask_f32=False
    ) == (apply_rule(base, compute_rule("0.5.0-dev", 1, None)))
