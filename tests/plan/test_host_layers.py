"""plan/host_layers.py: a host layer's op sequence on the offloading device, scheduled and allocated
as llama.cpp does, against llama.cpp's own figures on the lavapipe Vulkan oracle
(tests/data/vulkan-oracle.json.gz, recorded by scripts/record_vulkan_oracle.py; re-record with the
Vulkan build of scripts/build-llamacpp-vulkan.sh). The op orders were read off GGML_SCHED_DEBUG=2
and an allocator trace of that build (docs/compute.md "A host layer's splits")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.model.ggml import is_quantized
from quantpick.plan.host_layers import (
    Copied,
    DenseAttentionLayer,
    HostLayerConfig,
    Op,
    dense_attention_layer,
    dense_host_layers_peak,
    hybrid_host_layers_peak,
    hybrid_layers,
    replay,
    schedule,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vulkan_oracle import MiB, layout_of, load  # noqa: E402

LAVAPIPE_ALIGNMENT = 16
LAVAPIPE_MAX_TENSOR = 128 * MiB  # maxStorageBufferRange: larger weights stay on the host
DENSE = (
    "llama-3.1-8b",
    "mistral-small-24b",
    "qwen2.5-7b",
    "qwen3-8b",
    "ministral-3-8b",
    "qwen3-30b-a3b",  # routed experts, each expert tensor copied in (108 MiB)
)


@pytest.fixture(scope="module")
def oracle() -> dict:
    return load()


def partial_rows(oracle: dict, name: str) -> list[tuple[dict, int]]:
    """(case, llama.cpp's Vulkan0 compute bytes) of a config's -ngl rows with flash attention."""
    config = next(c for c in oracle["configs"] if c["config"] == name)
    return [
        (case["config"], dev["compute"])
        for case in config["cases"]
        if case["config"]["ngl"] != "all" and case["config"]["fa"] == "on"
        for dev in case["bytes"]["devices"]
        if dev["name"] == "Vulkan0"
    ]


@pytest.mark.parametrize("name", DENSE)
def test_the_replay_is_llama_cpps_buffer_for_dense_host_layers(oracle: dict, name: str) -> None:
    """Every dense attention model's -ngl rows with flash attention (f16 and q8_0 cache, 4096 and
    32768 cells): the replay of its host layers is llama.cpp's Vulkan0 compute buffer to the byte
    or within 4 KiB (the graph inputs' sizes: token positions, the temperature). The fitted
    phases it replaces were 51 MiB over on ministral-3-8b at 32768, 73 MiB under on
    mistral-small-24b's q8_0 cache there and 35.5 under on qwen3-30b-a3b's f16 cache."""
    config = next(c for c in oracle["configs"] if c["config"] == name)
    layout = layout_of(config)
    rows = partial_rows(oracle, name)
    assert len(rows) == 4
    for case, theirs in rows:
        # -ngl N: the last N - 1 blocks and the output on the device (src/llama-model.cpp,
        # i_gpu_start = n_layer + 1 - N)
        host = list(range(layout.architecture.block_count + 1 - int(case["ngl"])))
        run = HostLayerConfig(512, case["ctx"], case["ctk"], case["ctv"])
        dense = dense_attention_layer(layout, host, run, LAVAPIPE_MAX_TENSOR)
        assert dense is not None
        ours = dense_host_layers_peak(dense, len(host), LAVAPIPE_ALIGNMENT)
        assert abs(ours - theirs) <= 4096, (case, ours / MiB, theirs / MiB)


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


def test_two_results_named_alike_are_refused() -> None:
    """A template that names two results alike would free the first at the second's last use:
    the replay refuses it rather than place blocks wrongly."""
    ops = [Op("x", 8, ("in",)), Op("x", 8, ("x",))]
    with pytest.raises(ValueError, match="named twice"):
        replay(ops, {"in": Copied(8, weight=False)}, 16)


@pytest.mark.parametrize("name", ["gemma-3-27b", "gemma-4-e2b", "gpt-oss-20b", "glm-4.5-air"])
def test_layers_outside_the_template_are_not_replayed(oracle: dict, name: str) -> None:
    """Post-norms and two masks (gemma3), per-layer inputs and a shared KV cache (gemma4),
    attention sinks (gpt-oss) or a dense first layer with biases before routed experts
    (glm4moe) are op sequences the templates do not have: no replay, the fitted phases stay."""
    config = next(c for c in oracle["configs"] if c["config"] == name)
    layout = layout_of(config)
    n = layout.architecture.block_count // 2
    host = list(range(n))
    run = HostLayerConfig(512, 4096, "f16", "f16")
    assert dense_attention_layer(layout, host, run, LAVAPIPE_MAX_TENSOR) is None
    assert hybrid_layers(layout, host, run, LAVAPIPE_MAX_TENSOR) is None


def test_an_op_whose_host_weight_was_copied_before_starts_a_split_the_next_weight_joins() -> None:
    """llama-3's rope reads `rope_freqs`, a host weight: in the second layer its copy exists, so
    the rope starts a split with no input, and the V projection's weight joins that split: it is
    copied in before the rope's result is allocated (GGML_SCHED_DEBUG=2: SPLIT #17 holds the
    rope of Q and the V matmul, its one input blk.1.attn_v.weight)."""
    copied = {
        "wq": Copied(9, weight=True),
        "freqs": Copied(1, weight=True, persistent=True),
        "wv": Copied(2, weight=True),
    }
    ops = [
        Op("q", 8, ("wq", "x")),
        Op("q_rope", 8, ("q", "freqs")),
        Op("v", 2, ("wv", "x")),
    ]
    # the first layer copied freqs already: mark it done by a split before
    splits = schedule([Op("warm", 0, ("freqs",)), *ops], copied)
    assert [(inputs, [op.out for op in s]) for inputs, s in splits] == [
        (["freqs"], ["warm"]),
        (["wq"], ["q"]),
        (["wv"], ["q_rope", "v"]),
    ]


sizes = st.integers(min_value=1, max_value=64).map(lambda n: n * 1024 * 1024)


@given(
    e=sizes, ffn=sizes, w=sizes, kv=sizes, mask=sizes, layers=st.integers(min_value=1, max_value=4)
)
def test_the_attention_split_holds_q_k_v_and_the_mask_at_once(
    e: int, ffn: int, w: int, kv: int, mask: int, layers: int
) -> None:
    """Flash attention's split copies in K and V with the mask while the roped Q and the
    residual stream are alive: the buffer holds at least all of them, whatever the sizes."""
    s = DenseAttentionLayer(
        e=e, q=e, k=e // 4, v=e // 4, attn=e, ffn=ffn, w_q=w, w_k=w // 4, w_v=w // 4, w_o=w,
        w_gate=w, w_up=w, w_down=w, norm_w=16384, k_view=kv, v_view=kv, mask=mask,
    )  # fmt: skip
    assert dense_host_layers_peak(s, layers, 16) >= e + e + 2 * kv + mask


def test_quantized_types_are_the_block_types() -> None:
    assert is_quantized("q8_0") and is_quantized("Q4_K") and is_quantized("iq4_nl")
    assert not any(is_quantized(t) for t in ("f16", "F32", "bf16"))
