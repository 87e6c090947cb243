"""A GGUF already on disk: its exact layout (all shards of a split file) and, when no manifest
describes it, a one-file manifest built from its own header (`command --gguf`).
"""

from __future__ import annotations

from pathlib import Path

from quantpick.model.layout import ModelLayout
from quantpick.model.manifest import Manifest


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
