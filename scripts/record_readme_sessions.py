"""Re-record the README's offline sessions: every `$ quantpick ...` line in a ```console block
that runs offline (`--offline`, or a described machine with a bundled manifest) is run again and
the output under it replaced, at the width the README's tables are printed (COLUMNS=100), with
trailing blanks removed. Where the README shortens an output with a `(... ...)` line, the new
output is cut at the line above it. `--check` only lists the sessions whose output moved (exit 1).

    python scripts/record_readme_sessions.py --check
    python scripts/record_readme_sessions.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
WIDTH = "100"


def sessions(lines: list[str]) -> list[tuple[int, int]]:
    """(index of the `$` line, index after its output) for each offline session."""
    out = []
    in_console = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_console = line.strip() == "```console" and not in_console
            continue
        if in_console and line.startswith("$ quantpick ") and "--offline" in line:
            end = i + 1
            while not lines[end].startswith(("$ ", "```")):
                end += 1
            out.append((i, end))
    return out


def run(command: str) -> list[str]:
    env = dict(os.environ, COLUMNS=WIDTH, NO_COLOR="1", TERM="dumb")
    done = subprocess.run(
        command, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    return [ln.rstrip() for ln in done.stdout.splitlines()]


def _key(line: str) -> str:
    return line[:16]


def rerecorded(old: list[str], new: list[str]) -> list[str]:
    """The new output shaped as the README shows the old one (the notes it shows): cut above a
    `(...` line; a table
    session up to the line that ended it; an excerpt (a few lines of a longer output) line by
    line, each the new line that starts as the old one did."""
    shown = {_key(ln) for ln in old}
    new = [ln for ln in new if not ln.startswith("Note: ") or _key(ln) in shown]  # as shown
    cut = next((k for k, ln in enumerate(old) if ln.startswith("(...")), None)
    if cut is not None:
        above = old[cut - 1] if cut else None
        if above is not None:
            at = [k for k, ln in enumerate(new) if _key(ln) == _key(above)]
            if at:
                return new[: at[0] + 1] + old[cut:]
        return new
    if any(ln.startswith("\u250f") for ln in old):  # a table: the session as printed
        last = [k for k, ln in enumerate(new) if old and _key(ln) == _key(old[-1])]
        return new[: last[-1] + 1] if last else new
    out, pos = [], 0
    for line in old:
        at = next((k for k in range(pos, len(new)) if _key(new[k]) == _key(line)), None)
        if at is None:
            out.append(line)
        else:
            out.append(new[at])
            pos = at + 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    lines = README.read_text().split("\n")
    moved = 0
    for start, end in reversed(sessions(lines)):
        old = lines[start + 1 : end]
        new = rerecorded(old, run(lines[start][2:]))
        if new != old:
            moved += 1
            print(f"README.md:{start + 1}: {lines[start][2:]}")
            lines[start + 1 : end] = new
    if not args.check:
        README.write_text("\n".join(lines))
    return 1 if moved and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
