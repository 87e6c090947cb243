"""`quantpick get`: plan, fetch + verify (or verify what is in place when no hub answers), re-plan
on the downloaded file's own header and confirm it with llama.cpp."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.jobs.confirm import confirm_local_plan
from quantpick.jobs.dry_run import dry_run
from quantpick.jobs.plan import PlanInputs, plan_for, plan_on_local_file

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.fetch.fetch_plan import FetchReport
    from quantpick.fetch.progress import ProgressSink
    from quantpick.jobs.confirm import ConfirmOptions, ConfirmReport
    from quantpick.jobs.tuning import Tuning
    from quantpick.plan.plan_types import Plan


@dataclass(frozen=True)
class GetRequest:
    """`quantpick get`: the planning inputs and where and how to fetch."""

    plan: PlanInputs  # `network=False`: --offline (no hub is contacted); local_dir: set by get
    dest_dir: Path | None  # None: the default (the models dir, or the HF cache with --hf-cache)
    source: str = "auto"
    allow_unverified: bool = False
    dry_run: bool = False
    confirm: ConfirmOptions | None = None  # None: --no-confirm


@dataclass(frozen=True)
class FetchWatch:
    """What the caller shows of a fetch: the transfer's `progress`, `on_plan(plan)` once the quant
    is chosen (before any transfer), and `live`, a context manager around the transfer (the CLI's
    progress display)."""

    progress: ProgressSink | None = None
    on_plan: Callable[[Plan], None] | None = None
    live: Any = None


UNWATCHED = FetchWatch()  # nothing shown


@dataclass(frozen=True)
class GetResult:
    plan: Plan  # re-planned on the downloaded file's own header unless a dry run
    first_plan: Plan  # the plan that chose the quant (manifest or remote header)
    report: FetchReport | None  # None: no hub was used (offline, files verified in place)
    # One entry per file in place ([] for a dry run), with `reuse`: the other tool's copy it
    # came from (store, path, how it was linked), or null.
    files: list[dict[str, Any]] | None
    model_path: Path
    mmproj_path: Path | None
    header_problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)
    confirmation: ConfirmReport | None = None  # llama.cpp's check of `plan` (None: not run)
    tuning: Tuning | None = None  # the compute rule and calibration the plan was made with
    contradictions: tuple[str, ...] = ()  # PlanResult.contradictions: what `pick` notes too


def get(req: GetRequest, *, settings: Settings, watch: FetchWatch = UNWATCHED) -> GetResult:
    """Plan, fetch + verify (or verify what is in place when no hub answers), re-plan on the file;
    `watch` sees it happen."""
    from contextlib import nullcontext

    from quantpick.errors import DownloadError
    from quantpick.fetch.download import fetch_model
    from quantpick.fetch.offline import (
        files_in_place,
        report_files,
        verified_hf_cache_files,
        verified_local_files,
    )
    from quantpick.fetch.stores import HashCache, hash_cache_path
    from quantpick.hub.http import RetryPolicy

    manifest = req.plan.manifest
    vision = req.plan.request.vision
    dest = req.dest_dir if req.dest_dir is not None else settings.models_dir / manifest.id
    in_cache = settings.hf_cache and req.dest_dir is None
    planned = plan_for(replace(req.plan, local_dir=None if in_cache else dest), settings=settings)
    first = planned.plan
    # what the file's own plan and the confirm rounds use: the tuned request and overheads
    tuned = planned.inputs
    if watch.on_plan is not None:
        watch.on_plan(first)
    warnings: list[str] = []
    report = None
    files: list[dict[str, Any]] | None = None
    offline = not req.plan.network or settings.offline
    pre_download = None
    if req.confirm is not None and not offline:
        # `pick`'s dry run on a stand-in of the file's own header: a file this llama.cpp build
        # cannot load ends here (ModelRejectedError, exit 7), before a byte of it is fetched;
        # `get --dry-run` answers with its plan, as `pick` does.
        pre_download = dry_run(planned, req.confirm, settings=settings)
    if offline and req.dry_run:
        # Offline means offline, dry run included: the plan and the local files, no hub.
        warnings.append(f"offline: no hub contacted; the dry run shows the plan for {dest}")
        model_path = dest / manifest.quant_files(first.quant)[0].name
        mmproj = dest / manifest.projector.name if vision and manifest.projector else None
        return GetResult(
            first, first, None, None, model_path, mmproj, planned.header_problems,
            tuple(warnings), tuning=planned.tuning, contradictions=planned.contradictions,
        )  # fmt: skip
    try:
        if offline and not req.dry_run:
            raise DownloadError("offline (--offline or QUANTPICK_OFFLINE): no hub contacted")
        with watch.live if watch.live is not None else nullcontext():
            # Files in place that a pinned sha256 verifies need no hub.
            files = None if req.dry_run else files_in_place(
                manifest, first.quant, vision, settings=settings, dest_dir=req.dest_dir,
                progress=watch.progress,
            )  # fmt: skip
            if files is None:
                report = fetch_model(
                    manifest,
                    first.quant,
                    settings=settings,
                    vision=vision,
                    dest_dir=req.dest_dir,
                    source=req.source,
                    allow_unverified=req.allow_unverified,
                    dry_run=req.dry_run,
                    progress=watch.progress,
                    # a dry run reads a listing and a checksums file: one attempt, like `download`
                    policy=RetryPolicy(attempts=1) if req.dry_run else None,
                )
                files = [] if req.dry_run else report_files(report)
    except DownloadError as exc:
        # No hub (offline, HF_HUB_OFFLINE, an outage): files already in place still serve, once
        # verified against the checksums a previous run left beside them (or, in the Hugging
        # Face cache, against the manifest and the blob names).
        cache = HashCache(hash_cache_path(settings.cache_dir))
        if req.dry_run:
            files = None
        elif settings.hf_cache and req.dest_dir is None:
            files = verified_hf_cache_files(manifest, first.quant, vision, settings, cache)
        else:
            files = verified_local_files(manifest, first.quant, vision, dest, cache)
        if files is None:
            raise
        where = (
            "the Hugging Face cache"
            if settings.hf_cache
            else f"{dest}, verified against their pinned sha256"
        )
        warnings.append(f"{exc.message}; using the files in {where}")
    model_name = manifest.quant_files(first.quant)[0].name
    projector = manifest.projector if vision else None
    by_name = {f["name"]: Path(f["path"]) for f in files or []}
    if report is not None and report.plan.hf_cache is not None and not by_name:
        # a dry run into the HF cache: where the files will be
        by_name = {p.name: report.plan.hf_cache.pointer_path(p.name) for p in report.plan.files}
    # The file's own path: a reused copy used in place, or a Hugging Face cache snapshot entry,
    # is not under the models dir.
    model_path = by_name.get(model_name, dest / model_name)
    mmproj_path = by_name.get(projector.name, dest / projector.name) if projector else None
    final = first
    confirmation = None
    if req.dry_run and pre_download is not None:
        confirmation = pre_download
        if pre_download.status in ("confirmed", "replanned"):
            final = pre_download.plan
    if not req.dry_run:
        final = plan_on_local_file(
            manifest, first.quant, model_path, tuned.machine, tuned.request, tuned.overheads
        )
        if req.confirm is not None:
            confirmation = confirm_local_plan(
                final, manifest, model_path, tuned.machine, tuned.request, tuned.overheads,
                req.confirm,
            )  # fmt: skip
            final = confirmation.plan
    return GetResult(
        plan=final,
        first_plan=first,
        report=report,
        files=files,
        model_path=model_path,
        mmproj_path=mmproj_path,
        header_problems=planned.header_problems,
        warnings=tuple(warnings),
        confirmation=confirmation,
        tuning=planned.tuning,
        contradictions=planned.contradictions,
    )
