"""docs/architectures.md is generated from the registry and the recorded llama.cpp projections
(scripts/gen_arch_docs.py): a family, a rule or a recording that changes without the page fails."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_architectures_page_is_current() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_arch_docs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert (ROOT / "docs" / "architectures.md").read_text() == gen_arch_docs.render(), (
        "run: python scripts/gen_arch_docs.py"
    )
