"""`quantpick manifest add REPO` and `quantpick manifest check FILE`.

Usage:
    quantpick manifest add unsloth/Qwen3.6-35B-A3B-GGUF
    quantpick manifest add unsloth/Qwen3.6-35B-A3B-GGUF --source modelscope --id qwen36-ms
    quantpick manifest check ~/.config/quantpick/manifests/my-model.toml

"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from quantpick.cli.core import command_group
from quantpick.cli.option_blocks import takes
from quantpick.cli.option_table import ManifestForceOpt, ManifestSourceOpt

if TYPE_CHECKING:
    from quantpick.model.from_repo import NewManifest
    from quantpick.model.manifest import Manifest

manifest_app = command_group(
    "manifest", "Create and check model manifests (TOML descriptions of GGUF repositories)."
)


@manifest_app.command("add")
@takes("repo source revision manifest_id force json_")
def add_command(
    source: ManifestSourceOpt = "hf", force: ManifestForceOpt = False, **given: Any
) -> None:
    """Write a manifest for any GGUF repository (listing + one remote header read)."""
    from quantpick.cli import output
    from quantpick.config import load_settings
    from quantpick.errors import UsageError
    from quantpick.model.from_repo import build_manifest, write_manifest
    from quantpick.model.repo_ref import parse_repo_ref

    repo, revision, manifest_id, json_ = (
        given[k] for k in ("repo", "revision", "manifest_id", "json_")
    )
    # A pasted URL says where the repository lives and may name a revision: both are used.
    ref = parse_repo_ref(repo)
    if ref.kind is not None and ref.kind != source:
        if source != "hf":  # --source given, and another hub's URL
            raise UsageError(f"--source {source} but {repo} is on {ref.kind}")
        source = ref.kind
    if ref.revision is not None:
        if revision is not None and revision != ref.revision:
            raise UsageError(f"--revision {revision} but {repo} names {ref.revision}")
        revision = ref.revision
    if ref.path is not None:
        output.note(f"Note: {repo} names one file; the manifest describes all of {ref.repo}")
    repo = ref.repo
    settings = load_settings()
    new = build_manifest(
        repo, kind=source, revision=revision, manifest_id=manifest_id, settings=settings
    )
    path = write_manifest(new, settings, force=force)
    for warning in new.warnings:
        output.warn(warning)
    if json_:
        output.print_json(
            {
                "id": new.manifest_id,
                "path": str(path),
                "repo": repo,
                "source": source,
                "quants": new.quants,
                "projectors": new.projectors,
                "skipped": [{"name": n, "reason": r} for n, r in new.skipped],
                "checksums_file": new.checksums_file,
                "header": new.header,
                "warnings": new.warnings,
            }
        )
        return
    _render_added(new, path)


def _render_added(new: NewManifest, path: Path) -> None:
    """`manifest add`'s human rendering: the quants found, projectors and skipped files."""
    from rich.table import Table

    from quantpick.cli import output
    from quantpick.units import human

    table = Table(title=f"{new.manifest_id}: {len(new.quants)} quants", show_edge=False)
    for col in ("quant", "size", "bits/weight", "rank", "files"):
        table.add_column(col, justify="left" if col in ("quant", "files") else "right")
    for q in new.quants:
        table.add_row(
            q["quant"], human(q["size_bytes"]), f"{q['bits_per_weight']:.2f}",
            str(q["quality_rank"]), str(len(q["files"])),
        )  # fmt: skip
    console = output.stdout()
    console.print(table)
    if new.projectors:
        console.print("projectors: " + ", ".join(new.projectors))
    for name, reason in new.skipped:
        output.note(f"skipped {name}: {reason}")
    console.print(f"wrote {path}")


@manifest_app.command("check")
@takes("file json_")
def check_command(**given: Any) -> None:
    """Validate a manifest file: prints OK, or the one-line error (exit 1)."""
    from quantpick.cli import output

    # A failure is the CLI's usual one: `Error: ...` on stderr and, with --json, the error
    # document on stdout (cli.core).
    file = given["file"]
    manifest = _check(file)
    if given["json_"]:
        output.print_json(
            {"ok": True, "path": str(file), "id": manifest.id, "quants": list(manifest.quants)}
        )
        return
    typer.echo(f"OK {file}: {manifest.id}, {len(manifest.quants)} quants")


def _check(file: Path) -> Manifest:
    from quantpick.arch.registry import support
    from quantpick.cli import output
    from quantpick.model.registry import load_manifest_file

    manifest = load_manifest_file(file)
    note = support(manifest.architecture.name).note
    if note:
        output.note(f"Note: {file}: {note}")
    return manifest
