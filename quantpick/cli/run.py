"""`quantpick command` and `quantpick get`: the ready-to-run llama-server command, and the whole
pipeline (probe -> pick -> download + verify -> command) in one step.

Usage:
    quantpick get qwen3.8-35b-a3b-distill -c 262144
    quantpick get qwen3.8-35b-a3b-distill -c 65536 --format systemd > llama.service
    quantpick command qwen3.8-35b-a3b-distill -q Q4_K_M -c 32768 --model-source hf
    quantpick get qwen3.8-35b-a3b-distill -c 131072 --gpu 3090 --gpu t4 --dry-run --json
    quantpick get qwen3.8-35b-a3b-distill -c 65536 --script ~/bin/serve-qwen
    quantpick command --gguf ./Qwen3.8-35B-A3B-Q4_K_M.gguf -c 65536
    quantpick get qwen3.8-35b-a3b-distill -c 131072 --rpc 192.168.1.20:50052 --script ~/bin/serve
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.cli.core import app
from quantpick.cli.groups import (
    FetchOptions,
    LaunchOptions,
    LlamaCppOptions,
    MachineOptions,
    OutputOptions,
    PlanOptions,
    notes,
)
from quantpick.cli.launch import (
    announce_plan,
    checked_launch,
    fetch_watch,
    files_in_place,
    installed_capabilities,
    write_command,
)
from quantpick.cli.option_blocks import (
    CHOICE,
    FETCH,
    LAUNCH,
    LAUNCH_FILES,
    MACHINE,
    MACHINE_DETAILS,
    RUN_TOOLS,
    takes,
)
from quantpick.cli.option_table import CommandGgufOpt, GetDryRunOpt

if TYPE_CHECKING:
    from quantpick.jobs.get import GetResult
    from quantpick.machine.spec import Machine
    from quantpick.model.manifest import Manifest
    from quantpick.serve.formats.base import EcosystemOptions


@app.command("command")
@takes(
    "model quant gguf mmproj ctx_size",
    CHOICE,
    MACHINE,
    RUN_TOOLS,
    MACHINE_DETAILS,
    LAUNCH,
    "exact no_network",
    LAUNCH_FILES,
    "json_",
)
def command_cmd(gguf: CommandGgufOpt = None, **given: Any) -> None:
    """Plan for a GGUF already on disk (or, with --model-source hf, one llama-server fetches
    itself) and print the llama-server command that runs it (confirmed by llama.cpp's
    llama-fit-params when it is installed)."""
    given = {**given, "gguf": gguf}
    json_ = given["json_"]
    from quantpick.cli.confirm import confirmation_to_dict, report_confirmation
    from quantpick.cli.local import local_model
    from quantpick.cli.render import plan_to_dict
    from quantpick.jobs.on_disk import plan_file

    launch = LaunchOptions.of(given)
    eco = checked_launch(launch)
    machine = MachineOptions.of(given).machine()
    if launch.model_source == "hf":
        _command_from_hub(given, machine, launch, eco)
        return
    local = local_model(given)
    inputs = PlanOptions.of(given, quant=local.quant).inputs(
        local.manifest, machine, local=local.layout
    )
    llama = LlamaCppOptions.of(given)
    planned = plan_file(inputs, local.model_path, llama.confirm(machine))
    notes(planned.result.notes)
    p, confirmation = planned.plan, planned.confirmation
    report_confirmation(confirmation, machine, llama.no_confirm, quiet=json_)
    caps = installed_capabilities(machine, llama.llama_server, llama.timeout_s)
    doc = None
    if json_:
        doc = {
            "plan": plan_to_dict(p, machine, local.manifest.architecture.block_count),
            "confirmation": confirmation_to_dict(confirmation),
        }
    write_command(
        p, local.manifest, machine, launch, capabilities=caps, model_path=local.model_path,
        mmproj_path=local.projector, json_doc=doc, eco=eco, script=launch.script,
    )  # fmt: skip


def _command_from_hub(
    given: dict[str, Any], machine: Machine, launch: LaunchOptions, eco: EcosystemOptions
) -> None:
    """`command --model-source hf`: the plan for a repository file llama-server fetches itself
    (-hf), on its exact header when it can be read, through the recipe `pick` uses."""
    from quantpick.cli.local import canonical_quant
    from quantpick.errors import UsageError

    if given["gguf"] is not None:
        raise UsageError("--model-source hf plans a repository file, not --gguf")
    plan = PlanOptions.of(given)
    manifest = plan.manifest()
    if not plan.quant:
        raise UsageError("give --quant Q", hint=f"`quantpick get {manifest.id} -c N "
                         "--model-source hf` picks one")  # fmt: skip
    plan = replace(plan, quant=canonical_quant(manifest, plan.quant))
    _write_from_hub(
        plan, manifest, machine, launch, LlamaCppOptions.of(given), eco,
        json_doc={} if given["json_"] else None, script=launch.script,
    )  # fmt: skip


def _write_from_hub(
    plan: PlanOptions,
    manifest: Manifest,
    machine: Machine,
    launch: LaunchOptions,
    llama: LlamaCppOptions,
    eco: EcosystemOptions,
    *,
    json_doc: dict[str, Any] | None,
    script: Path | None,
    announce: bool = False,
) -> None:
    """The plan for a file that stays on the hub (llama-server fetches it: -hf) and its command."""
    from quantpick.cli import output
    from quantpick.cli.render import plan_to_dict
    from quantpick.jobs.plan import plan_for

    result = plan_for(plan.inputs(manifest, machine))
    notes(result.notes)
    p = result.plan
    if announce:
        output.note(announce_plan(p, hf=True))
    if json_doc is not None:
        block_count = manifest.architecture.block_count
        json_doc = {**json_doc, "plan": plan_to_dict(p, machine, block_count),
                    "model_source": "hf"}  # fmt: skip
    write_command(
        p, manifest, machine, launch,
        capabilities=installed_capabilities(machine, llama.llama_server, llama.timeout_s),
        model_path=None, json_doc=json_doc, eco=eco, script=script,
    )  # fmt: skip


@app.command("get")
@takes(
    "model ctx_size quant",
    CHOICE,
    "source allow_unverified dry_run",
    FETCH,
    "connections quiet",
    MACHINE,
    RUN_TOOLS,
    MACHINE_DETAILS,
    "exact no_network",
    LAUNCH,
    LAUNCH_FILES,
    "json_",
)
def get_cmd(dry_run: GetDryRunOpt = False, **given: Any) -> None:
    """Pick, download + verify, and print (or --script) the llama-server command: the whole job."""
    json_ = given["json_"]
    from quantpick.cli import output
    from quantpick.cli.confirm import report_confirmation
    from quantpick.jobs.get import GetRequest, get

    launch = LaunchOptions.of(given)
    eco = checked_launch(launch, dry_run=dry_run)
    fetch = FetchOptions.of(given)
    settings = fetch.settings()
    plan = PlanOptions.of(given)
    manifest = plan.manifest()
    machine = MachineOptions.of(given).machine()
    llama = LlamaCppOptions.of(given)
    shown = OutputOptions.of(given)
    if launch.model_source == "hf":
        # llama-server fetches the file itself: plan (on the hub's header), nothing to download.
        plan.request()  # its options are checked first, as for a download
        _write_from_hub(
            plan, manifest, machine, launch, llama, eco,
            json_doc={"dry_run": dry_run, "fetch": None, "files": None} if json_ else None,
            script=None if dry_run else launch.script, announce=not shown.silent,
        )  # fmt: skip
        return
    inputs = plan.inputs(manifest, machine)
    result = get(
        GetRequest(
            inputs, dest_dir=fetch.dir_, source=given["source"],
            allow_unverified=given["allow_unverified"],
            dry_run=dry_run, confirm=llama.confirm(machine),
        ),
        settings=settings, watch=fetch_watch(shown.silent),
    )  # fmt: skip
    notes((*(result.tuning.notes if result.tuning is not None else ()), *result.contradictions))
    for warning in result.warnings:
        output.warn(warning)
    if not dry_run:
        report_confirmation(result.confirmation, machine, llama.no_confirm, quiet=shown.silent)
    caps = installed_capabilities(machine, llama.llama_server, llama.timeout_s)
    dest = fetch.dir_ or settings.models_dir / manifest.id
    doc = _report_fetch(result, manifest, machine, dest, dry_run=dry_run, vision=plan.vision,
                        json_=json_)  # fmt: skip
    write_command(
        result.plan, manifest, machine, launch, capabilities=caps,
        model_path=result.model_path, mmproj_path=result.mmproj_path, json_doc=doc, eco=eco,
        script=None if dry_run else launch.script,
    )  # fmt: skip


def _report_fetch(
    result: GetResult,
    manifest: Manifest,
    machine: Machine,
    dest: Path,
    *,
    dry_run: bool,
    vision: bool,
    json_: bool,
) -> dict[str, Any] | None:
    """What `get` fetched (or would): with --json the document's fields (the command and its
    renderings are added by write_command), else a dry run's lines on stderr."""
    from quantpick.cli import output
    from quantpick.cli.confirm import confirmation_to_dict
    from quantpick.cli.download import plan_to_dict as fetch_plan_to_dict
    from quantpick.cli.download import reuse_lines
    from quantpick.cli.render import plan_to_dict
    from quantpick.units import human

    p, report = result.plan, result.report
    in_place = files_in_place(manifest, p.quant, vision, dest) if dry_run and not report else []
    if json_:
        doc = {
            "plan": plan_to_dict(p, machine, manifest.architecture.block_count),
            "dry_run": dry_run,
            "fetch": fetch_plan_to_dict(report.plan) if report is not None else None,
            "files": result.files,
            "confirmation": confirmation_to_dict(result.confirmation),
        }
        if in_place:
            doc["in_place"] = in_place
        return doc
    if in_place:
        for f in in_place:
            where = "in place (checked against SHA256SUMS when used)" if f["present"] else "not in"
            output.note(f"  {f['name']}: {where} {dest if not f['present'] else ''}".rstrip())
    elif dry_run and report is not None:
        fp = report.plan
        output.note(
            f"Would fetch {human(fp.bytes_to_fetch)} from {fp.source} into {fp.dest_dir} "
            f"({human(fp.free_bytes)} free: {'enough' if fp.enough_space else 'NOT enough'})"
        )
        for planned in fp.files:
            output.note(
                f"  {planned.name}: {planned.state}, sha256 from "
                f"{', '.join(planned.sha256_from) or 'nowhere'}"
            )
        for line in reuse_lines(fp):
            output.note(line)
    return None
