"""Calibration profiles on disk: `<config dir>/calibration/<machine key>.json`.

One file per machine (its GPUs by UUID and its host), holding one profile per llama.cpp build
(`b<N>-<commit>`). `quantpick bench` writes them; `pick`, `estimate`, `get` and `command` read
the one for the installed build. The format is documented in docs/calibration.md; what a profile
changes is `plan/calibration.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.plan.calibration import (
    PROFILE_KIND,
    PROFILE_SCHEMA,
    Calibration,
    calibration_from_profile,
    gpu_identity,
    machine_key,
)

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.machine.spec import Machine


def calibration_dir(settings: Settings | None = None) -> Path:
    from quantpick.config import load_settings

    return (settings or load_settings()).config_dir / "calibration"


def profile_path(machine: Machine, settings: Settings | None = None) -> Path:
    return calibration_dir(settings) / f"{machine_key(machine)}.json"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_calibration(
    machine: Machine, build: str, *, settings: Settings | None = None
) -> tuple[Calibration | None, str | None]:
    """(this machine's calibration for `build`, or None and why none applies; (None, None) when
    nothing was ever measured here)."""
    path = profile_path(machine, settings)
    stored = _read(path)
    if stored is not None:
        return calibration_from_profile(stored, machine, build)
    if path.exists():
        return None, f"{path} is not readable JSON; re-run quantpick bench"
    # Another machine's profile (other GPUs, or a changed host) is never applied: say so.
    others = sorted(calibration_dir(settings).glob("*.json")) if path.parent.is_dir() else []
    for other in others:
        data = _read(other)
        if data is not None:
            _, why = calibration_from_profile(data, machine, build)
            return None, why or f"{other.name} was measured on another machine"
    return None, None


def save_profile(machine: Machine, entry: dict[str, Any], settings: Settings | None = None) -> Path:
    """Store `entry` (one build's measurements) in this machine's file, replacing the same build's
    earlier entry and keeping the others. Written atomically."""
    import tempfile

    path = profile_path(machine, settings)
    stored = _read(path)
    if (
        stored is None
        or stored.get("kind") != PROFILE_KIND
        or stored.get("schema_version") != PROFILE_SCHEMA
    ):
        stored = {}
    profiles = dict(stored.get("profiles", {}))
    profiles[entry["build_id"]] = entry
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
