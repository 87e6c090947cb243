"""A `.part` (and its sidecar) planted by another user in a shared models folder is never written
through (issue #26, "Writes"): a symlink, a hard link, a FIFO or another user's file at
`NAME.gguf.part` is replaced by a fresh file of this user's (one line says which), and a link is
never renamed into the final name. Each test runs over one stream and segmented.

The folder is shared as people share one (mode 0777); "another user's" file is made with
os.lchown (the tests run as root in CI; as another user they are skipped where chown needs root).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import test_transfer
from fakehub import FakeHub
from test_transfer import DATA, NAME, SHA, Notes, fetch, part_paths, seed_part

from quantpick.errors import ExitCode, QuantpickError
from quantpick.fetch.progress import NullProgress
from quantpick.hub.http import RetryPolicy

# test_transfer's fixtures: its fake hub with the file, the retry policy, both transfer modes
hub, policy, mode, sleeps = (test_transfer.hub, test_transfer.policy, test_transfer.mode,
                             test_transfer.sleeps)  # fmt: skip
STRANGER = 4242  # a uid that is not this process's
SECRET = b"root-only contents that a download must never overwrite\n"


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    folder.chmod(0o777)
    return folder


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def as_stranger(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a file another user's needs root (os.lchown)")
    os.lchown(path, STRANGER, STRANGER)


def assert_fresh_download(dest: Path) -> None:
    info = os.lstat(dest)
    assert stat.S_ISREG(info.st_mode) and info.st_nlink == 1
    assert dest.read_bytes() == DATA
    part, sidecar = part_paths(dest)
    assert not os.path.lexists(part) and not os.path.lexists(sidecar)


@pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="no O_NOFOLLOW on this OS")
def test_a_planted_part_symlink_is_replaced_not_written_through(
    hub: FakeHub, shared: Path, secret: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = shared / NAME
    part, _ = part_paths(dest)
    part.symlink_to(secret)
    as_stranger(part)
    notes = Notes()
    result = fetch(hub, dest, policy, mode, progress=notes)
    assert result.verified and result.sha256 == SHA
    assert secret.read_bytes() == SECRET  # the link's target is untouched
    assert_fresh_download(dest)  # and the final name is no link
    assert any(f"{part.name} is a symbolic link" in line for line in notes.lines), notes.lines


def test_a_planted_part_symlink_with_a_matching_sidecar_is_not_resumed_through(
    hub: FakeHub, shared: Path, secret: Path, policy: RetryPolicy, mode: str
) -> None:
    """The sidecar says "1 MiB done": a run that believed it would hash and append to the
    link's target."""
    dest = shared / NAME
    seed_part(hub, dest, 1024 * 1024)
    part, _ = part_paths(dest)
    part.unlink()
    part.symlink_to(secret)
    fetch(hub, dest, policy, mode)
    assert secret.read_bytes() == SECRET
    assert_fresh_download(dest)


def test_a_part_hardlinked_to_another_file_is_replaced(
    hub: FakeHub, shared: Path, secret: Path, policy: RetryPolicy, mode: str
) -> None:
    # A hard link owned by root when this process is root: only its link count gives it away.
    dest = shared / NAME
    part, _ = part_paths(dest)
    try:
        os.link(secret, part)
    except OSError as exc:
        pytest.skip(f"no hard link here: {exc}")
    notes = Notes()
    fetch(hub, dest, policy, mode, progress=notes)
    assert secret.read_bytes() == SECRET
    assert_fresh_download(dest)
    assert any("has other names" in line for line in notes.lines), notes.lines


def test_another_users_part_is_started_again(
    hub: FakeHub, shared: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = shared / NAME
    seed_part(hub, dest, 1024 * 1024)
    part, _ = part_paths(dest)
    as_stranger(part)
    notes = Notes()
    result = fetch(hub, dest, policy, mode, progress=notes)
    assert result.resumed_from == 0
    assert_fresh_download(dest)
    assert any("belongs to another user" in line for line in notes.lines), notes.lines


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
def test_a_fifo_part_or_sidecar_never_hangs_the_download(
    hub: FakeHub, shared: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = shared / NAME
    part, sidecar = part_paths(dest)
    os.mkfifo(part)
    os.mkfifo(sidecar)
    outcome: list[Any] = []
    worker = threading.Thread(
        target=lambda: outcome.append(fetch(hub, dest, policy, mode)), daemon=True
    )
    worker.start()
    worker.join(30)
    if worker.is_alive():  # unblock it (a writer opens the FIFOs) so the test run ends
        for fifo in (part, sidecar):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail("the download hung on a FIFO")
    assert outcome and outcome[0].verified
    assert_fresh_download(dest)


def test_a_planted_sidecar_symlink_is_neither_read_through_nor_written_through(
    hub: FakeHub, shared: Path, secret: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = shared / NAME
    seed_part(hub, dest, 1024 * 1024)
    part, sidecar = part_paths(dest)
    sidecar.unlink()
    sidecar.symlink_to(secret)
    fetch(hub, dest, policy, mode)
    assert secret.read_bytes() == SECRET
    assert_fresh_download(dest)


def test_a_part_swapped_for_a_link_to_itself_is_never_renamed_into_the_final_name(
    hub: FakeHub, shared: Path, policy: RetryPolicy, mode: str
) -> None:
    """Mid-transfer another user moves the .part aside and leaves a symlink to it at its name:
    following the link, it is "still" the same file, but renaming the name would put a link
    (that its owner can repoint) at the final name."""
    from test_transfer import slow_down

    slow_down(hub, mode, 4_000_000)
    dest = shared / NAME
    part, _ = part_paths(dest)
    aside = shared / "aside"

    class Swap(NullProgress):
        done = False

        def advance(self, name: str, n_bytes: int) -> None:
            if not self.done:
                self.done = True
                os.replace(part, aside)
                part.symlink_to(aside)

    with pytest.raises(QuantpickError, match="renamed or replaced by another process") as info:
        fetch(hub, dest, policy, mode, progress=Swap())
    assert info.value.exit_code == ExitCode.DOWNLOAD_FAILED
    assert not os.path.lexists(dest)


def test_a_planted_part_that_cannot_be_removed_is_refused_in_one_line(
    hub: FakeHub, shared: Path, secret: Path, policy: RetryPolicy, mode: str, monkeypatch: Any
) -> None:
    """In a sticky folder (1777, /tmp-like) another user's entry cannot be removed: the download
    stops with one line naming it, and writes nothing."""
    dest = shared / NAME
    part, _ = part_paths(dest)
    part.symlink_to(secret)
    real_unlink = os.unlink

    def sticky(path: Any, *args: Any, **kw: Any) -> None:
        if Path(path) == part:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        real_unlink(path, *args, **kw)

    monkeypatch.setattr(os, "unlink", sticky)
    with pytest.raises(QuantpickError) as info:
        fetch(hub, dest, policy, mode)
    assert "is a symbolic link" in info.value.message and str(part) in info.value.message
    assert "\n" not in info.value.message
    assert info.value.hint and "remove" in info.value.hint
    assert secret.read_bytes() == SECRET and not os.path.lexists(dest)
