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
from dataclasses import dataclass
from enum import Enum

from quantpick.arch.base import ModelView

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


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer facts llama.cpp's compatibility check compares."""

    model: str  # tokenizer.ggml.model ("gpt2", "llama", ...)
    pre: str  # tokenizer.ggml.pre ("qwen35", "llama-bpe", ...)
    n_vocab: int
    bos: int | None = None
    eos: int | None = None


def vocab_problem(target: Vocabulary, draft: Vocabulary) -> str | None:
    """Why llama.cpp would refuse `draft` for `target` (None: compatible), after
    common_speculative_are_compatible: the vocab type, BOS/EOS and the size within 128 tokens."""
    if target.model != draft.model:
        return f"tokenizer {draft.model!r} differs from the model's {target.model!r}"
    if target.pre and draft.pre and target.pre != draft.pre:
        return f"pre-tokenizer {draft.pre!r} differs from the model's {target.pre!r}"
    if abs(target.n_vocab - draft.n_vocab) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return (
            f"vocabulary of {draft.n_vocab} tokens differs from the model's {target.n_vocab} "
            f"by more than {SPEC_VOCAB_MAX_SIZE_DIFFERENCE}"
        )
    for what, a, b in (("BOS", target.bos, draft.bos), ("EOS", target.eos, draft.eos)):
        if a is not None and b is not None and a != b:
            return f"{what} token {b} differs from the model's {a}"
    return None


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
