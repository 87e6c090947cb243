from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from quantpick.errors import VerificationError
from quantpick.hub.verify import (
    format_sha256sums,
    hash_file,
    parse_sha256sums,
    read_sha256sums,
    verify_files,
)
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


# -- lenient reading: check what can be checked, report the rest ---------------------------------


def test_a_5000_character_name_is_one_refused_line_not_a_crash(tmp_path: Path) -> None:
    long_name = "d/" * 2499 + "x.gguf"  # 5,004 characters, every component short
    long_component = "y" * 300 + ".gguf"
    text = f"{A}  ok.gguf\n{A}  {long_name}\n{B}  {long_component}\n{'c' * 64}  also.gguf\n"
    parsed = read_sha256sums(text)
    assert parsed.entries == {"ok.gguf": A, "also.gguf": "c" * 64}
    assert parsed.refused_lines == 2
    assert parsed.problems[0].startswith("SHA256SUMS line 2: refusing file name")
    assert "more than the 3072 bytes" in parsed.problems[0]
    assert (
        parsed.problems[1].startswith("SHA256SUMS line 3:")
        and "305-byte component" in (parsed.problems[1])
    )
    assert all(len(p) < 400 for p in parsed.problems)  # the name is shown cut, with its length
    with pytest.raises(VerificationError, match="line 2.*and 1 more refused"):
        parse_sha256sums(text)


def test_file_and_folder_of_the_same_name_are_both_refused() -> None:
    parsed = read_sha256sums(f"{A}  a.gguf\n{B}  a.gguf/b.gguf\n{A}  c.gguf\n")
    assert parsed.entries == {"c.gguf": A}
    assert parsed.refused_lines == 2
    assert "both as a file and as a folder" in parsed.problems[0]


def test_verify_cli_checks_the_rest_and_reports_the_bad_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import quantpick.cli.download  # noqa: F401 - registers the commands
    from quantpick.cli import app

    (tmp_path / "ok.gguf").write_bytes(b"fine")
    digest = hashlib.sha256(b"fine").hexdigest()
    (tmp_path / "SHA256SUMS").write_text(f"{digest}  ok.gguf\n{A}  {'z' * 5000}.gguf\n")
    result = CliRunner().invoke(app, ["verify", str(tmp_path)])
    assert result.exit_code == 4
    assert result.stdout == "ok.gguf: OK\n"  # the good line was checked
    assert "SHA256SUMS line 2: refusing file name" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr) < 1000
