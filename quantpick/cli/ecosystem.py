"""`--format preset | llama-swap | ollama | lmstudio` on `get` and `command`: the plan handed to
llama.cpp's router, llama-swap, Ollama or LM Studio (one module each in serve/formats/). This
module checks their file options (declared in cli/option_table.py) before any planning, and
builds their input (a `Target`) from the plan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine
    from quantpick.model.manifest import Manifest
    from quantpick.plan.plan_types import Plan
    from quantpick.serve.command import ServerCommand
    from quantpick.serve.formats.base import EcosystemOptions
    from quantpick.serve.formats.target import Target


def check_ecosystem_options(
    fmt: str, files: dict[str, Path | None], opts: EcosystemOptions
) -> None:
    """Before any planning or download: the format's file options make sense. `files`: the
    value of every format's file option (--preset, --swap-config, --modelfile)."""
    from quantpick.errors import UsageError
    from quantpick.serve.formats import REGISTRY, entry, output_format
    from quantpick.serve.formats.config_file import open_config

    owner = {e.file_option: e.name for e in REGISTRY if e.file_option}
    for flag, value in files.items():
        if value is not None and fmt != owner[flag]:
            raise UsageError(f"{flag} goes with --format {owner[flag]}")
    output_format(fmt).check(opts)
    if opts.ttl < 0:
        raise UsageError(f"--ttl {opts.ttl}: seconds, 0 or more")
    own = entry(fmt).file_option
    path = opts.file
    if own is not None and path is not None:
        if path.is_dir():
            raise UsageError(f"{path}: is a directory", hint="give a file name")
        if not path.resolve().parent.is_dir():
            raise UsageError(f"{path}: no such directory {path.resolve().parent}")
        open_config(path, own, force=opts.force)  # a device, FIFO, link, ...: refused now


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
    from quantpick.serve.formats.target import DeviceUse, Target, machine_key

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
