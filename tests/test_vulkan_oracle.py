"""quantpick's per-device memory for Vulkan devices against llama.cpp's own projection on a real
Vulkan backend: Mesa's lavapipe, one device and two (-ts 3,1), over the 16 real configs of
tests/arch_configs.py (tests/data/vulkan-oracle.json.gz; re-record with
scripts/build-llamacpp-vulkan.sh and scripts/record_vulkan_oracle.py, docs/backends.md).

What the oracle covers: every tensor type of these configs has a ggml-vulkan kernel on lavapipe;
what lavapipe lacks is range: its storage buffers end at 128 MiB, and llama.cpp keeps any larger
weight in host memory (ggml-vulkan.cpp:15304-15330 supports_op, then the loader's next buffer
type). Two driver facts make quantpick exact, each read from the recording and carried by the
GPU (Gpu.max_tensor_bytes, Gpu.buffer_alignment): neither is printed by `--list-devices`, so a
described or probed Vulkan GPU has them only where its driver's are known.
"""

from __future__ import annotations

import statistics

import pytest
from vulkan_oracle import FIXTURE, MiB, Row, load, rows

# The largest weight llama.cpp kept on a lavapipe device is at most 128 MiB, the smallest it
# kept on the host above (qwen3-8b's 487 MiB output.weight; gemma-3-27b's tied token_embd).
LAVAPIPE_MAX_TENSOR_BYTES = 128 * MiB
# lavapipe's minStorageBufferOffsetAlignment: of 4, 8, 16, 32 and 64 (the Vulkan backend's
# assumed figure) only 16 makes gemma-4-e2b's 4-byte per-layer scalars exact (64 over-counts
# 48 B each: 1680 B over 35 layers).
LAVAPIPE_ALIGNMENT = 16


@pytest.fixture(scope="module")
def oracle() -> dict:
    return load(FIXTURE)


def device_rows(oracle: dict, alignment: int | None, limit: int | None) -> list[Row]:
    return [r for r in rows(oracle, alignment, limit) if r.device != "Host"]


@pytest.fixture(scope="module")
def lavapipe_rows(oracle: dict) -> list[Row]:
    return device_rows(oracle, LAVAPIPE_ALIGNMENT, LAVAPIPE_MAX_TENSOR_BYTES)


def test_the_recording_covers_every_config_on_one_and_two_devices(oracle: dict) -> None:
    assert len(oracle["configs"]) == 16
    for doc in oracle["configs"]:
        assert {c["config"]["visible"] for c in doc["cases"]} == {"0", "0,0"}
        assert all(c["exit_code"] == 0 and c["bytes"].get("devices") for c in doc["cases"])


def test_weights_kv_and_state_are_exact_on_every_vulkan_device(lavapipe_rows: list[Row]) -> None:
    assert len(lavapipe_rows) == 384
    assert [r for r in lavapipe_rows if not r.exact] == []


def test_the_host_is_exact_but_for_a_few_bytes_of_one_partial_offload(oracle: dict) -> None:
    """Host rows (CPU, CPU_REPACK and Vulkan_Host buffers): weights and KV exact on 282 of 288;
    the 6 left are gemma-4-e2b with -ngl 17, 608 B short each (small host tensors' padding, not
    yet traced). A tied head whose copy cannot go to the device is loaded on the host when the
    architecture always loads it (gemma4: tied_copy_always), once otherwise."""
    host = [r for r in rows(oracle, LAVAPIPE_ALIGNMENT, LAVAPIPE_MAX_TENSOR_BYTES)
            if r.device == "Host"]  # fmt: skip
    assert len(host) == 288 and sum(r.exact for r in host) == 282
    for r in (r for r in host if not r.exact):
        assert r.config == "gemma-4-e2b" and "ngl=17" in r.case
        assert r.weights[1] - r.weights[0] == 608 and r.context[0] == r.context[1]


def test_each_driver_fact_is_needed(oracle: dict) -> None:
    """Before Gpu.max_tensor_bytes and Gpu.buffer_alignment: 78 of 384 rows exact (every
    oversized head counted on the device); with the range only 360, with the alignment only 84;
    no other alignment makes all 384 exact."""

    def exact(alignment: int | None, limit: int | None) -> int:
        return sum(r.exact for r in device_rows(oracle, alignment, limit))

    assert exact(None, None) == 78
    assert exact(None, LAVAPIPE_MAX_TENSOR_BYTES) == 360
    assert exact(LAVAPIPE_ALIGNMENT, None) == 84
    for other in (4, 8, 32, 64):
        assert exact(other, LAVAPIPE_MAX_TENSOR_BYTES) == 360


def test_kv_and_state_need_neither(oracle: dict) -> None:
    plain = device_rows(oracle, None, None)
    assert all(r.context[0] == r.context[1] for r in plain)


def row_class(r: Row) -> str:
    if "visible=0,0" in r.case:
        return "two devices"
    return "every layer" if "ngl=all" in r.case else "partial"


def test_compute_follows_the_vulkan_backends_own_graph(lavapipe_rows: list[Row]) -> None:
    """Compute on the Vulkan devices with the backend's traits (machine/backends/vulkan.py: ops
    over maxStorageBufferRange on the host with what they hand over and get back, split inputs
    copied per layer under pipeline parallelism, flash attention's dequantized cache outside the
    buffer; under -ngl the host layers run on the device as phases of their own; the last of
    two devices, its head on the host, a layer over its inputs; the FFN above a narrow
    attention's Q, K and V; the V cache's indices without flash attention; an ungated FFN's
    one block; a host layer's FFN alone without flash attention, or replayed above the mask
    with it; dense attention, routed-expert and gated delta-net host layers scheduled and
    allocated as llama.cpp does, plan/host_layers.py): 373 of 384 within max(5%, 16 MiB), median
    error 0%
    (the CPU/CUDA rule alone: 38 within, median +93%; the host layers' copies on top of a device
    layer: 318; the fitted pipeline terms on the last device: 336; without the host layers'
    replay: 364).
    docs/compute.md names the rest."""
    within = sum(r.compute_within for r in lavapipe_rows)
    errors = [abs(r.compute[0] - r.compute[1]) / MiB for r in lavapipe_rows]
    signed = [(r.compute[0] - r.compute[1]) / r.compute[1] for r in lavapipe_rows]
    assert within == 373
    assert statistics.median(errors) < 16
    assert abs(statistics.median(signed)) < 0.01
    by_class: dict[str, list[Row]] = {}
    for r in lavapipe_rows:
        by_class.setdefault(row_class(r), []).append(r)
    counts = {k: (sum(r.compute_within for r in v), len(v)) for k, v in by_class.items()}
    assert counts == {"every layer": (94, 96), "partial": (93, 96), "two devices": (186, 192)}


def test_the_rows_left_are_the_named_classes(lavapipe_rows: list[Row]) -> None:
    """What docs/compute.md says is not matched: 3 rows of -ngl partial offload whose host
    layers no template replays (gemma-4-e2b: the fitted phases, worst 19%; 31% before the
    replays). Every layer offloaded, on one device or two: 280 of 288 within
    (gemma-4-e2b -fa off at 32768 on the second device was 27%: its per-layer inputs are its
    layers' slices). No row of the 384 is beyond 25%."""
    rest = [r for r in lavapipe_rows if row_class(r) != "partial"]
    assert (sum(r.compute_within for r in rest), len(rest)) == (280, 288)
    far = [r for r in lavapipe_rows if abs(r.compute[0] / r.compute[1] - 1) > 0.25]
    assert far == []


def test_the_host_buffer_follows_what_it_runs_for_the_devices(oracle: dict) -> None:
    """The host's compute (CPU, Vulkan_Host): the logits and KQ it runs for a refusing device, and
    with pipeline parallelism the Q, K and V it receives per layer, copied 4 times: 235 of 288
    host rows within max(5%, 16 MiB) (157 before, 233 before the V cache's indices without flash
    attention; two devices: 80 of 96, was 4)."""
    host = [r for r in rows(oracle, LAVAPIPE_ALIGNMENT, LAVAPIPE_MAX_TENSOR_BYTES)
            if r.device == "Host"]  # fmt: skip
    assert sum(r.compute_within for r in host) == 235
    two = [r for r in host if row_class(r) == "two devices"]
    assert sum(r.compute_within for r in two) == 80


@pytest.mark.parametrize(
    ("config", "case", "device"),
    [
        # the logits (and the head over them) run on the host
        ("llama-3.1-8b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0 ngl=all", "Vulkan0"),
        ("llama-3.1-8b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0 ngl=all", "Host"),
        # the KQ matrix over the cap runs on the host
        ("qwen3-8b", "ctx=32768 np=1 ctk=f16 ctv=f16 fa=off visible=0 ngl=all", "Vulkan0"),
        # the quantized cache is dequantized outside the buffer
        ("llama-3.1-8b", "ctx=32768 np=1 ctk=q8_0 ctv=q8_0 fa=on visible=0 ngl=all", "Vulkan0"),
        # pipeline parallelism: what the host returns, copied per layer
        ("llama-3.1-8b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=off visible=0,0 ngl=all ts=3,1",
         "Vulkan0"),
        ("qwen3.6-35b-a3b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0,0 ngl=all ts=3,1",
         "Vulkan0"),
        # gpt-oss's expert biases: gate and up results come back beside the experts' outputs
        ("gpt-oss-20b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0 ngl=all", "Vulkan0"),
        ("gpt-oss-20b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0,0 ngl=all ts=3,1",
         "Vulkan1"),
        # deepseek-v3's absorbed MLA Q is over the cap: the host runs its attention
        ("deepseek-v3", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0 ngl=all", "Vulkan0"),
        ("deepseek-v3", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0,0 ngl=all ts=3,1",
         "Vulkan0"),
        # the last device, its head on the host: a layer over its inputs (the residual and
        # its norm, per-layer slices), nothing fitted on top
        ("qwen3.5-27b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0,0 ngl=all ts=3,1",
         "Vulkan1"),
        ("gemma-4-e2b", "ctx=32768 np=1 ctk=f16 ctv=f16 fa=off visible=0,0 ngl=all ts=3,1",
         "Vulkan1"),
        # without flash attention: the V cache's element indices, copied with the inputs
        ("gemma-3-27b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=off visible=0,0 ngl=all ts=3,1",
         "Vulkan1"),
        # flash attention narrower than the residual stream: the FFN above its Q, K and V
        ("gemma-3-27b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0 ngl=all", "Vulkan0"),
        # an FFN without a gate (nemotron-h's relu^2): one block, so a host layer's copied
        # weight goes with the FFN's live set, not the fitted Mamba-2 layer's
        ("nemotron-h-8b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=on visible=0 ngl=26", "Vulkan0"),
        # the host with pipeline parallelism: the layers' Q, K and V it receives, copied
        ("llama-3.1-8b", "ctx=4096 np=1 ctk=f16 ctv=f16 fa=off visible=0,0 ngl=all ts=3,1",
         "Host"),
    ],
)  # fmt: skip
def test_each_vulkan_rule_matches_its_rows(
    oracle: dict, config: str, case: str, device: str
) -> None:
    """One row per rule, each off by more than the bound before its rule (the first ones more
    than 2x under the CPU/CUDA rule, before the traits)."""
    got = rows(oracle, LAVAPIPE_ALIGNMENT, LAVAPIPE_MAX_TENSOR_BYTES)
    (row,) = [r for r in got if r.config == config and r.case == case and r.device == device]
    assert row.compute_within, (row.compute[0] / MiB, row.compute[1] / MiB)
