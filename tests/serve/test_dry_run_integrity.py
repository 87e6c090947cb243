"""The dry run's leftovers and cache against hostile state (issue 26): an edited cache entry is
ignored and run again (serve/sealed.py), a stand-in left by a SIGKILL is removed by the next dry
run, and a `cache/standins` that is a dangling link (or a file) does not make every pick fail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_llamacpp import DATA, fake_tool

from quantpick.jobs.dry_run import DryRunCache
from quantpick.serve import sealed, standin
from quantpick.serve.standin import standins

HEADER = b"GGUF" + bytes(64)
SIZE = 2**30


def _calls(bin_dir: Path) -> int:
    log = bin_dir / "calls.jsonl"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_an_edited_dry_run_entry_is_ignored_and_run_again(tmp_path: Path) -> None:
    """Before: whatever the entry said was read back as llama.cpp's projection (an edit could make
    `pick` refuse a plan llama.cpp never refused)."""
    bin_dir = tmp_path / "bin"
    tool = fake_tool(bin_dir, "llama-fit-params",
                     routes=[(["-c"], DATA / "llama-fit-params-tiny-host.txt")])  # fmt: skip
    key = sealed.install_key(tmp_path / "state" / "dry-run.key")
    assert key is not None and len(key) == sealed.KEY_BYTES
    assert (tmp_path / "state" / "dry-run.key").stat().st_mode & 0o777 == 0o600
    cache = tmp_path / "dry-runs"
    argv = [str(tool), "-m", "/standin.gguf", "-c", "4096"]

    def run() -> DryRunCache:
        runner = DryRunCache(cache, "feed", "devices", standin="/standin.gguf", key=key)
        got = runner(argv, {}, timeout_s=30)
        assert [d.model_mib for d in got.projection.devices] == [16]
        return runner

    assert run().hits == 0 and _calls(bin_dir) == 1
    assert run().hits == 1 and _calls(bin_dir) == 1  # read back
    (entry,) = cache.iterdir()
    entry.write_bytes(entry.read_bytes().replace(b"Host 16 4 11", b"Host 99999 4 11"))
    assert run().hits == 0 and _calls(bin_dir) == 2  # edited: ignored, run again
    assert run().hits == 1 and _calls(bin_dir) == 2  # and the fresh entry replaced it
    body = entry.read_bytes().partition(b"\n")[2]
    entry.write_bytes(body)  # an unsealed entry (an older quantpick's, or forged)
    assert run().hits == 0 and _calls(bin_dir) == 3
    other = sealed.install_key(tmp_path / "other" / "dry-run.key")
    assert other is not None and sealed.read_sealed(entry, other) is None  # another install's


def test_a_key_that_is_a_link_or_shared_is_not_used(tmp_path: Path) -> None:
    target = tmp_path / "k"
    target.write_bytes(bytes(sealed.KEY_BYTES))
    link = tmp_path / "link.key"
    link.symlink_to(target)
    assert sealed.install_key(link) is None
    target.chmod(0o644)
    assert sealed.install_key(target) is None  # readable by others: not a secret


_KILLED_DURING_A_DRY_RUN = """
import sys, time
from pathlib import Path
from quantpick.serve.standin import standins
with standins([("m.gguf", b"GGUF" + bytes(64), 2**30)], parent=Path(sys.argv[1])) as path:
    print(path, flush=True)
    time.sleep(60)
"""


def test_a_stand_in_left_by_sigkill_is_removed_by_the_next_dry_run(tmp_path: Path) -> None:
    parent = tmp_path / "standins"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_DURING_A_DRY_RUN, str(parent)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None
    left = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert left.exists()  # nothing could remove it
    with standins([("n.gguf", HEADER, SIZE)], parent=parent) as path:
        assert path.exists() and not left.parent.exists()
    assert list(parent.iterdir()) == []


def test_a_running_dry_runs_stand_in_is_kept_and_an_old_one_is_not(tmp_path: Path) -> None:
    parent = tmp_path / "standins"
    with standins([("n.gguf", HEADER, SIZE)], parent=parent) as mine:
        assert standin.remove_stale(parent) == []  # this process runs
        later = time.time() + standin.STALE_S + 60
        assert standin.remove_stale(parent, now=later) == [mine.parent]


@pytest.mark.parametrize("kind", ["dangling-link", "link-to-dir", "file"])
def test_a_standins_path_that_is_not_our_directory_is_left_alone(tmp_path: Path, kind: str) -> None:
    """Before: a dangling link at cache/standins made every pick fail (FileExistsError)."""
    parent = tmp_path / "cache" / "standins"
    parent.parent.mkdir()
    elsewhere = tmp_path / "elsewhere"
    if kind == "dangling-link":
        parent.symlink_to(elsewhere)
    elif kind == "link-to-dir":
        elsewhere.mkdir()
        parent.symlink_to(elsewhere)
    else:
        parent.write_text("not a directory")
    before = os.lstat(parent)
    with standins([("n.gguf", HEADER, SIZE)], parent=parent) as path:
        assert path.exists() and parent not in path.parents and elsewhere not in path.parents
    assert not path.parent.exists()
    after = os.lstat(parent)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert kind != "link-to-dir" or list(elsewhere.iterdir()) == []
    assert not (kind == "dangling-link" and elsewhere.exists())
