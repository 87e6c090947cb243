"""The compute-graph rule per architecture: the coefficients of plan/compute.py's phases, fitted
to llama.cpp's own projections (scripts/fit_compute.py; `--emit` rewrites GRAPH_RULES). Pure."""

# ruff: noqa: E501  (GRAPH_RULES is a generated table: one record a line)
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GraphRule:
    """Per-architecture coefficients of the phases, in units of E (n_ubatch x n_embd x 4 B)."""

    layer: float = 0.0  # a layer's live set beyond its mask and the generic rule's (FA on)
    no_fa: float = 4.5  # beside the KQ matrix and its f32 mask (flash attention off)
    output: float = 1.0  # beside the logits (the normed hidden state of the output rows)
    pipeline: float = 0.0  # extra with pipeline parallelism, on a device holding layers
    pipeline_output: float = 4.0  # extra with pipeline parallelism, on the output device
    pipeline_host_no_fa: float = 2.0  # extra on the host with pipeline parallelism, no FA
    # score matrices of n_kv x n_ubatch f32 alive in a layer beside the mask (a sparse-attention
    # indexer's scores and top-k, compressed or gated attention): a multiple of the f32 mask
    kv_scores: float = 0.0
    # multiples of the experts' intermediate alive when the host computes routed experts (gate,
    # up and their product: 3; a fused gate+up: 2)
    expert_mid: float = 3.0
    remote_kv: float = 1.0  # multiples of the remote K and V copied in (DeviceGraph.remote_kv)
    pipeline_host_masks: float = 0.0  # extra masks per input copy on the host (pipeline)
    # extra on a device whose layers' routed experts all live in host memory (-ot exps=CPU)
    no_experts: float = 0.0
    source: str = "generic: 2E + 3 x the widest FFN (dense) or the experts' live set (MoE)"


GENERIC = GraphRule()

# Fitted per architecture on llama.cpp b11312's projections, CPU backend and two CPU RPC devices
# (scripts/fit_compute.py --emit writes this table: tests/data/arch-real, arch-real-compute.json.gz,
# llamacpp-archs.json.gz); only the coefficients that differ from GENERIC, and per architecture the
# device rows within max(5%, 16 MiB), the median relative error, the rows off by more than 25%. An
# architecture on which the generic rule holds for every recorded row has no entry.
# fmt: off
# -- GRAPH_RULES: written by scripts/fit_compute.py --emit --
GRAPH_RULES: dict[str, GraphRule] = {
    "deepseek2": GraphRule(layer=8.0, no_fa=27.0, pipeline=1.5, pipeline_host_no_fa=0.0, no_experts=12.5, source="163/164 rows within, median 0.5%, 0 beyond 25%"),
    "deepseek32": GraphRule(layer=34.0, no_fa=40.0, pipeline=40.0, pipeline_output=0.0, kv_scores=5.5, expert_mid=40.0, pipeline_host_masks=1.0, source="18/20 rows within, median 1.6%, 0 beyond 25%"),
    "deepseek4": GraphRule(layer=10.0, no_fa=29.5, output=10.0, pipeline=0.5, pipeline_output=16.5, source="20/20 rows within, median 0.5%, 0 beyond 25% (beside its GraphTrait)"),
    "dots3note": GraphRule(layer=40.0, no_fa=40.0, pipeline=40.0, pipeline_output=0.0, kv_scores=4.5, expert_mid=40.0, pipeline_host_masks=1.0, source="18/20 rows within, median 5.5%, 0 beyond 25%"),
    "gemma3": GraphRule(no_fa=3.5, pipeline=1.0, pipeline_host_no_fa=0.0, source="119/119 rows within, median 0.0%, 0 beyond 25%"),
    "gemma4": GraphRule(layer=7.0, no_fa=13.0, output=2.0, pipeline=5.5, pipeline_output=0.0, pipeline_host_no_fa=1.5, remote_kv=2.0, source="97/102 rows within, median 2.2%, 0 beyond 25%"),
    "glm-dsa": GraphRule(layer=34.0, no_fa=40.0, pipeline=40.0, pipeline_output=0.0, kv_scores=5.5, expert_mid=40.0, pipeline_host_masks=1.0, source="18/20 rows within, median 1.6%, 0 beyond 25%"),
    "glm4moe": GraphRule(layer=-1.0, no_fa=9.0, output=3.0, pipeline=1.0, pipeline_host_no_fa=0.0, no_experts=4.0, source="164/164 rows within, median 0.1%, 0 beyond 25%"),
    "glm5-next": GraphRule(layer=5.5, no_fa=40.0, output=4.5, pipeline_output=0.0, source="20/20 rows within, median 1.3%, 0 beyond 25% (beside its GraphTrait)"),
    "gpt-oss": GraphRule(layer=-4.5, no_fa=5.0, output=3.0, pipeline_output=3.0, pipeline_host_no_fa=0.0, expert_mid=2.0, no_experts=6.0, source="164/164 rows within, median 0.4%, 0 beyond 25%"),
    "hrm_text": GraphRule(no_fa=5.0, pipeline=40.0, pipeline_output=40.0, source="17/17 rows within, median 0.8%, 0 beyond 25%"),
    "hy_v4": GraphRule(layer=40.0, no_fa=40.0, output=19.0, pipeline=40.0, pipeline_output=40.0, kv_scores=5.0, expert_mid=40.0, pipeline_host_masks=1.0, source="19/20 rows within, median 6.8%, 0 beyond 25%"),
    "lfm2": GraphRule(layer=0.5, no_fa=4.0, output=2.5, pipeline_host_no_fa=0.0, source="119/119 rows within, median 2.9%, 0 beyond 25% (with state_rows_fence)"),
    "llama": GraphRule(no_fa=4.0, pipeline=1.0, pipeline_host_no_fa=0.0, expert_mid=0.0, source="241/241 rows within, median 0.0%, 0 beyond 25%"),
    "minimax-m3": GraphRule(layer=-10.0, source="20/20 rows within, median 5.5%, 0 beyond 25% (beside its GraphTrait); tests/data/arch-traits.json: 16/20 within 1%, worst -np 4 +19%"),
    "mistral3": GraphRule(no_fa=4.0, pipeline_host_no_fa=0.0, expert_mid=0.0, source="139/139 rows within, median 0.0%, 0 beyond 25%"),
    "nemotron_h": GraphRule(layer=8.0, no_fa=4.0, output=2.0, pipeline_host_no_fa=0.0, source="119/119 rows within, median 0.1%, 0 beyond 25%"),
    "qwen2": GraphRule(no_fa=4.0, pipeline_host_no_fa=0.0, source="119/119 rows within, median 0.0%, 0 beyond 25%"),
    "qwen3": GraphRule(no_fa=4.0, pipeline_host_no_fa=0.0, source="119/119 rows within, median 0.0%, 0 beyond 25%"),
    "qwen35": GraphRule(no_fa=5.5, output=3.5, pipeline_output=2.5, pipeline_host_no_fa=0.0, source="119/119 rows within, median 0.6%, 0 beyond 25%"),
    "qwen35moe": GraphRule(no_fa=9.0, output=3.0, pipeline_output=4.0, pipeline_host_no_fa=0.0, no_experts=4.0, source="163/164 rows within, median 0.8%, 0 beyond 25% (pipeline_output 4.0, not the fit's 3.0: this script's rows tie on it, and the bundled qwen35moe's RPC rows, tests/data/llamacpp-fit-*.json, are exact at 4.0 and 4 MiB under at 3.0)"),
    "qwen3moe": GraphRule(no_fa=6.5, pipeline_host_no_fa=0.0, no_experts=2.0, source="164/164 rows within, median 0.1%, 0 beyond 25%"),
    "qwen3next": GraphRule(layer=-0.5, no_fa=9.5, output=6.0, pipeline_output=1.0, pipeline_host_no_fa=0.0, no_experts=10.5, source="164/164 rows within, median 2.0%, 0 beyond 25%"),
    "qwen4exp": GraphRule(layer=40.0, no_fa=40.0, output=9.0, pipeline=17.5, pipeline_output=10.5, kv_scores=34.5, expert_mid=3.5, pipeline_host_masks=0.5, source="20/20 rows within, median 0.9%, 0 beyond 25%"),
}
# -- end of GRAPH_RULES --
# fmt: on
