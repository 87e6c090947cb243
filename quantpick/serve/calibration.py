"""Calibration profiles on disk: `<config dir>/calibration/<machine key>.json`.

One file per machine (its GPUs by UUID and its host), holding one entry per scope: the llama.cpp
build (`b<N>-<commit>`), the devices the bench ran on and the size class of the model it ran.
`quantpick bench` writes them, and only entries that pass `plan.calibration.plausibility_problems`;
`pick`, `estimate`, `max-context`, `get`, `command` and `confirm` read the one that matches the
installed build, this machine's devices and the model being planned; `quantpick calibration
list|show|reset` shows and removes them. The format is documented in docs/calibration.md; what a
profile changes is `plan/calibration.py`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.errors import QuantpickError
from quantpick.plan.calibration import (
    PROFILE_KIND,
    PROFILE_SCHEMA,
    Calibration,
    calibration_from_profile,
    gpu_identity,
    machine_key,
    plausibility_problems,
    same_scope,
)

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.machine.spec import Machine

# A profile file holds a few entries of ~2 KB; anything far larger is not one (and is not read
# into memory whole).
MAX_PROFILE_BYTES = 4 * 1024**2


class CalibrationRefused(QuantpickError):
    """A bench entry that cannot be true is never stored."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(
            "calibration not stored: " + "; ".join(problems),
            hint="the measurement is shown above; bench a model of the fitted size on a quiet "
            "machine (--reps 2 or more) to calibrate",
        )
        self.problems = problems


def calibration_dir(settings: Settings | None = None) -> Path:
    from quantpick.config import load_settings

    return (settings or load_settings()).config_dir / "calibration"


def profile_path(machine: Machine, settings: Settings | None = None) -> Path:
    return calibration_dir(settings) / f"{machine_key(machine)}.json"


def read_profile(path: Path) -> dict[str, Any] | None:
    """A profile file's JSON object, or None when it is missing, not a regular file, too large
    or not JSON."""
    import stat

    try:
        # O_NONBLOCK: a FIFO put there does not hang the open; only a regular file is read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_PROFILE_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = json.loads(f.read(MAX_PROFILE_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def load_calibration(
    machine: Machine,
    build: str,
    *,
    sizes: Sequence[int] = (),
    settings: Settings | None = None,
) -> tuple[Calibration | None, str | None]:
    """(this machine's calibration for `build` and a model of `sizes`, or None and why none
    applies; (None, None) when nothing was ever measured here)."""
    path = profile_path(machine, settings)
    stored = read_profile(path)
    if stored is not None:
        return calibration_from_profile(stored, machine, build, sizes)
    if path.exists():
        return None, (
            f"{path} is not a readable calibration file; `quantpick calibration reset` removes it"
        )
    # Another machine's profile (other GPUs, or a changed host) is never applied: say so.
    others = sorted(calibration_dir(settings).glob("*.json")) if path.parent.is_dir() else []
    for other in others:
        data = read_profile(other)
        if data is not None:
            _, why = calibration_from_profile(data, machine, build, sizes)
            return None, why or f"{other.name} was measured on another machine"
    return None, None


def save_profile(machine: Machine, entry: dict[str, Any], settings: Settings | None = None) -> Path:
    """Store `entry` (one bench's measurements) in this machine's file, replacing the entry of
    the same scope (build, devices, size class) and keeping the others. Written atomically.
    Raises CalibrationRefused for an entry that cannot be true: nothing is written then."""

    problems = plausibility_problems(entry)
    if problems:
        raise CalibrationRefused(problems)
    path = profile_path(machine, settings)
    stored = read_profile(path)
    if (
        stored is None
        or stored.get("kind") != PROFILE_KIND
        or stored.get("schema_version") != PROFILE_SCHEMA
        or not isinstance(stored.get("profiles"), list)
    ):
        stored = {}
    profiles = [
        e for e in stored.get("profiles", []) if isinstance(e, dict) and not same_scope(e, entry)
    ]
    profiles.append(entry)
    doc = {
        "schema_version": PROFILE_SCHEMA,
        "kind": PROFILE_KIND,
        "machine_key": machine_key(machine),
        "gpus": gpu_identity(machine),
        "host": {
            "ram_total_bytes": machine.host.ram_total_bytes,
            "cpu_cores": machine.host.cpu_cores,
        },
        "profiles": profiles,
    }
    from quantpick.outputs import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    # allow_nan=False: plausibility_problems already refused them; never a bare NaN
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    write_atomic(path, text.encode("utf-8"), durable=False)  # never through a link
    return path


def list_profiles(settings: Settings | None = None) -> list[tuple[Path, dict[str, Any] | None]]:
    """Every profile file in the calibration directory, with its JSON (None: unreadable)."""
    directory = calibration_dir(settings)
    if not directory.is_dir():
        return []
    return [(p, read_profile(p)) for p in sorted(directory.glob("*.json"))]


def remove_profiles(paths: Sequence[Path]) -> list[Path]:
    """Delete these profile files (regular files only); the ones removed."""
    removed = []
    for path in paths:
        # a symbolic link is removed itself, never what it points to
        if path.is_symlink() or path.is_file():
            path.unlink()
            removed.append(path)
    return removed


# ---- memory calibration (quantpick check --learn) ---------------------------------------------
# `<config dir>/calibration/memory/<machine key>.json`: a directory of its own, so that the
# speed profiles' readers (`*.json` beside it) never see these files.


def memory_path(machine: Machine, settings: Settings | None = None) -> Path:
    return calibration_dir(settings) / "memory" / f"{machine_key(machine)}.json"


def _memory_entries(machine: Machine, doc: dict[str, Any] | None) -> list[Any]:
    from quantpick.plan.memory_calibration import MEMORY_KIND, MEMORY_SCHEMA

    if doc is None or doc.get("kind") != MEMORY_KIND or doc.get("schema_version") != MEMORY_SCHEMA:
        return []
    if doc.get("gpus") != gpu_identity(machine):
        return []
    entries = doc.get("entries")
    return list(entries) if isinstance(entries, list) else []


def save_memory_entry(
    machine: Machine, entry: dict[str, Any], settings: Settings | None = None
) -> Path:
    """Store one learned check, replacing the entry of the same scope (build, devices, size
    class). Raises CalibrationRefused for an entry that cannot be true: nothing is written."""
    import tempfile

    from quantpick.plan.memory_calibration import (
        MEMORY_KIND,
        MEMORY_SCHEMA,
        entry_problems,
    )
    from quantpick.plan.memory_calibration import same_scope as same_memory_scope

    problems = entry_problems(entry)
    if problems:
        raise CalibrationRefused(problems)
    path = memory_path(machine, settings)
    kept = [
        e
        for e in _memory_entries(machine, read_profile(path))
        if isinstance(e, dict) and not same_memory_scope(e, entry)
    ]
    doc = {
        "schema_version": MEMORY_SCHEMA,
        "kind": MEMORY_KIND,
        "machine_key": machine_key(machine),
        "gpus": gpu_identity(machine),
        "entries": [*kept, entry],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_memory_calibration(
    machine: Machine, build: str, *, sizes: Sequence[int] = (), settings: Settings | None = None
) -> tuple[Any, str | None]:
    """(the MemoryCalibration for this build, this machine's devices and a model of `sizes`, or
    None and why; (None, None) when nothing was learned here)."""
    from quantpick.plan.calibration import machine_devices
    from quantpick.plan.memory_calibration import calibration_for

    entries = _memory_entries(machine, read_profile(memory_path(machine, settings)))
    return calibration_for(entries, build, machine_devices(machine), sizes)


def list_memory_profiles(
    settings: Settings | None = None,
) -> list[tuple[Path, dict[str, Any] | None]]:
    directory = calibration_dir(settings) / "memory"
    if not directory.is_dir():
        return []
    return [(p, read_profile(p)) for p in sorted(directory.glob("*.json"))]
