"""`quantpick calibration list|show|reset`: the calibration profiles `bench` stored.

Usage:
    quantpick calibration list              # every stored entry, and whether it applies here
    quantpick calibration show --json       # this machine's profile file as stored
    quantpick calibration reset             # remove this machine's profile (--all: every one)

`pick`, `estimate`, `max-context`, `get`, `command` and `confirm` take `--no-calibration` to
plan without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.cli.core import command_group
from quantpick.cli.option_blocks import takes

if TYPE_CHECKING:
    from quantpick.machine.spec import Machine

calibration_app = command_group(
    "calibration", "Show or remove the calibration profiles `quantpick bench` stored."
)


def _this_machine() -> Machine:
    from quantpick.machine.probe import probe

    return probe(inspect_server=False)


def _entry_rows(path: Path, doc: dict[str, Any] | None, here: str) -> list[dict[str, Any]]:
    """One row per stored entry (or one for an unreadable file), with why it cannot be used."""
    from quantpick.plan.calibration import (
        PROFILE_KIND,
        PROFILE_SCHEMA,
        entry_scope,
        plausibility_problems,
    )

    key = path.stem
    base = {"machine_key": key, "this_machine": key == here, "path": str(path)}
    if doc is None or doc.get("kind") != PROFILE_KIND:
        return [{**base, "entry": None, "problem": "not a readable calibration file"}]
    if doc.get("schema_version") != PROFILE_SCHEMA:
        problem = "written by another quantpick version (no scope, never applied)"
        return [{**base, "entry": None, "problem": problem}]
    rows = []
    profiles = doc.get("profiles")
    for entry in profiles if isinstance(profiles, list) else []:
        if not isinstance(entry, dict):
            continue
        scope = entry_scope(entry)
        problems = plausibility_problems(entry)
        rows.append(
            {
                **base,
                "entry": {
                    "build": entry.get("build_label") or scope.build,
                    "build_id": scope.build,
                    "date": entry.get("date"),
                    "tool": entry.get("tool"),
                    "model": entry.get("model"),
                    "quant": entry.get("quant"),
                    "model_bytes": scope.model_bytes,
                    "size_class": scope.size_class,
                    "devices": list(scope.devices),
                    "ratios": entry.get("ratios"),
                },
                "problem": problems[0] if problems else None,
            }
        )
    return rows


@calibration_app.command("list")
@takes("json_")
def list_cmd(**given: Any) -> None:
    """Every stored calibration entry: machine, build, model, devices, ratios."""
    from rich.table import Table

    from quantpick.cli import output
    from quantpick.plan.calibration import machine_key
    from quantpick.serve.calibration import calibration_dir, list_profiles
    from quantpick.units import human

    here = machine_key(_this_machine())
    rows = [row for path, doc in list_profiles() for row in _entry_rows(path, doc, here)]
    memory = _memory_rows(here)
    if given["json_"]:
        output.print_json({"directory": str(calibration_dir()), "entries": rows,
                           "memory": memory})  # fmt: skip
        return
    _print_memory(memory)
    if not rows:
        output.note(f"No calibration stored ({calibration_dir()}); `quantpick bench` makes one.")
        return
    table = Table(title=f"Calibration profiles in {calibration_dir()}", title_justify="left",
                  pad_edge=False)  # fmt: skip
    for col in ("machine", "build", "date", "model", "devices", "decode x", "prefill x", "state"):
        table.add_column(col)
    for row in rows:
        machine = row["machine_key"] + (" (this one)" if row["this_machine"] else "")
        e = row["entry"]
        state = row["problem"] or ("stored" if row["this_machine"] else "another machine")
        if e is None:
            table.add_row(machine, "-", "-", "-", "-", "-", "-", state)
            continue
        ratios = e["ratios"] if isinstance(e["ratios"], dict) else {}
        decode = "/".join(_ratio(ratios.get(k)) for k in ("decode_empty", "decode_depth"))
        model = " ".join(str(x) for x in (e["model"], e["quant"]) if x)
        model += f" ({human(e['model_bytes'])})" if e["model_bytes"] else ""
        devices = f"{len(e['devices'])} device(s)" if e["devices"] else "host only"
        table.add_row(machine, str(e["build"]), str(e["date"]), model, devices, decode,
                      _ratio(ratios.get("prefill")), state)  # fmt: skip
    output.stdout().print(table)


def _memory_rows(here: str) -> list[dict[str, Any]]:
    """One row per learned compute calibration (quantpick check --learn)."""
    from quantpick.plan.memory_calibration import MEMORY_KIND, entry_problems, usable_ratios
    from quantpick.serve.calibration import list_memory_profiles

    rows: list[dict[str, Any]] = []
    for path, doc in list_memory_profiles():
        base = {"machine_key": path.stem, "this_machine": path.stem == here, "path": str(path)}
        entries = doc.get("entries") if doc and doc.get("kind") == MEMORY_KIND else None
        if not isinstance(entries, list):
            rows.append({**base, "entry": None, "problem": "not a readable calibration file"})
            continue
        for entry in entries:
            problems = entry_problems(entry)
            ok = isinstance(entry, dict) and not problems
            rows.append(
                {
                    **base,
                    "entry": {
                        "build_id": entry.get("build_id"),
                        "date": entry.get("date"),
                        "model": entry.get("model"),
                        "model_bytes": entry.get("model_bytes"),
                        "devices": entry.get("devices"),
                        "compute_ratios": dict(usable_ratios(entry)) if ok else {},
                    }
                    if isinstance(entry, dict)
                    else None,
                    "problem": problems[0] if problems else None,
                }
            )
    return rows


def _print_memory(rows: list[dict[str, Any]]) -> None:
    from quantpick.cli import output

    for row in rows:
        e = row["entry"]
        where = row["machine_key"] + (" (this one)" if row["this_machine"] else "")
        if e is None or row["problem"]:
            output.note(f"Memory calibration {where}: {row['problem']}")
            continue
        ratios = ", ".join(f"{d} x{r:.2f}" for d, r in e["compute_ratios"].items())
        output.note(f"Memory calibration {where}: compute {ratios} (build {e['build_id']}, "
                    f"{e['model']}, {e['date']}; quantpick check --learn)")  # fmt: skip


def _ratio(value: object) -> str:
    if isinstance(value, float) or (isinstance(value, int) and abs(value) < 10**300):
        return f"{value:.3g}"
    return "-"


@calibration_app.command("show")
@takes("json_")
def show_cmd(**given: Any) -> None:
    """This machine's profile file, as stored (JSON)."""
    import json

    from quantpick.cli import output
    from quantpick.errors import QuantpickError
    from quantpick.serve.calibration import profile_path, read_profile

    path = profile_path(_this_machine())
    doc = read_profile(path)
    if doc is None:
        what = "is not a readable calibration file" if path.exists() else "does not exist"
        raise QuantpickError(
            f"no calibration for this machine: {path} {what}",
            hint="`quantpick bench` measures and stores one; `quantpick calibration list` "
            "shows every stored one",
        )
    if given["json_"]:
        output.print_json({"path": str(path), "profile": doc})
        return
    output.note(f"{path}:")
    import sys

    sys.stdout.write(json.dumps(doc, indent=1, default=str) + "\n")


@calibration_app.command("reset")
@takes("all_ json_")
def reset_cmd(**given: Any) -> None:
    """Remove this machine's calibration (later answers are uncalibrated until the next bench)."""
    from quantpick.cli import output
    from quantpick.serve.calibration import (
        list_memory_profiles,
        list_profiles,
        memory_path,
        profile_path,
        remove_profiles,
    )

    if given["all_"]:
        paths = [p for p, _ in (*list_profiles(), *list_memory_profiles())]
    else:
        machine = _this_machine()
        paths = [profile_path(machine), memory_path(machine)]
    removed = remove_profiles(paths)
    if given["json_"]:
        output.print_json({"removed": [str(p) for p in removed]})
        return
    if not removed:
        output.note("No calibration to remove.")
    for path in removed:
        output.note(f"Removed {path}")
