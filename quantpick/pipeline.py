"""The whole job, stage by stage: machine -> model -> plan -> fetch -> serve.

Functions here join the stages (each stage is its own package and knows nothing of the others'
I/O); the CLI parses options, calls one of these and renders what comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.fetch.download import FetchReport
    from quantpick.fetch.transfer import ProgressSink
    from quantpick.machine.spec import Machine
    from quantpick.model.headers import LayoutSource
    from quantpick.model.manifest import Manifest
    from quantpick.plan.memory import Overheads
    from quantpick.plan.planner import Plan, PlanRequest


def plan_exact(
    manifest: Manifest,
    machine: Machine,
    layouts: LayoutSource,
    request: PlanRequest,
    overheads: Overheads,
) -> Plan:
    """Plan, then redo it on the chosen quant's exact header (at most three rounds)."""
    from quantpick.plan.planner import plan

    p = plan(manifest, machine, layouts, request, overheads=overheads)
    for _ in range(3):
        if not layouts.upgrade(p.quant):
            break
        p = plan(manifest, machine, layouts, request, overheads=overheads)
    return p


def plan_on_local_file(
    manifest: Manifest,
    quant: str,
    model_path: Path,
    machine: Machine,
    request: PlanRequest,
    overheads: Overheads,
) -> Plan:
    """Plan one quant on the header of its file on disk: the file is the truth."""
    from quantpick.model.local import local_layout
    from quantpick.plan.planner import plan

    layout = local_layout(model_path, quant)
    return plan(
        manifest, machine, lambda _q: layout, replace(request, quant=quant), overheads=overheads
    )


@dataclass(frozen=True)
class GetRequest:
    """`quantpick get`: the planning inputs and where and how to fetch."""

    manifest: Manifest
    machine: Machine
    plan_request: PlanRequest
    overheads: Overheads
    dest_dir: Path | None  # None: the default (the models dir, or the HF cache with --hf-cache)
    exact: bool = False
    network: bool = True  # False: --offline (no hub is contacted)
    source: str = "auto"
    allow_unverified: bool = False
    dry_run: bool = False


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


def get(
    req: GetRequest,
    *,
    settings: Settings,
    progress: ProgressSink | None = None,
    on_plan: Any = None,
    live: Any = None,
) -> GetResult:
    """Plan, fetch + verify (or verify what is in place when no hub answers), re-plan on the file.

    `on_plan(plan)` is called once the quant is chosen, before any transfer (the CLI prints it);
    `live` is a context manager around the transfer (the CLI's progress display).
    """
    from contextlib import nullcontext

    from quantpick.errors import DownloadError
    from quantpick.fetch.download import (
        fetch_model,
        report_files,
        verified_hf_cache_files,
        verified_local_files,
    )
    from quantpick.fetch.stores import HashCache, hash_cache_path
    from quantpick.model.headers import LayoutSource

    manifest = req.manifest
    vision = req.plan_request.vision
    layouts = LayoutSource(manifest, exact=req.exact, network=req.network, settings=settings)
    first = plan_exact(manifest, req.machine, layouts, req.plan_request, req.overheads)
    if on_plan is not None:
        on_plan(first)
    warnings: list[str] = []
    report = None
    files: list[dict[str, Any]] | None = None
    offline = not req.network or settings.offline
    dest = req.dest_dir if req.dest_dir is not None else settings.models_dir / manifest.id
    if offline and req.dry_run:
        # Offline means offline, dry run included: the plan and the local files, no hub.
        warnings.append(f"offline: no hub contacted; the dry run shows the plan for {dest}")
        model_path = dest / manifest.quant_files(first.quant)[0].name
        mmproj = dest / manifest.projector.name if vision and manifest.projector else None
        return GetResult(first, first, None, None, model_path, mmproj,
                         tuple(layouts.problems), tuple(warnings))  # fmt: skip
    try:
        if offline and not req.dry_run:
            raise DownloadError("offline (--offline or QUANTPICK_OFFLINE): no hub contacted")
        with live if live is not None else nullcontext():
            report = fetch_model(
                manifest,
                first.quant,
                settings=settings,
                vision=vision,
                dest_dir=req.dest_dir,
                source=req.source,
                allow_unverified=req.allow_unverified,
                dry_run=req.dry_run,
                progress=progress,
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
            else f"{dest}, verified against its SHA256SUMS"
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
    if not req.dry_run:
        final = plan_on_local_file(
            manifest, first.quant, model_path, req.machine, req.plan_request, req.overheads
        )
    return GetResult(
        plan=final,
        first_plan=first,
        report=report,
        files=files,
        model_path=model_path,
        mmproj_path=mmproj_path,
        header_problems=tuple(layouts.problems),
        warnings=tuple(warnings),
    )
