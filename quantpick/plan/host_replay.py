"""A GPU's share of the host layers it runs by op offload (-ngl partial offload), replayed as
llama.cpp schedules and allocates them: ops in graph order, cut into splits by ggml_backend_sched's
rules and laid out by its graph allocator (plan/allocator.py). Pure: sizes in, the device
buffer's high-water mark out. The layers' op sequences are templates of their own modules:
plan/host_layers.py (dense attention layers, with a dense FFN or routed experts) and
plan/hybrid_layers.py (the gated delta-net families); this module holds what they share.

Where this is exact (allocator traces and GGML_SCHED_DEBUG=2 of the lavapipe Vulkan build, b11312:
docs/compute.md "A host layer's splits"), the scheduler does this with a host layer:
- every op that takes a weight held in host memory starts a new split when the current split
  already has an input (ggml-backend.cpp, ggml_backend_sched_split_graph, "check if we should
  start a new split based on the sources of the current node"), so each weight gets a split of
  its own, and an op whose only host weight was copied before (a rope's `rope_freqs`) starts one
  with no input, which the next weight then joins;
- a split's inputs -- host weights, graph inputs (token positions, the attention temperature, the
  KQ mask), the K and V views of the host's cache -- are copied in when the split starts, before
  its first op (ggml-backend.cpp:1514-1531), each tensor once per graph: the copy lives until its
  last consumer, so a weight's copy is freed after its one op and a graph input's stays to the
  end of the graph;
- ops run in graph order; the allocator gives each result the best-fitting free block, or the
  block of its first source where the op can run in place (ggml_op_can_inplace: ADD, MUL, ROPE,
  RMS_NORM, ...; ggml-alloc.c:22-46) and that source has no other consumer and is not a view
  (a reshaped matmul result is: the rope of Q and K gets a new block), and frees each source after
  its last consumer (ggml-alloc.c:632-700).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from quantpick.model.ggml import is_quantized
from quantpick.plan.allocator import Allocator


@dataclass(frozen=True)
class Op:
    """One node of the graph: its result's bytes and its sources, by name."""

    out: str
    size: int
    srcs: tuple[str, ...]
    inplace: bool = False  # may reuse srcs[0]'s block (an in-place op on a non-view source)
    on_host: bool = False  # runs on the host (the cache writes): its sources here are copied out


@dataclass(frozen=True)
class Copied:
    """A tensor copied into the device as a split input."""

    size: int
    weight: bool  # a weight held in host memory (starts a split where the split has inputs)
    persistent: bool = False  # a graph input: used to the end of the graph


@dataclass(frozen=True)
class HostLayerConfig:
    """What a host layer replay needs of the run: the ubatch, the cache's cells and types."""

    ubatch: int
    cells: int
    type_k: str
    type_v: str
    streams: int = 1  # sequences or KV streams: the templates have one
    masks: int = 1  # attention kinds of the graph (iSWA: 2)
    swa_cells: int = 0  # a sliding-window layer's cache cells


def replay_layers(
    e: int,
    n_layers: int,
    layer_ops: Callable[[int, str], tuple[list[Op], dict[str, Copied]]],
    alignment: int,
    scale_embd: bool = False,
) -> int:
    """The device buffer's high-water mark over `n_layers` host layers from the first on: the
    token embeddings (`e` bytes) copied in (`scale_embd`: scaled in place, gemma) and normalized,
    then each layer's ops (`layer_ops(i, its input)`), each layer's result the next one's input."""
    copied: dict[str, Copied] = {"embd": Copied(e, weight=False)}
    x = "embd"
    ops: list[Op] = []
    if scale_embd:
        ops.append(Op("inp_scaled", e, (x,), True))
        x = "inp_scaled"
    ops.append(Op("norm-0", e, (x,)))
    for i in range(n_layers):
        layer, inputs = layer_ops(i, x)
        ops += layer
        copied.update(inputs)
        x = f"l_out-{i}"
    return replay(ops, copied, alignment)


def replay(ops: list[Op], copied: dict[str, Copied], alignment: int) -> int:
    """Schedule `ops` into splits, allocate them and return the device buffer's high-water mark."""
    outs = Counter(op.out for op in ops)
    if max(outs.values(), default=1) > 1:  # a template naming two results alike frees one early
        raise ValueError(f"a result named twice: {outs.most_common(1)[0][0]}")
    uses = Counter(src for op in ops for src in op.srcs)
    alloc = Allocator(alignment)
    where: dict[str, tuple[int, int]] = {}  # live tensor -> (offset, size)
    for inputs, split_ops in schedule(ops, copied):
        for name in inputs:  # a split's inputs are copied in before its first op
            where[name] = (alloc.alloc(copied[name].size)[1], copied[name].size)
        for op in split_ops:
            parent = op.srcs[0] if op.srcs else None
            if op.on_host:
                pass
            elif (
                op.inplace
                and parent in where
                and not (parent in copied and (copied[parent].weight or copied[parent].persistent))
                and uses[parent] == 1
                and where[parent][1] == op.size
            ):
                where[op.out] = where.pop(parent)
            elif op.size:
                where[op.out] = (alloc.alloc(op.size)[1], op.size)
            for src in op.srcs:
                uses[src] -= 1
                if uses[src] == 0 and src in where and not copied.get(src, _KEEP).persistent:
                    offset, size = where.pop(src)
                    alloc.free(offset, size)
    return alloc.max_size


_KEEP = Copied(0, weight=False)


def schedule(ops: list[Op], copied: dict[str, Copied]) -> list[tuple[list[str], list[Op]]]:
    """`ops` cut into splits, each with the tensors it copies in (in the order its ops first read
    them): a new split at an op on the host and at the next one after it, and at an op taking a
    host weight where the current split already has an input."""
    splits: list[tuple[list[str], list[Op]]] = []
    done: set[str] = set()
    current: tuple[list[str], list[Op]] | None = None
    for op in ops:
        takes_weight = any(s in copied and copied[s].weight for s in op.srcs)
        if op.on_host or current is None or (takes_weight and current[0]):
            current = ([], [])
            splits.append(current)
        for src in op.srcs:
            if src in copied and src not in done and not op.on_host:
                done.add(src)
                current[0].append(src)
        current[1].append(op)
        if op.on_host:
            current = None
    return splits


def rotate(ops: list[Op], copied: dict[str, Copied], x: str, size: int, rot: str, n: int) -> str:
    """`x` multiplied by a quantized cache's Hadamard rotation `rot` of `n` bytes (a graph input;
    src/llama-kv-cache.cpp:1447-1486), or `x` itself without one."""
    if not n:
        return x
    copied[rot] = Copied(n, weight=False, persistent=True)
    ops.append(Op(x + "_rot", size, (rot, x)))
    return x + "_rot"


def rotation_bytes(cache_type: str, head_dim: int, grow: bool) -> int:
    """Bytes of a quantized cache's Hadamard rotation (src/llama-kv-cache.cpp:321-338,
    :1447-1486): for a quantized type and a head a multiple of 64, f32 [n, n] with n the largest
    power of two from 64 up dividing the head for K, 64 for V; 0 otherwise."""
    if not is_quantized(cache_type) or head_dim % 64:
        return 0
    n = 64
    while grow and head_dim % (n * 2) == 0:
        n *= 2
    return n * n * 4


def softmax_router(n: str, tokens: int, n_expert: int, k: int, weight: str, x: str) -> list[Op]:
    """build_moe_ffn's softmax router: the logits, their softmax, the argsort (its first k
    columns, a view, are the choice), the chosen weights normalized by their sum. The logits are
    freed only after the normalization (the allocator trace's order)."""
    scores = tokens * n_expert * 4
    return [
        Op("logits" + n, scores, (weight, x)),
        Op("probs" + n, scores, ("logits" + n,)),
        Op("argsort" + n, scores, ("probs" + n,)),
        *_chosen_weights(n, tokens, k, ("logits" + n,)),
    ]


def sigmoid_router(
    n: str, tokens: int, n_expert: int, k: int, weight: str, bias: str, x: str
) -> list[Op]:
    """build_moe_ffn's sigmoid router with a selection bias (glm4moe, exp_probs_b): the logits,
    their sigmoid in place, the biased scores the argsort chooses by (a new block: the unbiased
    ones are read again for the weights), the chosen weights normalized by their sum (an
    allocator trace of glm-4.5-air -ngl 23)."""
    scores = tokens * n_expert * 4
    return [
        Op("logits" + n, scores, (weight, x)),
        Op("probs" + n, scores, ("logits" + n,), True),
        Op("biased" + n, scores, ("probs" + n, bias)),
        Op("argsort" + n, scores, ("biased" + n,)),
        *_chosen_weights(n, tokens, k, ()),
    ]


def _chosen_weights(n: str, tokens: int, k: int, held: tuple[str, ...]) -> list[Op]:
    """The chosen experts' weights gathered from the scores, normalized by their (clamped) sum;
    `held`: what stays alive until the normalization."""
    return [
        Op("weights" + n, tokens * k * 4, ("probs" + n, "argsort" + n)),
        Op("weights_sum" + n, tokens * 4, ("weights" + n,)),
        Op("weights_sum_c" + n, tokens * 4, ("weights_sum" + n,), True),
        Op("weights_norm" + n, tokens * k * 4, ("weights" + n, "weights_sum_c" + n, *held)),
    ]


def weighted_sum(n: str, e: int, k: int, down: tuple[str, int], out: str) -> list[Op]:
    """The experts' down result weighted in place, then its k slices (views of it) summed: the
    first add gets a new block, the others run in place."""
    ops = [Op("moe_weighted" + n, down[1], (down[0], "weights_norm" + n), True)]
    sums = [f"moe_sum{j}{n}" for j in range(k - 2)] + [out]
    ops.append(Op(sums[0], e, ("moe_weighted" + n,) * 2))
    for prev, nxt in zip(sums, sums[1:], strict=False):
        ops.append(Op(nxt, e, (prev, "moe_weighted" + n), True))
    return ops
