"""A hub whose GGUF contradicts the manifest (another block count, a size off by orders of
magnitude): `pick` and `get` say so in one line each, the same lines, and plan on the header."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from fakehub import FakeHub
from gguf_fixtures import TINY, write_gguf
from typer.testing import CliRunner

from quantpick.cli import app
from quantpick.model.headers import manifest_contradictions

runner = CliRunner()
REPO = "org/Tiny-GGUF"


@pytest.fixture
def stale_manifest(fake_hub: FakeHub, tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    path = root / "Tiny-Q8_0.gguf"
    write_gguf(path, TINY, big="Q8_0", data="random")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (root / "SHA256SUMS").write_text(f"{digest}  {path.name}\n")
    fake_hub.add_repo(REPO, {path.name: path, "SHA256SUMS": root / "SHA256SUMS"})
    added = runner.invoke(app, ["manifest", "add", REPO, "--id", "tiny", "--json"])
    assert added.exit_code == 0, added.stderr
    written = Path(json.loads(added.stdout)["path"])
    text = written.read_text()
    # the manifest as if written for another model: 4 more blocks, a file 1000x the size
    blocks = int(re.search(r"^block_count = (\d+)", text, re.M).group(1))  # type: ignore[union-attr]
    size = int(re.search(r"^size_bytes = (\d+)", text, re.M).group(1))  # type: ignore[union-attr]
    text = re.sub(r"^block_count = \d+", f"block_count = {blocks + 4}", text, flags=re.M)
    text = re.sub(r"^size_bytes = \d+", f"size_bytes = {size * 1000}", text, flags=re.M)
    text = re.sub(r"^size_exact = true", "size_exact = false", text, flags=re.M)
    written.write_text(text)
    return written


def _notes(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "the manifest" in ln and "hub's GGUF header" in ln]


def test_pick_and_get_say_the_same_one_line_each(stale_manifest: Path, tmp_path: Path) -> None:
    args = ["tiny", "-c", "4096", "--no-confirm", "--exact"]
    pick = runner.invoke(app, ["pick", *args])
    assert pick.exit_code == 0, pick.stderr
    notes = _notes(pick.stderr)
    assert len(notes) == 2, pick.stderr
    assert "blocks, the manifest" in notes[0] and "GiB of weights, the manifest says" in notes[1]
    get = runner.invoke(app, ["get", *args, "--dry-run", "--dir", str(tmp_path / "m")])
    assert get.exit_code == 0, get.stderr
    assert _notes(get.stderr) == notes


def test_an_agreeing_manifest_says_nothing(fake_hub: FakeHub, tmp_path: Path) -> None:
    path = tmp_path / "Tiny-Q8_0.gguf"
    write_gguf(path, TINY, big="Q8_0", data="random")
    fake_hub.add_repo(REPO, {path.name: path})
    added = runner.invoke(app, ["manifest", "add", REPO, "--id", "tiny"])
    assert added.exit_code == 0, added.stderr
    pick = runner.invoke(app, ["pick", "tiny", "-c", "4096", "--no-confirm", "--exact"])
    assert pick.exit_code == 0, pick.stderr
    assert _notes(pick.stderr) == []


def test_a_synthesized_layout_contradicts_nothing() -> None:
    from quantpick.model.layout import synthesize_layout
    from quantpick.model.registry import find_manifest

    m = find_manifest("qwen3.8-35b-a3b-distill")
    size = sum(f.size_bytes for f in m.quant_files("Q4_K_M"))
    assert (
        manifest_contradictions(m, "Q4_K_M", synthesize_layout(m.architecture, "Q4_K_M", size))
        == []
    )
