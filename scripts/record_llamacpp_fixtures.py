#!/usr/bin/env python3
"""Record the llama.cpp outputs the unit tests read, from the pinned build (scripts/llamacpp.pin).

    scripts/record_llamacpp_fixtures.py --bin "$(scripts/build-llamacpp.sh | tail -1)"

Writes tests/data/llama-server-help-current.txt and llama-server-version-current.txt, each with a
header naming the build they came from. The conformance grid (llama-fit-params) is recorded by
scripts/record_conformance.py; the confirm/bench fixtures by the scripts of those features.
"""

from __future__ import annotations

import argparse
import subprocess
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def read_pin() -> dict[str, str]:
    pin: dict[str, str] = {}
    for line in (ROOT / "scripts" / "llamacpp.pin").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            pin[key] = value
    return pin


def pin_label(pin: dict[str, str]) -> str:
    build, commit = pin["LLAMACPP_BUILD_NUMBER"], pin["LLAMACPP_COMMIT"][:9]
    sdist = f"{pin['LLAMACPP_SDIST_NAME']} {pin['LLAMACPP_SDIST_VERSION']}"
    return (
        f"llama.cpp b{build} (commit {commit}), the tree vendored in {sdist}, "
        "CPU + RPC build by scripts/build-llamacpp.sh"
    )


def run(binary: Path, *args: str) -> str:
    proc = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, check=False
    )
    return proc.stdout + proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, required=True, help="directory of the built tools")
    opts = parser.parse_args()
    pin = read_pin()
    server = opts.bin / "llama-server"
    today = date.today().isoformat()
    help_text = run(server, "--help")
    version_text = run(server, "--version")
    if f"build {pin['LLAMACPP_BUILD_NUMBER']}" not in version_text:
        raise SystemExit(f"{server} is not the pinned build: {version_text.strip()}")
    (DATA / "llama-server-help-current.txt").write_text(
        f"# Recorded: `llama-server --help` (stdout+stderr) of {pin_label(pin)}, on {today}.\n"
        "# Lines starting with '#' are this header, not llama-server output.\n" + help_text
    )
    (DATA / "llama-server-version-current.txt").write_text(
        f"# Recorded: `llama-server --version` (stdout+stderr) of {pin_label(pin)}, on {today}.\n"
        + version_text
    )
    print(f"recorded help and version of {version_text.splitlines()[0]}")


if __name__ == "__main__":
    main()
