"""Nothing outside a backend module knows CUDA (issue #31): llama.cpp's backends are a type
(quantpick/machine/backends), and the rest of the code reaches CUDA's device names, variables,
container runtime and figures through a Backend. Checked on the source (AST): no string literal
that spells "CUDA" (in any case: "cuda" as a backend key too) and no `BackendKind.CUDA` outside
quantpick/machine/backends. Docstrings and comments may cite llama.cpp's CUDA files and
behaviour; identifiers naming a llama.cpp feature (plan/speed.py's cuda_graphs) are not strings.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "quantpick"
BACKENDS = PACKAGE / "machine" / "backends"
CUDA = re.compile(r"cuda", re.IGNORECASE)


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that stand alone as statements (docstrings, attribute docs)."""
    return {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Constant)
        and isinstance(n.value.value, str)
    }


def cuda_in_code(source: str, where: str) -> list[str]:
    tree = ast.parse(source)
    docs = docstrings(tree)
    found = []
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and id(n) not in docs
            and CUDA.search(n.value)
        ):
            found.append(f"{where}:{n.lineno}: string {n.value[:60]!r}")
        elif isinstance(n, ast.Attribute) and n.attr.upper() == "CUDA":
            found.append(f"{where}:{n.lineno}: .{n.attr}")
    return found


def test_no_code_outside_the_backend_modules_says_cuda() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if BACKENDS in path.parents:
            continue
        found += cuda_in_code(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    assert found == [], "CUDA outside machine/backends:\n" + "\n".join(found)


def test_the_check_sees_strings_and_the_kind_but_not_docs_or_comments() -> None:
    flagged = cuda_in_code(
        '"""CUDA0 is cited here."""\n'
        "# CUDA_VISIBLE_DEVICES in a comment\n"
        "def f(b):\n"
        '    """ggml-cuda.cu:897 as a citation."""\n'
        '    if b.label == "CUDA":\n'
        "        return BackendKind.CUDA\n"
        '    return f"cuda{1}", backend("cuda")\n',
        "x.py",
    )
    assert [f.split(": ", 1)[1] for f in flagged] == [
        "string 'CUDA'",
        ".CUDA",
        "string 'cuda'",
        "string 'cuda'",
    ]
