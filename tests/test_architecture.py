"""The layout rules of docs/architecture.md, checked on the source (AST), not by convention.

- No import cycles between quantpick's modules (imports inside functions count too: a cycle that
  only closes at run time is still a cycle for a reader).
- One direction: nothing outside `cli/` imports `cli/`; only `cli/` imports `jobs/`.
- The planning core (`quantpick/plan/`) and the plain data it reads are pure: no I/O modules, no
  open()/print()/input(), no environment reads, and imports only from the pure set.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "quantpick"

# Modules the planning core may import: plain data and pure functions.
PURE_MODULES = {
    "quantpick.errors",
    "quantpick.units",
    "quantpick.json_view",
    "quantpick.safe_names",
    "quantpick.machine.spec",
    "quantpick.machine.backends",
    "quantpick.machine.backends.base",
    "quantpick.machine.backends.cuda",
    "quantpick.machine.backends.rocm",
    "quantpick.machine.backends.metal",
    "quantpick.machine.backends.vulkan",
    "quantpick.machine.backends.sycl",
    "quantpick.machine.backends.cpu",
    "quantpick.model.manifest",
    "quantpick.model.layout",
    "quantpick.model.ggml",
    "quantpick.model.gguf_names",
    "quantpick.model.speculative",
    "quantpick.hub.kinds",
}
# Standard-library modules that do I/O or read the environment.
IO_MODULES = {
    "os", "sys", "io", "subprocess", "socket", "pathlib", "shutil", "tempfile", "time", "random",
    "http", "urllib", "ssl", "threading", "multiprocessing", "asyncio", "glob", "platform",
    "httpx", "pynvml", "huggingface_hub", "modelscope", "rich", "typer", "click", "gguf", "numpy",
    "filelock", "platformdirs",
}  # fmt: skip
IO_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """quantpick modules imported anywhere in `path` (`from quantpick.x import y` counts as
    quantpick.x.y when that is a module, else quantpick.x)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("quantpick"):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("quantpick"):
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    # An empty package __init__ is only a namespace: importing quantpick.plan.memory "imports"
    # quantpick.plan, which says nothing about dependencies.
    return {
        name: {m for m in imports_of(path, known) if m != name and modules[m].stat().st_size > 0}
        for name, path in modules.items()
    }


def test_the_graph_is_read() -> None:
    g = graph()
    assert "quantpick.plan.memory" in g["quantpick.plan.planner"]
    assert "quantpick.plan.planner" in g["quantpick.jobs.plan"]


def test_no_import_cycles() -> None:
    g = graph()
    # Tarjan's strongly connected components: any component of two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert cycles == []


def test_only_the_cli_imports_the_cli_and_the_jobs() -> None:
    offenders = []
    for name, deps in graph().items():
        if name.startswith("quantpick.cli") or name == "quantpick.__main__":
            continue
        for dep in deps:
            if dep.startswith("quantpick.cli"):
                offenders.append(f"{name} -> {dep}")
            if dep.startswith("quantpick.jobs") and not name.startswith("quantpick.jobs"):
                offenders.append(f"{name} -> {dep}")
    assert offenders == []


def test_the_pipeline_module_is_gone() -> None:
    # one module per job (quantpick/jobs/), not one module doing them all
    assert not (PACKAGE / "pipeline.py").exists()


# The floors of docs/architecture.md, ground first: a package imports only packages on lower
# floors (and itself). The hub layer (hub/: http, hub kinds, checksums) lies below model/, which
# reads headers through it before anything is planned; fetch/ is the download stage above both.
FLOORS = (
    {
        "errors",
        "units",
        "safe_names",
        "json_view",
        "local_files",
        "process",
        "outputs",
        "config",
        "answers",
        "app_dirs",
        "",
    },
    {"arch", "hub"},
    {"model"},
    {"machine"},  # a backend's buffer rules read ggml's type sizes (model/ggml.py)
    {"plan"},
    {"fetch"},
    {"serve"},
    {"jobs"},
    {"cli"},
    {"__main__"},
)


def floor_of(module: str) -> int:
    package = module.split(".")[1] if "." in module else ""
    return next(i for i, names in enumerate(FLOORS) if package in names)


def test_every_package_has_a_floor() -> None:
    for name in all_modules():
        floor_of(name)


def test_no_arrow_runs_upward() -> None:
    upward = [
        f"{name} -> {dep}"
        for name, deps in graph().items()
        for dep in deps
        if floor_of(dep) > floor_of(name)
        or (floor_of(dep) == floor_of(name) and dep.split(".")[1:2] != name.split(".")[1:2]
            and floor_of(name) > 0)
    ]  # fmt: skip
    assert upward == []


def core_modules() -> list[str]:
    """The pure core: plan/, arch/ (architectures as data) and the plain data modules."""
    return sorted(
        m for m in all_modules() if m.startswith(("quantpick.plan.", "quantpick.arch"))
    ) + sorted(PURE_MODULES)


@pytest.mark.parametrize("module", core_modules())
def test_planning_core_is_pure(module: str) -> None:
    path = all_modules()[module]
    tree = ast.parse(path.read_text(), str(path))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            names = []
        for n in names:
            if n.split(".")[0] in IO_MODULES:
                problems.append(f"line {node.lineno}: imports {n}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in IO_CALLS:
                problems.append(f"line {node.lineno}: calls {node.func.id}()")
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
            problems.append(f"line {node.lineno}: reads the environment")
    allowed = PURE_MODULES | {
        m for m in all_modules() if m.startswith(("quantpick.plan", "quantpick.arch"))
    }
    known = set(all_modules())
    for dep in imports_of(path, known):
        if dep not in allowed and dep != "quantpick":
            problems.append(f"imports {dep}, which is not part of the pure core")
    assert problems == [], module


# ---- the top floor: a command parses, calls one job, renders ---------------------------------

MAX_COMMAND_BODY_LINES = 60


def commands() -> list[tuple[str, ast.FunctionDef]]:
    """Every CLI command: a function decorated with `<app>.command(...)` or `.callback()`."""
    found = []
    for name, path in all_modules().items():
        if not name.startswith("quantpick.cli"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef):
                continue
            for d in node.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                if isinstance(f, ast.Attribute) and f.attr in ("command", "callback"):
                    found.append((f"{name}.{node.name}", node))
    return found


def body_lines(fn: ast.FunctionDef) -> int:
    """Lines of a function's body, its docstring left out."""
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return (fn.end_lineno or fn.lineno) - body[0].lineno + 1 if body else 0


def test_commands_are_read() -> None:
    names = {n.rsplit(".", 1)[1] for n, _ in commands()}
    assert {"pick_cmd", "get_cmd", "command_cmd", "serve_cmd", "estimate_cmd"} <= names


def test_no_command_body_over_60_lines() -> None:
    long = {n: body_lines(fn) for n, fn in commands() if body_lines(fn) > MAX_COMMAND_BODY_LINES}
    assert long == {}


def test_no_private_names_imported_across_modules() -> None:
    offenders = []
    for name, path in all_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if not node.module.startswith("quantpick") or node.module == name:
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        offenders.append(f"{name} <- {node.module}.{alias.name}")
    assert offenders == []


# The core inputs a command needs are built from its options in one place each
# (quantpick/cli/groups.py): no command builds a machine, a plan request or overheads by hand.
BUILT_ONCE = {"resolve_machine", "PlanRequest", "Overheads", "PlanInputs", "ConfirmOptions"}


def test_core_inputs_are_built_only_by_the_option_groups() -> None:
    offenders = []
    for name, path in all_modules().items():
        if not name.startswith("quantpick.cli") or name == "quantpick.cli.groups":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if called in BUILT_ONCE:
                    offenders.append(f"{name}:{node.lineno} {called}(...)")
    assert offenders == []


# A module is one job a reader can hold in mind. Over this, split it along its seams (formats
# into serve/formats/, a machine's description into device specs / hardware files / resolution,
# the transfer into its lock, directory, progress and write-behind helpers, the server into
# ports, processes and records).
MAX_MODULE_LINES = 800
# Allowed over the bound, each with its reason (and an owner working on it).
LONG_MODULES: dict[str, str] = {}


def test_no_module_over_800_lines() -> None:
    long = {
        name: n
        for name, path in all_modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert {m: n for m, n in long.items() if m not in LONG_MODULES} == {}
    # an allowance that is no longer needed goes
    assert set(LONG_MODULES) <= set(long)
