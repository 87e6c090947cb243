"""The contract between the registry and one family module (quantpick/arch/<family>.py). Pure.

A family module defines one `FAMILY = Family(...)`: the architectures it covers, `configure`
(its load_arch_hparams and create_memory choices, applied to the shared hparams), and optionally
`tensor_shapes` (the tensors its llama.cpp loader expects, for planning before a header is read
and for writing full-size test files). Adding an architecture is one module (or one entry in a
family's table), one fixture and one recorded llama.cpp projection (docs/architectures.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from quantpick.arch.base import Architecture, HParams
from quantpick.arch.graph import GraphTrait

# (tensor name, ne): ne in ggml order, ne[0] the row length.
TensorShapes = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Family:
    name: str  # the module's short name: "transformer", "qwen35", ...
    architectures: tuple[str, ...]  # general.architecture values it covers
    configure: Callable[[HParams], None]  # load_arch_hparams + create_memory, on shared hparams
    summary: str  # one line for docs and `show`: what sets this family apart
    rules: tuple[str, ...] = ()  # the memory rules it applies, each citing llama.cpp
    # llm_arch_is_recurrent (src/llama-arch.cpp:1070-1081): every layer starts recurrent
    recurrent: frozenset[str] = frozenset()
    # Architectures whose rules are proven against llama-fit-params (tests/arch); the others of
    # `architectures` are handled by the family's rules but listed as not yet checked.
    checked: frozenset[str] = frozenset()
    # None from the call: no table for that architecture of the family (a layout then needs the
    # GGUF header)
    tensor_shapes: Callable[[Architecture], TensorShapes | None] | None = None
    # The first llama.cpp build that loads each architecture (None: older than the builds
    # quantpick knows: every build it can meet loads it).
    min_build: Mapping[str, int] = field(default_factory=dict)
    # Short manifest keys this family accepts for GGUF key suffixes (manifests written before
    # architectures became data used them): "ssm_state_size" -> "ssm.state_size".
    manifest_aliases: Mapping[str, str] = field(default_factory=dict)
    # GGUF keys this family's loader requires (llama.cpp's get_key without `false`) and which
    # must be >= 1: a manifest without them is refused at load, naming the key.
    required_keys: tuple[str, ...] = ()
    # What an architecture's graph keeps alive beyond plan/compute.py's generic phases
    # (arch/graph.py), per architecture of the family that has such a term.
    graph_traits: Mapping[str, GraphTrait] = field(default_factory=dict)
