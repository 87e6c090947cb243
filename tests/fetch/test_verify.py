from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from quantpick.errors import VerificationError
from quantpick.fetch.verify import format_sha256sums, hash_file, parse_sha256sums, verify_files
from quantpick.safe_names import safe_relative_name

A = "a" * 64
B = "B" * 64


def test_parse_text_and_binary_modes_and_comments() -> None:
    text = f"# made by sha256sum\n{A}  model.gguf\n\n{B} *sub/mmproj.gguf\n{A}  ./dot.gguf\r\n"
    assert parse_sha256sums(text) == {
        "model.gguf": A,
        "sub/mmproj.gguf": B.lower(),
        "dot.gguf": A,
    }


def test_format_round_trips() -> None:
    entries = {"b.gguf": A, "a/c.gguf": "0" * 64}
    assert parse_sha256sums(format_sha256sums(entries)) == entries


@pytest.mark.parametrize(
    "name",
    [
        "../evil.gguf",
        "a/../../evil",
        "/etc/passwd",
        "C:/x.gguf",
        "a\\b.gguf",
        "a\x00b",
        "a%2F..%2Fb",
        "%2e%2e/x",
        "a//b",
        "./",
        "",
    ],
)
def test_hostile_names_are_refused(name: str) -> None:
    with pytest.raises(VerificationError):
        safe_relative_name(name)
    if name:
        with pytest.raises(VerificationError):
            parse_sha256sums(f"{A}  {name}\n")


def test_plain_subfolders_are_fine() -> None:
    assert safe_relative_name("BF16/m-00001-of-00002.gguf") == "BF16/m-00001-of-00002.gguf"


@pytest.mark.parametrize(
    "line",
    [f"{A[:63]}  x.gguf", f"{A} x.gguf", f"{A}  ", f"\\{A}  a\\nb", f"{A}\tx.gguf"],
)
def test_malformed_lines_are_refused(line: str) -> None:
    with pytest.raises(VerificationError):
        parse_sha256sums(line + "\n")


def test_one_name_with_two_hashes_is_refused() -> None:
    with pytest.raises(VerificationError, match="twice"):
        parse_sha256sums(f"{A}  x.gguf\n{'c' * 64}  x.gguf\n")


def test_hash_file_matches_hashlib(tmp_path: Path) -> None:
    data = bytes(range(256)) * 9000  # > 2 chunks of the reused buffer when chunk_size is small
    path = tmp_path / "f"
    path.write_bytes(data)
    assert hash_file(path, chunk_size=4096) == hashlib.sha256(data).hexdigest()


def test_verify_files_reports_ok_mismatch_missing(tmp_path: Path) -> None:
    good, bad = b"GGUF good", b"GGUF bad"
    (tmp_path / "sub").mkdir()
    (tmp_path / "good.gguf").write_bytes(good)
    (tmp_path / "sub" / "bad.gguf").write_bytes(bad)
    expected = {
        "good.gguf": hashlib.sha256(good).hexdigest(),
        "sub/bad.gguf": hashlib.sha256(b"something else").hexdigest(),
        "missing.gguf": A,
    }
    result = verify_files(tmp_path, expected, workers=2)
    status = {f.name: f.status for f in result.files}
    assert status == {"good.gguf": "ok", "sub/bad.gguf": "mismatch", "missing.gguf": "missing"}
    assert not result.ok
    assert [f.name for f in result.mismatched] == ["sub/bad.gguf"]
    assert len(result.checked) == 2


def test_verify_files_ignores_missing_like_sha256sum(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"x")
    result = verify_files(tmp_path, {"x": hashlib.sha256(b"x").hexdigest(), "y": A})
    assert result.ok
