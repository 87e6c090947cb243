"""quantpick.model.from_repo.build_manifest on the fake hub: what `manifest add` says about a
repository whose checksums file or listing is odd (the CLI side is tests/cli/test_cli_manifests.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fakehub import FakeHub
from gguf_fixtures import TINY, write_gguf

from quantpick.config import load_settings
from quantpick.hub.verify import CHECKSUMS_MAX_BYTES
from quantpick.model.from_repo import build_manifest


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("repo") / "Tiny-Q8_0.gguf"
    write_gguf(path, TINY)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(repo: str) -> object:
    return build_manifest(
        repo, kind="hf", revision=None, manifest_id=None, settings=load_settings()
    )


def test_disagreeing_hashes_are_shown_whole(fake_hub: FakeHub, model: Path) -> None:
    # Two hashes that share their first 12 characters: prefixes would look identical.
    real = _sha(model)
    other = real[:12] + ("0" if real[12] != "0" else "1") + real[13:]
    sums = f"{other}  {model.name}\n".encode()
    fake_hub.add_repo("org/Tiny-GGUF", {model.name: model, "SHA256SUMS": sums})
    new = build("org/Tiny-GGUF")
    (warning,) = [w for w in new.warnings if "keeping the listing's" in w]
    assert other in warning and real in warning


def test_a_sha256sums_over_the_cap_does_not_fail_the_add(fake_hub: FakeHub, model: Path) -> None:
    lines = [f"{_sha(model)}  {model.name}\n"]
    lines += [f"{'0' * 64}  pad/{i:08d}.bin\n" for i in range(CHECKSUMS_MAX_BYTES // 80 + 10)]
    sums = "".join(lines).encode()
    assert len(sums) > CHECKSUMS_MAX_BYTES  # 8 MiB; the old 1 MiB cap failed the whole add
    fake_hub.add_repo("org/Tiny-GGUF", {model.name: model, "SHA256SUMS": sums})
    new = build("org/Tiny-GGUF")
    assert new.checksums_file is None
    assert any("larger than" in w for w in new.warnings)
    assert _sha(model) in new.toml  # the listing still gives the hash


def test_a_sha256sums_just_over_the_old_cap_is_used(fake_hub: FakeHub, model: Path) -> None:
    lines = [f"{_sha(model)}  {model.name}\n"]
    lines += [f"{'0' * 64}  pad/{i:08d}.bin\n" for i in range(1024 * 1024 // 80 + 10)]
    fake_hub.add_repo("org/Tiny-GGUF", {model.name: model, "SHA256SUMS": "".join(lines).encode()})
    assert build("org/Tiny-GGUF").checksums_file == "SHA256SUMS"


def test_refused_listing_names_are_reported(fake_hub: FakeHub, model: Path) -> None:
    fake_hub.add_repo(
        "org/Tiny-GGUF", {model.name: model, "../up.gguf": b"GGUF", "z" * 300 + ".gguf": b"G"}
    )
    new = build("org/Tiny-GGUF")
    (warning,) = [w for w in new.warnings if "will not write" in w]
    assert "2 file name(s)" in warning and "'../up.gguf'" in warning
    assert "../up.gguf" not in new.toml
