"""What llama.cpp will allocate on each device for one configuration. Pure: data in, data out.

Every rule mirrors llama.cpp (tree of 2026-10-01, commit 0c1e570); the project's llamacpp-memory
notes cite the functions. Weights, KV cache and recurrent state are deterministic in llama.cpp and
are computed to the byte; compute buffers and the GPU runtime's context are estimates, labelled
as such.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field, replace

from quantpick.arch.base import AttentionKind, MemoryClass
from quantpick.arch.graph import ArchLive, GraphSizes
from quantpick.arch.registry import graph_trait
from quantpick.machine.backends import backend_of
from quantpick.machine.spec import Machine
from quantpick.model.ggml import (
    CPU_BUFFER,
    pad,
    row_size,
)
from quantpick.model.layout import INPUT_SLOT, ModelLayout, TensorInfo
from quantpick.plan.compute import (
    GPU_ESTIMATE,
    PIPELINE_COPIES,
    ComputeBackend,
    DeviceGraph,
    accuracy,
    device_compute,
    gpu_accuracy,
    graph_shape,
    output_buffer,
    state_rows_fence,
    v_cache_indices,
)
from quantpick.plan.graph_rules import GENERIC, GRAPH_RULES
from quantpick.plan.host_layers import gated_ffn_up, replayed_host_layers_peak
from quantpick.plan.host_replay import HostLayerConfig
from quantpick.plan.kv_cache import (
    context_cells,
    kv_bytes_per_cell_per_layer,
    kv_type_problem,
    layer_kv_bytes,
    layer_kv_bytes_per_cell,
    recurrent_bytes_per_layer_per_row,
    swa_cells,
    validate_config,
)
from quantpick.plan.llama_devices import (
    LlamaDevice,
    backend_kind,
    buffer_device,
    device_buffer,
    host_weight_tensor,
    llama_devices,
    rpc_devices,
)
from quantpick.plan.memory_types import (
    DESCRIBED_HOST_RESERVE,
    PROBED_HOST_RESERVE,
    PROJECTOR_COMPUTE_BYTES,
    DeviceEstimate,
    DraftRun,
    Estimate,
    Overheads,
    RunConfig,
    host_reserve_bytes,
    spec_n_max,
)

MiB = 1024**2
GiB = 1024**3

# The memory model's inputs, outputs, KV sizing and device list live in their own modules
# (plan/memory_types.py, plan/kv_cache.py, plan/llama_devices.py); their names are this
# module's too, as they were before the split.
__all__ = [
    "DESCRIBED_HOST_RESERVE",
    "DeviceEstimate",
    "DraftRun",
    "Estimate",
    "LlamaDevice",
    "Overheads",
    "PROBED_HOST_RESERVE",
    "PROJECTOR_COMPUTE_BYTES",
    "RunConfig",
    "context_cells",
    "host_reserve_bytes",
    "kv_bytes_per_cell_per_layer",
    "kv_type_problem",
    "layer_kv_bytes",
    "layer_kv_bytes_per_cell",
    "llama_devices",
    "pad",
    "recurrent_bytes_per_layer_per_row",
    "rpc_devices",
    "spec_n_max",
    "swa_cells",
    "validate_config",
    "apply_compute_ratios",
    "backend_kind",
    "device_buffer",
    "estimate",
    "host_weight_tensor",
]

# ----------------------------------------------------------------------------------------------
# The estimate.


@dataclass
class _Acc:
    weights: int = 0
    kv: int = 0
    recurrent: int = 0
    compute: int = 0
    overhead: int = 0
    projector: int = 0
    layers: list[int] = field(default_factory=list)
    attention: list[int] = field(default_factory=list)
    recurrent_layers: list[int] = field(default_factory=list)
    experts: list[int] = field(default_factory=list)


def _f32(value: float) -> float:
    """`value` rounded to single precision (C++ float); memoized (a plan asks ~10^4 times)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _max_alloc_notes(
    layout: ModelLayout,
    devs: tuple[LlamaDevice, ...],
    slot_device: list[int],
    n_cpu_moe: int,
    acc: list[_Acc],
) -> list[str]:
    """A backend whose driver caps one allocation (Vulkan: machine/backends/vulkan.py) cannot
    hold a single tensor or compute buffer above the cap: llama.cpp splits weights over several
    buffers, but not one tensor, and a compute buffer is one allocation."""
    notes: list[str] = []
    for pos, d in enumerate(devs):
        b = backend_of(d.gpu.backend)
        cap = None if d.is_rpc else b.max_alloc_bytes
        if not cap:
            continue
        biggest = max(
            (
                t.n_bytes
                for t in layout.tensors
                if (slot := layout.slot_of(t.name)) != INPUT_SLOT
                and slot_device[slot] == pos
                and not (t.is_expert and slot < n_cpu_moe)
            ),
            default=0,
        )
        for what, size in (("tensor", biggest), ("compute buffer", acc[pos].compute)):
            if size > cap:
                notes.append(
                    f"{d.name}: a {what} of {size / GiB:.2f} GiB is above {b.label}'s "
                    f"{cap / GiB:.0f} GiB single allocation on some drivers ({b.max_alloc_source})"
                )
    return notes


def estimate(
    layout: ModelLayout,
    machine: Machine,
    config: RunConfig,
    *,
    overheads: Overheads | None = None,
    projector_bytes: int = 0,
) -> Estimate:
    """Bytes on every device for `config` on `machine`, device order as llama.cpp's."""
    overheads = overheads or Overheads()
    validate_config(config, layout)
    arch = layout.architecture
    devs = llama_devices(machine, config)
    n_gpu = len(devs)
    host_pos = n_gpu  # index of the host accumulator

    n_slots = layout.n_slots  # block_count + 1
    ngl = n_slots if config.n_gpu_layers is None else min(config.n_gpu_layers, n_slots)
    if n_gpu == 0:
        ngl = 0
    i_gpu_start = max(n_slots - ngl, 0)
    act_gpu_layers = min(ngl, n_slots) if n_gpu else 0

    # llama_model_base::load_tensors (src/llama-model.cpp:1556-1614): cumulative split fractions,
    # from -ts or free memory, in float (single precision, as llama.cpp computes them: a split
    # exactly at a layer boundary falls where float32 rounding puts it).
    if config.tensor_split is not None and any(config.tensor_split) and n_gpu:
        shares = list(config.tensor_split[:n_gpu]) + [0.0] * max(
            0, n_gpu - len(config.tensor_split)
        )
    else:
        shares = [float(d.gpu.free_bytes) for d in devs]
    splits: list[float] = []
    running = 0.0
    for share in shares:
        running = _f32(running + _f32(share))
        splits.append(running)
    total_share = running or 1.0
    splits = [_f32(edge / total_share) for edge in splits]

    def device_of_slot(slot: int) -> int:
        if n_gpu == 0 or slot < i_gpu_start or slot - i_gpu_start >= act_gpu_layers:
            return host_pos
        # (float)(il - i_gpu_start) is exact for a layer index: the one rounding is the quotient's
        frac = _f32((slot - i_gpu_start) / act_gpu_layers)
        # std::upper_bound: the first split strictly greater than frac
        for pos, edge in enumerate(splits):
            if edge > frac:
                return pos
        return n_gpu - 1

    slot_device = [device_of_slot(s) for s in range(n_slots)]
    acc = [_Acc() for _ in range(n_gpu + 1)]
    view = layout.view
    per_device = frozenset(layout.per_device_tensors)
    mtp_loaded = config.spec_draft_n > 0 and arch.nextn_predict_layers > 0

    # Weights. The NextN/MTP block is skipped (never allocated) unless MTP speculation loads it.
    overrides = [(re.compile(p), buffer_device(b, devs)) for p, b in config.override_tensors]
    n_cpu_moe = arch.block_count if config.cpu_moe else config.n_cpu_moe

    nextn_skipped = frozenset() if mtp_loaded else frozenset(range(arch.n_layer, arch.block_count))

    def skipped(slot: int) -> bool:
        return slot in nextn_skipped

    # Each device's buffers size their tensors by its backend's rule (model/ggml.py BufferRule:
    # alignment, quantized row padding: machine/backends); the host is the CPU backend.
    rules = [device_buffer(d) for d in devs] + [CPU_BUFFER]
    host_experts = [0] * n_slots  # routed-expert bytes of each block that live in host memory
    # A device whose driver takes no tensor above a size (Gpu.max_tensor_bytes) leaves larger
    # weights in host memory: its backend's supports_op refuses them, and the loader takes the
    # next buffer type, the CPU's (llama-model.cpp select_weight_buft; ggml-vulkan.cpp:15304-15330).
    limits = [d.gpu.max_tensor_bytes for d in devs] + [None]

    def too_big(t: TensorInfo, pos: int) -> bool:
        limit = limits[pos]
        return isinstance(limit, int) and limit > 0 and t.n_bytes > limit

    limited = any(limits) and any(too_big(t, pos) for t in layout.tensors for pos in range(n_gpu))
    if overrides or limited:
        # -ot: std::regex_search on every tensor name, first match wins, before the normal choice
        # (llama_model_loader::create_tensor); --n-cpu-moe's own patterns come after the user's.
        for t in layout.tensors:
            if t in per_device:
                continue
            slot = layout.slot_of(t.name)
            if skipped(slot):
                continue
            target = host_pos if slot == INPUT_SLOT else slot_device[slot]
            for pattern, dev in overrides:
                if pattern.search(t.name):
                    target = host_pos if dev is None else dev
                    break
            else:
                if slot != INPUT_SLOT and t.is_expert and slot < n_cpu_moe:
                    target = host_pos
            if too_big(t, target):
                target = host_pos
            acc[target].weights += layout.tensor_alloc(t, rules[target])
            if t.is_expert and target == host_pos and slot != INPUT_SLOT:
                host_experts[slot] += t.n_bytes
    else:
        acc[host_pos].weights += layout.input_bytes_under(CPU_BUFFER)
        by_rule = {rule.name: layout.slots_under(rule) for rule in set(rules)}
        host_slots = by_rule[CPU_BUFFER.name]
        for slot, sw in enumerate(layout.slots):
            if skipped(slot):
                continue
            dev = slot_device[slot]
            on_host = slot < n_cpu_moe or dev == host_pos
            acc[dev].weights += by_rule[rules[dev].name][slot].dense_bytes
            if on_host:
                acc[host_pos].weights += host_slots[slot].expert_bytes
                host_experts[slot] = sw.expert_bytes
            else:
                acc[dev].weights += by_rule[rules[dev].name][slot].expert_bytes
    # rope_freqs and kin: one copy per device holding a trunk layer (TENSOR_DUPLICATED)
    if per_device:
        holders = dict.fromkeys(slot_device[il] for il in range(arch.n_layer))
        for pos in holders:
            acc[pos].weights += sum(layout.tensor_alloc(t, rules[pos]) for t in per_device)
    # A tied output head: token_embd loaded again on the output layer's device when that is not
    # the host (the same buffer type keeps one copy: src/llama-model-loader.cpp:1371-1376).
    output_dev = slot_device[layout.output_slot]
    if layout.tied_output_bytes and (output_dev != host_pos or view.tied_copy_always):
        embd = layout.tensor("token_embd.weight")
        assert embd is not None  # tied_output_bytes is 0 without it
        if not too_big(embd, output_dev):
            acc[output_dev].weights += layout.tensor_alloc(embd, rules[output_dev])
        elif view.tied_copy_always:  # the copy falls back to the host, where it is loaded anyway
            acc[host_pos].weights += layout.tensor_alloc(embd, rules[host_pos])
        # else: the host's one copy serves the output too
    for slot in range(n_slots):
        if skipped(slot):
            continue
        acc[slot_device[slot]].layers.append(slot)
        if layout.slots[slot].expert_bytes:
            acc[host_pos if host_experts[slot] else slot_device[slot]].experts.append(slot)

    # KV cache and recurrent state, layer by layer from the architecture's view: each layer's
    # cache on its layer's device (dev_layer(il)), or the host with -nkvo
    # (src/llama-kv-cache.cpp:213-222, llama-memory-recurrent.cpp).
    n_ctx, kv_size, n_stream = context_cells(
        config.ctx_size, arch.context_length, config.n_parallel, config.kv_unified
    )
    ub = min(config.ubatch, config.batch, n_ctx)
    fa = config.flash_attn != "off" and view.flash_attn
    if view.split_streams:  # one stream per sequence whatever -kvu says (ModelView)
        n_stream = max(1, config.n_parallel)
    window_cells = swa_cells(
        view, kv_size, config.n_parallel, config.kv_unified and not view.split_streams, ub,
        config.swa_full,
    )  # fmt: skip
    # one row per sequence, times (1 + drafts) rollback snapshots with MTP speculation
    rows = max(1, config.n_parallel) * (1 + config.spec_draft_n)
    for layer in view.layers:
        il = layer.index
        dev = slot_device[il] if config.kv_offload else host_pos
        rule = rules[dev]
        for comp in layer.compressed:  # K only, -ctk type, one tensor over the streams
            acc[dev].kv += rule.alloc(
                config.cache_type_k, comp.width,
                row_size(config.cache_type_k, comp.width) * comp.cells(kv_size) * n_stream,
            )  # fmt: skip
        for state in layer.states:  # f32 kv and score, per stream and rollback plane
            plane = state.width * state.rows * 4
            acc[dev].recurrent += 2 * rule.alloc("F32", state.width, plane * rows)
        if layer.kv:
            cells = window_cells if layer.attention is AttentionKind.SLIDING else kv_size
            acc[dev].kv += layer_kv_bytes(
                layer, view, cells * n_stream, config.cache_type_k, config.cache_type_v, fa, rule
            )
            acc[dev].attention.append(il)
        if layer.index_k_width:
            # the indexer's cache: one key head (and for MSA a value head), every cell
            acc[dev].kv += rule.alloc(
                config.cache_type_k, layer.index_k_width,
                row_size(config.cache_type_k, layer.index_k_width) * kv_size * n_stream,
            )  # fmt: skip
            if layer.index_v_width:
                acc[dev].kv += rule.alloc(
                    config.cache_type_v, layer.index_v_width,
                    row_size(config.cache_type_v, layer.index_v_width) * kv_size * n_stream,
                )  # fmt: skip
        if layer.recurrent:
            # r and s: two f32 tensors of rows x n_embd_r / n_embd_s
            acc[dev].recurrent += rule.alloc("F32", view.state_r, rows * view.state_r * 4)
            acc[dev].recurrent += rule.alloc("F32", view.state_s, rows * view.state_s * 4)
            acc[dev].recurrent_layers.append(il)
    if mtp_loaded:
        # The MTP draft context (common/speculative.cpp:2525-2567): the target's n_ctx, the same
        # sequences and streams, n_rs_seq 0, a plain KV cache of the NextN layers only
        # (src/llama-model.cpp ~2662-2800 filter il >= n_layer()) at -ctkd/-ctvd, on each
        # layer's device. Its cells total n_ctx whatever the streams (checked against
        # llama-server -lv 4: tests/data/llama-server-mtp-buffers.json).
        for il in view.mtp_kv_layers:
            mtp_dev = slot_device[il] if config.kv_offload else host_pos
            acc[mtp_dev].kv += layer_kv_bytes(
                view.layers[il], view, n_ctx, config.spec_cache_type_k,
                config.spec_cache_type_v, fa, rules[mtp_dev],
            )  # fmt: skip

    # Compute buffers: the peak of each device's part of the graph (plan/compute.py).
    overridden = bool(config.override_tensors) or config.cpu_moe or config.n_cpu_moe > 0
    full_offload = n_gpu > 0 and ngl >= n_slots
    pipeline = n_gpu > 1 and full_offload and not overridden and config.kv_offload
    copies = PIPELINE_COPIES if pipeline else 1
    n_outputs_max = (
        # server_output_limits: np x (1 + common_speculative_n_max), the largest draft of the
        # enabled types (common/speculative.cpp:2315-2350)
        min(
            config.batch,
            max(1, config.n_parallel) * (1 + spec_n_max(config)),
        )
        if config.logits_rows == "server"
        else config.batch
    )
    shape = graph_shape(layout, ub, min(ub, n_outputs_max))
    graph_rule = GRAPH_RULES.get(arch.name, GENERIC)
    # A backend whose supports_op refuses ops over the device's largest tensor
    # (ComputeTraits.ops_capped: Vulkan's maxStorageBufferRange) leaves such ops to the CPU
    # backend: their live set moves to the host's compute buffer.
    traits = [backend_of(d.gpu.backend).compute for d in devs]
    caps: list[int | None] = [
        lim if t.ops_capped and isinstance(lim, int) and lim > 0 else None
        for t, lim in ((t, d.gpu.max_tensor_bytes) for t, d in zip(traits, devs, strict=True))
    ] + [None]

    def refuses(pos: int, nbytes: int) -> bool:
        cap = caps[pos]
        return cap is not None and nbytes > cap

    kinds: list[dict[AttentionKind, int]] = [{} for _ in range(n_gpu + 1)]
    trait = graph_trait(arch.name)
    trait_pos: set[int] = set()  # devices running a layer the architecture's trait covers
    attn_layers: list[list[int]] = [[] for _ in range(n_gpu + 1)]  # the attention each runs
    kq = [0] * (n_gpu + 1)
    # A layer whose attention the device's backend refuses (its Q, its output or, without flash
    # attention, its KQ matrix above the cap) has it computed on the host: the KQ there, the
    # output (n_head x head_dim_v x n_ubatch x 4) back here as a split input
    kq_host = 0
    attn_moved = [False] * (n_gpu + 1)
    attn_q_moved = [False] * (n_gpu + 1)
    attn_back = [0] * (n_gpu + 1)  # the largest attention output a device gets back
    # ... and the largest Q it hands over, beside the Q projection's output it was built from
    # (attn_q, or MLA's attn_q_b: n_head x (nope + rope) wide)
    attn_handoff = [0] * (n_gpu + 1)
    host_received = 0  # split inputs of the host's part, summed over the layers it runs for others
    q_proj_rows = layout.q_proj_rows
    attn_returned = [0] * (n_gpu + 1)  # summed over its layers
    # a host layer's K and V: with op offload its flash attention runs on the offloading GPU too
    # (the scheduler spreads a GPU's assignment to the ops around an offloaded matmul:
    # ggml-backend.cpp ggml_backend_sched_split_graph, pass 2), which copies them in
    host_layer_kv = 0
    layer_kq: dict[int, int] = {}  # each attending layer's no-FA KQ matrix (bytes)
    remote: list[dict[int, int]] = [{} for _ in range(n_gpu + 1)]
    remote_views = [0] * (n_gpu + 1)
    attn_narrow = [0] * (n_gpu + 1)  # below a narrow attention's projection (DeviceGraph)
    no_cache = view.memory is MemoryClass.NONE  # non-causal (diffusion): n_kv = the ubatch
    for layer in view.layers:
        reads_kv = layer.kv or layer.kv_shared_from is not None or no_cache
        if not layer.attends or not reads_kv or skipped(layer.index):
            continue
        # the attention runs on the layer's device, also with -nkvo (its K and V are copied in)
        pos = slot_device[layer.index]
        cells = window_cells if layer.attention is AttentionKind.SLIDING else kv_size
        if no_cache:
            cells = ub
        layer_kq[layer.index] = cells * ub * max(layer.n_head, 1) * 4
        head_k = layer.k_width // max(layer.n_head_kv, 1)
        head_v = (
            layer.v_width // max(layer.n_head_kv, 1)
            if layer.v_width
            else max(view.head_v_sizes, default=head_k)  # MLA: the latent's width
        )
        q_bytes = ub * max(layer.n_head, 1) * head_k * 4
        out_bytes = ub * max(layer.n_head, 1) * head_v * 4
        narrow = out_bytes < shape.e and bool(layer.v_width)
        if (
            refuses(pos, q_bytes)
            or refuses(pos, out_bytes)
            or (not fa and refuses(pos, layer_kq[layer.index]))
        ):
            attn_moved[pos] = True
            attn_q_moved[pos] = attn_q_moved[pos] or refuses(pos, q_bytes)
            attn_back[pos] = max(attn_back[pos], out_bytes)
            q_proj = ub * q_proj_rows.get(layer.index, 0) * 4
            attn_handoff[pos] = max(attn_handoff[pos], q_bytes + q_proj)
            attn_returned[pos] += out_bytes
            if narrow:
                # the returned output and its contiguous copy below the output projection's
                # result (DeviceGraph.attn_narrow)
                attn_narrow[pos] = max(attn_narrow[pos], 2 * out_bytes)
            kq_host = max(kq_host, layer_kq[layer.index])
            # what the host receives for it: the Q, and the layer's K and V (views of a cache
            # in device memory)
            host_received += q_bytes + layer_kv_bytes(
                layer, view, cells * n_stream, config.cache_type_k, config.cache_type_v, fa,
                CPU_BUFFER,
            )  # fmt: skip
            kinds[host_pos][layer.attention] = cells
            continue
        src = layer.kv_shared_from
        if src is not None and (slot_device[src] if config.kv_offload else host_pos) != pos:
            remote[pos][src] = layer_kv_bytes(
                view.layers[src], view, cells * n_stream, config.cache_type_k,
                config.cache_type_v, fa, CPU_BUFFER,
            )  # fmt: skip
            # each layer's view of the shared cache is its own split input (DeviceGraph)
            remote_views[pos] += remote[pos][src]
        kinds[pos][layer.attention] = cells
        if pos == host_pos and layer.kv and fa:
            host_layer_kv = max(host_layer_kv, layer_kv_bytes(
                layer, view, cells * n_stream, config.cache_type_k, config.cache_type_v, fa,
                CPU_BUFFER,
            ))  # fmt: skip
        attn_layers[pos].append(layer.index)
        if narrow and fa:
            # the roped Q's copy and the attention's output below the output projection's
            # result (DeviceGraph.attn_narrow)
            attn_narrow[pos] = max(attn_narrow[pos], q_bytes + out_bytes)
        if trait is not None and trait.layers(arch, layer.index):
            trait_pos.add(pos)
        kq[pos] = max(kq[pos], layer_kq[layer.index])
    all_kinds: dict[AttentionKind, int] = {}
    for k in kinds:
        all_kinds.update(k)
    # the f16 FA mask since PR #23764 (src/llama-graph.cpp:29-46); before, the host kept the f32
    # input it was cast from: a pre-cap CUDA log's CUDA_Host buffer is the f32 mask + 2E
    # (real-cuda.md, tests/data/cuda-logs.json)
    host_fa_bytes = 4 if config.fa_mask_f32 else 2
    # the output head: its weight (the tied token_embd where there is no output.weight) and the
    # logits it writes; either above the cap and the matmul runs on the host
    head = layout.tensor("output.weight") or layout.tensor("token_embd.weight")
    output_compute = output_dev
    if output_dev != host_pos and (
        refuses(output_dev, shape.logits)
        or (head is not None and refuses(output_dev, head.n_bytes))
    ):
        output_compute = host_pos
    # what each device's layers get back from the ops the host ran for them: the attention's
    # output after a KQ over the cap, the routed experts' outputs where their weights stayed in
    # host memory over the cap (split inputs: ggml-backend.cpp:1514-1531)
    returned = list(attn_returned)
    # expert biases (gpt-oss): the gate and up results come back to be biased here, too
    expert_bias = layout.expert_bias
    experts_back = 2 * shape.moe_mid if expert_bias else 0
    for layer in view.layers:
        pos = slot_device[layer.index]
        if pos == host_pos or skipped(layer.index) or caps[pos] is None:
            continue
        if host_experts[layer.index]:
            returned[pos] += shape.moe_out + experts_back
            # the host receives the normed hidden state (and the selected experts, small), and
            # with expert biases the biased gate and up product for the down matmul
            host_received += shape.e + (shape.moe_mid if expert_bias else 0)
    # a cache other than f16: a GPU's flash attention converts one layer's K and V to f16
    kv_convert = 0
    if fa and (config.cache_type_k, config.cache_type_v) != ("f16", "f16"):
        kv_convert = max(
            (kv_size * n_stream * (lv.k_width + lv.v_width) * 2 for lv in view.layers if lv.kv),
            default=0,
        )
    # the architecture's own live set in an attention layer (arch/graph.py), on each device
    # running one; the reserved ubatch is a multiple of n_seq_max (src/llama-context.cpp:2529)
    n_seq = max(1, config.n_parallel)
    sizes = GraphSizes(-(-ub // n_seq) * n_seq, kv_size, n_stream, n_seq, 2 if fa else 4)
    # per device: the merge of its layers' (arch/graph.py GraphTrait.of_layers); the host sets
    # the inputs of them all
    dev_live = [ArchLive()] * (n_gpu + 1)
    host_inputs = 0
    if trait is not None:
        dev_live = [trait.of_layers(arch, sizes, attn_layers[pos]) for pos in range(n_gpu + 1)]
        host_inputs = trait.host_inputs(arch, sizes, sorted(set().union(*attn_layers)))
    backends = [backend_kind(d) for d in devs] + [ComputeBackend.CPU]
    # op offload: the first device whose backend takes offloaded ops (a local GPU; an RPC device
    # never does: its offload_op is NULL, ggml-rpc.cpp device interface)
    op_offload_pos = next(
        (p for p, d in enumerate(devs) if not d.is_rpc and backends[p] is ComputeBackend.GPU), None
    )
    offloading = op_offload_pos is not None and ub >= traits[op_offload_pos].offload_min_batch
    op_cap = caps[op_offload_pos] if op_offload_pos is not None else None
    host_weight = host_weight_tensor(layout, slot_device, host_pos, host_experts, skipped, op_cap)
    # the offloading backend's traits give the host layers phases of their own (ComputeTraits)
    split_host_layers = (
        op_offload_pos is not None and traits[op_offload_pos].host_layer_weight_share is not None
    )
    # ... its host layers: none recurrent?, a gated FFN's up weight, their replayed op sequence
    offloaded = [s for s in range(arch.n_layer) if slot_device[s] == host_pos and not skipped(s)]
    host_ffn_up, host_plain, host_layers_peak = 0, True, 0
    if split_host_layers and offloading and op_offload_pos is not None:
        host_plain = not any(view.layers[s].recurrent for s in offloaded)
        host_ffn_up = gated_ffn_up(layout, offloaded)
        if fa:
            kv = (config.cache_type_k, config.cache_type_v, max(n_stream, n_seq))
            run = HostLayerConfig(ub, kv_size, *kv, len(all_kinds), window_cells)
            align = rules[op_offload_pos].alignment
            host_layers_peak = replayed_host_layers_peak(layout, offloaded, run, op_cap, align)
    # routed experts in host memory that the offloading device refuses stay the host's to compute
    experts_offloaded = offloading and not (
        op_cap is not None
        and host_weight_tensor(
            layout, slot_device, host_pos, host_experts, skipped, experts_only=True
        )
        > op_cap
    )
    # without flash attention: the V cache's element indices on each device (plan/compute.py)
    writer = [
        -1 if skipped(lv.index) else slot_device[lv.index] if config.kv_offload else host_pos
        for lv in view.layers
    ]
    v_idxs = [0] * (n_gpu + 1) if fa else v_cache_indices(view.layers, writer, host_pos, ub)
    for pos in range(n_gpu + 1):
        a = acc[pos]
        is_host = pos == host_pos
        mask_cells = sum((all_kinds if is_host else kinds[pos]).values())
        computes = [s for s in a.layers if 0 <= s < arch.n_layer or s == layout.output_slot]
        block_layers = [s for s in a.layers if s != layout.output_slot]
        a.compute = device_compute(
            DeviceGraph(
                backend=backends[pos],
                is_host=is_host,
                holds_layers=bool(block_layers) or (bool(kinds[pos]) and not is_host),
                holds_output=(pos == output_dev and bool(computes))
                or (pos == output_compute != output_dev),
                output_elsewhere=pos == output_dev != output_compute,
                returned=host_received if is_host else returned[pos],
                experts_back=experts_back if pos < n_gpu and caps[pos] is not None else 0,
                mask_f16=mask_cells * ub * (host_fa_bytes if is_host else 2),
                mask_f32=mask_cells * ub * 4,
                v_idxs=v_idxs[pos],
                kq=0 if fa else (max(kq_host, kq[pos]) if is_host else kq[pos]),
                attn_elsewhere=attn_moved[pos],
                attn_back=attn_back[pos],
                attn_handoff=attn_handoff[pos],
                attn_q_elsewhere=attn_q_moved[pos],
                flash_attn=fa,
                host_experts=is_host and any(host_experts) and not experts_offloaded,
                offload_weight=(
                    (host_weight if split_host_layers else max(host_weight, host_layer_kv))
                    if offloading and pos == op_offload_pos
                    else 0
                ),
                offload_weight_share=traits[pos].host_layer_weight_share if pos < n_gpu else None,
                offload_kv=host_layer_kv if offloading and pos == op_offload_pos else 0,
                offload_kv_e=traits[pos].host_layer_kv_e if pos < n_gpu else 0.0,
                offload_ffn_up=host_ffn_up if pos == op_offload_pos else 0,
                host_layers_peak=host_layers_peak if pos == op_offload_pos else 0,
                offload_plain=host_plain,
                copies=copies,
                remote_kv=sum(remote[pos].values()),
                remote_kv_views=remote_views[pos],
                arch_live=(
                    dev_live[pos]
                    if pos in trait_pos
                    else ArchLive(inputs=host_inputs)
                    if is_host
                    else ArchLive()
                ),
                kv_convert=kv_convert if pos < n_gpu and traits[pos].fa_kv_convert else 0,
                experts=bool(a.experts) or not view.is_moe,
                attn_narrow=(
                    attn_narrow[pos] if pos < n_gpu and traits[pos].narrow_attn_above else 0
                ),
                layer_share=len(block_layers) / max(arch.n_layer, 1),
                logits_above_layer=is_host
                and bool(a.recurrent_layers)
                and state_rows_fence(sizes.ubatch, n_seq, view.state_r, view.state_s),
            ),
            shape,
            graph_rule,
        )
        if pos < n_gpu:
            a.overhead = (
                0
                if devs[pos].context_in_free
                else dict(overheads.gpu_context_by_device).get(
                    devs[pos].name, overheads.gpu_context_bytes
                )
            )
    host = acc[host_pos]
    # The output buffer: output_reserve(n_seq_max) at context creation; llama-server's verify
    # batches of speculative decoding grow it to their outputs, np x (1 + drafts) rows
    # (output_reserve(n_outputs_all), src/llama-context.cpp:1857)
    out_rows = config.n_parallel
    if config.logits_rows == "server":
        out_rows = max(out_rows, min(ub, n_outputs_max))
    host.overhead = output_buffer(arch.vocab_size, out_rows)
    if mtp_loaded:
        # the draft context's own output buffer: n_outputs_max = n_parallel rows
        # (common_base_params_to_speculative, common/speculative.cpp:2480)
        host.overhead += output_buffer(arch.vocab_size, config.n_parallel)
        # Its compute buffer: a second llama_context with its own scheduler, so it adds to the
        # main one's. The same phases (plan/compute.py) for its one NextN block, its mask over
        # the main context's cells per stream, logits for n_parallel rows, on the NextN block's
        # device; llama-server -lv 4 on the tiny model (tests/data/llama-server-mtp-buffers.json):
        # 1.3-2.0x (its layer allowance is the main context's).
        nextn_dev = slot_device[arch.n_layer] if arch.n_layer < n_slots else host_pos
        draft_rows = min(ub, max(1, config.n_parallel))
        acc[nextn_dev].compute += device_compute(
            DeviceGraph(
                backend=backends[nextn_dev],
                is_host=nextn_dev == host_pos,
                holds_layers=True,
                holds_output=True,
                mask_f16=kv_size * ub * 2,
                mask_f32=kv_size * ub * 4,
                kq=0 if fa else kv_size * ub * max(view.n_head, 1) * 4,
                flash_attn=fa,
            ),
            replace(shape, logits=arch.vocab_size * draft_rows * 4),
            graph_rule,
        )
    if config.vision and projector_bytes:
        # The projector goes to --device's first device, else to the first GPU registered, which
        # is a local one when there is any: RPC devices register at --rpc, after the built-in
        # backends (common/arg.cpp: mmproj_device; tools/mtmd/clip.cpp clip_ctx).
        first = 0 if config.devices is not None or op_offload_pos is None else op_offload_pos
        projector_acc = acc[first] if n_gpu else host
        projector_acc.projector = projector_bytes + PROJECTOR_COMPUTE_BYTES

    notes: list[str] = []
    if not fa:
        notes.append("flash attention off: the KQ matrix is materialised (large at long context)")
    notes += _max_alloc_notes(layout, devs, slot_device, n_cpu_moe, acc)
    corrections = dict(overheads.device_correction_bytes)
    # the rule is checked for a known architecture and the current build class
    checked = view.known and not config.fa_mask_f32
    # each GPU's expected error: its backend's (machine/backends ComputeTraits), the op-offload
    # one on the device that runs host-resident layers' matmuls where the backend has one
    gpu_acc = [GPU_ESTIMATE] * (n_gpu + 1)
    for pos in range(n_gpu):
        tr = traits[pos]
        offloaded_here = offloading and pos == op_offload_pos and host_weight > 0
        if offloaded_here and tr.offload_expected_error:
            gpu_acc[pos] = gpu_accuracy(tr.offload_expected_error, tr.offload_error_basis)
        else:
            gpu_acc[pos] = gpu_accuracy(tr.expected_error, tr.error_basis)
    devices: list[DeviceEstimate] = []
    # Unified memory (docs/backends.md): a local GPU whose memory is the host's draws on the same
    # RAM as the host's buffers. Its own budget is the share the OS lets it take (its free_bytes:
    # Metal's working set, the GTT limit, ...); what it takes is then not the host's.
    unified_taken = 0
    for pos in range(n_gpu + 1):
        a = acc[pos]
        endpoint: str | None = None
        if pos < n_gpu:
            rdev = devs[pos]
            # llama.cpp reports an RPC device as type GPU (ggml_backend_rpc_device_get_type).
            name, kind, device, endpoint = rdev.gpu.name, "gpu", rdev.name, rdev.endpoint
            free = rdev.gpu.free_bytes
            budget = free - overheads.gpu_margin_bytes
            if pos == 0 and not rdev.is_rpc and rdev.gpu.free_bytes >= rdev.gpu.total_bytes:
                budget -= overheads.gpu_desktop_bytes
            gpu_index: int | None = None if rdev.is_rpc else rdev.gpu.index
            backend = "RPC" if rdev.is_rpc else backend_of(rdev.gpu.backend).label
            unified = not rdev.is_rpc and rdev.gpu.unified
        else:
            name, kind, device, gpu_index = "Host", "host", "CPU", None
            backend, unified = "CPU", True
            free = max(0, machine.host.ram_available_bytes - unified_taken)
            budget = free - host_reserve_bytes(
                machine.host.ram_total_bytes, machine.host.ram_available_bytes, overheads
            )
        correction = corrections.get(device, 0)
        total = a.weights + a.kv + a.recurrent + a.compute + a.overhead + a.projector + correction
        if pos < n_gpu and not devs[pos].is_rpc and devs[pos].gpu.unified:
            unified_taken += total
        devices.append(
            DeviceEstimate(
                name=name,
                kind=kind,
                device=device,
                gpu_index=gpu_index,
                weights_bytes=a.weights,
                kv_bytes=a.kv,
                recurrent_bytes=a.recurrent,
                compute_bytes=a.compute,
                overhead_bytes=a.overhead,
                projector_bytes=a.projector,
                total_bytes=total,
                free_bytes=free,
                budget_bytes=budget,
                layers=tuple(a.layers),
                attention_layers=tuple(a.attention),
                recurrent_layers=tuple(a.recurrent_layers),
                expert_layers=tuple(a.experts),
                endpoint=endpoint,
                correction_bytes=correction,
                compute_accuracy=accuracy(backends[pos], checked, gpu_acc[pos]),
                backend=backend,
                unified=unified,
            )
        )
    result = Estimate(
        devices=tuple(devices),
        config=config,
        basis=layout.basis,
        exact_weights=layout.exact,
        n_ctx=n_ctx,
        kv_size=kv_size,
        n_stream=n_stream,
        pipeline_parallel=pipeline,
        notes=tuple(notes),
    )
    return apply_compute_ratios(result, overheads)


def apply_compute_ratios(est: Estimate, overheads: Overheads) -> Estimate:
    """The estimate with each device's compute buffers scaled by the measured ratio of this
    machine (Overheads.compute_ratio_by_device), a step on the estimate's output, outside the
    compute model; totals follow, the basis is named in the notes."""
    ratios = dict(overheads.compute_ratio_by_device)
    if not ratios:
        return est
    devices = []
    changed = []
    for d in est.devices:
        ratio = ratios.get(d.device)
        if ratio is None or not d.compute_bytes:
            devices.append(d)
            continue
        compute = round(d.compute_bytes * ratio)
        devices.append(
            replace(d, compute_bytes=compute, total_bytes=d.total_bytes - d.compute_bytes + compute)
        )
        changed.append(f"{d.device} x{ratio:.2f}")
    if not changed:
        return est
    note = f"compute {', '.join(changed)}: {overheads.compute_basis or 'measured on this machine'}"
    return replace(est, devices=tuple(devices), notes=(*est.notes, note))
