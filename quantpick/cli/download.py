"""`quantpick download` and `quantpick verify`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from quantpick.cli.core import app
from quantpick.cli.option_blocks import DOWNLOAD_WHAT, FETCH, takes
from quantpick.cli.option_table import DownloadDryRunOpt, DownloadQuietOpt
from quantpick.cli.options import SOURCE_CHOICES
from quantpick.errors import QuantpickError, UsageError, VerificationError

if TYPE_CHECKING:
    from quantpick.fetch.fetch_plan import FetchPlan, FetchReport
    from quantpick.fetch.progress import DownloadResult, ProgressSink
    from quantpick.hub.verify import Verification


DOWNLOAD_EXAMPLES = [
    "quantpick download qwen3.8-35b-a3b-distill --quant Q4_K_M",
    "quantpick download qwen3.8-35b-a3b-distill --quant IQ4_XS --vision --dir ./models",
    "quantpick download qwen3.8-35b-a3b-distill --quant Q4_K_M --dry-run --json",
    "quantpick download qwen3.8-35b-a3b-distill --quant Q4_K_M --hf-cache --reuse-from ollama",
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

    def hash_started(self, label: str, total: int) -> None:
        from quantpick.units import human

        self.message(f"Verifying {label}: hashing {human(total)}")

    def hash_advance(self, label: str, n_bytes: int) -> None:
        pass

    def hash_finished(self, label: str) -> None:
        pass


class RichProgress(LineProgress):
    """TTY stderr: a bar per file and one for the total (bytes, speed, ETA), and the number of
    connections a segmented file is coming over (the speed is theirs together)."""

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

    def connections(self, name: str, n: int) -> None:
        task = self._tasks.get(name)
        if task is not None:
            label = f"{name} ({n} connections)" if n > 1 else name
            self._progress.update(task, description=label)

    def file_finished(self, name: str, result: DownloadResult) -> None:
        task = self._tasks.get(name)
        if task is not None:
            self._progress.update(task, completed=result.size, total=result.size)
            self._progress.update(task, description=name)

    def hash_started(self, label: str, total: int) -> None:
        self._tasks[f"hash:{label}"] = self._progress.add_task(f"sha256 {label}", total=total)

    def hash_advance(self, label: str, n_bytes: int) -> None:
        self._progress.advance(self._tasks[f"hash:{label}"], n_bytes)

    def hash_finished(self, label: str) -> None:
        task = self._tasks.pop(f"hash:{label}", None)
        if task is not None:
            self._progress.remove_task(task)


class _Quiet:
    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def transfer_progress(quiet: bool) -> tuple[ProgressSink, Any]:
    from quantpick.fetch.progress import NullProgress

    if quiet:
        return NullProgress(), _Quiet()
    if sys.stderr.isatty():
        rich_progress = RichProgress()
        return rich_progress, rich_progress
    return LineProgress(), _Quiet()


# -- rendering -----------------------------------------------------------------------------------


def plan_to_dict(plan: FetchPlan) -> dict[str, Any]:
    from quantpick.json_view import attrs

    return {
        "model": plan.manifest_id,
        "quant": plan.quant,
        "dir": str(plan.dest_dir),
        **attrs(plan, "source source_kind revision checksums_file"),
        # store copies not yet verified count as to fetch; bytes_to_verify are hashed first
        **attrs(plan, "bytes_to_fetch bytes_to_verify bytes_to_fetch_if_verified free_bytes "
                      "enough_space"),
        "reuse_from": {
            "origin": plan.reuse_origin,  # the setting that chose the stores
            "stores": list(plan.reuse_stores),
            "looked_in": [r.as_dict() for r in plan.reuse_roots],  # the ones that exist here
        },
        "hf_cache": _hf_cache_dict(plan),
        "files": [
            {
                **attrs(f, "name role url"),
                "path": str(f.path),
                **attrs(f, "size sha256"),
                "sha256_from": list(f.sha256_from),
                **attrs(f, "state local_bytes bytes_to_fetch bytes_to_verify"),
                # the other tool's copy a run would use (hashed first unless `verified`), or null
                "reuse": f.reuse.as_dict() if f.reuse and f.state != "present" else None,
                "reuse_rejected": [r.as_dict() for r in f.reuse_rejected],
            }
            for f in plan.files
        ],
    }  # fmt: skip


def _hf_cache_dict(plan: FetchPlan) -> dict[str, Any] | None:
    target = plan.hf_cache
    if target is None:
        return None
    return {
        "cache_dir": str(target.cache_dir),
        "repo": target.repo,
        "commit": target.commit,
        "revision": target.revision,
        "snapshot": str(target.snapshot_dir),
    }


def report_to_dict(report: FetchReport) -> dict[str, Any]:
    from quantpick.fetch.offline import report_files

    return {
        "model": report.plan.manifest_id,
        "quant": report.plan.quant,
        "dir": str(report.plan.dest_dir),
        "source": report.plan.source,
        "revision": report.plan.revision,
        "skipped_sources": list(report.skipped_sources),
        "hf_cache": _hf_cache_dict(report.plan),
        "files": report_files(report),
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
    verify = (
        f" ({human(plan.bytes_to_fetch_if_verified)} if the store copies verify: "
        f"{human(plan.bytes_to_verify)} to hash first)"
        if plan.bytes_to_verify
        else ""
    )
    console.print(
        f"Into {plan.dest_dir}: {human(plan.bytes_to_fetch)} to fetch{verify}, "
        f"{human(plan.free_bytes)} free ({room} room)",
        markup=False,
    )
    for line in reuse_lines(plan):
        console.print(line, markup=False, soft_wrap=True)  # paths stay whole for copy-paste


def reuse_lines(plan: FetchPlan) -> list[str]:
    """What a run would reuse, from where, and how (for --dry-run of download and get)."""
    if not plan.reuse_stores:
        lines = [f"Reuse: off ({plan.reuse_origin})"]
    else:
        where = ", ".join(f"{r.path} ({r.store})" for r in plan.reuse_roots) or "none exists here"
        lines = [
            f"Reuse from {', '.join(plan.reuse_stores)} ({plan.reuse_origin}); looked in: {where}"
        ]
    if plan.hf_cache is not None:
        lines.append(f"Writing into the Hugging Face cache: {plan.hf_cache.snapshot_dir}")
    for f in plan.files:
        for bad in f.reuse_rejected:
            lines.append(f"  {f.name}: {bad.path} ({bad.store}) {bad.reason}")
        if f.reuse is None or f.state == "present":
            continue
        r = f.reuse
        check = (
            "sha256 verified earlier"
            if r.verified
            else "not verified yet: hashed before any transfer, used only if it matches"
        )
        lines.append(
            f"  {f.name}: would reuse {r.path} ({r.store}; {check}); would {r.action} it "
            f"into {f.path.parent} ({r.why})"
        )
    return lines


def _print_report(report: FetchReport) -> None:
    from rich.table import Table

    from quantpick.cli import output
    from quantpick.units import human

    table = Table(title=f"{report.plan.manifest_id} {report.plan.quant} from {report.plan.source}")
    for column in ("file", "size", "sha256", "status"):
        table.add_column(column)
    for r in report.results:
        status = "already present, verified" if r.reused else "downloaded, verified"
        used = report.reused.get(r.name)
        if used is not None:
            status = f"reused from {used.store} ({used.action}), verified"
        if not r.verified:
            status = "NOT verified (no known sha256)"
        table.add_row(r.name, human(r.size), r.sha256[:16], status)
    console = output.stdout()
    console.print(table)
    console.print(f"Saved in {report.plan.dest_dir}", markup=False)
    for name, used in report.reused.items():
        line = f"{name}: {used.action} of {used.path} ({used.why})"
        console.print(line, markup=False, soft_wrap=True)


# -- commands ------------------------------------------------------------------------------------


@app.command(epilog=_epilog(DOWNLOAD_EXAMPLES))
@takes(DOWNLOAD_WHAT, "source dry_run allow_unverified quiet", FETCH, "connections json_")
def download(
    dry_run: DownloadDryRunOpt = False, quiet: DownloadQuietOpt = False, **given: Any
) -> None:
    """Download one quant of MODEL (all shards, + projector with --vision), verified by sha256.

    Before any transfer, copies already in the Hugging Face cache, llama.cpp's cache, LM Studio
    or Ollama are verified and linked in instead (see docs/download.md).
    """
    from quantpick.cli.output import print_json
    from quantpick.config import load_settings, with_fetch_flags
    from quantpick.fetch.download import fetch_model
    from quantpick.hub.http import RetryPolicy

    model, quant, source, json_ = (given[k] for k in ("model", "quant", "source", "json_"))
    if source not in SOURCE_CHOICES:
        raise UsageError(f"--source must be one of {', '.join(SOURCE_CHOICES)}, not {source!r}")
    flags = {k: given[k] for k in ("reuse", "reuse_from", "hf_cache", "connections")}
    settings = with_fetch_flags(load_settings(), **flags)
    from quantpick.cli.options import load_manifest

    manifest = load_manifest(model)
    sink, context = transfer_progress(quiet)
    with context:
        report = fetch_model(
            manifest,
            quant,
            settings=settings,
            vision=given["vision"],
            dest_dir=given["dir_"],
            source=source,
            allow_unverified=given["allow_unverified"],
            dry_run=dry_run,
            progress=sink,
            # A dry run asks each source once: no network should fail in seconds, not after
            # the back-off a real transfer needs.
            policy=RetryPolicy(attempts=1) if dry_run else None,
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
@takes("directory checksums json_")
def verify(**given: Any) -> None:
    """Check files against DIR/SHA256SUMS (like `sha256sum -c --ignore-missing`), in parallel."""
    from quantpick.cli import output
    from quantpick.hub.verify import read_sha256sums, verify_files

    directory, checksums, json_ = given["directory"], given["checksums"], given["json_"]
    sums_path = directory / checksums
    if not directory.is_dir():
        what = "not a directory" if directory.exists() else "no such directory"
        raise UsageError(f"{directory}: {what}", hint="give the directory that holds SHA256SUMS")
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
