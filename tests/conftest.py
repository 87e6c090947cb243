"""Shared fixtures: every test runs isolated from the user's config, tokens and colours."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QUANTPICK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("QUANTPICK_MANIFESTS", raising=False)
    monkeypatch.delenv("QUANTPICK_MODELS_DIR", raising=False)
    monkeypatch.delenv("QUANTPICK_DEBUG", raising=False)


# Fake HF/ModelScope hub + CDN (tests/fakehub.py): the `fake_hub` fixture for download, remote
# header reads, `get` and `manifest add` tests.
try:
    from fakehub import fake_hub  # noqa: E402,F401
except ImportError:  # tests/ imported as a package
    from tests.fakehub import fake_hub  # noqa: E402,F401
