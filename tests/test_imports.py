"""Import hygiene: the CLI and the pure core must not pull in NVML, HTTP or hub SDKs at import.

Each check runs in a fresh interpreter, since this test process has imported everything already.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

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
