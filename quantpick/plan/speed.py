"""Decode speed upper bound: memory bandwidth over bytes read per token. Pure.

tokens/s <= efficiency / sum over devices (bytes read per token on the device / its bandwidth).
Bytes read per token: every dense weight on the device (attention, DeltaNet, router, shared expert,
output head), expert_used/expert_count of the routed experts, the KV cache up to the current fill,
and the recurrent state (read and written once per token). Decode is bandwidth-bound on every
device this model runs on, so this is an upper bound; `efficiency` is where a calibration against
measured runs goes (1.0 = the bound itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from quantpick.model.layout import ModelLayout
from quantpick.plan.memory import (
    Estimate,
    kv_bytes_per_cell_per_layer,
    recurrent_bytes_per_layer_per_row,
)

# Dual-channel DDR4-3200 (51.2 GB/s) when the host's bandwidth is neither probed nor described.
DEFAULT_HOST_BANDWIDTH = 50 * 10**9
# A GPU whose bandwidth NVML could not tell (bus width or clock unsupported).
DEFAULT_GPU_BANDWIDTH = 300 * 10**9


@dataclass(frozen=True)
class DeviceTraffic:
    device: str
    bandwidth_bytes_per_s: int
    weight_bytes_per_token: int
    kv_bytes_per_token_at_target: int
    state_bytes_per_token: int


@dataclass(frozen=True)
class SpeedEstimate:
    tokens_per_s_empty: float  # decode upper bound with an empty context
    tokens_per_s_target: float  # ... with the KV cache filled to the target context
    target_context: int
    efficiency: float
    devices: tuple[DeviceTraffic, ...]
    bound: str = "upper bound: bandwidth / bytes read per token"


def decode_speed(
    layout: ModelLayout,
    estimate: Estimate,
    bandwidths: dict[str, int],
    *,
    target_context: int | None = None,
    efficiency: float = 1.0,
) -> SpeedEstimate:
    """`bandwidths` maps device name ("CUDA0", "CPU") to bytes/s."""
    arch = layout.architecture
    used_fraction = arch.expert_used_count / arch.expert_count if arch.expert_count else 1.0
    target = target_context if target_context is not None else estimate.n_ctx
    kv_cell = kv_bytes_per_cell_per_layer(
        layout, estimate.config.cache_type_k, estimate.config.cache_type_v
    )
    state_row = recurrent_bytes_per_layer_per_row(layout)
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
        kv_target = len(dev.attention_layers) * kv_cell * target
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
