"""The MTP draft context's memory against llama-server's own buffer lines (-lv 4), recorded over a
grid by scripts/record_spec_oracle.py into tests/data/llama-server-mtp-buffers.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_model import write_tiny_model

from quantpick.machine.spec import Host, Machine
from quantpick.model.gguf import layout_from_header, read_gguf_file
from quantpick.model.layout import ModelLayout
from quantpick.plan.memory import RunConfig, estimate

DATA = Path(__file__).resolve().parents[1] / "data" / "llama-server-mtp-buffers.json"
CASES = json.loads(DATA.read_text())["cases"]
MiB = 1024**2
GiB = 1024**3
HOST_ONLY = Machine(gpus=(), host=Host(64 * GiB, 64 * GiB, 8), described=True, source="test")


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory: pytest.TempPathFactory) -> ModelLayout:
    path = tmp_path_factory.mktemp("mtp") / "tiny-mtp.gguf"
    write_tiny_model(path, mtp=True)
    return layout_from_header(read_gguf_file(path), basis=f"gguf:{path}")


def mib(n: int) -> float:
    return round(n / MiB, 2)


def config_of(case: dict, n: int) -> RunConfig:
    return RunConfig(
        ctx_size=case["ctx"], n_parallel=case["np"], spec_draft_n=n,
        cache_type_k=case["ctk"], cache_type_v=case["ctk"],
        spec_cache_type_k=case["ctkd"], spec_cache_type_v=case["ctkd"],
    )  # fmt: skip


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"c{c['ctx']}-np{c['np']}-n{c['n_max']}-{c['ctk']}-{c['ctkd']}"
)
def test_mtp_weights_kv_state_and_outputs_match_llama_server(
    tiny_mtp: ModelLayout, case: dict
) -> None:
    with_mtp = estimate(tiny_mtp, HOST_ONLY, config_of(case, case["n_max"])).host
    without = estimate(tiny_mtp, HOST_ONLY, config_of(case, 0)).host
    main, draft = case["main"], case["draft"]
    # the NextN block's weights load only with the MTP context
    assert mib(with_mtp.weights_bytes) == main["model"]
    assert with_mtp.weights_bytes > without.weights_bytes
    # the draft context's KV (NextN layer, -ctkd, n_ctx cells) on top of the main one's
    assert mib(with_mtp.kv_bytes - without.kv_bytes) == draft["kv"]
    assert mib(without.kv_bytes) == main["kv"]
    # the main context keeps n_max rollback snapshots of the recurrent state per sequence
    assert mib(with_mtp.recurrent_bytes) == main["recurrent"]
    # the draft context's output buffer: np rows (the main one is reserved at np rows and grows
    # to the verify batch's np x (1 + n) at run time, which the estimate charges)
    draft_output = tiny_mtp.architecture.vocab_size * case["np"] * 4
    assert mib(draft_output) == draft["output"]
    rows = case["np"] * (1 + case["n_max"])
    main_output = tiny_mtp.architecture.vocab_size * rows * 4
    assert with_mtp.overhead_bytes == main_output + draft_output
    # the draft context's compute buffer (estimate): never under llama-server's, at most 2.5x
    # on this tiny model (one block's activation allowance dominates; the mask term is exact)
    ratio = (with_mtp.compute_bytes - without.compute_bytes) / MiB / draft["compute"]
    assert 1.0 <= ratio <= 2.5
