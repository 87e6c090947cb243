"""plan/hybrid_layers.py: the gated delta-net families' host layers replayed as llama.cpp runs them
by op offload, against llama.cpp's own figures on the lavapipe Vulkan oracle
(tests/data/vulkan-oracle.json.gz, recorded by scripts/record_vulkan_oracle.py; re-record with
the Vulkan build of scripts/build-llamacpp-vulkan.sh). The op orders were read off
GGML_SCHED_DEBUG=2 and an allocator trace of that build (ALLOC_TRACE=1; docs/compute.md "A host
layer's splits")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quantpick.plan.host_replay import HostLayerConfig
from quantpick.plan.hybrid_layers import hybrid_host_layers_peak, hybrid_layers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vulkan_oracle import (  # noqa: E402
    LAVAPIPE_ALIGNMENT,
    LAVAPIPE_MAX_TENSOR,
    MiB,
    layout_of,
    load,
    partial_rows,
)


@pytest.fixture(scope="module")
def oracle() -> dict:
    return load()


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "qwen3.6-35b-a3b", "qwen3.5-27b"])
def test_gated_delta_net_host_layers_are_llama_cpps_buffer(oracle: dict, name: str) -> None:
    """qwen3next and the qwen3.5 families: three gated delta-net layers, then a gated attention
    layer; routed experts the device refuses (over lavapipe's 128 MiB: they run on the host and
    their weighted result comes back) beside a shared expert, or a dense FFN (qwen3.5-27b).
    qwen3-next-80b-a3b -ngl 24: the first attention layer copies the mask in at 33 MiB, above the
    gated Q and V, and each layer's experts' result (40 MiB) lands above it: 77 MiB, where the
    fitted phases said 98.8 (28% over). Every row exact (qwen3.5-27b at 32768 was 23 MiB over
    with a q8_0 cache 41 under; qwen3.6-35b-a3b's q8_0 cache 23 under)."""
    config = next(c for c in oracle["configs"] if c["config"] == name)
    layout = layout_of(config)
    rows = partial_rows(oracle, name)
    assert len(rows) == 4
    for case, theirs in rows:
        host = list(range(layout.architecture.block_count + 1 - int(case["ngl"])))
        run = HostLayerConfig(512, case["ctx"], case["ctk"], case["ctv"])
        layers = hybrid_layers(layout, host, run, LAVAPIPE_MAX_TENSOR)
        assert layers is not None
        assert sum(layers.kinds) == len(host) // 4  # full_attention_interval 4
        ours = hybrid_host_layers_peak(layers, LAVAPIPE_ALIGNMENT)
        assert abs(ours - theirs) <= 4096, (case, ours / MiB, theirs / MiB)


def test_a_hybrid_layer_whose_experts_are_copied_in_is_not_replayed(oracle: dict) -> None:
    """On a device that takes the expert tensors op offload copies them in: another sequence,
    left to the fitted phases."""
    config = next(c for c in oracle["configs"] if c["config"] == "qwen3-next-80b-a3b")
    run = HostLayerConfig(512, 4096, "f16", "f16")
    assert hybrid_layers(layout_of(config), list(range(26)), run, 1 << 40) is None
