"""The architecture registry: the one place that says whether an architecture is known. Pure.

`family_of(name)` gives the family module covering `general.architecture` (None: unknown);
`view_of(arch)` builds the per-layer view every other stage reads, with the generic rule (plain
KV on every layer, llama.cpp's shared hyperparameters) and a note when the architecture is not
known. Family modules are listed in `families` and imported on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from quantpick.arch.base import Architecture, HValue, ModelView, build_view, load_hparams
from quantpick.arch.family import Family, TensorShapes
from quantpick.arch.graph import GraphTrait

GENERIC = "generic"
GENERIC_NOTE = (
    "architecture {name!r} is not one quantpick models: weights are exact from the header, "
    "KV cache from the generic rule (every layer, llama.cpp's shared hyperparameters): "
    "generic, not checked for this architecture"
)


@lru_cache(maxsize=1)
def families() -> tuple[Family, ...]:
    """Every family module's FAMILY (imported on first use: planning one model loads them all,
    and they are small pure modules). A new family is one module and one line here."""
    from quantpick.arch import (
        deepseek,
        deepseek4,
        encoder,
        gemma,
        lfm2,
        linear_attention,
        qwen35,
        rwkv,
        sparse_attention,
        ssm,
        transformer,
    )

    return tuple(
        m.FAMILY
        for m in (
            qwen35, transformer, gemma, deepseek, deepseek4, sparse_attention, ssm,
            linear_attention, lfm2, rwkv, encoder,
        )
    )  # fmt: skip


@lru_cache(maxsize=1)
def _by_arch() -> dict[str, Family]:
    table: dict[str, Family] = {}
    for fam in families():
        for name in fam.architectures:
            if name in table:
                raise RuntimeError(f"{name} is claimed by {table[name].name} and {fam.name}")
            table[name] = fam
    return table


def family_of(name: str) -> Family | None:
    """The family covering `general.architecture` = name (None: quantpick does not model it)."""
    return _by_arch().get(name)


def known_architectures() -> tuple[str, ...]:
    return tuple(sorted(_by_arch()))


@dataclass(frozen=True)
class Support:
    """What quantpick knows of an architecture, in one place (manifest load, header parse,
    planning and `show` all ask this)."""

    name: str
    family: str  # "generic" when unknown
    known: bool  # a family module covers it
    checked: bool  # ... and its rules are proven against llama-fit-params
    note: str | None  # for the user when not known or not checked

    @property
    def basis(self) -> str:
        if self.checked:
            return f"{self.family} rules, checked against llama.cpp"
        if self.known:
            return f"{self.family} rules, not yet checked against llama.cpp for {self.name}"
        return "generic, not checked for this architecture"


def support(name: str) -> Support:
    fam = family_of(name)
    if fam is None:
        return Support(name, GENERIC, False, False, GENERIC_NOTE.format(name=name))
    checked = name in fam.checked
    note = (
        None
        if checked
        else (f"{name}: {fam.name} rules, not yet checked against llama.cpp for this architecture")
    )
    return Support(name, fam.name, True, checked, note)


@lru_cache(maxsize=128)
def view_of(arch: Architecture) -> ModelView:
    """The per-layer view of `arch` (cached: architectures are immutable and hashable)."""
    fam = family_of(arch.name)
    recurrent = fam is not None and arch.name in fam.recurrent
    hp = load_hparams(arch, recurrent_arch=recurrent)
    if fam is None:
        hp.notes.append(GENERIC_NOTE.format(name=arch.name))
        return build_view(hp, family=GENERIC, known=False)
    fam.configure(hp)
    return build_view(hp, family=fam.name, known=True)


@lru_cache(maxsize=64)
def tensor_shapes(arch: Architecture) -> TensorShapes | None:
    """The tensors the family's loader expects (None: the family cannot say, or it is unknown;
    a layout then needs the GGUF header). Memoized: a pick synthesizes every quant of one
    architecture from the same table (a tuple, and the architecture is frozen)."""
    fam = family_of(arch.name)
    if fam is None or fam.tensor_shapes is None:
        return None
    return fam.tensor_shapes(arch)


def graph_trait(name: str) -> GraphTrait | None:
    """What `name`'s graph keeps alive beyond the generic compute phases (None: nothing known
    beyond them, or the architecture is unknown)."""
    fam = family_of(name)
    return None if fam is None else fam.graph_traits.get(name)


def min_build(name: str) -> int | None:
    fam = family_of(name)
    return None if fam is None else fam.min_build.get(name)


def manifest_aliases(name: str) -> dict[str, str]:
    """Short manifest keys for `name`'s GGUF keys: the shared ones and its family's."""
    fam = family_of(name)
    out = dict(SHARED_MANIFEST_ALIASES)
    if fam is not None:
        out.update(fam.manifest_aliases)
    return out


# Short names manifests have always used for the keys every architecture shares.
SHARED_MANIFEST_ALIASES = {
    "head_count": "attention.head_count",
    "head_count_kv": "attention.head_count_kv",
    "key_length": "attention.key_length",
    "value_length": "attention.value_length",
    "sliding_window": "attention.sliding_window",
}


def architecture(name: str, /, **fields: HValue) -> Architecture:
    """An Architecture from short manifest names or GGUF key suffixes (tests, benchmarks and
    hand-written configs): `architecture("qwen35moe", block_count=41, head_count_kv=2, ...)`.
    `vocab_size` and `has_output_tensor` are taken from `fields` as well."""
    aliases = manifest_aliases(name)
    vocab = fields.pop("vocab_size", 0)
    has_output = fields.pop("has_output_tensor", True)
    if not isinstance(vocab, int):
        raise TypeError(f"vocab_size {vocab!r}: an integer")
    hparams = {aliases.get(k, k).replace("__", "."): v for k, v in fields.items()}
    return Architecture.of(name, hparams, vocab, has_output_tensor=bool(has_output))


def required_keys(name: str) -> tuple[str, ...]:
    fam = family_of(name)
    return () if fam is None else fam.required_keys
