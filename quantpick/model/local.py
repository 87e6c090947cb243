"""A GGUF already on disk: its exact layout (all shards of a split file) and, when no manifest
describes it, a one-file manifest built from its own header (`command --gguf`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantpick.model.layout import ModelLayout
from quantpick.model.manifest import Manifest

if TYPE_CHECKING:
    from quantpick.model.speculative import DraftModel, Vocabulary


def local_layout(path: Path, quant: str | None) -> ModelLayout:
    """The exact layout of a GGUF on disk (all shards of a split file)."""
    from quantpick.model.gguf import layout_from_header, read_gguf_split

    header = read_gguf_split(path)
    return layout_from_header(
        header, basis=f"gguf:{path}", file_bytes=header.stats.get("file_bytes"), quant=quant
    )


def manifest_for_gguf(path: Path, layout: ModelLayout) -> Manifest:
    """A one-file manifest for a GGUF that no manifest describes (`command --gguf`)."""
    from quantpick.model.gguf_names import quant_tag
    from quantpick.model.manifest import Manifest, ModelFile, Sampling

    meta = layout.metadata
    quant = quant_tag(path.name) or "custom"
    sampling = None
    values = [meta.get(f"general.sampling.{k}") for k in ("temp", "top_p", "top_k", "min_p")]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        temp, top_p, top_k, min_p = (float(v) for v in values)  # type: ignore[arg-type]
        sampling = Sampling(temp, top_p, int(top_k), min_p)
    return Manifest(
        id=path.stem,
        display_name=str(meta.get("general.name", path.stem)),
        license=None,
        architecture=layout.architecture,
        sources=(),
        files=(
            ModelFile(
                name=path.name,
                quant=quant,
                size_bytes=path.stat().st_size,
                size_exact=True,
                quality_rank=1,
                role="model",
            ),
        ),
        sampling=sampling,
        reasoning=False,
        checksums_file=None,
    )


def token_texts(path: Path) -> tuple[str, ...] | None:
    """The texts of a GGUF's tokens (tokenizer.ggml.tokens), which llama.cpp's draft
    compatibility check compares (common/speculative.cpp:115-126). Read with gguf's own reader
    (it memory-maps the file; quantpick's bounded header parser keeps only the array's length).
    None: the file has no token list."""
    import gguf

    field = gguf.GGUFReader(str(path)).get_field("tokenizer.ggml.tokens")
    if field is None:
        return None
    return tuple(bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data)


def load_draft(path: Path) -> DraftModel:
    """A draft model on disk (`--draft PATH`): its exact layout and its vocabulary, token texts
    included."""
    from quantpick.errors import UsageError
    from quantpick.model.gguf import GGUFError
    from quantpick.model.speculative import DraftModel, vocabulary_of

    try:
        layout = local_layout(path, None)
        tokens = token_texts(path)
    except (GGUFError, OSError, ValueError) as exc:
        raise UsageError(f"--draft {path}: {exc}", hint="give a GGUF file") from None
    n_vocab = len(tokens) if tokens is not None else layout.architecture.vocab_size
    vocab = vocabulary_of(layout.metadata, n_vocab, tokens)
    return DraftModel(layout, vocab, str(path.resolve()), path.name)


def local_vocabulary(path: Path, layout: ModelLayout) -> Vocabulary:
    """The vocabulary of a model file on disk, token texts included."""
    from quantpick.model.speculative import vocabulary_of

    tokens = token_texts(path)
    n_vocab = len(tokens) if tokens is not None else layout.architecture.vocab_size
    return vocabulary_of(layout.metadata, n_vocab, tokens)
