"""quantpick.outputs: the one policy for every file quantpick writes (issue #26, "Writes")."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantpick.outputs import (
    EXISTING_MAX_BYTES,
    Authorship,
    LocalFileError,
    NotReplaceable,
    OutputRefused,
    authorship,
    check_output,
    create_new,
    open_log,
    stamp,
    write_atomic,
    write_output,
)


def test_write_atomic_never_replaces_a_fifo_or_a_directory(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotReplaceable, match="is a FIFO, never written over"):
        write_atomic(fifo, b"x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    folder = tmp_path / "dir"
    folder.mkdir()
    with pytest.raises(NotReplaceable, match="is a directory"):
        write_atomic(folder, b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "fifo"]  # no temp file left


def test_write_atomic_replaces_a_link_not_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    link = tmp_path / "cache.json"
    link.symlink_to(victim)
    write_atomic(link, b"ours", durable=False)
    assert not link.is_symlink() and link.read_bytes() == b"ours"
    assert victim.read_text() == "theirs"


def test_create_new_never_follows_a_dangling_link(tmp_path: Path) -> None:
    planted = tmp_path / "CACHEDIR.TAG"
    planted.symlink_to(tmp_path / "created-elsewhere")
    assert create_new(planted, b"tag") is False
    assert not (tmp_path / "created-elsewhere").exists()
    assert create_new(tmp_path / "fresh", b"tag") is True


def test_an_existing_output_is_read_bounded_and_never_blocks(tmp_path: Path) -> None:
    huge = tmp_path / "huge.ini"
    with open(huge, "wb") as f:
        f.truncate(EXISTING_MAX_BYTES + 1)  # sparse: no disk used
    with pytest.raises(OutputRefused, match="is larger than"):
        check_output(huge, "--preset")
    fifo = tmp_path / "fifo.ini"
    os.mkfifo(fifo)
    box: dict[str, BaseException] = {}

    def read() -> None:
        try:
            check_output(fifo, "--preset", force=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["error"] = exc

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and isinstance(box["error"], OutputRefused)


def test_backups_are_never_overwritten_nor_written_through(tmp_path: Path) -> None:
    path = tmp_path / "Modelfile"
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "Modelfile.bak.1").symlink_to(victim)  # planted: a taken name, skipped
    versions = [f"version {n}\n".encode() for n in range(5)]
    path.write_bytes(versions[0])
    backups = []
    for new in versions[1:]:
        written = write_output(path, new, check_output(path, "--modelfile"), "the Modelfile")
        assert written.backup is not None
        backups.append(written.backup.name)
    assert backups == ["Modelfile.bak", "Modelfile.bak.2", "Modelfile.bak.3", "Modelfile.bak.4"]
    kept = [(tmp_path / name).read_bytes() for name in backups]
    assert kept == versions[:-1] and path.read_bytes() == versions[-1]
    assert victim.read_text() == "keep"
    # the same bytes again: nothing written, no backup
    again = write_output(path, versions[-1], check_output(path, "--modelfile"), "the Modelfile")
    assert not again.changed and again.backup is None


def test_open_log_appends_to_its_own_file_only(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    for line in (b"one\n", b"two\n"):
        fd = open_log(log, append=True)
        os.write(fd, line)
        os.close(fd)
    assert log.read_bytes() == b"one\ntwo\n"
    link = tmp_path / "b.log"
    link.symlink_to(log)
    with pytest.raises(LocalFileError, match="is a symbolic link"):
        open_log(link, append=True)
    assert log.read_bytes() == b"one\ntwo\n"


LINES = st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=30),
                 min_size=1, max_size=12)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(body=LINES, where=st.integers(min_value=0, max_value=11), extra=st.text(min_size=1))
def test_any_edit_makes_it_the_users_and_blanks_do_not(
    body: list[str], where: int, extra: str
) -> None:
    lines = [stamp(";", body), *body]
    assert authorship(lines) is Authorship.QUANTPICK
    # re-indented, other line endings, blank lines added: still quantpick's, unchanged
    assert authorship([f"  {line}\r" for line in lines] + ["", "   "]) is Authorship.QUANTPICK
    # an edit to any line (one that is not blank around what it adds) is the user's now
    edited = list(lines)
    i = 1 + where % len(body)
    if not (edited[i] + extra).strip() or (edited[i] + extra).strip() == edited[i].strip():
        return
    edited[i] = edited[i] + extra
    assert authorship(edited) is Authorship.EDITED
    assert authorship(body) is Authorship.USER  # no stamp at all


def _tree(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every entry under `root`: its kind and bytes (a link: its target; a FIFO: nothing)."""
    out: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                out[str(path)] = ("link", os.readlink(path).encode())
            elif stat.S_ISREG(info.st_mode):
                out[str(path)] = ("file", path.read_bytes())
            else:
                out[str(path)] = (stat.filemode(info.st_mode)[0], b"")
    return out


def test_as_root_nothing_outside_the_named_paths_is_written(tmp_path: Path) -> None:
    """Every output option aimed at a hostile path (a link to a file elsewhere, a link to
    /dev/zero, a FIFO, a planted .bak link), with and without --force: outside the paths named
    on the command line and their new backups, not one byte changes."""
    import sys

    from typer.testing import CliRunner

    from quantpick.cli import app

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tiny_model import write_tiny_model

    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("victim.conf", "secret", "bak-target"):
        (outside / name).write_text(f"{name}: not quantpick's\n")
    work = tmp_path / "work"
    work.mkdir()
    model = work / "Tiny-Q8_0.gguf"
    write_tiny_model(model)
    os.mkfifo(work / "swap.yaml")
    (work / "models.ini").symlink_to(outside / "victim.conf")
    (work / "Modelfile").symlink_to("/dev/zero")
    (work / "serve.sh").symlink_to(outside / "secret")
    (work / "own.ini").write_text("version = 1\n")
    (work / "own.ini.bak").symlink_to(outside / "bak-target")
    runs = [
        ["--format", "preset", "--preset", str(work / "models.ini")],
        ["--format", "llama-swap", "--swap-config", str(work / "swap.yaml")],
        ["--format", "ollama", "--modelfile", str(work / "Modelfile")],
        ["--format", "script", "--script", str(work / "serve.sh")],
        ["--format", "preset", "--preset", str(work / "own.ini")],
    ]
    named = {str(work / n) for n in ("models.ini", "swap.yaml", "Modelfile", "serve.sh", "own.ini")}
    before_outside, before_work = _tree(outside), _tree(work)
    codes = []
    for args in runs:
        for force in ([], ["--force"]):
            result = CliRunner().invoke(
                app, ["command", "--gguf", str(model), "-c", "8192", "--no-confirm", *args, *force]
            )
            codes.append(result.exit_code)
    after_outside, after_work = _tree(outside), _tree(work)
    assert after_outside == before_outside
    changed = {p for p in set(before_work) | set(after_work)
               if before_work.get(p) != after_work.get(p)}  # fmt: skip
    stray = {p for p in changed if p not in named and ".bak" not in Path(p).name}
    assert stray == set(), stray
    assert not any(before_work.get(p) for p in changed if ".bak" in Path(p).name)  # only new ones
    assert set(codes) <= {0, 2}
    print(
        f"\nhostile outputs: {len(runs) * 2} runs (exit codes {codes}); outside the named paths "
        f"{len(after_outside)} entries checked, 0 bytes changed; in the working folder only the "
        f"named paths and new backups changed: {sorted(Path(p).name for p in changed)}"
    )
