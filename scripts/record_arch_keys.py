#!/usr/bin/env python3
"""Write ARCH_KEYS in quantpick/arch/keys.py: the `<arch>.*` GGUF keys llama.cpp reads, taken from
its own table (src/llama-arch.cpp, LLM_KV_NAMES: the "%s."-prefixed entries, prefix stripped).

    python scripts/record_arch_keys.py LLAMA_CPP_SOURCE_DIR [--check]

LLAMA_CPP_SOURCE_DIR is a llama.cpp tree at the pinned build (scripts/llamacpp.pin;
scripts/build-llamacpp.sh leaves one beside the tools it builds: `<bin>/../src`).
tests/arch/test_keys.py compares keys.py with the pinned source where the tools are built.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS_PY = ROOT / "quantpick" / "arch" / "keys.py"
BEGIN = "# -- ARCH_KEYS: written by scripts/record_arch_keys.py from {pin}; do not edit --\n"
END = "# -- end of ARCH_KEYS --\n"
BLOCK = re.compile(r"# -- ARCH_KEYS: .*?# -- end of ARCH_KEYS --\n", re.DOTALL)


def arch_keys(source: str) -> list[str]:
    """The `%s.`-prefixed names of LLM_KV_NAMES, in the source's order, each once."""
    start = source.index("LLM_KV_NAMES")
    table = source[start : source.index("};", start)]
    seen: dict[str, None] = {}
    for name in re.findall(r'"%s\.([^"]+)"', table):
        seen.setdefault(name, None)
    return list(seen)


def block(keys: list[str], pin: str) -> str:
    """The ARCH_KEYS assignment: one string of names (a table, not code)."""
    body = textwrap.fill(" ".join(keys), width=96, break_on_hyphens=False)
    return (
        BEGIN.format(pin=pin) + f'ARCH_KEYS = frozenset(\n    """\n{body}\n""".split()\n)\n' + END
    )


def pin() -> str:
    """`b11312 (0c1e57098)`, from scripts/llamacpp.pin."""
    text = (ROOT / "scripts" / "llamacpp.pin").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if "=" in line and not line.startswith("#")]
    values = dict(line.split("=", 1) for line in lines)
    return f"b{values['LLAMACPP_BUILD_NUMBER']} ({values['LLAMACPP_COMMIT'][:9]})"


def rewritten(keys_py: str, keys: list[str]) -> str:
    new, n = BLOCK.subn(lambda _: block(keys, pin()), keys_py)
    if n != 1:
        raise SystemExit(f"{KEYS_PY.relative_to(ROOT)}: no ARCH_KEYS block to rewrite")
    return new


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source_dir", type=Path, help="a llama.cpp tree at the pinned build")
    parser.add_argument("--check", action="store_true", help="exit 1 if keys.py is stale")
    args = parser.parse_args()
    keys = arch_keys((args.source_dir / "src" / "llama-arch.cpp").read_text(encoding="utf-8"))
    old = KEYS_PY.read_text(encoding="utf-8")
    new = rewritten(old, keys)
    if args.check:
        if new != old:
            print(f"{KEYS_PY.relative_to(ROOT)} is stale: run this script", file=sys.stderr)
            return 1
        return 0
    KEYS_PY.write_text(new, encoding="utf-8")
    print(f"wrote ARCH_KEYS in {KEYS_PY.relative_to(ROOT)}: {len(keys)} keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
