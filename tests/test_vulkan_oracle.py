"""quantpick's per-device memory for Vulkan devices against llama.cpp's own projection on a real
Vulkan backend: Mesa's lavapipe, one device and two (-ts 3,1), over the real configs of
tests/arch_configs.py (tests/data/vulkan-oracle.json.gz; re-record with
scripts/build-llamacpp-vulkan.sh and scripts/record_vulkan_oracle.py, docs/backends.md).

What the oracle covers: every tensor type of these configs is supported by ggml-vulkan's kernels
on lavapipe, but lavapipe's storage-buffer range is small (128 MiB), and llama.cpp keeps any
weight above it in host memory (vulkan_oracle.kept_on_host). quantpick does not apply that limit
on its own (no Vulkan driver reports it through `--list-devices`), so the comparison places
those weights on the host with -ot, as a user would; a tied model's output copy of an oversized
token_embd cannot be placed that way and is checked to be exactly that tensor.
"""

from __future__ import annotations

import statistics

import pytest
from vulkan_oracle import FIXTURE, MiB, Row, layout_of, load, rows

from quantpick.machine.backends import backend
from quantpick.model.ggml import BufferRule

# lavapipe's limit, read from the recording: the largest weight llama.cpp kept on a Vulkan
# device is below it and the smallest it kept on the host above it (qwen3-8b's 487 MiB
# output.weight on the host, 128 MiB and smaller tensors on the device).
LAVAPIPE_MAX_TENSOR_BYTES = 128 * MiB
# lavapipe's minStorageBufferOffsetAlignment, read from the recording too: of 4, 8, 16, 32 and 64
# (the Vulkan backend's assumed figure) only 16 makes gemma-4-e2b's 4-byte per-layer scalars
# exact (64 over-counts 48 B each: 1680 B over 35 layers); Gpu.buffer_alignment carries it.
LAVAPIPE_ALIGNMENT = 16


@pytest.fixture(scope="module")
def oracle() -> dict:
    return load(FIXTURE)


@pytest.fixture(scope="module")
def device_rows(oracle: dict) -> list[Row]:
    return [
        r for r in rows(oracle, LAVAPIPE_ALIGNMENT, LAVAPIPE_MAX_TENSOR_BYTES) if r.device != "Host"
    ]


def test_the_recording_covers_every_config_on_one_and_two_devices(oracle: dict) -> None:
    assert len(oracle["configs"]) == 16
    for doc in oracle["configs"]:
        assert {c["config"]["visible"] for c in doc["cases"]} == {"0", "0,0"}
        assert all(c["exit_code"] == 0 and c["bytes"].get("devices") for c in doc["cases"])


def test_kv_and_recurrent_state_are_exact_on_every_vulkan_device(device_rows: list[Row]) -> None:
    assert len(device_rows) == 384
    wrong = [r for r in device_rows if r.context[0] != r.context[1]]
    assert wrong == []


def test_weights_are_exact_on_every_vulkan_device_but_a_tied_oversized_output(
    oracle: dict, device_rows: list[Row]
) -> None:
    """Exact, except where a tied model's output head (a copy of token_embd, above lavapipe's
    range) stays on the host: there the difference is exactly that tensor."""
    layouts = {doc["config"]: layout_of(doc) for doc in oracle["configs"]}
    base = backend("vulkan").buffer
    rule = BufferRule(base.name, LAVAPIPE_ALIGNMENT, base.row_padding)
    exact = [r for r in device_rows if r.weights[0] == r.weights[1]]
    others = [r for r in device_rows if r.weights[0] != r.weights[1]]
    assert len(exact) == 342 + 6
    for r in others:
        layout = layouts[r.config]
        embd = next(t for t in layout.tensors if t.name == "token_embd.weight")
        assert not any(t.name == "output.weight" for t in layout.tensors), r  # tied
        assert embd.n_bytes > LAVAPIPE_MAX_TENSOR_BYTES
        assert r.weights[0] - r.weights[1] == layout.tensor_alloc(embd, rule), r
    assert {r.config for r in others} == {"gemma-3-27b", "gemma-4-e2b"}


def test_without_the_host_rule_the_oversized_weights_are_the_whole_difference(
    oracle: dict,
) -> None:
    """Before the rule (quantpick as it is): only the rows without a weight above 128 MiB on a
    device are exact; this pins what the oracle says about lavapipe's limit."""
    plain = [r for r in rows(oracle, LAVAPIPE_ALIGNMENT) if r.device != "Host"]
    assert sum(r.weights[0] == r.weights[1] for r in plain) < 342
    # and the backend's assumed 64-byte alignment over-counts where tensors are not multiples
    assumed = [r for r in rows(oracle, None, LAVAPIPE_MAX_TENSOR_BYTES) if r.device != "Host"]
    assert sum(r.weights[0] == r.weights[1] for r in assumed) == 342


def test_compute_against_the_bound_is_reported(device_rows: list[Row]) -> None:
    """Compute buffers are #32's model (not this issue's): the share within max(5%, 16 MiB) and
    the median error are recorded here so that a change shows; the figures are in the report."""
    within = sum(r.compute_within for r in device_rows)
    errors = [abs(r.compute[0] - r.compute[1]) / MiB for r in device_rows]
    assert within == 10
    assert 100 < statistics.median(errors) < 1000
