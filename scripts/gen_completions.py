#!/usr/bin/env python3
"""Regenerate completions/quantpick.{bash,zsh,fish} from the CLI (typer's completion scripts).

The scripts ask `quantpick` itself for candidates (`_QUANTPICK_COMPLETE=complete_<shell>`), so
commands, options and model ids stay current; tests/cli/test_completions.py fails when these files
differ from what this prints, and checks that completion answers.

    python scripts/gen_completions.py            # rewrite the files
    python scripts/gen_completions.py --check    # exit 1 when a file is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELLS = ("bash", "zsh", "fish")
PROG = "quantpick"


def completion_script(shell: str) -> str:
    # typer's own templates, exactly what `_QUANTPICK_COMPLETE=source_<shell> quantpick` prints
    # (quantpick.cli.complete.source_script: no blank first line, so zsh reads `#compdef`)
    from quantpick.cli.complete import source_script

    script = source_script(shell)
    if script is None:
        raise SystemExit(f"typer has no completion script for {shell}")
    return script


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    stale = []
    for shell in SHELLS:
        path = ROOT / "completions" / f"{PROG}.{shell}"
        text = completion_script(shell)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
