"""plan/host_layers.py: dense attention host layers replayed as llama.cpp runs them by op offload,
against llama.cpp's own figures on the lavapipe Vulkan oracle (tests/data/vulkan-oracle.json.gz,
recorded by scripts/record_vulkan_oracle.py; re-record with the Vulkan build of
scripts/build-llamacpp-vulkan.sh). The op orders were read off GGML_SCHED_DEBUG=2 and an
allocator trace of that build (ALLOC_TRACE=1; docs/compute.md "A host layer's splits")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quantpick.plan.host_layers import (
    dense_attention_layer,
    dense_host_layers_peak,
    replayed_host_layers_peak,
)
from quantpick.plan.host_replay import HostLayerConfig
from quantpick.plan.hybrid_layers import hybrid_layers
from quantpick.plan.kv_cache import swa_cells

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vulkan_oracle import (  # noqa: E402
    LAVAPIPE_ALIGNMENT,
    LAVAPIPE_MAX_TENSOR,
    MiB,
    layout_of,
    load,
    partial_rows,
)

DENSE = (
    "llama-3.1-8b",
    "mistral-small-24b",
    "qwen2.5-7b",
    "qwen3-8b",
    "ministral-3-8b",
    "qwen3-30b-a3b",  # routed experts, each expert tensor copied in (108 MiB)
    "glm-4.5-air",  # a dense first layer, then experts run on the host beside a shared expert
    "gemma-3-27b",  # post-norms, Q scaled, K before V, sliding-window layers with their own mask
)


@pytest.fixture(scope="module")
def oracle() -> dict:
    return load()


@pytest.mark.parametrize("name", DENSE)
def test_the_replay_is_llama_cpps_buffer_for_dense_host_layers(oracle: dict, name: str) -> None:
    """Every dense attention model's -ngl rows with flash attention (f16 and q8_0 cache, 4096 and
    32768 cells): the replay of its host layers is llama.cpp's Vulkan0 compute buffer to the byte
    or within 4 KiB (the graph inputs' sizes: token positions, the temperature). The fitted
    phases it replaces were 51 MiB over on ministral-3-8b at 32768, 73 MiB under on
    mistral-small-24b's q8_0 cache there, 35.5 under on qwen3-30b-a3b's f16 cache and 28 under
    on glm-4.5-air's (its sigmoid router with a selection bias, experts the device refuses);
    gemma-3-27b's was 64 MiB over at 32768."""
    config = next(c for c in oracle["configs"] if c["config"] == name)
    layout = layout_of(config)
    rows = partial_rows(oracle, name)
    assert len(rows) == 4
    for case, theirs in rows:
        # -ngl N: the last N - 1 blocks and the output on the device (src/llama-model.cpp,
        # i_gpu_start = n_layer + 1 - N)
        host = list(range(layout.architecture.block_count + 1 - int(case["ngl"])))
        window = swa_cells(layout.view, case["ctx"], 1, False, 512, False)
        masks = len({layout.view.layers[s].attention for s in range(len(layout.view.layers))})
        run = HostLayerConfig(512, case["ctx"], case["ctk"], case["ctv"], 1, masks, window)
        dense = dense_attention_layer(layout, host, run, LAVAPIPE_MAX_TENSOR)
        assert dense is not None
        ours = dense_host_layers_peak(dense, len(host), LAVAPIPE_ALIGNMENT)
        assert abs(ours - theirs) <= 4096, (case, ours / MiB, theirs / MiB)


@pytest.mark.parametrize("name", ["gemma-4-e2b", "gpt-oss-20b", "nemotron-h-8b"])
def test_layers_outside_the_template_are_not_replayed(oracle: dict, name: str) -> None:
    """Per-layer inputs and a shared KV cache (gemma4), attention sinks (gpt-oss) or Mamba-2
    layers (nemotron-h) are op sequences the templates do not have: no replay, the fitted phases
    stay."""
    config = next(c for c in oracle["configs"] if c["config"] == name)
    layout = layout_of(config)
    n = layout.architecture.block_count // 2
    host = list(range(n))
    run = HostLayerConfig(512, 4096, "f16", "f16")
    assert dense_attention_layer(layout, host, run, LAVAPIPE_MAX_TENSOR) is None
    assert hybrid_layers(layout, host, run, LAVAPIPE_MAX_TENSOR) is None


def test_only_one_sequence_and_at_most_two_masks_are_replayed(oracle: dict) -> None:
    """The templates describe one sequence and one KV stream (-np 1) and a graph of one or two
    attention kinds: anything else keeps the fitted phases (the entry point returns 0)."""
    config = next(c for c in oracle["configs"] if c["config"] == "llama-3.1-8b")
    layout = layout_of(config)
    host = list(range(17))

    def peak(streams: int, masks: int) -> int:
        run = HostLayerConfig(512, 4096, "f16", "f16", streams, masks)
        return replayed_host_layers_peak(layout, host, run, LAVAPIPE_MAX_TENSOR, 16)

    assert abs(peak(1, 1) - 131.5 * MiB) < 4096
    assert peak(2, 1) == 0
    assert peak(1, 3) == 0
