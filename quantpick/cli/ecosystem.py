"""`--format preset | llama-swap | ollama | lmstudio` on `get` and `command`: the plan handed to
llama.cpp's router, llama-swap, Ollama or LM Studio (renderers: serve/ecosystem.py). This module
builds their input from the plan and says on stderr what was written and how to start it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.model.manifest import Manifest
    from quantpick.plan.planner import Plan
    from quantpick.serve.command import ServerCommand
    from quantpick.serve.ecosystem import Target

ECOSYSTEM_FORMATS = ("preset", "llama-swap", "ollama", "lmstudio")

PresetOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--preset",
        help="--format preset: the llama.cpp router INI file to add this model's section to "
        "(created if missing; other sections kept byte for byte; the old file kept as .bak, "
        ".bak.1, ...; a section quantpick did not write is replaced only with --force).",
        dir_okay=False,
    ),
]
SwapConfigOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--swap-config",
        help="--format llama-swap: merge the entry into this llama-swap config (else print it).",
        dir_okay=False,
    ),
]
ModelfileOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(
        "--modelfile",
        help="--format ollama: write the Modelfile here (else print it).",
        dir_okay=False,
    ),
]
TtlOpt = Annotated[
    int,
    typer.Option(
        "--ttl",
        help="--format llama-swap: seconds idle before llama-swap unloads the model (0: never).",
    ),
]


@dataclass(frozen=True)
class EcosystemOptions:
    preset: Path | None = None
    swap_config: Path | None = None
    modelfile: Path | None = None
    ttl: int = 900  # serve.ecosystem.SWAP_TTL_S
    dry_run: bool = False  # show what would be written, write nothing
    host: str = "127.0.0.1"
    port: int = 8080
    force: bool = False  # replace a file, section or entry quantpick did not write


def check_ecosystem_options(fmt: str, opts: EcosystemOptions) -> None:
    """Before any planning or download: the format's file options make sense."""
    from quantpick.errors import UsageError

    given = {"--preset": opts.preset, "--swap-config": opts.swap_config,
             "--modelfile": opts.modelfile}  # fmt: skip
    owner = {"--preset": "preset", "--swap-config": "llama-swap", "--modelfile": "ollama"}
    for flag, value in given.items():
        if value is not None and fmt != owner[flag]:
            raise UsageError(f"{flag} goes with --format {owner[flag]}")
    if fmt == "preset" and opts.preset is None:
        raise UsageError(
            "--format preset needs --preset FILE (the INI file the router reads)",
            hint="e.g. --preset ~/llama-presets.ini",
        )
    if opts.ttl < 0:
        raise UsageError(f"--ttl {opts.ttl}: seconds, 0 or more")
    from quantpick.serve.ecosystem import open_config

    for flag, path in given.items():
        if path is not None and path.is_dir():
            raise UsageError(f"{path}: is a directory", hint="give a file name")
        if path is not None and not path.resolve().parent.is_dir():
            raise UsageError(f"{path}: no such directory {path.resolve().parent}")
        if path is not None:  # a device, FIFO, link, ...: refused before any planning
            open_config(path, flag, force=opts.force)


def _machine_parts(machine: Machine) -> list[str]:
    parts = [machine.source if machine.described else "probe"]
    parts += [f"gpu {g.uuid or g.name} {g.total_bytes}" for g in machine.usable_gpus]
    parts += [f"rpc {w.endpoint}" for w in machine.rpc_workers]
    parts.append(f"ram {machine.host.ram_total_bytes}")
    return parts


def ecosystem_target(
    p: Plan,
    machine: Machine,
    manifest: Manifest,
    model_path: Path | None,
    mmproj_path: Path | None,
    name: str,
    comment: str,
    cmd: ServerCommand,
    *,
    with_template: bool = False,
) -> Target:
    from quantpick.cli.render import machine_label
    from quantpick.model.gguf import split_names
    from quantpick.serve.ecosystem import DeviceUse, Target, machine_key

    files: tuple[Path, ...] = ()
    template = None
    if model_path is not None:
        model_path = model_path.absolute()  # every tool reads it from another directory
        files = tuple(model_path.parent / n for n in split_names(model_path.name))
        if with_template and model_path.is_file():
            from quantpick.model.gguf import read_gguf_file

            value = read_gguf_file(model_path).metadata.get("tokenizer.chat_template")
            template = value if isinstance(value, str) else None
    argv = list(cmd.argv)
    ngl = int(argv[argv.index("-ngl") + 1]) if "-ngl" in argv else 0
    source = next((s for s in manifest.sources if s.kind == "hf" and s.repo), None)
    c = p.config
    return Target(
        name=name,
        quant=p.quant,
        plan_comment=comment,
        ctx_size=c.ctx_size,
        n_parallel=c.n_parallel,
        n_gpu_layers=ngl,
        model_files=files,
        model_bytes=sum(f.size_bytes for f in p.files),
        mmproj_path=mmproj_path.absolute() if mmproj_path is not None else None,
        devices=tuple(
            DeviceUse(d.device, d.total_bytes, d.budget_bytes) for d in p.estimate.devices
        ),
        machine_key=machine_key(_machine_parts(machine)),
        machine_label=machine_label(machine),
        hf_repo=source.repo if source else None,
        sampling=manifest.sampling,
        chat_template=template,
        cache_type_k=c.cache_type_k,
        cache_type_v=c.cache_type_v,
        flash_attn=c.flash_attn,
        n_cpu_moe=c.n_cpu_moe,
        override_tensors=tuple(f"{pat}={buft}" for pat, buft in c.override_tensors),
        tensor_split=c.tensor_split if c.devices != () else None,
        kv_unified=c.kv_unified,
        rpc=c.rpc_servers,
    )


def emit_ecosystem(
    fmt: str,
    cmd: ServerCommand,
    target: Target,
    opts: EcosystemOptions,
    *,
    json_doc: dict[str, Any] | None,
) -> dict[str, Any]:
    """Write or print the format's output; notes on stderr; the JSON part it adds."""
    if fmt == "preset":
        doc = _preset(cmd, target, opts)
    elif fmt == "llama-swap":
        doc = _swap(cmd, target, opts)
    elif fmt == "ollama":
        doc = _ollama(cmd, target, opts)
    else:
        doc = _lmstudio(target, opts)
    if json_doc is None:
        sys.stdout.write(doc.pop("_stdout"))
    else:
        doc.pop("_stdout")
    return doc


def _say_written(what: str, written: Any) -> None:
    from quantpick.cli import output

    if not written.changed:
        output.note(f"Unchanged: {what} {written.path} already says this")
        return
    kept = f" (the previous version: {written.backup})" if written.backup else ""
    output.note(f"Wrote {what} {written.path}{kept}")


def _preset(cmd: ServerCommand, target: Target, opts: EcosystemOptions) -> dict[str, Any]:
    from quantpick.cli import output
    from quantpick.serve.ecosystem import (
        merge_preset,
        models_max,
        open_config,
        planned_sections,
        preset_section,
        router_line,
    )

    assert opts.preset is not None
    path = opts.preset
    section, warnings = preset_section(cmd, target)
    for w in warnings:
        output.warn(w)
    config = open_config(path, "--preset", force=opts.force)
    text, replaced = merge_preset(config.text, target.name, section, force=opts.force,
                                  where=f"--preset {path}")  # fmt: skip
    planned, others = planned_sections(text)
    limit = models_max(planned, target)
    written = None
    if not opts.dry_run:
        written = config.write(text, force=opts.force)
        _say_written(f"[{target.name}] ({'updated' if replaced else 'added'}) in", written)
    preset_path = path.absolute()
    line = router_line(cmd.argv[0], preset_path, limit.value, cmd, opts.host, opts.port)
    output.note(f"--models-max {limit.value}: {limit.reason}")
    if others:
        output.note(
            f"Note: {len(others)} section(s) not written by quantpick ({', '.join(others[:5])}) "
            "are not counted: their memory is unknown"
        )
    output.note(
        f'Start the router with the line on stdout, then ask for the model by name ("model": '
        f'"{target.name}"); after the file changes: GET /models?reload=1, or restart it'
    )
    return {
        "preset": {
            "file": str(preset_path),
            "section": target.name,
            "replaced": replaced,
            "backup": str(written.backup) if written and written.backup else None,
            "models_max": limit.value,
            "models_max_reason": limit.reason,
            "router": line,
            "text": "\n".join(section) + "\n",
        },
        "_stdout": line + "\n",
    }


def _swap(cmd: ServerCommand, target: Target, opts: EcosystemOptions) -> dict[str, Any]:
    from quantpick.cli import output
    from quantpick.serve.ecosystem import merge_swap_config, open_config, swap_entry

    entry = swap_entry(cmd, target, ttl=opts.ttl)
    if cmd.env_from:
        output.warn(
            "llama-swap's own apiKeys protect its proxy; the model's llama-server listens on "
            "127.0.0.1 only, so the entry sets no key"
        )
    stdout = "models:\n" + "\n".join(entry) + "\n"
    doc: dict[str, Any] = {"entry": "\n".join(entry) + "\n", "file": None, "replaced": None}
    if opts.swap_config is not None:
        config = open_config(opts.swap_config, "--swap-config", force=opts.force)
        text, replaced = merge_swap_config(config.text, target.name, entry, force=opts.force,
                                           where=f"--swap-config {opts.swap_config}")  # fmt: skip
        doc.update(replaced=replaced, file=str(opts.swap_config.absolute()))
        if not opts.dry_run:
            written = config.write(text, force=opts.force)
            _say_written(f"models.{target.name} ({'updated' if replaced else 'added'}) in",
                         written)  # fmt: skip
            doc["backup"] = str(written.backup) if written.backup else None
            stdout = ""
        output.note(f"Run: llama-swap --config {opts.swap_config}")
    else:
        output.note("Add this under `models:` in llama-swap's config (or give --swap-config FILE)")
    return {"llama_swap": doc, "_stdout": stdout}


def _ollama(cmd: ServerCommand, target: Target, opts: EcosystemOptions) -> dict[str, Any]:
    from quantpick.cli import output
    from quantpick.serve.ecosystem import (
        check_whole_file,
        ollama_modelfile,
        ollama_name,
        open_config,
    )
    from quantpick.units import human

    text, cannot = ollama_modelfile(cmd, target)
    for line in cannot:
        output.warn(f"Ollama cannot run this plan as planned: {line}")
    name = ollama_name(target)
    where = opts.modelfile
    stdout = text
    if where is not None:
        config = open_config(where, "--modelfile", force=opts.force)
        check_whole_file(config, force=opts.force)  # a Modelfile the user wrote: --force
        if not opts.dry_run:
            _say_written("the Modelfile", config.write(text, force=opts.force))
            stdout = ""
    size = target.model_bytes or sum(f.stat().st_size for f in target.model_files if f.is_file())
    create = f"ollama create {name} -f {where if where is not None else 'Modelfile'}"
    output.note(
        f"Then: {create}  (Ollama copies the {human(size)} file into its own store, so it "
        "needs that much free space again)"
    )
    return {
        "ollama": {"name": name, "modelfile": text, "file": str(where) if where else None,
                   "create": create, "cannot_express": cannot},
        "_stdout": stdout,
    }  # fmt: skip


def _lmstudio(target: Target, opts: EcosystemOptions) -> dict[str, Any]:
    from quantpick.cli import output
    from quantpick.config import load_settings
    from quantpick.fetch.stores import lmstudio_models_dirs
    from quantpick.serve.ecosystem import link_into_lmstudio, lmstudio_folder

    configured = load_settings().store_paths.get("lmstudio")
    models_dir = configured[0] if configured else lmstudio_models_dirs(Path.home())[0][0]
    linked = link_into_lmstudio(target, models_dir, dry_run=opts.dry_run)
    publisher, repo = lmstudio_folder(target)
    verb = "Would link" if opts.dry_run else "Linked"
    for item in linked:
        if item.action == "present":
            output.note(f"Already in LM Studio: {item.dest}")
        else:
            output.note(f"{verb} {item.source} -> {item.dest} ({item.action}: {item.why})")
    output.note(
        f"LM Studio lists it as {publisher}/{repo}; load it with the plan's settings: context "
        f"length {target.ctx_size}, GPU offload {target.n_gpu_layers} layers, flash attention "
        f"{target.flash_attn}, K/V cache {target.cache_type_k}/{target.cache_type_v}"
        + (f", MoE experts of {target.n_cpu_moe} layers on the CPU" if target.n_cpu_moe else "")
    )
    return {
        "lmstudio": {
            "models_dir": str(models_dir),
            "model": f"{publisher}/{repo}",
            "links": [
                {"source": str(i.source), "dest": str(i.dest), "action": i.action} for i in linked
            ],
            "dry_run": opts.dry_run,
        },
        "_stdout": "".join(f"{i.dest}\n" for i in linked),
    }
