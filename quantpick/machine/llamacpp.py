"""The llama-server binary: where it is and which build it is (`--version` parsing is pure).

`llama-server --version` prints, on stderr (llama.cpp `common/build-info.cpp.in`):
    version: 0.5.0-dev (build 1, commit 0c1e570)      # semver-era builds
    version: 7988 (7f5f5119b)                          # older builds: b-number and hash
followed by a "built with ..." line.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from quantpick.machine.spec import LlamaServer

VERSION_TIMEOUT_S = 5.0
# `--version` prints two lines (~150 bytes) and, on GPU builds, one line per device found.
VERSION_CAP = 64 * 1024

_NEW_FORM = re.compile(
    r"version:\s*(?P<version>[^\s(]+)\s*\(\s*build\s+(?P<build>\d+)\s*,\s*commit\s+(?P<commit>[0-9a-fA-F]+)\s*\)"
)
_OLD_FORM = re.compile(r"version:\s*(?P<build>\d+)\s*\(\s*(?P<commit>[0-9a-fA-F]+)\s*\)")
# The compact build_info form ("b7988-7f5f5119b") seen in User-Agent and /props.
_COMPACT_FORM = re.compile(r"\bb(?P<build>\d+)-(?P<commit>[0-9a-fA-F]{6,})\b")


def parse_version_output(text: str) -> tuple[str | None, int | None, str | None]:
    """(version, build, commit) from `llama-server --version` output; Nones when absent.

    version is the semver string of new builds ("0.5.0-dev"); old builds have none.
    """
    match = _NEW_FORM.search(text)
    if match:
        return match["version"], int(match["build"]), match["commit"].lower()
    for pattern in (_OLD_FORM, _COMPACT_FORM):
        match = pattern.search(text)
        if match:
            return None, int(match["build"]), match["commit"].lower()
    return None, None, None


def find_llama_server(path: Path | None = None) -> Path | None:
    """The given path if it exists (or names a program on PATH), else `llama-server` on PATH."""
    if path is not None:
        if path.exists():
            return path
        found = shutil.which(str(path))
        return Path(found) if found else None
    found = shutil.which("llama-server")
    return Path(found) if found else None


def inspect_llama_server(path: Path, *, timeout_s: float = VERSION_TIMEOUT_S) -> LlamaServer:
    """Run `path --version` and read its build; any failure is reported in `error`, not raised.
    Bounded (quantpick.process): its own process group, capped output, killed at the deadline."""
    from quantpick.process import printable, run_tool

    try:
        proc = run_tool([str(path), "--version"], timeout_s=timeout_s, stdout_cap=VERSION_CAP)
    except FileNotFoundError:
        return LlamaServer(path=str(path), error="not found")
    except PermissionError:
        return LlamaServer(path=str(path), error="not executable")
    except OSError as exc:
        return LlamaServer(path=str(path), error=f"cannot run: {exc.strerror or exc}")
    if proc.timed_out:
        return LlamaServer(path=str(path), error=f"--version did not finish in {timeout_s:g} s")
    # New builds print to stderr, the combined `llama` app to stdout: read both.
    text = f"{proc.stdout}\n{proc.stderr}"
    version, build, commit = parse_version_output(text)
    if build is None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        what = f"exit {proc.returncode}" if proc.returncode else "no version line"
        if proc.overflowed:
            what = "more than 64 KiB of output"
        return LlamaServer(
            path=str(path), error=f"cannot read --version ({what}): {printable(first)[:120]!r}"
        )
    return LlamaServer(path=str(path), version=version, build=build, commit=commit)
