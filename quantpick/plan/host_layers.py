"""The host layers a GPU runs by op offload (-ngl partial offload), replayed as llama.cpp schedules
and allocates them: the layer's ops in graph order, cut into splits by ggml_backend_sched's rules
and laid out by its graph allocator (plan/allocator.py). Pure: sizes in, the device buffer's
high-water mark out.

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
from collections.abc import Sequence
from dataclasses import dataclass

from quantpick.model.ggml import is_quantized, row_size
from quantpick.model.layout import ModelLayout
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
class DenseAttentionLayer:
    """The sizes of a dense attention layer with a gated FFN (bytes): llama and the families
    whose layer only adds biases, Q/K norms, a rope frequency table or an attention temperature
    (llama, mistral3, qwen2, qwen3)."""

    e: int  # n_ubatch x n_embd x 4: the residual stream
    q: int  # n_ubatch x n_head x head_dim_k x 4
    k: int  # n_ubatch x n_head_kv x head_dim_k x 4
    v: int  # n_ubatch x n_head_kv x head_dim_v x 4
    attn: int  # n_ubatch x n_head x head_dim_v x 4: flash attention's result
    ffn: int  # n_ubatch x n_ff x 4
    w_q: int
    w_k: int
    w_v: int
    w_o: int
    w_gate: int
    w_up: int
    w_down: int
    norm_w: int  # attn_norm / ffn_norm weight
    k_view: int  # the host cache's K of one layer, as flash attention reads it
    v_view: int
    mask: int  # the f16 KQ mask
    bias_q: int = 0  # qwen2: attn_q/k/v biases, added in place after each projection
    bias_k: int = 0
    bias_v: int = 0
    qk_norm_w: int = 0  # qwen3: attn_q_norm / attn_k_norm (an RMS norm of Q and K before rope)
    rope_freqs: int = 0  # llama-3 rope scaling: a host weight every rope reads
    attn_temp: int = 0  # mistral3: Q scaled by a per-token temperature (a graph input)
    # a quantized cache: the Hadamard rotations of K (and Q) and of V (and the attention's
    # result), graph inputs (src/llama-kv-cache.cpp:1447-1486), one matmul each (0: none)
    k_rot: int = 0
    v_rot: int = 0


def _layer_ops(i: int, s: DenseAttentionLayer, x: str) -> tuple[list[Op], dict[str, Copied]]:
    """Layer `i`'s ops with the residual stream `x` (graph order of llama.cpp's build_attn and
    build_ffn, as GGML_SCHED_DEBUG=2 prints them), and what they copy in."""
    ops: list[Op] = []
    copied: dict[str, Copied] = {}

    def w(name: str, size: int) -> str:
        copied[name] = Copied(size, weight=True)
        return name

    def graph_input(name: str, size: int) -> str:
        copied[name] = Copied(size, weight=False, persistent=True)
        return name

    n = f"-{i}"
    ops.append(Op("attn_norm" + n, s.e, ("norm" + n, w("attn_norm.w" + n, s.norm_w)), True))
    pos = graph_input("inp_pos", 2048)
    rope_srcs: tuple[str, ...] = (pos,)
    if s.rope_freqs:
        rope_srcs += (w("rope_freqs", s.rope_freqs),)

    def projection(name: str, size: int, weight: int, bias: int, norm: bool, rope: bool) -> str:
        out = name + n
        ops.append(Op(out, size, (w("w_" + out, weight), "attn_norm" + n)))
        if bias:
            ops.append(Op(out + "_b", size, (out, w("b_" + out, bias)), True))
            out += "_b"
        if norm:
            ops.append(Op(out + "_rms", size, (out,)))  # the norm of a reshaped view: new
            ops.append(Op(out + "_n", size, (out + "_rms", w("n_" + out, s.qk_norm_w)), True))
            out += "_n"
        if rope:
            # in place where its input is the norm's own result; a reshaped view gets a new block
            ops.append(Op(out + "_rope", size, (out, *rope_srcs), inplace=norm))
            out += "_rope"
        return out

    q = projection("q", s.q, s.w_q, s.bias_q, bool(s.qk_norm_w), True)
    if s.attn_temp:
        ops.append(Op(q + "_t", s.q, (q, graph_input("inp_attn_scale", s.attn_temp)), True))
        q += "_t"

    def rotated(x: str, size: int, rot: str, rot_size: int) -> str:
        if not rot_size:
            return x
        ops.append(Op(x + "_rot", size, (graph_input(rot, rot_size), x)))
        return x + "_rot"

    q = rotated(q, s.q, "k_rot", s.k_rot)
    v = rotated(projection("v", s.v, s.w_v, s.bias_v, False, False), s.v, "v_rot", s.v_rot)
    k = rotated(
        projection("k", s.k, s.w_k, s.bias_k, bool(s.qk_norm_w), True), s.k, "k_rot", s.k_rot
    )
    # the cache writes run on the host: K and V are copied out, then freed here
    ops.append(Op("cache_write" + n, 0, (k, v), on_host=True))
    # the K and V views are activations of the host, not weights: they start no split
    copied["k_view" + n] = Copied(s.k_view, weight=False)
    copied["v_view" + n] = Copied(s.v_view, weight=False)
    kv = ("k_view" + n, "v_view" + n)
    ops.append(Op("fa" + n, s.attn, (q, *kv, graph_input("mask", s.mask))))
    fa = rotated("fa" + n, s.attn, "v_rot", s.v_rot)
    ops.append(Op("attn_out" + n, s.e, (w("w_o" + n, s.w_o), fa)))
    ops.append(Op("ffn_inp" + n, s.e, ("attn_out" + n, x), True))
    ops.append(Op("ffn_rms" + n, s.e, ("ffn_inp" + n,)))
    ops.append(Op("ffn_norm" + n, s.e, ("ffn_rms" + n, w("ffn_norm.w" + n, s.norm_w)), True))
    ops.append(Op("gate" + n, s.ffn, (w("w_gate" + n, s.w_gate), "ffn_norm" + n)))
    ops.append(Op("up" + n, s.ffn, (w("w_up" + n, s.w_up), "ffn_norm" + n)))
    ops.append(Op("swiglu" + n, s.ffn, ("gate" + n, "up" + n)))
    ops.append(Op("ffn_out" + n, s.e, (w("w_down" + n, s.w_down), "swiglu" + n)))
    ops.append(Op("l_out" + n, s.e, ("ffn_out" + n, "ffn_inp" + n), True))
    ops.append(Op(f"norm-{i + 1}", s.e, ("l_out" + n,)))
    return ops, copied


def dense_host_layers_peak(s: DenseAttentionLayer, n_layers: int, alignment: int) -> int:
    """The device buffer's high-water mark over `n_layers` host layers of `s` run by op offload,
    from the first (its input, the token embeddings, copied in) on."""
    ops: list[Op] = [Op("norm-0", s.e, ("embd",))]
    copied: dict[str, Copied] = {"embd": Copied(s.e, weight=False)}
    x = "embd"
    for i in range(n_layers):
        layer, inputs = _layer_ops(i, s, x)
        ops += layer
        copied.update(inputs)
        x = f"l_out-{i}"
    return replay(ops, copied, alignment)


def replay(ops: list[Op], copied: dict[str, Copied], alignment: int) -> int:
    """Schedule `ops` into splits, allocate them and return the device buffer's high-water mark."""
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
                and parent not in copied
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


# the tensors of a block `DenseAttentionLayer` describes (biases and Q/K norms optional)
_DENSE_BLOCK = frozenset(
    {
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    }
)
_DENSE_OPTIONAL = frozenset(
    {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight"}
)


def dense_attention_layer(
    layout: ModelLayout,
    slots: Sequence[int],
    ubatch: int,
    cells: int,
    type_k: str,
    type_v: str,
) -> DenseAttentionLayer | None:
    """The host layers `slots` as one `DenseAttentionLayer` (flash attention, `cells` cells of
    cache, `ubatch` tokens), or None where they are not all that layer with the same tensors:
    each block holds exactly the template's tensors (llama, mistral3, qwen2, qwen3; any other
    tensor -- a post-norm, sinks, experts, a recurrent state -- is an op sequence the template
    does not have), one attention kind, K and V of the same width."""
    view = layout.view
    if not slots:
        return None
    shapes: set[tuple[tuple[str, int], ...]] = set()
    for slot in slots:
        lv = view.layers[slot]
        if lv.recurrent or not lv.kv or lv.k_width != lv.v_width:
            return None
        prefix = f"blk.{slot}."
        own = {
            t.name[len(prefix) :]: t.n_bytes for t in layout.tensors if t.name.startswith(prefix)
        }
        if not _DENSE_BLOCK <= own.keys() <= _DENSE_BLOCK | _DENSE_OPTIONAL:
            return None
        shapes.add(tuple(sorted(own.items())))
    if len(shapes) != 1:
        return None  # layers of different sizes or quant mixes: not one template
    first = slots[0]
    lv = view.layers[first]
    sizes = dict(next(iter(shapes)))
    arch = layout.architecture
    n_embd, n_head = view.n_embd, max(lv.n_head, 1)
    n_head_kv = max(lv.n_head_kv, 1)
    head_k = lv.k_width // n_head_kv
    ffn = layout.tensor(f"blk.{first}.ffn_up.weight")
    n_ff = ffn.shape[1] if ffn is not None and len(ffn.shape) > 1 else 0
    rope_freqs = layout.tensor("rope_freqs.weight")
    return DenseAttentionLayer(
        e=ubatch * n_embd * 4,
        q=ubatch * n_head * head_k * 4,
        k=ubatch * lv.k_width * 4,
        v=ubatch * lv.v_width * 4,
        attn=ubatch * n_head * (lv.v_width // n_head_kv) * 4,
        ffn=ubatch * n_ff * 4,
        w_q=sizes["attn_q.weight"],
        w_k=sizes["attn_k.weight"],
        w_v=sizes["attn_v.weight"],
        w_o=sizes["attn_output.weight"],
        w_gate=sizes["ffn_gate.weight"],
        w_up=sizes["ffn_up.weight"],
        w_down=sizes["ffn_down.weight"],
        norm_w=sizes["attn_norm.weight"],
        k_view=row_size(type_k, lv.k_width) * cells,
        v_view=row_size(type_v, lv.v_width) * cells,
        mask=cells * ubatch * 2,
        bias_q=sizes.get("attn_q.bias", 0),
        bias_k=sizes.get("attn_k.bias", 0),
        bias_v=sizes.get("attn_v.bias", 0),
        qk_norm_w=sizes.get("attn_q_norm.weight", 0),
        rope_freqs=rope_freqs.n_bytes if rope_freqs is not None else 0,
        # the attention temperature (src/models/mistral3.cpp:107-111): a graph input of n_tokens
        attn_temp=ubatch * 4 if arch.get("attention.temperature_scale") else 0,
        k_rot=_rotation(type_k, head_k, grow=True),
        v_rot=_rotation(type_v, lv.v_width // n_head_kv, grow=False),
    )


def _rotation(cache_type: str, head_dim: int, grow: bool) -> int:
    """Bytes of a quantized cache's Hadamard rotation (src/llama-kv-cache.cpp:321-338,
    :1447-1486): for a quantized type and a head a multiple of 64, f32 [n, n] with n the largest
    power of two from 64 up dividing the head for K, 64 for V; 0 otherwise."""
    if not is_quantized(cache_type) or head_dim % 64:
        return 0
    n = 64
    while grow and head_dim % (n * 2) == 0:
        n *= 2
    return n * n * 4
