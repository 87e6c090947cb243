"""Import hygiene: the CLI and the pure core must not pull in NVML, HTTP or hub SDKs at import.

Each check runs in a fresh interpreter, since this test process has imported everything already.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("pynvml", "httpx", "huggingface_hub", "modelscope")


def imported_after(statement: str) -> list[str]:
    code = f"import sys; {statement}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_cli_imports_no_heavy_module() -> None:
    assert imported_after("import quantpick.cli") == []


def test_describe_and_hardware_import_no_heavy_module() -> None:
    # hardware imports pynvml only inside probe_gpus(); describe only calls it for a real probe.
    assert imported_after("import quantpick.machine.describe, quantpick.machine.probe") == []


PURE = (
    "quantpick.plan.planner",
    "quantpick.plan.memory",
    "quantpick.plan.speed",
    "quantpick.model.layout",
    "quantpick.model.manifest",
    "quantpick.model.ggml",
    "quantpick.model.gguf_names",
    "quantpick.machine.spec",
    "quantpick.safe_names",
    "quantpick.serve.command",
    "quantpick.hub.verify",
    "quantpick.jobs.plan",
    "quantpick.jobs.get",
    "quantpick.jobs.serve",
    "quantpick.jobs.confirm",
    "quantpick.jobs.dry_run",
    "quantpick.jobs.bench",
)


@pytest.mark.parametrize("module", PURE)
def test_pure_core_imports_no_heavy_module(module: str) -> None:
    assert importlib.util.find_spec(module) is not None
    # numpy/gguf too: the planner reads nothing through them
    libs = ("numpy", "gguf", "rich", "typer")
    code = f"import sys, {module}; print([m for m in {libs!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", module
    assert imported_after(f"import {module}") == []


def test_described_probe_never_imports_pynvml() -> None:
    statement = (
        "from quantpick.machine.describe import resolve_machine; "
        "resolve_machine(gpus=['3090', 't4'])"
    )
    assert imported_after(statement) == []


def modules_loaded_by(args: list[str], home: str) -> set[str]:
    """quantpick's modules (and rich) in sys.modules after `quantpick ARGS` runs to its end."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.__stderr__.write('LOADED=' + ','.join(m for m in "
        "sys.modules if m.startswith(('quantpick', 'rich'))) + '\\n'))\n"
        f"sys.argv = ['quantpick', *{args!r}]\n"
        "from quantpick.cli import main\n"
        "main()\n"
    )
    env = {**os.environ, "QUANTPICK_HOME": home, "NO_COLOR": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)  # fmt: skip
    line = next(x for x in out.stderr.splitlines() if x.startswith("LOADED="))
    return set(line.removeprefix("LOADED=").split(","))


# benchmarks/startup.py's goal row: a described machine, from the manifest, offline
GOAL = ["pick", "qwen3.8-35b-a3b-distill", "-c", "32768", "--gpu", "3090", "--gpu", "t4",
        "--ram", "64G", "--offline"]  # fmt: skip


def test_help_loads_no_planning_and_no_rich(tmp_path: Path) -> None:
    loaded = modules_loaded_by(["--help"], str(tmp_path))
    assert "quantpick.cli" in loaded
    heavy = ("quantpick.plan", "quantpick.machine.describe", "rich", "quantpick.serve.formats.")
    assert not {m for m in loaded if m.startswith(heavy)}
    assert "quantpick.answers" not in loaded  # only the planning commands replay answers


def test_only_the_planning_commands_load_the_answer_store(tmp_path: Path) -> None:
    probe = modules_loaded_by(["probe", "--json", "--gpu", "3090"], str(tmp_path))
    assert "quantpick.answers" not in probe
    assert "quantpick.answers" in modules_loaded_by(GOAL, str(tmp_path))


def test_a_described_pick_loads_only_what_it_uses(tmp_path: Path) -> None:
    """Start-up time: a plan for a described machine reads no hardware file, runs no llama.cpp
    dry run (it projects this box, not the described one), reads no calibration profile (they
    are this machine's) and fetches nothing."""
    loaded = modules_loaded_by(GOAL, str(tmp_path))
    assert "quantpick.plan.planner" in loaded
    unused = {
        "quantpick.machine.hardware_file", "quantpick.jobs.confirm", "quantpick.jobs.dry_run",
        "quantpick.serve.calibration", "quantpick.hub.http", "quantpick.fetch.transfer",
        "quantpick.serve.formats.base",
        "quantpick.model.gguf",  # the GGUF reader: a synthesized table reads no header
    }  # fmt: skip
    assert loaded & unused == set()
