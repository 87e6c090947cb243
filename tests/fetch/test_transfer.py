"""The transfer engine against the fake hub: resume, retries, faults, verification, locking.

Tests taking the `mode` fixture run twice: over one stream, and segmented (1 MiB pieces over up
to 4 connections; quantpick.fetch.segmented). Faults that only exist with segments (a CDN URL
expiring, a server busy past N connections, a sidecar of ranges) are in test_segmented.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
from fakehub import SMALL_ARCH_TOML, FakeHub, gguf_bytes, make_manifest, sha256sums

from quantpick.config import load_settings
from quantpick.errors import DownloadError, ExitCode, UsageError, VerificationError
from quantpick.fetch.download import fetch_model
from quantpick.fetch.file_lock import acquire_file_lock, lock_path
from quantpick.fetch.progress import NullProgress
from quantpick.fetch.segments import SINGLE_STREAM, MiB, SegmentPolicy
from quantpick.fetch.transfer import DiskSpaceError, download_file, part_paths
from quantpick.hub.base import RemoteFile
from quantpick.hub.http import RetryPolicy
from quantpick.model.manifest import Source

SIZE = 3 * 1024 * 1024 + 123
NAME = "m-Q4_K_M.gguf"
DATA = gguf_bytes(SIZE, seed=1)
SHA = hashlib.sha256(DATA).hexdigest()
Usage = namedtuple("Usage", "total used free")
# 3 MiB in 1 MiB pieces: [0, 1 MiB), [1 MiB, 2 MiB), [2 MiB, SIZE) (the 123-byte crumb joins the
# last), two connections at first, up to four; halves of 256 KiB at least when splitting.
SEGMENTED = SegmentPolicy(
    max_connections=4,
    initial_connections=2,
    min_piece=MiB,
    max_piece=MiB,
    min_split=256 * 1024,
    single_stream_below=MiB,
    window_seconds=0.2,
)
MODES = {"stream": SINGLE_STREAM, "segmented": SEGMENTED}


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def policy(sleeps: Sleeps) -> RetryPolicy:
    return RetryPolicy(
        attempts=4, idle_timeout=0.5, connect_timeout=2, sleep=sleeps, jitter=lambda: 0
    )


@pytest.fixture(params=list(MODES))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": sha256sums({NAME: DATA})})
    return fake_hub


def remote(hub: FakeHub, name: str = NAME) -> RemoteFile:
    commit = hub.repos["org/model"].commit
    url = f"{hub.hf_endpoint}/org/model/resolve/{commit}/{name}"
    return RemoteFile(name, SIZE, SHA, url, "hf", commit)


def no_auth(url: str) -> dict[str, str]:
    return {"User-Agent": "quantpick-test"}


def fetch(hub: FakeHub, dest: Path, policy: RetryPolicy, mode: str = "", **kw: Any) -> Any:
    if mode:
        kw["segments"] = MODES[mode]
    return download_file(remote(hub), dest, headers_for=no_auth, policy=policy, **kw)


def slow_down(hub: FakeHub, mode: str, rate: float) -> None:
    """About `rate` bytes/s for the whole file: one throttled stream, or each connection."""
    if mode == "stream":
        hub.faults.add(NAME, "throttle", rate=rate)
    else:
        hub.per_connection_rate = rate / 2


def byte_gets(hub: FakeHub) -> list[dict[str, Any]]:
    return [r for r in hub.requests_for(NAME) if r["server"] == "cdn"]


def first_offset(gets: list[dict[str, Any]]) -> int | None:
    """The lowest byte asked for (segments run in parallel and are logged as each ends, so the
    log's order is the machine's, not the client's); None when a GET had no Range."""
    if any(g["range"] is None for g in gets):
        return None
    return min(int(g["range"].split("=")[1].split("-")[0]) for g in gets)


def seed_part(hub: FakeHub, dest: Path, n: int, *, sha: str = SHA) -> None:
    """A .part holding the first n bytes, with the sidecar a previous run would have left."""
    part, sidecar = part_paths(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(DATA[:n])
    sidecar.write_text(
        json.dumps(
            {"version": 1, "url": remote(hub).url, "size": SIZE, "sha256": sha, "commit": "x"}
        )
    )


def assert_complete(dest: Path) -> None:
    assert dest.read_bytes() == DATA
    part, sidecar = part_paths(dest)
    assert not part.exists() and not sidecar.exists()


def test_plain_download_follows_redirect_and_verifies(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = tmp_path / NAME
    result = fetch(hub, dest, policy, mode)
    assert_complete(dest)
    assert (result.sha256, result.size, result.verified, result.bytes_fetched) == (
        SHA,
        SIZE,
        True,
        SIZE,
    )
    statuses = [r["status"] for r in hub.requests_for(NAME)]
    if mode == "stream":
        assert statuses == [302, 200] and result.connections == 1
    else:
        # The first piece through the hub, the others straight from the CDN URL it named.
        assert statuses[0] == 302 and set(statuses[1:]) == {206}
        assert [r["server"] for r in hub.requests_for(NAME)].count("hub") == 1
        assert {r["range"] for r in byte_gets(hub)} >= {"bytes=0-1048575"}
    assert result.as_dict()["connections"] == result.connections
    assert result.as_dict()["rate_bytes_per_s"] == round(SIZE / result.seconds)


def test_connection_cut_resumes_with_range(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    hub.faults.add(NAME, "cut", after=1_000_000)
    dest = tmp_path / NAME
    result = fetch(hub, dest, policy, mode)
    assert_complete(dest)
    gets = byte_gets(hub)
    (cut,) = [g for g in gets if g.get("cut")]
    assert cut["sent"] == 1_000_000
    # Only the cut piece is asked again, from where it stopped.
    again = "bytes=1000000-" if mode == "stream" else "bytes=1000000-1048575"
    assert [g["status"] for g in gets if g["range"] == again] == [206]
    assert result.bytes_fetched == SIZE  # nothing fetched twice


def test_500_then_success(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, sleeps: Sleeps, mode: str
) -> None:
    hub.faults.add(NAME, "status", status=500)
    fetch(hub, tmp_path / NAME, policy, mode)
    assert_complete(tmp_path / NAME)
    statuses = [r["status"] for r in byte_gets(hub)]
    assert statuses[0] == 500 and set(statuses[1:]) == ({200} if mode == "stream" else {206})
    assert sleeps == [0.5]  # base 1 s, "equal jitter" with jitter()=0


def test_429_honours_retry_after(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, sleeps: Sleeps, mode: str
) -> None:
    hub.faults.add(NAME, "429", retry_after=7)
    fetch(hub, tmp_path / NAME, policy, mode)
    assert_complete(tmp_path / NAME)
    assert sleeps == [7.0]


def test_stalled_body_hits_idle_timeout_and_resumes(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    # Inside the first answer: the whole stream, or the first 1 MiB piece.
    hub.faults.add(NAME, "stall", after=2_500_000 if mode == "stream" else 500_000, seconds=3)
    fetch(hub, tmp_path / NAME, policy, mode)  # idle_timeout=0.5 s
    assert_complete(tmp_path / NAME)
    ranges = [r["range"] for r in byte_gets(hub)]
    # Reads are whole 1 MiB chunks: the partial chunk is dropped, what came before is kept.
    if mode == "stream":
        assert ranges == [None, "bytes=2097152-"]
    else:
        # The stalled piece is asked again from its start (by its own connection; the others,
        # done with theirs, may have split off its upper part in the meantime).
        assert ranges[0] == "bytes=0-1048575"
        assert any(r.startswith("bytes=0-") for r in ranges[1:])


def test_short_body_resumes(hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str) -> None:
    hub.faults.add(NAME, "short", after=2_000_000 if mode == "stream" else 500_000)
    fetch(hub, tmp_path / NAME, policy, mode)
    assert_complete(tmp_path / NAME)
    ranges = [r["range"] for r in byte_gets(hub)]
    if mode == "stream":
        assert ranges[-1] == "bytes=2000000-"
    else:
        assert "bytes=500000-1048575" in ranges


def test_wrong_content_length_is_retried(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    hub.faults.add(NAME, "wrong_length", delta=-10)
    fetch(hub, tmp_path / NAME, policy, mode)
    assert_complete(tmp_path / NAME)
    gets = byte_gets(hub)
    if mode == "stream":
        assert len(gets) == 2
    else:
        (bad,) = [g for g in gets if g.get("faults") == ["wrong_length"]]
        assert [g["range"] for g in gets].count(bad["range"]) == 2  # that piece again


def test_persistent_wrong_content_length_fails_with_exit_5(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    hub.faults.add(NAME, "wrong_length", delta=100, times=None)
    with pytest.raises(DownloadError, match="Content-Length") as info:
        fetch(hub, tmp_path / NAME, policy, mode)
    assert info.value.exit_code == ExitCode.DOWNLOAD_FAILED
    assert not (tmp_path / NAME).exists()
    # retried, then given up (under load a retry may fail before reaching the server: <=)
    assert 2 <= len(byte_gets(hub)) <= policy.attempts


def test_flipped_byte_is_exit_4_and_never_at_final_name(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    hub.faults.add(NAME, "flip", at=1_234_567, times=None)
    dest = tmp_path / NAME
    with pytest.raises(VerificationError, match="expected from") as info:
        fetch(hub, dest, policy, mode, expected_from="SHA256SUMS")
    assert info.value.exit_code == ExitCode.VERIFY_FAILED
    assert "SHA256SUMS" in info.value.message
    assert not dest.exists()
    assert not part_paths(dest)[0].exists()
    bad = list(tmp_path.glob(f"{NAME}.bad-*"))
    assert len(bad) == 1 and bad[0].stat().st_size == SIZE


def test_wrong_content_range_restarts_from_zero(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = tmp_path / NAME
    seed_part(hub, dest, 1_500_000)
    hub.faults.add(NAME, "wrong_range", delta=4096)
    fetch(hub, dest, policy, mode)
    assert_complete(dest)
    ranges = [r["range"] for r in byte_gets(hub)]
    if mode == "stream":
        assert ranges == ["bytes=1500000-", None]
    else:
        # Segments cannot trust this server: one stream from the prefix (honoured this time).
        assert ranges == ["bytes=1500000-2548575", "bytes=1500000-"]


def test_200_instead_of_206_restarts_cleanly(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = tmp_path / NAME
    seed_part(hub, dest, 1_500_000)
    hub.faults.add(NAME, "ignore_range")
    result = fetch(hub, dest, policy, mode)
    assert_complete(dest)
    gets = byte_gets(hub)
    if mode == "stream":
        assert [(g["status"], g["range"]) for g in gets] == [(200, "bytes=1500000-")]
        assert result.bytes_fetched == SIZE
    else:
        # The 200 is dropped unread; one stream goes on from the prefix.
        assert [(g["status"], g["range"]) for g in gets] == [
            (200, "bytes=1500000-2548575"),
            (206, "bytes=1500000-"),
        ]
        assert result.bytes_fetched == SIZE - 1_500_000 and result.resumed_from == 1_500_000


def test_resume_rehashes_the_prefix_on_disk(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    """A corrupted prefix is caught by the final hash even though only the tail was fetched."""
    dest = tmp_path / NAME
    seed_part(hub, dest, 1_000_000)
    part = part_paths(dest)[0]
    corrupted = bytearray(part.read_bytes())
    corrupted[10] ^= 1
    part.write_bytes(bytes(corrupted))
    with pytest.raises(VerificationError):
        fetch(hub, dest, policy, mode)
    assert first_offset(byte_gets(hub)) == 1_000_000
    assert not dest.exists()


def test_sidecar_for_other_content_means_restart(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = tmp_path / NAME
    seed_part(hub, dest, 1_000_000, sha="0" * 64)
    result = fetch(hub, dest, policy, mode)
    assert_complete(dest)
    ranges = [g["range"] for g in byte_gets(hub)]
    if mode == "stream":
        assert ranges[0] is None
    else:  # segments run in parallel: which is recorded first depends on the machine's load
        assert "bytes=0-1048575" in ranges
        assert not any(r and r.startswith("bytes=1000000-") for r in ranges)
    assert (result.resumed_from, result.bytes_fetched) == (0, SIZE)


def test_modelscope_200_with_content_range_is_a_valid_resume(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    fake_hub.add_repo("org/model", {NAME: DATA})
    fake_hub.ms_range_status = 200
    dest = tmp_path / NAME
    seed_part(fake_hub, dest, 2_000_000)
    url = f"{fake_hub.ms_endpoint}/api/v1/models/org/model/repo?Revision=master&FilePath={NAME}"
    result = download_file(
        RemoteFile(NAME, SIZE, SHA, url, "modelscope", "master"),
        dest,
        headers_for=no_auth,
        policy=policy,
        segments=MODES[mode],
    )
    assert_complete(dest)
    gets = fake_hub.requests_for(NAME)
    if mode == "stream":
        (get,) = gets
        assert (get["status"], get["range"], get["sent"]) == (200, "bytes=2000000-", SIZE - 2e6)
    else:
        # The rest is one piece (the crumb joins it), which the second connection may split.
        assert f"bytes=2000000-{SIZE - 1}" in [g["range"] for g in gets]
        assert {g["status"] for g in gets} == {200}
    assert (result.resumed_from, result.bytes_fetched) == (2_000_000, SIZE - 2_000_000)


def test_disk_space_precheck(hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str) -> None:
    with pytest.raises(DiskSpaceError, match="not enough free space") as info:
        fetch(hub, tmp_path / NAME, policy, mode, disk_usage=lambda p: Usage(10**12, 0, SIZE))
    assert info.value.exit_code == ExitCode.ERROR
    assert byte_gets(hub) == []


def test_enospc_mid_write_keeps_the_part_and_says_how_much(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import quantpick.fetch.transfer as engine

    room = 2_044_480  # not a multiple of the 1 MiB chunks: the last write is a short one

    class FullDisk:
        """The .part handle of a disk with `room` bytes: like write(2), a write that reaches
        the end takes what fits and returns that count; the next one fails with ENOSPC."""

        def __init__(self, path: Path) -> None:
            self._f = open(path, "r+b", buffering=0)  # noqa: SIM115

        def write(self, data: Any) -> int:
            fits = room - self._f.tell()
            if fits <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self._f.write(data[:fits])

        def __getattr__(self, name: str) -> Any:
            return getattr(self._f, name)

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self._f.close()

    dest = tmp_path / NAME
    with monkeypatch.context() as patch, pytest.raises(DiskSpaceError, match="No space") as info:
        patch.setattr(engine, "_open_part", FullDisk)
        fetch(hub, dest, policy)
    assert info.value.exit_code == ExitCode.ERROR
    assert f"({room} bytes kept)" in info.value.message  # what the disk holds, not what was sent
    part = part_paths(dest)[0]
    assert part.read_bytes() == DATA[:room] and not dest.exists()
    result = fetch(hub, dest, policy)  # space freed: the rerun resumes
    assert_complete(dest)
    assert byte_gets(hub)[-1]["range"] == f"bytes={room}-"
    assert result.resumed_from == room


def test_present_file_is_verified_not_trusted(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = tmp_path / NAME
    dest.write_bytes(DATA)
    assert fetch(hub, dest, policy, mode).reused
    assert byte_gets(hub) == []
    # Same size, one byte altered: moved aside and fetched again.
    altered = bytearray(DATA)
    altered[-1] ^= 1
    dest.write_bytes(bytes(altered))
    result = fetch(hub, dest, policy, mode)
    assert not result.reused and result.bytes_fetched == SIZE
    assert_complete(dest)
    assert len(list(tmp_path.glob(f"{NAME}.bad-*"))) == 1


def test_truncated_final_file_is_resumed(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = tmp_path / NAME
    dest.write_bytes(DATA[:1_000_000])
    result = fetch(hub, dest, policy, mode)
    assert_complete(dest)
    assert first_offset(byte_gets(hub)) == 1_000_000
    assert result.bytes_fetched == SIZE - 1_000_000


class Notes(NullProgress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def test_second_download_waits_while_the_first_makes_progress(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    # The first run takes ~3 s and its .part grows every ~1 s (1 MiB reads at 1 MB/s). The
    # second gives up after 2.5 s *without progress*: it must outwait the whole first run.
    hub.faults.add(NAME, "throttle", rate=1_000_000)
    dest = tmp_path / NAME
    errors: list[BaseException] = []

    def first() -> None:
        try:
            fetch(hub, dest, policy)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    while not byte_gets(hub):
        threading.Event().wait(0.02)
    notes = Notes()
    started = time.monotonic()
    late = fetch(hub, dest, policy, lock_timeout=2.5, progress=notes)
    thread.join()
    assert errors == []
    assert time.monotonic() - started > 2.5  # it did wait longer than its stall timeout
    assert late.reused and late.bytes_fetched == 0  # then found the file and verified it
    assert len(byte_gets(hub)) == 1
    assert any("waiting while it makes progress" in line for line in notes.lines)
    assert lock_path(dest).exists() and lock_path(dest).parent == dest.parent  # beside the data


def test_second_download_gives_up_when_the_holder_is_stuck(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    dest = tmp_path / NAME
    stuck = acquire_file_lock(dest)  # holds the lock and never writes a byte
    try:
        started = time.monotonic()
        with pytest.raises(DownloadError, match="no progress for 0.5 s") as info:
            fetch(hub, dest, policy, lock_timeout=0.5)
        assert time.monotonic() - started < 10
        assert info.value.exit_code == ExitCode.DOWNLOAD_FAILED
        assert str(lock_path(dest)) in info.value.message
    finally:
        stuck.release()
    assert byte_gets(hub) == []
    fetch(hub, dest, policy)  # once released, a run goes through
    assert_complete(dest)


def test_lock_mode_lets_the_directory_s_writers_share_it(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)  # a group's models volume (setgid, group-writable)
    private = tmp_path / "private"
    private.mkdir()
    private.chmod(0o755)
    old_umask = os.umask(0o077)  # the strictest umask must not narrow the shared lock
    try:
        for directory, mode in ((shared, 0o664), (private, 0o644)):
            dest = directory / NAME
            lock = acquire_file_lock(dest)
            lock.release()
            assert stat.S_IMODE(lock_path(dest).stat().st_mode) == mode
    finally:
        os.umask(old_umask)


def test_authorization_is_dropped_on_the_cdn(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    fake_hub.add_repo("org/gated", {NAME: DATA}, gated=True, token="hf_secret")
    commit = fake_hub.repos["org/gated"].commit
    url = f"{fake_hub.hf_endpoint}/org/gated/resolve/{commit}/{NAME}"

    def with_token(u: str) -> dict[str, str]:
        return {"Authorization": "Bearer hf_secret", "User-Agent": "t"}

    dest = tmp_path / NAME
    download_file(
        RemoteFile(NAME, SIZE, SHA, url, "hf", commit),
        dest,
        headers_for=with_token,
        policy=policy,
        segments=MODES[mode],
    )
    assert_complete(dest)
    hub_req, *cdn_reqs = fake_hub.requests_for(NAME)
    assert (hub_req["server"], hub_req["authorization"]) == ("hub", True)
    assert cdn_reqs and {(r["server"], r["authorization"]) for r in cdn_reqs} == {("cdn", False)}


def test_gated_without_token_is_a_clear_error(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    fake_hub.add_repo("org/gated", {NAME: DATA}, gated=True, token="hf_secret")
    commit = fake_hub.repos["org/gated"].commit
    url = f"{fake_hub.hf_endpoint}/org/gated/resolve/{commit}/{NAME}"
    with pytest.raises(DownloadError, match="gated") as info:
        download_file(
            RemoteFile(NAME, SIZE, SHA, url, "hf", commit),
            tmp_path / NAME,
            headers_for=no_auth,
            policy=policy,
        )
    assert "hf auth login" in (info.value.hint or "")


def test_a_complete_part_is_finished_without_a_request(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = tmp_path / NAME
    seed_part(hub, dest, SIZE)  # killed after the last byte, before the rename
    result = fetch(hub, dest, policy, mode)
    assert_complete(dest)
    assert byte_gets(hub) == []
    assert (result.bytes_fetched, result.resumed_from, result.reused) == (0, SIZE, False)


def test_an_orphan_sidecar_is_cleaned_on_the_next_run(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    dest = tmp_path / NAME
    seed_part(hub, dest, SIZE)
    part, sidecar = part_paths(dest)
    part.rename(dest)  # killed between the final rename and the sidecar's removal
    assert sidecar.exists()
    result = fetch(hub, dest, policy, mode)
    assert result.reused and not sidecar.exists()
    assert_complete(dest)


class Events:
    """os.fsync / os.replace, recorded in order (fsync'ed paths read back from /proc)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[tuple[str, str]] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd: int) -> None:
            self.log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            real_fsync(fd)

        def replace(src: Any, dst: Any) -> None:
            self.log.append(("replace", f"{src} -> {dst}"))
            real_replace(src, dst)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def index(self, kind: str, text: str) -> int:
        return next(i for i, (k, t) in enumerate(self.log) if k == kind and t == text)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name the fds")
def test_data_and_directory_are_fsynced_around_the_final_rename(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    dest = tmp_path / NAME
    part, sidecar = part_paths(dest)
    events = Events(monkeypatch)
    fetch(hub, dest, policy, mode)
    assert_complete(dest)
    data = events.index("fsync", str(part))
    rename = events.index("replace", f"{part} -> {dest}")
    directory = max(i for i, e in enumerate(events.log) if e == ("fsync", str(tmp_path)))
    assert data < rename < directory  # bytes on disk, then the name, then the name made durable
    # The sidecar too: its temporary file is fsynced before it takes the sidecar's name.
    tmp_syncs = [t for k, t in events.log if k == "fsync" and t.endswith(".tmp")]
    renames = [t for k, t in events.log if k == "replace" and t.endswith(f" -> {sidecar}")]
    assert tmp_syncs and renames and renames[0].startswith(tmp_syncs[0])

    events.log.clear()
    dest.unlink()
    fetch(hub, dest, policy, mode, durable=False)
    assert [e for e in events.log if e[0] == "fsync"] == []  # the benchmark's "without" side


def test_writeback_runs_during_the_transfer_not_only_at_the_end(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quantpick.fetch.transfer as engine

    synced: list[int] = []
    real = getattr(os, "fdatasync", os.fsync)

    def fdatasync(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)  # how much was written when it ran
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync, raising=False)
    monkeypatch.setattr(engine, "FLUSH_EVERY", 1024 * 1024)
    hub.faults.add(NAME, "throttle", rate=4_000_000)  # ~0.8 s: time for the thread to run
    fetch(hub, tmp_path / NAME, policy)
    assert_complete(tmp_path / NAME)
    assert synced and min(synced) < SIZE  # at least one flush before the last byte arrived
    synced.clear()
    (tmp_path / NAME).unlink()
    fetch(hub, tmp_path / NAME, policy, durable=False)
    assert synced == []


def test_a_part_replaced_by_another_process_is_never_written_or_renamed(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, mode: str
) -> None:
    """Another writer swaps the .part for its own file mid-transfer (what a second downloader
    with its own lock did before the lock moved beside the data): this process stops at its next
    chunk and leaves that file alone, instead of writing, truncating or renaming through a handle
    that no longer is the path."""
    slow_down(hub, mode, 4_000_000)
    dest = tmp_path / NAME
    part, _ = part_paths(dest)
    foreign = b"the other process's bytes"

    class Swap(NullProgress):
        done = False

        def advance(self, name: str, n_bytes: int) -> None:
            if not self.done:
                self.done = True
                other = tmp_path / "other"
                other.write_bytes(foreign)
                os.replace(other, part)

    with pytest.raises(DownloadError, match="renamed or replaced by another process") as info:
        fetch(hub, dest, policy, mode, progress=Swap())
    assert info.value.exit_code == ExitCode.DOWNLOAD_FAILED
    assert part.read_bytes() == foreign and not dest.exists()


# -- fetch_model: a manifest quant, cross-checks before any transfer ---------------------------


def hf_manifest(**kw: Any) -> Any:
    return make_manifest("test-model", {NAME: DATA}, (Source("hf", repo="org/model"),), **kw)


def test_fetch_model_downloads_and_records_checksums(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    report = fetch_model(
        hf_manifest(), "q4_k_m", settings=load_settings(), dest_dir=tmp_path, policy=policy
    )
    (result,) = report.results
    assert result.verified and result.path == tmp_path / NAME
    assert report.plan.source.startswith("hf:org/model@")
    assert set(report.plan.files[0].sha256_from) == {
        f"SHA256SUMS ({report.plan.source})",
        f"{report.plan.source} listing",
        "manifest test-model",
    }
    assert (tmp_path / "SHA256SUMS").read_text() == f"{SHA}  {NAME}\n"


def test_sha256sums_disagreeing_with_hub_fails_before_transfer(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    wrong = {NAME: b"not the model"}
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": sha256sums(wrong)})
    with pytest.raises(VerificationError, match="disagree") as info:
        fetch_model(
            hf_manifest(), "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy
        )
    assert info.value.exit_code == ExitCode.VERIFY_FAILED
    assert byte_gets(fake_hub) == []


def test_lying_hub_sha_fails_before_transfer(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.lie_sha("org/model", NAME)
    with pytest.raises(VerificationError, match="listing says"):
        fetch_model(
            hf_manifest(), "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy
        )
    assert byte_gets(hub) == []


def test_hostile_name_in_sha256sums_is_refused(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    sums = sha256sums({NAME: DATA}) + f"{SHA}  ../../evil.gguf\n".encode()
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": sums})
    with pytest.raises(VerificationError, match="refusing file name"):
        fetch_model(
            hf_manifest(), "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy
        )
    assert list(tmp_path.iterdir()) == []


def test_no_hash_anywhere_needs_allow_unverified(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    fake_hub.add_repo("org/model", {NAME: DATA}, lfs_suffixes=())  # no LFS oid in the listing
    manifest = hf_manifest(checksums_file=None, manifest_sha={NAME: None})
    with pytest.raises(VerificationError, match="no sha256 known") as info:
        fetch_model(manifest, "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy)
    assert "--allow-unverified" in (info.value.hint or "")
    report = fetch_model(
        manifest,
        "Q4_K_M",
        settings=load_settings(),
        dest_dir=tmp_path,
        policy=policy,
        allow_unverified=True,
    )
    assert not report.results[0].verified and (tmp_path / NAME).read_bytes() == DATA


def test_dry_run_fetches_nothing_and_reports_space(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    report = fetch_model(
        hf_manifest(),
        "Q4_K_M",
        settings=load_settings(),
        dest_dir=tmp_path,
        dry_run=True,
        disk_usage=lambda p: Usage(10**12, 0, 1000),
    )
    assert report.results == ()
    assert (report.plan.bytes_to_fetch, report.plan.enough_space) == (SIZE, False)
    assert byte_gets(hub) == []


def test_auto_falls_back_to_the_next_source(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    sources = (
        Source("hf", repo="org/missing"),
        Source("mirror", url_template=f"{hub.mirror_base}/org/model/{{file}}", name="local"),
    )
    manifest = make_manifest("test-model", {NAME: DATA}, sources)
    report = fetch_model(
        manifest, "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy
    )
    assert report.plan.source == "mirror:local"
    assert "org/missing" in report.skipped_sources[0]
    assert (tmp_path / NAME).read_bytes() == DATA


def test_unknown_quant_is_a_usage_error(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="Q8_0") as info:
        fetch_model(hf_manifest(), "Q8_0", settings=load_settings(), dest_dir=tmp_path)
    assert "Q4_K_M" in (info.value.hint or "")


# -- two users, one directory --------------------------------------------------------------------


def test_two_homes_racing_on_one_directory_never_leave_a_bad_final_file(
    hub: FakeHub, tmp_path: Path
) -> None:
    """Two `quantpick download` processes with different QUANTPICK_HOMEs (two users sharing a
    models volume) fetch one file into one --dir. The first transfer is cut and the server
    ignores Range on the retry (a full 200: restart from byte 0). Before the lock moved beside
    the data, both transferred at once and the loser truncated the winner's verified file."""
    import subprocess
    import sys

    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "race.toml").write_text(
        'schema = 1\nid = "race"\ndisplay_name = "Race"\nchecksums_file = "SHA256SUMS"\n'
        + SMALL_ARCH_TOML
        + '\n[[sources]]\nkind = "hf"\nrepo = "org/model"\n\n'
        + f'[[files]]\nname = "{NAME}"\nquant = "Q4_K_M"\nsize_bytes = {SIZE}\n'
        + "size_exact = true\nquality_rank = 1\n"
    )
    hub.faults.add(NAME, "throttle", rate=1_500_000, times=None)
    hub.faults.add(NAME, "cut", after=1_200_000, times=1)
    hub.faults.add(NAME, "ignore_range", times=None)
    dest = tmp_path / "shared-models"
    final = dest / NAME
    bootstrap = "import quantpick.cli.download; from quantpick.cli import main; main()"

    def start(home: str) -> subprocess.Popen[str]:
        env = dict(os.environ, QUANTPICK_HOME=str(tmp_path / home))
        env["QUANTPICK_MANIFESTS"] = str(manifests)
        argv = [sys.executable, "-c", bootstrap, "download", "race", "--quant", "Q4_K_M"]
        argv += ["--dir", str(dest), "--json"]
        return subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    first = start("home-a")
    deadline = time.monotonic() + 60
    while not byte_gets(hub):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    second = start("home-b")
    wrong: list[str] = []
    while first.poll() is None or second.poll() is None:
        assert time.monotonic() < deadline + 60
        try:
            data = final.read_bytes()
        except FileNotFoundError:
            data = None
        if data is not None and data != DATA:
            wrong.append(f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]}")
        time.sleep(0.01)
    outs = [p.communicate() for p in (first, second)]
    assert (first.returncode, second.returncode) == (0, 0), outs
    assert wrong == []  # never a wrong file at the final name, at any moment
    assert final.read_bytes() == DATA
    documents = [json.loads(out) for out, _ in outs]
    reused = sorted(d["files"][0]["reused"] for d in documents)
    assert reused == [False, True]  # one transferred, the other waited and verified it
    assert "waiting while it makes progress" in outs[1][1]
    assert not part_paths(final)[0].exists() and not part_paths(final)[1].exists()
