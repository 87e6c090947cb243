"""A model file already on disk, for `command`, `confirm` and `bench`: which file, which quant,
its exact layout and manifest (from the registry, or built from the file's own header)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.cli.options import load_manifest

if TYPE_CHECKING:
    from quantpick.model.layout import ModelLayout
    from quantpick.model.manifest import Manifest


@dataclass(frozen=True)
class LocalModel:
    manifest: Manifest
    quant: str
    model_path: Path
    layout: ModelLayout
    projector: Path | None  # the mmproj file when --vision


def resolve_local(
    model: str | None,
    quant: str | None,
    gguf: Path | None,
    mmproj: Path | None,
    dir_: Path | None,
    vision: bool,
) -> LocalModel:
    """--gguf PATH (with or without MODEL), or MODEL --quant Q in --dir / the models dir."""
    from quantpick.config import load_settings
    from quantpick.errors import UsageError
    from quantpick.model.local import local_layout, manifest_for_gguf

    if gguf is not None:
        layout = local_layout(gguf, quant)
        manifest = load_manifest(model) if model else manifest_for_gguf(gguf, layout)
        if model:
            # Both given: the file is what runs, so its own header is the basis of the plan;
            # MODEL only adds what a header lacks (sampling, reasoning format, alias).
            if layout.architecture.name != manifest.architecture.name:
                raise UsageError(
                    f"{gguf} is {layout.architecture.name}, {manifest.id} is "
                    f"{manifest.architecture.name}",
                    hint="drop MODEL to plan the file on its own",
                )
            from quantpick.cli import output

            output.note(
                f"Note: planning on {gguf.name}'s own header; {manifest.id} adds its sampling, "
                "reasoning format and alias"
            )
        q = (quant or quant_of(manifest, gguf.name)) if model else manifest.files[0].quant
        if vision and mmproj is None:
            raise UsageError("--vision with --gguf needs --mmproj PATH")
        return LocalModel(manifest, q, gguf, layout, mmproj)
    manifest = load_manifest(model)
    if not quant:
        raise UsageError("give --quant Q (or --gguf PATH)")
    q = canonical_quant(manifest, quant)
    base = dir_ or load_settings().models_dir / manifest.id
    files = [base / f.name for f in manifest.quant_files(q)]
    missing = [p for p in files if not p.is_file()]
    if missing:
        raise UsageError(
            f"{missing[0]} is not there",
            hint=f"download it first: quantpick get {manifest.id} --quant {q} (or pass --dir)",
        )
    projector = None
    if vision:
        if manifest.projector is None:
            raise UsageError(f"{manifest.id} has no vision projector")
        projector = base / manifest.projector.name
        if not projector.is_file():
            raise UsageError(
                f"{projector} is not there",
                hint=f"quantpick get {manifest.id} --quant {q} --vision",
            )
    return LocalModel(manifest, q, files[0], local_layout(files[0], q), projector)


def canonical_quant(manifest: Manifest, quant: str) -> str:
    from quantpick.errors import UsageError

    for q in manifest.quants:
        if q.upper() == quant.upper():
            return q
    raise UsageError(
        f"{manifest.id} has no quant {quant}", hint="available: " + ", ".join(manifest.quants)
    )


def quant_of(manifest: Manifest, filename: str) -> str:
    from quantpick.errors import UsageError

    for f in manifest.files:
        if f.name == filename and f.role == "model":
            return f.quant
    raise UsageError(f"{filename} is not a file of {manifest.id}", hint="pass --quant Q")


def local_model(given: Mapping[str, Any]) -> LocalModel:
    """`resolve_local` from a command's parsed options (MODEL, -q, --gguf, --mmproj, --dir,
    --vision; an option the command does not take counts as not given)."""
    return resolve_local(
        given.get("model"), given.get("quant"), given.get("gguf"), given.get("mmproj"),
        given.get("dir_"), bool(given.get("vision", False)),
    )  # fmt: skip
