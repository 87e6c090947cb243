"""plan/host_replay.py: the scheduler's split rules and the allocator replay the host-layer
templates share (their figures against llama.cpp: tests/plan/test_host_layers.py and
tests/plan/test_hybrid_layers.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.plan.host_layers import DenseAttentionLayer, dense_host_layers_peak
from quantpick.plan.host_replay import Copied, Op, replay, schedule


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


def test_two_results_named_alike_are_refused() -> None:
    """A template that names two results alike would free the first at the second's last use:
    the replay refuses it rather than place blocks wrongly."""
    ops = [Op("x", 8, ("in",)), Op("x", 8, ("x",))]
    with pytest.raises(ValueError, match="named twice"):
        replay(ops, {"in": Copied(8, weight=False)}, 16)


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
