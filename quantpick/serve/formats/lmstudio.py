"""`--format lmstudio`: the quant's files linked into LM Studio's models folder
(`<models>/<publisher>/<repo>/<file>`, fetch/stores.py), and the settings to load it with.

`lms import` moves the file by default, which breaks every other tool's path to it, so quantpick
links (fetch.stores.link_into: a hard link where it can, else a symbolic one; never a move).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from quantpick.errors import UsageError
from quantpick.serve.formats.base import Emission, Emitted, OutputFormat, Reporter
from quantpick.serve.formats.target import Target

# The characters of a folder name quantpick makes up (as Ollama's names: ollama.py)
_FOLDER_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Linked:
    source: Path
    dest: Path
    action: str  # "hardlink", "symlink", "present" (already this file)
    why: str


def lmstudio_folder(target: Target) -> tuple[str, str]:
    """(publisher, repo) for LM Studio's layout: the Hugging Face source's, else quantpick/id."""
    if target.hf_repo and target.hf_repo.count("/") == 1:
        publisher, repo = target.hf_repo.split("/")
        return publisher, repo
    return "quantpick", _FOLDER_NAME.sub("-", target.name).strip("-.") or "model"


def link_into_lmstudio(target: Target, models_dir: Path, *, dry_run: bool = False) -> list[Linked]:
    """Link every file of the quant (and the projector) into
    `<models_dir>/<publisher>/<repo>/`; the files stay where they are. An existing different file
    there is never replaced."""
    from quantpick.errors import QuantpickError
    from quantpick.fetch.stores import LINK_WHY, FileIdentity, link_into

    if not target.model_files:
        raise UsageError("--format lmstudio needs the file on disk (`quantpick get` first)")
    publisher, repo = lmstudio_folder(target)
    folder = models_dir / publisher / repo
    sources = list(target.model_files) + ([target.mmproj_path] if target.mmproj_path else [])
    plan: list[tuple[Path, Path]] = []
    for source in sources:
        if not dry_run and not source.is_file():
            raise UsageError(f"{source} is not there", hint="`quantpick get` it first")
        dest = folder / source.name
        if dest.exists() or dest.is_symlink():
            if dest.exists() and os.path.samefile(dest, source):
                continue
            raise QuantpickError(
                f"LM Studio already has a different file at {dest}",
                hint="remove it in LM Studio first; quantpick never replaces another tool's file",
            )
        plan.append((source, dest))
    out = [Linked(s, folder / s.name, "present", "already linked") for s in sources
           if (s, folder / s.name) not in plan]  # fmt: skip
    for source, dest in plan:
        if dry_run:
            action = "hardlink" if _same_device(source, dest) else "symlink"
            out.append(Linked(source, dest, action, LINK_WHY[action]))
            continue
        # quantpick's own verified file: its identity now is the one linked (and re-checked
        # after the link is made)
        made = link_into(source, dest, FileIdentity.of(os.stat(os.path.realpath(source))))
        action, why = made.action, made.why
        if action == "in-place":
            raise QuantpickError(f"cannot link {source} into {folder}: {why}")
        out.append(Linked(source, dest, action, why))
    return out


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _same_device(source: Path, dest: Path) -> bool:
    """Whether a hard link from `source` to `dest` could be made (a dry run: either may not exist
    yet, so their nearest existing directories are compared)."""
    try:
        real = _existing(Path(os.path.realpath(source)))
        return os.stat(_existing(dest.parent)).st_dev == os.stat(real).st_dev
    except OSError:
        return False


class LmStudio(OutputFormat):
    name = "lmstudio"
    uses_target = True
    needs_file = True

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        from quantpick.config import load_settings
        from quantpick.fetch.stores import lmstudio_models_dirs

        target, opts = job.target(), job.options
        configured = load_settings().store_paths.get("lmstudio")
        models_dir = configured[0] if configured else lmstudio_models_dirs(Path.home())[0][0]
        linked = link_into_lmstudio(target, models_dir, dry_run=opts.dry_run)
        publisher, repo = lmstudio_folder(target)
        verb = "Would link" if opts.dry_run else "Linked"
        for item in linked:
            if item.action == "present":
                say.note(f"Already in LM Studio: {item.dest}")
            else:
                say.note(f"{verb} {item.source} -> {item.dest} ({item.action}: {item.why})")
        say.note(
            f"LM Studio lists it as {publisher}/{repo}; load it with the plan's settings: context "
            f"length {target.ctx_size}, GPU offload {target.n_gpu_layers} layers, flash attention "
            f"{target.flash_attn}, K/V cache {target.cache_type_k}/{target.cache_type_v}"
            + (f", MoE experts of {target.n_cpu_moe} layers on the CPU" if target.n_cpu_moe else "")
        )
        doc = {
            "models_dir": str(models_dir),
            "model": f"{publisher}/{repo}",
            "links": [
                {"source": str(i.source), "dest": str(i.dest), "action": i.action} for i in linked
            ],
            "dry_run": opts.dry_run,
        }
        return Emitted(stdout="".join(f"{i.dest}\n" for i in linked), rendered={"lmstudio": doc})


FORMAT = LmStudio()
