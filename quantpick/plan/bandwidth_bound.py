"""The bandwidth bound of decode: the bytes each device reads per token (weights, and the KV and
state attention reads at a fill), and the tokens per second that reading allows; the speed
estimate a plan carries."""

from __future__ import annotations

from dataclasses import dataclass, field

from quantpick.arch.base import AttentionKind
from quantpick.machine.spec import (
    ASSUMED_GPU_BANDWIDTH_BYTES_PER_S,
    ASSUMED_HOST_BANDWIDTH_BYTES_PER_S,
)
from quantpick.model.layout import ModelLayout
from quantpick.plan.memory import DeviceEstimate, Estimate, layer_kv_bytes_per_cell

DEFAULT_HOST_BANDWIDTH = ASSUMED_HOST_BANDWIDTH_BYTES_PER_S


DEFAULT_GPU_BANDWIDTH = ASSUMED_GPU_BANDWIDTH_BYTES_PER_S


@dataclass(frozen=True)
class DeviceTraffic:
    device: str
    bandwidth_bytes_per_s: int
    weight_bytes_per_token: int
    kv_bytes_per_token_at_target: int
    state_bytes_per_token: int


@dataclass(frozen=True)
class ExpectedSpeed:
    """Tokens/s to expect from llama-server, with the basis of the figures."""

    decode_tps_empty: float
    decode_tps_target: float  # with the KV cache filled to target_context
    prefill_tps: float  # a 512-token prompt (pp512-like) at an empty context, the plan's -ub
    target_context: int
    basis: str
    assumed: tuple[str, ...] = ()  # "CUDA1 bandwidth", ...: figures the machine did not tell
    # RPC workers: the one-time transfer of their weights at load (bytes / link bandwidth, one
    # worker after the other; 0 with no worker, or with a warm tensor cache `-c` on the worker),
    # and the network's share of one decoded token at the target fill.
    load_seconds: float = 0.0
    network_ms_target: float = 0.0


@dataclass(frozen=True)
class SpeedEstimate:
    tokens_per_s_empty: float  # decode upper bound with an empty context
    tokens_per_s_target: float  # ... with the KV cache filled to the target context
    target_context: int
    efficiency: float
    devices: tuple[DeviceTraffic, ...]
    bound: str = "upper bound: bandwidth / bytes read per token"
    expected: ExpectedSpeed | None = field(default=None, compare=False)


def attention_reads(
    layout: ModelLayout, dev: DeviceEstimate, type_k: str, type_v: str
) -> tuple[int, int]:
    """(bytes per token of fill over full-context layers, ... over sliding-window layers) that
    decode reads on `dev`: the KV layers placed there, plus layers there that attend over
    another layer's KV (gemma3n, gemma4)."""
    view = layout.view
    full = window = 0
    attending = list(dev.attention_layers)
    owned = set(attending)
    for il in dev.layers:
        if il < len(view.layers) and view.layers[il].kv_shared_from is not None:
            if il not in owned and view.layers[il].attends:
                attending.append(il)
    for il in attending:
        layer = view.layers[il]
        source = view.layers[layer.kv_shared_from] if layer.kv_shared_from is not None else layer
        cell = layer_kv_bytes_per_cell(source, view, type_k, type_v)
        if layer.attention is AttentionKind.SLIDING and view.n_swa > 0:
            window += cell
        else:
            full += cell
    return full, window


def filled(fill: int, window_bytes: float, full_bytes: float, n_swa: int) -> float:
    """KV bytes attention reads at `fill` tokens: every cell of a full layer, at most n_swa of a
    sliding one (or any other per-cell cost: the heads' FLOPs per cell)."""
    return (
        fill * full_bytes + min(fill, n_swa) * window_bytes
        if n_swa
        else fill * (full_bytes + window_bytes)
    )


def decode_speed(
    layout: ModelLayout,
    estimate: Estimate,
    bandwidths: dict[str, int],
    *,
    target_context: int | None = None,
    efficiency: float = 1.0,
) -> SpeedEstimate:
    """The bound. `bandwidths` maps device name ("CUDA0", "CPU") to bytes/s."""
    view = layout.view
    used_fraction = view.expert_used_count / view.expert_count if view.expert_count else 1.0
    target = target_context if target_context is not None else estimate.n_ctx
    type_k, type_v = estimate.config.cache_type_k, estimate.config.cache_type_v
    state_row = layout.view.state_bytes_per_row
    n_swa = layout.view.n_swa
    slots = layout.slots
    host_name = estimate.host.device
    traffic: list[DeviceTraffic] = []
    seconds_empty = 0.0
    seconds_target = 0.0
    expert_host = set(estimate.host.expert_layers)
    for dev in estimate.devices:
        weights = 0
        for slot in dev.layers:
            sw = slots[slot]
            weights += sw.dense_bytes
            if slot not in expert_host or dev.device == host_name:
                weights += int(sw.expert_bytes * used_fraction)
        if dev.device == host_name:
            # experts of GPU layers kept in host memory are read from the host
            for slot in expert_host:
                if slot not in dev.layers:
                    weights += int(slots[slot].expert_bytes * used_fraction)
        if layout.output_slot in dev.layers:
            weights += layout.tied_output_bytes  # a tied head reads token_embd's rows
        full, window = attention_reads(layout, dev, type_k, type_v)
        kv_target = int(filled(target, window, full, n_swa))
        state = 2 * len(dev.recurrent_layers) * state_row
        bw = bandwidths.get(dev.device) or (
            DEFAULT_HOST_BANDWIDTH if dev.kind == "host" else DEFAULT_GPU_BANDWIDTH
        )
        traffic.append(DeviceTraffic(dev.device, bw, weights, kv_target, state))
        seconds_empty += (weights + state) / bw
        seconds_target += (weights + state + kv_target) / bw
    return SpeedEstimate(
        tokens_per_s_empty=efficiency / seconds_empty if seconds_empty else 0.0,
        tokens_per_s_target=efficiency / seconds_target if seconds_target else 0.0,
        target_context=target,
        efficiency=efficiency,
        devices=tuple(traffic),
    )
