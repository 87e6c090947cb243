"""`quantpick download` and `quantpick verify`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from quantpick.cli.core import app
from quantpick.cli.options import JsonOpt
from quantpick.errors import QuantpickError, UsageError, VerificationError

if TYPE_CHECKING:
    from quantpick.fetch.download import FetchPlan, FetchReport
    from quantpick.fetch.transfer import DownloadResult, ProgressSink
    from quantpick.fetch.verify import Verification

SOURCE_CHOICES = ("auto", "hf", "modelscope", "mirror")

DOWNLOAD_EXAMPLES = [
    "quantpick download qwen3.8-35b-a3b-distill --quant Q4_K_M",
    "quantpick download qwen3.8-35b-a3b-distill --quant IQ4_XS --vision --dir ./models",
    "quantpick download qwen3.8-35b-a3b-distill --quant Q4_K_M --dry-run --json",
]
VERIFY_EXAMPLES = ["quantpick verify ./models/qwen3.8-35b-a3b-distill", "quantpick verify . --json"]


def _epilog(examples: list[str]) -> str:
    return "Examples:\n\n" + "\n\n".join(f"  {e}" for e in examples)


# -- progress on stderr --------------------------------------------------------------------------


class LineProgress:
    """Non-TTY stderr: one line when a file starts and one when it ends, plus notes."""

    def message(self, text: str) -> None:
        from quantpick.cli import output

        output.note(text)

    def total_started(self, n_files: int, total_bytes: int) -> None:
        from quantpick.units import human

        self.message(f"{n_files} file(s), {human(total_bytes)} to fetch")

    def file_started(self, name: str, total: int | None, done: int) -> None:
        from quantpick.units import human

        size = human(total) if total is not None else "unknown size"
        resume = f", resuming at {human(done)}" if done else ""
        self.message(f"Downloading {name} ({size}{resume})")

    def advance(self, name: str, n_bytes: int) -> None:
        pass

    def file_finished(self, name: str, result: DownloadResult) -> None:
        from quantpick.units import human

        check = "sha256 verified" if result.verified else "NOT verified"
        self.message(f"Done {name}: {human(result.bytes_fetched)} fetched, {check}")


class RichProgress(LineProgress):
    """TTY stderr: a bar per file and one for the total (bytes, speed, ETA)."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        from quantpick.cli import output

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=output.stderr(),
            transient=False,
        )
        self._tasks: dict[str, Any] = {}
        self._total: Any = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def message(self, text: str) -> None:
        self._progress.console.print(text, markup=False, highlight=False)

    def total_started(self, n_files: int, total_bytes: int) -> None:
        self._total = self._progress.add_task(f"total ({n_files} files)", total=total_bytes)

    def file_started(self, name: str, total: int | None, done: int) -> None:
        self._tasks[name] = self._progress.add_task(name, total=total, completed=done)

    def advance(self, name: str, n_bytes: int) -> None:
        self._progress.advance(self._tasks[name], n_bytes)
        if self._total is not None:
            self._progress.advance(self._total, n_bytes)

    def file_finished(self, name: str, result: DownloadResult) -> None:
        task = self._tasks.get(name)
        if task is not None:
            self._progress.update(task, completed=result.size, total=result.size)


class _Quiet:
    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _progress(quiet: bool) -> tuple[ProgressSink, Any]:
    from quantpick.fetch.transfer import NullProgress

    if quiet:
        return NullProgress(), _Quiet()
    if sys.stderr.isatty():
        rich_progress = RichProgress()
        return rich_progress, rich_progress
    return LineProgress(), _Quiet()


# -- rendering -----------------------------------------------------------------------------------


def plan_to_dict(plan: FetchPlan) -> dict[str, Any]:
    return {
        "model": plan.manifest_id,
        "quant": plan.quant,
        "dir": str(plan.dest_dir),
        "source": plan.source,
        "source_kind": plan.source_kind,
        "revision": plan.revision,
        "checksums_file": plan.checksums_file,
        "bytes_to_fetch": plan.bytes_to_fetch,
        "free_bytes": plan.free_bytes,
        "enough_space": plan.enough_space,
        "files": [
            {
                "name": f.name,
                "role": f.role,
                "url": f.url,
                "path": str(f.path),
                "size": f.size,
                "sha256": f.sha256,
                "sha256_from": list(f.sha256_from),
                "state": f.state,
                "local_bytes": f.local_bytes,
                "bytes_to_fetch": f.bytes_to_fetch,
            }
            for f in plan.files
        ],
    }


def report_to_dict(report: FetchReport) -> dict[str, Any]:
    return {
        "model": report.plan.manifest_id,
        "quant": report.plan.quant,
        "dir": str(report.plan.dest_dir),
        "source": report.plan.source,
        "revision": report.plan.revision,
        "skipped_sources": list(report.skipped_sources),
        "files": [r.as_dict() for r in report.results],
    }


def _print_plan(plan: FetchPlan) -> None:
    from rich.table import Table

    from quantpick.cli import output
    from quantpick.units import human

    table = Table(title=f"{plan.manifest_id} {plan.quant} from {plan.source}")
    for column in ("file", "size", "on disk", "to fetch", "sha256 from"):
        table.add_column(column)
    for f in plan.files:
        table.add_row(
            f.name,
            human(f.size) if f.size is not None else "?",
            f.state,
            human(f.bytes_to_fetch),
            ", ".join(f.sha256_from) or "(none)",
        )
    console = output.stdout()
    console.print(table)
    room = "enough" if plan.enough_space else "NOT enough"
    console.print(
        f"Into {plan.dest_dir}: {human(plan.bytes_to_fetch)} to fetch, "
        f"{human(plan.free_bytes)} free ({room} room)",
        markup=False,
    )


def _print_report(report: FetchReport) -> None:
    from rich.table import Table

    from quantpick.cli import output
    from quantpick.units import human

    table = Table(title=f"{report.plan.manifest_id} {report.plan.quant} from {report.plan.source}")
    for column in ("file", "size", "sha256", "status"):
        table.add_column(column)
    for r in report.results:
        status = "already present, verified" if r.reused else "downloaded, verified"
        if not r.verified:
            status = "NOT verified (no known sha256)"
        table.add_row(r.name, human(r.size), r.sha256[:16], status)
    console = output.stdout()
    console.print(table)
    console.print(f"Saved in {report.plan.dest_dir}", markup=False)


# -- commands ------------------------------------------------------------------------------------


@app.command(epilog=_epilog(DOWNLOAD_EXAMPLES))
def download(
    model: Annotated[str, typer.Argument(help="Manifest id, alias or hub repo id.")],
    quant: Annotated[str, typer.Option("--quant", help="The quant to fetch, e.g. Q4_K_M.")],
    vision: Annotated[
        bool, typer.Option("--vision", help="Also fetch the vision projector (mmproj).")
    ] = False,
    dir_: Annotated[
        Optional[Path],  # noqa: UP045 - typer needs Optional on 3.10
        typer.Option(
            "--dir",
            help="Target directory (default: QUANTPICK_MODELS_DIR or the data dir, "
            "then the manifest id).",
            file_okay=False,
        ),
    ] = None,
    source: Annotated[
        str,
        typer.Option(
            "--source",
            help="auto (the manifest's sources in order, falling back on failure), "
            "hf, modelscope or mirror.",
        ),
    ] = "auto",
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show what would be fetched, from where, and disk room."),
    ] = False,
    allow_unverified: Annotated[
        bool,
        typer.Option(
            "--allow-unverified",
            help="Download files that have no known sha256 anywhere (refused by default).",
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="No progress; print only the model file's path.")
    ] = False,
    json_: JsonOpt = False,
) -> None:
    """Download one quant of MODEL (all shards, + projector with --vision), verified by sha256."""
    from quantpick.cli.output import print_json
    from quantpick.config import load_settings
    from quantpick.fetch.download import fetch_model
    from quantpick.model.registry import find_manifest

    if source not in SOURCE_CHOICES:
        raise UsageError(f"--source must be one of {', '.join(SOURCE_CHOICES)}, not {source!r}")
    settings = load_settings()
    manifest = find_manifest(model, settings)
    sink, context = _progress(quiet)
    with context:
        report = fetch_model(
            manifest,
            quant,
            settings=settings,
            vision=vision,
            dest_dir=dir_,
            source=source,
            allow_unverified=allow_unverified,
            dry_run=dry_run,
            progress=sink,
        )
    if dry_run:
        if json_:
            print_json({"dry_run": True, **plan_to_dict(report.plan)})
        elif quiet:
            typer.echo(str(report.plan.dest_dir))
        else:
            _print_plan(report.plan)
        return
    if json_:
        print_json(report_to_dict(report))
    elif quiet:
        models = [r for r in report.results if not r.name.lower().startswith("mmproj")]
        typer.echo(str((models or list(report.results))[0].path))
    else:
        _print_report(report)


def verification_to_dict(result: Verification) -> dict[str, Any]:
    return {
        "dir": result.root,
        "ok": result.ok,
        "files": [
            {
                "name": f.name,
                "status": f.status,
                "expected": f.expected,
                "actual": f.actual,
                "size": f.size,
            }
            for f in result.files
        ],
    }


@app.command(epilog=_epilog(VERIFY_EXAMPLES))
def verify(
    directory: Annotated[
        Path,
        typer.Argument(help="Directory holding SHA256SUMS and the files.", file_okay=False),
    ] = Path("."),
    checksums: Annotated[
        str, typer.Option("--checksums", help="Checksums file name inside DIR.")
    ] = "SHA256SUMS",
    json_: JsonOpt = False,
) -> None:
    """Check files against DIR/SHA256SUMS (like `sha256sum -c --ignore-missing`), in parallel."""
    from quantpick.cli import output
    from quantpick.fetch.verify import read_sha256sums, verify_files

    sums_path = directory / checksums
    if not sums_path.is_file():
        raise QuantpickError(
            f"no {checksums} in {directory}",
            hint="`quantpick download` writes one; or pass --checksums NAME",
        )
    # Lenient: a bad line (hostile or overlong name, malformed) is reported, the rest checked.
    parsed = read_sha256sums(sums_path.read_text(errors="replace"), checksums)
    for problem in parsed.problems:
        output.warn(problem)
    result = verify_files(directory, parsed.entries)
    if json_:
        output.print_json(verification_to_dict(result))
    else:
        for f in result.files:
            if f.status != "missing":
                typer.echo(f"{f.name}: {'OK' if f.status == 'ok' else 'FAILED'}")
    bad = result.mismatched
    if bad:
        raise VerificationError(
            f"{len(bad)} of {len(result.checked)} checked file(s) do not match {checksums}: "
            + ", ".join(f.name for f in bad)
        )
    refused = parsed.summary()
    if refused is not None:
        raise VerificationError(refused)
    if not result.checked:
        raise QuantpickError(f"none of the files listed in {checksums} is in {directory}")
