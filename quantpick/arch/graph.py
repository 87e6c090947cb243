"""What an architecture's graph keeps alive beyond the generic phases: the per-architecture compute
trait (the architecture registry's seam for compute buffers). Pure.

plan/compute.py sizes a device's compute buffer as the largest live set over the phases of the
graph (inputs, a layer, the output), with a generic layer (the residual stream, the FFN or MoE
temporaries, the KQ mask) and fitted per-architecture multiples of the residual stream. Some
architectures keep tensors alive that scale with neither: a sparse indexer's selection masks
scale with the slots it selects x the ubatch, whatever n_embd is. Such an architecture's family
module gives a `GraphTrait`: the bytes its attention layer keeps alive beside the generic live
set, from the sizes llama.cpp reserves the graph with (`GraphSizes`), each term citing the
graph builder (src/models/<arch>.cpp at b11312). The planner adds them to the layer phase of each
device that runs such a layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quantpick.arch.base import Architecture


@dataclass(frozen=True)
class GraphSizes:
    """The sizes llama.cpp reserves the worst-case graph with (src/llama-context.cpp:628-674:
    n_seqs = n_seq_max, n_tokens = min(n_ctx, n_ubatch) made a multiple of n_seqs, :2529)."""

    ubatch: int  # tokens of the reserved ubatch
    cells: int  # KV cells per stream (the cache's size: every cell is used in the reserve)
    n_stream: int  # 1 with a unified cache, else n_seq_max
    n_seq_max: int
    mask_bytes: int  # bytes per element of the KQ mask: 2 (f16) with flash attention, 4 without


@dataclass(frozen=True)
class ArchLive:
    """Bytes an architecture's graph keeps alive beyond the generic phases."""

    # temporaries alive at the peak of one of its attention layers, beside the generic live set
    layer: int = 0
    # its own graph inputs beyond the KQ masks and the embeddings: set by llama.cpp before the
    # graph runs, held by the host and copied into each split that reads them (PIPELINE_COPIES
    # times with pipeline parallelism, alive for the whole graph then)
    inputs: int = 0
    # the part of `inputs` still alive at that layer's peak (their last consumer runs later)
    inputs_in_layer: int = 0


def every_layer(arch: Architecture, il: int) -> bool:
    """Every attention layer of the architecture."""
    return True


@dataclass(frozen=True)
class GraphTrait:
    """An architecture's live set beyond the generic rule."""

    live: Callable[[Architecture, GraphSizes], ArchLive]
    source: str  # one line: the graph builder and what the terms are
    # the attention layers that keep it alive (a device running none of them has none of it)
    layers: Callable[[Architecture, int], bool] = every_layer
