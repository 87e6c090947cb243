"""What speculative decoding can use for a model: its own NextN/MTP blocks, an `mtp-` sidecar GGUF
in its repository (found as llama.cpp's `-hf` finds one), a compatible draft model (same
vocabulary) from a small table of known siblings, and n-gram lookup (always there). Pure.

llama.cpp b11312 (commit 0c1e570), where each rule comes from:
- `--spec-type` names: common/arg.cpp (the help text in tests/data/llama-server-help-current.txt:
  none, draft-simple, draft-eagle3, draft-mtp, draft-dflash, draft-dspark, ngram-simple,
  ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache).
- The NextN block loads only with an MTP context (`mparams.load_mtp`); the MTP draft context runs
  on the target's weights (common/speculative.cpp:2556-2567 "creating MTP draft context").
- A sidecar: common/download.cpp:541-616 `find_best_sibling(files, model, "mtp-", tag)`: a .gguf
  whose path contains "mtp-", in the model's directory or below it, the deepest shared directory
  first, then an exact `-TAG.` match, then the closest quant bits (`extract_quant_bits`,
  :513-522); it becomes the draft model path (common/arg.cpp:640-644).
- A draft model must share the target's vocabulary: common/speculative.cpp
  `common_speculative_are_compatible` compares vocab type, BOS/EOS and the token texts (a size
  difference of at most SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from quantpick.arch.base import ModelView
from quantpick.model.layout import ModelLayout

# common/speculative.cpp: SPEC_VOCAB_MAX_SIZE_DIFFERENCE (target and draft vocabularies may
# differ in size by this much; every token id below the smaller size must match)
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128


class SpecKind(str, Enum):
    """quantpick's kinds of speculation; `spec_type` is llama-server's `--spec-type` value."""

    MTP = "mtp"  # the model's NextN blocks (or an mtp- sidecar): --spec-type draft-mtp
    DRAFT = "draft"  # a separate small model of the same vocabulary: -md FILE
    NGRAM = "ngram"  # n-gram lookup over the context: --spec-type ngram-mod

    @property
    def spec_type(self) -> str:
        return SPEC_TYPES[self]


SPEC_TYPES = {
    SpecKind.MTP: "draft-mtp",
    SpecKind.DRAFT: "draft-simple",
    SpecKind.NGRAM: "ngram-mod",
}


# llama_vocab_type by tokenizer.ggml.model (src/llama-vocab.cpp:1949-2143 at b11312), and each
# type's default special ids and BOS/EOS addition where the file sets none (:1810-1832,
# :1971-2143, :2434-2452); a file's tokenizer.ggml.add_bos_token / add_eos_token override them
# (:2640-2646).
VOCAB_TYPES = {
    "none": "none", "no_vocab": "none", "llama": "spm", "bert": "wpm", "gpt2": "bpe",
    "hybriddna": "bpe", "whitespace": "bpe", "gemma4": "bpe", "t5": "ugm", "rwkv": "rwkv",
    "test": "test", "plamo2": "plamo2",
}  # fmt: skip
# type -> (bos, eos, add_bos, add_eos); None: no such token / not known without the pre-tokenizer
VOCAB_DEFAULTS: dict[str, tuple[int | None, int | None, bool | None, bool | None]] = {
    "none": (None, None, False, False),
    "spm": (1, 2, True, False),
    "wpm": (101, None, True, False),
    "bpe": (11, 11, None, None),  # some pre-tokenizers turn add_bos on (:2185-2333)
    "ugm": (None, 1, False, True),
    "rwkv": (None, None, False, False),
    "test": (None, None, False, False),
    "plamo2": (1, 2, False, False),
}
# common/speculative.cpp:31 SPEC_VOCAB_CHECK_START_TOKEN_ID: token texts are compared from here on
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer facts llama.cpp's compatibility check compares (common/speculative.cpp:67-122
    common_speculative_are_compatible): the vocab type, whether BOS/EOS are added and their ids,
    the size, and the token texts. `tokens`: the texts, where they were read (None: unknown)."""

    model: str  # tokenizer.ggml.model ("gpt2", "llama", ...)
    pre: str  # tokenizer.ggml.pre ("qwen35", "llama-bpe", ...): not compared by llama.cpp
    n_vocab: int
    bos: int | None = None
    eos: int | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    tokens: tuple[str, ...] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def vocab_type(self) -> str:
        return VOCAB_TYPES.get(self.model, self.model)


def vocabulary_of(
    metadata: dict[str, object], n_vocab: int, tokens: tuple[str, ...] | None = None
) -> Vocabulary:
    """A file's Vocabulary from its tokenizer.* metadata (a ModelLayout's `metadata`), with the
    defaults llama.cpp gives a vocab type where the file sets nothing."""
    model = str(metadata.get("tokenizer.ggml.model") or "")
    d_bos, d_eos, d_add_bos, d_add_eos = VOCAB_DEFAULTS.get(
        VOCAB_TYPES.get(model, ""), (None, None, None, None)
    )

    def ident(key: str, default: int | None) -> int | None:
        v = metadata.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else default

    def flag(key: str, default: bool | None) -> bool | None:
        v = metadata.get(key)
        return v if isinstance(v, bool) else default

    return Vocabulary(
        model=model,
        pre=str(metadata.get("tokenizer.ggml.pre") or ""),
        n_vocab=n_vocab,
        bos=ident("tokenizer.ggml.bos_token_id", d_bos),
        eos=ident("tokenizer.ggml.eos_token_id", d_eos),
        add_bos=flag("tokenizer.ggml.add_bos_token", d_add_bos),
        add_eos=flag("tokenizer.ggml.add_eos_token", d_add_eos),
        tokens=tokens,
    )


def vocab_problem(target: Vocabulary, draft: Vocabulary) -> str | None:
    """Why llama.cpp would refuse `draft` for `target` (None: compatible), in the order of
    common_speculative_are_compatible (common/speculative.cpp:67-122): the vocab type; add-BOS
    and, when added, the BOS id; the same for EOS; sizes within 128; the texts of every token
    from id 5 below the smaller size. What a side does not know (a layout without tokenizer
    metadata, token texts not read) is not compared."""
    if target.model and draft.model and target.vocab_type != draft.vocab_type:
        return f"tokenizer {draft.model!r} differs from the model's {target.model!r}"
    for what, add_t, add_d, id_t, id_d in (
        ("BOS", target.add_bos, draft.add_bos, target.bos, draft.bos),
        ("EOS", target.add_eos, draft.add_eos, target.eos, draft.eos),
    ):
        if add_t is not None and add_d is not None and add_t != add_d:
            return f"it {'adds' if add_d else 'does not add'} {what}, the model " + (
                "does not" if add_d else "does"
            )
        if add_t and add_d and id_t is not None and id_d is not None and id_t != id_d:
            return f"{what} token {id_d} differs from the model's {id_t}"
    if abs(target.n_vocab - draft.n_vocab) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return (
            f"vocabulary of {draft.n_vocab} tokens differs from the model's {target.n_vocab} "
            f"by more than {SPEC_VOCAB_MAX_SIZE_DIFFERENCE}"
        )
    if target.tokens is not None and draft.tokens is not None:
        n = min(len(target.tokens), len(draft.tokens))
        for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, n):
            if target.tokens[i] != draft.tokens[i]:
                return f"token {i} is {draft.tokens[i]!r}, the model's is {target.tokens[i]!r}"
    return None


@dataclass(frozen=True)
class DraftModel:
    """A separate GGUF to draft with (llama-server -md, or -hfd for a hub file): its layout,
    its vocabulary and what the command names it by."""

    layout: ModelLayout
    vocab: Vocabulary
    path: str  # -md's value (a local path), or -hfd's (OWNER/REPO:QUANT) where `hub`
    label: str  # how messages name it
    hub: bool = False  # llama-server fetches it from Hugging Face itself (-hfd)

    @property
    def file_bytes(self) -> int:
        return self.layout.file_bytes or sum(t.n_bytes for t in self.layout.tensors)


@dataclass(frozen=True)
class DraftSibling:
    """A known small model of a family's vocabulary, usable as a draft (-md)."""

    family: str  # what the target's name starts with (lower case)
    repo: str  # a GGUF repository of the draft
    file: str  # the file to use (a Q8_0 or Q4_0: a draft's cost is its bytes)
    n_vocab: int
    pre: str
    source: str  # where the pairing is documented


# Known draft pairs (target family -> draft GGUF), each with the public run that used it.
DRAFT_SIBLINGS: tuple[DraftSibling, ...] = (
    DraftSibling(
        "qwen2.5-coder", "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        "qwen2.5-coder-0.5b-instruct-q8_0.gguf", 151936, "qwen2",
        "ggml-org/llama.cpp#10290 (Qwen2.5-Coder-32B with the 0.5B as draft)",
    ),
    DraftSibling(
        "qwen2.5", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q8_0.gguf",
        151936, "qwen2", "ggml-org/llama.cpp#12968 (Qwen2.5-72B with the 0.5B as draft)",
    ),
    DraftSibling(
        "qwen3-", "Qwen/Qwen3-0.6B-GGUF", "Qwen3-0.6B-Q8_0.gguf", 151936, "qwen2",
        "vllm-project/vllm#24322 (Qwen3-32B with Qwen3 small models as drafts)",
    ),
    DraftSibling(
        "llama-3.1", "bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q8_0.gguf",
        128256, "llama-bpe",
        "ggml-org/llama.cpp#5877 (Llama-3.1-8B with Llama-3.2-1B as draft: 72% accepted)",
    ),
)  # fmt: skip


def draft_siblings(model_name: str, vocab: Vocabulary | None = None) -> tuple[DraftSibling, ...]:
    """Known drafts for a model by its name; with its vocabulary, only those llama.cpp accepts."""
    name = model_name.lower().rsplit("/", 1)[-1]
    found = [s for s in DRAFT_SIBLINGS if name.startswith(s.family)]
    if vocab is not None:
        found = [
            s
            for s in found
            if vocab_problem(vocab, Vocabulary(vocab.model, s.pre, s.n_vocab)) is None
        ]
    return tuple(found)


_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


def quant_tag(path: str) -> str:
    """get_gguf_split_info's tag (common/download.cpp:482-510): the last -/. separated word of
    the name without .gguf and the split suffix, upper case ("" when none)."""
    if not path.lower().endswith(".gguf"):
        return ""
    prefix = path[: -len(".gguf")]
    m = _SPLIT.match(prefix)
    if m:
        prefix = m.group(1)
    t = _TAG.search(prefix)
    return t.group(1).upper() if t else ""


def quant_bits(path: str, tag: str = "") -> int:
    """extract_quant_bits (common/download.cpp:513-522): Q4_K_M -> 4, F16 -> 16, none -> 0."""
    text = tag.upper() if tag else quant_tag(path)
    m = re.search(r"[0-9]+", text)
    return int(m.group(0)) if m else 0


def find_sidecar(files: tuple[str, ...] | list[str], model: str, tag: str = "") -> str | None:
    """The `mtp-` sidecar llama.cpp's -hf picks for `model` among the repository's `files`
    (find_best_sibling with keyword "mtp-", common/download.cpp:541-616)."""
    tag_upper = tag.upper()
    model_bits = quant_bits(model, tag)
    model_dir = model.split("/")[:-1]
    best: str | None = None
    best_key: tuple[int, bool, int] | None = None
    for f in files:
        if not f.endswith(".gguf") or "mtp-" not in f:
            continue
        sib_dir = f.split("/")[:-1]
        # std::mismatch over the model's directories: the sibling must lie in the model's
        # directory or deeper
        if sib_dir[: len(model_dir)] != model_dir:
            continue
        depth = len(model_dir)
        exact = bool(tag_upper) and f"-{tag_upper}." in f.upper()
        diff = abs(quant_bits(f) - model_bits)
        key = (depth, exact, -diff)
        if best_key is None or key > best_key:
            best, best_key = f, key
    return best


@dataclass(frozen=True)
class SpecSources:
    """What speculation can draw on for one model file."""

    nextn_layers: int  # NextN/MTP blocks in the file (loaded only with --spec-type draft-mtp)
    sidecar: str | None  # an mtp- sidecar file in the repository (llama.cpp uses it as -md)
    drafts: tuple[DraftSibling, ...]  # known compatible draft models

    @property
    def kinds(self) -> tuple[SpecKind, ...]:
        kinds = [SpecKind.MTP] if self.nextn_layers or self.sidecar else []
        if self.drafts:
            kinds.append(SpecKind.DRAFT)
        kinds.append(SpecKind.NGRAM)  # needs nothing but the context
        return tuple(kinds)


def spec_sources(
    view: ModelView,
    model_name: str,
    *,
    files: tuple[str, ...] = (),
    model_file: str = "",
    vocab: Vocabulary | None = None,
) -> SpecSources:
    """Speculation sources of a model: NextN blocks from its architecture view (the layers past
    n_layer(): arch/base.py build_view), a sidecar among `files` beside `model_file`, drafts
    from the sibling table filtered by `vocab`."""
    nextn = sum(1 for lv in view.layers if lv.nextn)
    sidecar = find_sidecar(files, model_file) if files and model_file and not nextn else None
    return SpecSources(nextn, sidecar, draft_siblings(model_name, vocab))
