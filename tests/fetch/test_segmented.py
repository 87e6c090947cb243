"""Segmented transfers (quantpick.fetch.segmented) against the fake hub: several connections,
the faults only segments meet (a server that ignores Range midway, a CDN URL that expires, a
server busy past N connections), the sidecar of written ranges, kill -9 and resume.

The fault matrix shared with the single stream runs in both modes in test_transfer.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fakehub import FakeHub, gguf_bytes

import quantpick.fetch.segmented as segmented
from quantpick.errors import ExitCode
from quantpick.fetch.file_lock import progress_mark
from quantpick.fetch.partfile import Content, PartLayout, read_sidecar, write_sidecar
from quantpick.fetch.progress import NullProgress
from quantpick.fetch.segments import SINGLE_STREAM, MiB, RangeSet, SegmentPolicy
from quantpick.fetch.transfer import DiskSpaceError, download_file, part_paths
from quantpick.hub.base import RemoteFile
from quantpick.hub.http import RetryPolicy

SIZE = 3 * MiB + 123
NAME = "m-Q4_K_M.gguf"
DATA = gguf_bytes(SIZE, seed=7)
SHA = hashlib.sha256(DATA).hexdigest()
POLICY = SegmentPolicy(
    max_connections=4,
    initial_connections=2,
    min_piece=MiB,
    max_piece=MiB,
    min_split=256 * 1024,
    single_stream_below=MiB,
    window_seconds=0.2,
)
FOUR = SegmentPolicy(**{**POLICY.__dict__, "initial_connections": 4})


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


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    fake_hub.add_repo("org/model", {NAME: DATA})
    return fake_hub


def remote(hub: FakeHub) -> RemoteFile:
    commit = hub.repos["org/model"].commit
    return RemoteFile(NAME, SIZE, SHA, f"{hub.hf_endpoint}/org/model/resolve/{commit}/{NAME}",
                      "hf", commit)  # fmt: skip


def fetch(hub: FakeHub, dest: Path, policy: RetryPolicy, **kw: Any) -> Any:
    kw.setdefault("segments", POLICY)
    return download_file(remote(hub), dest, headers_for=lambda u: {}, policy=policy, **kw)


def cdn_gets(hub: FakeHub) -> list[dict[str, Any]]:
    return [r for r in hub.requests_for(NAME) if r["server"] == "cdn"]


def assert_complete(dest: Path) -> None:
    assert dest.read_bytes() == DATA
    part, sidecar = part_paths(dest)
    assert not part.exists() and not sidecar.exists()


def seed_segments(hub: FakeHub, dest: Path, written: list[tuple[int, int]], listed: Any = None):
    """A segmented .part (final size, sparse) holding DATA in `written`, and a sidecar that lists
    `listed` (default: the same ranges)."""
    part, sidecar = part_paths(dest)
    with open(part, "wb") as handle:
        handle.truncate(SIZE)
        for start, end in written:
            handle.seek(start)
            handle.write(DATA[start:end])
    content = Content(remote(hub).url, SIZE, SHA, "x")
    write_sidecar(sidecar, content, PartLayout.SEGMENTS, RangeSet(listed or written))


def requested(gets: list[dict[str, Any]]) -> list[tuple[int, int]]:
    out = []
    for g in gets:
        start, end = g["range"].removeprefix("bytes=").split("-")
        out.append((int(start), int(end) + 1))
    return out


class Recorder(NullProgress):
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counts: list[int] = []

    def message(self, text: str) -> None:
        self.lines.append(text)

    def connections(self, name: str, n: int) -> None:
        self.counts.append(n)


def test_several_connections_share_one_file(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.per_connection_rate = 2e6  # 3 MiB: ~1.6 s on one connection
    seen = Recorder()
    dest = tmp_path / NAME
    result = fetch(hub, dest, policy, progress=seen)
    assert_complete(dest)
    # the count shown (sampled every tick) rises and falls; the result has the most at once
    assert result.connections >= max(seen.counts) >= 2 and seen.counts[0] == 1
    assert hub.most_active[NAME] >= 2
    assert result.bytes_fetched == SIZE  # every byte written once
    gets = cdn_gets(hub)
    assert all(g["status"] == 206 for g in gets)
    # keep-alive: some connection carried more than one piece
    ports = [g["port"] for g in gets]
    assert len(set(ports)) < len(ports)


def test_a_server_that_ignores_range_gets_one_stream(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.faults.add(NAME, "ignore_range", times=None)
    seen = Recorder()
    dest = tmp_path / NAME
    result = fetch(hub, dest, policy, progress=seen)
    assert_complete(dest)
    gets = cdn_gets(hub)
    # The first piece's 200 (the whole file) is dropped unread; then one plain GET.
    assert [(g["status"], g["range"]) for g in gets] == [(200, "bytes=0-1048575"), (200, None)]
    assert result.connections == 1 and result.bytes_fetched == SIZE
    assert any("ignored Range" in line and "one stream" in line for line in seen.lines)


def test_a_200_for_a_206_midway_falls_back_to_one_stream(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.per_connection_rate = 4e6
    hub.faults.add(NAME, "ignore_range", skip=2)  # the third piece comes back whole
    dest = tmp_path / NAME
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    gets = cdn_gets(hub)
    # the pieces before the fallback: 206s and the one 200 (logged when each ends, so in the
    # order they ended, which depends on the machine's load)
    pieces = [g["status"] for g in gets[:-1]]
    assert pieces.count(200) == 1 and set(pieces) == {200, 206} and len(pieces) >= 3
    last = gets[-1]
    # One stream from the contiguous prefix written so far (0 or more bytes).
    assert last["status"] in (200, 206) and (last["range"] or "bytes=0-").endswith("-")
    assert result.bytes_fetched >= SIZE - result.resumed_from


@pytest.mark.parametrize("status", [403, 410])
def test_an_expired_cdn_url_is_resolved_again_through_the_hub(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, status: int
) -> None:
    hub.per_connection_rate = 1.5e6

    class ExpireOnce(Recorder):
        def advance(self, name: str, n_bytes: int) -> None:
            if hub.cdn_generation == 0:
                hub.expire_cdn_urls(status)  # the URLs handed out so far are now refused

    seen = ExpireOnce()
    dest = tmp_path / NAME
    result = fetch(hub, dest, policy, progress=seen)
    assert_complete(dest)
    requests = hub.requests_for(NAME)
    # Once at the start, then again by each connection that met the expired URL before a fresh
    # one was known.
    resolves = [r["status"] for r in requests if r["server"] == "hub"]
    assert set(resolves) == {302} and 2 <= len(resolves) <= 1 + result.connections
    refused = [r for r in requests if r["server"] == "cdn" and r["status"] == status]
    assert refused and all("sig=0" in r["query"] for r in refused)
    late = [r for r in requests if r["server"] == "cdn" and "sig=1" in r["query"]]
    assert late and {r["status"] for r in late} == {206}
    assert any("no longer valid; asking the hub again" in line for line in seen.lines)
    assert result.bytes_fetched == SIZE


def test_a_cdn_that_refuses_a_fresh_url_is_an_error_not_a_loop(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    from quantpick.errors import DownloadError

    hub.faults.add(NAME, "status", status=403, times=None)
    with pytest.raises(DownloadError, match="access denied") as info:
        fetch(hub, tmp_path / NAME, policy)
    assert info.value.exit_code == ExitCode.DOWNLOAD_FAILED
    assert len(cdn_gets(hub)) == 1


@pytest.mark.parametrize("status", [429, 503])
def test_a_busy_server_gets_fewer_connections(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, status: int
) -> None:
    hub.per_connection_rate = 2e6
    hub.faults.add(NAME, "busy", limit=2, status=status, retry_after=3, times=None)
    seen = Recorder()
    dest = tmp_path / NAME
    result = fetch(hub, dest, policy, progress=seen, segments=FOUR)
    assert_complete(dest)
    busy = [r for r in cdn_gets(hub) if r["status"] == status]
    # Four asked at once, two were turned away and went; the two left were never refused
    # again (one more refusal is tolerated: the fake counts a body done a moment after the
    # client has read it, so a keep-alive request can arrive first).
    assert result.connections == 4 and 2 <= len(busy) <= 3
    assert any("busy; down to 2 connection(s)" in line for line in seen.lines)
    assert hub.most_active[NAME] <= 2


def test_a_segmented_part_resumes_only_the_missing_ranges(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    dest = tmp_path / NAME
    seed_segments(hub, dest, [(0, MiB), (2 * MiB, SIZE)])
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    asked = requested(cdn_gets(hub))
    assert min(s for s, _ in asked) == MiB and max(e for _, e in asked) == 2 * MiB
    assert (result.resumed_from, result.bytes_fetched) == (SIZE - MiB, MiB)


def _reports_holes(directory: Path) -> bool:
    probe = directory / "hole-probe"
    with open(probe, "wb") as handle:
        handle.truncate(MiB)
    fd = os.open(probe, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) == 0
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


def test_a_sidecar_listing_unwritten_bytes_does_not_make_them_done(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    """The sidecar says everything is written (as if it reached the disk before the data did);
    the .part holds only the first MiB. The ranges are checked against the file: the rest is
    fetched, and no unverified or wrong byte is ever used."""
    if not _reports_holes(tmp_path):
        pytest.skip("this file system does not report holes (the final sha256 still guards)")
    dest = tmp_path / NAME
    seed_segments(hub, dest, [(0, MiB)], listed=[(0, SIZE)])
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    assert result.resumed_from == MiB and result.bytes_fetched == SIZE - MiB


def test_a_torn_sidecar_starts_again(hub: FakeHub, tmp_path: Path, policy: RetryPolicy) -> None:
    dest = tmp_path / NAME
    seed_segments(hub, dest, [(0, 2 * MiB)])
    sidecar = part_paths(dest)[1]
    sidecar.write_bytes(sidecar.read_bytes()[:40])
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    assert result.resumed_from == 0 and "bytes=0-1048575" in [g["range"] for g in cdn_gets(hub)]


def test_one_connection_continues_a_segmented_part_as_a_stream(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    dest = tmp_path / NAME
    seed_segments(hub, dest, [(0, MiB), (2 * MiB, SIZE)])
    result = fetch(hub, dest, policy, segments=SINGLE_STREAM)
    assert_complete(dest)
    assert [g["range"] for g in cdn_gets(hub)] == [f"bytes={MiB}-"]  # pieces past it dropped
    assert (result.resumed_from, result.bytes_fetched) == (MiB, SIZE - MiB)


def test_a_stream_part_is_continued_in_segments(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    dest = tmp_path / NAME
    part, sidecar = part_paths(dest)
    part.write_bytes(DATA[:1_500_000])
    write_sidecar(sidecar, Content(remote(hub).url, SIZE, SHA, "x"), PartLayout.STREAM)
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    assert min(s for s, _ in requested(cdn_gets(hub))) == 1_500_000
    assert result.resumed_from == 1_500_000


@pytest.mark.skipif(not hasattr(os, "fdatasync"), reason="needs fdatasync")
def test_ranges_are_recorded_only_after_their_bytes_are_synced(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sidecar lists only bytes that were already correct in the .part at the fdatasync
    before it (what a power cut would keep)."""
    monkeypatch.setattr(segmented, "CHECKPOINT_SECONDS", 0.1)
    hub.per_connection_rate = 1.5e6  # ~1 s: several checkpoints
    dest = tmp_path / NAME
    part, sidecar = part_paths(dest)
    events: list[tuple[str, RangeSet]] = []
    real_sync, real_replace = os.fdatasync, os.replace

    def fdatasync(fd: int) -> None:
        real_sync(fd)
        data = os.pread(fd, SIZE, 0)
        good = RangeSet()
        block = 4096
        for at in range(0, SIZE, block):
            if data[at : at + block] == DATA[at : at + block]:
                good.add(at, min(SIZE, at + block))
                continue
            for i in range(at, min(SIZE, at + block)):  # a block written in part: byte by byte
                if data[i] == DATA[i]:
                    good.add(i, i + 1)
        events.append(("synced", good))

    def replace(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        if Path(dst) == sidecar:
            found = read_sidecar(sidecar)
            if found is not None and found.layout is PartLayout.SEGMENTS:
                events.append(("listed", found.done))

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "replace", replace)
    fetch(hub, dest, policy)
    assert_complete(dest)
    listings = [i for i, (kind, done) in enumerate(events) if kind == "listed" and done.total]
    assert len(listings) >= 2  # checkpoints happened during the transfer
    for i in listings:
        synced = [done for kind, done in events[:i] if kind == "synced"]
        assert synced, "a range listed before any fdatasync"
        assert all(synced[-1].covers(s, e) for s, e in events[i][1]), (events[i], synced[-1])


def test_enospc_keeps_what_was_written_and_the_rerun_resumes(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = [int(1.5 * MiB)]  # the disk takes 1.5 MiB, then it is full
    real = segmented._pwrite
    lock = threading.Lock()  # the connections write at once: one disk

    def full_disk(fd: int, data: memoryview, offset: int) -> None:
        with lock:
            fits = min(len(data), budget[0])
            budget[0] -= fits
        if fits:
            real(fd, data[:fits], offset)
        if fits < len(data):
            raise OSError(errno.ENOSPC, "No space left on device")

    dest = tmp_path / NAME
    with monkeypatch.context() as patch, pytest.raises(DiskSpaceError, match="No space") as info:
        patch.setattr(segmented, "_pwrite", full_disk)
        fetch(hub, dest, policy)
    assert info.value.exit_code == ExitCode.ERROR and "bytes kept" in info.value.message
    part, sidecar = part_paths(dest)
    kept = read_sidecar(sidecar)
    assert kept is not None and 0 < kept.done.total <= 1.5 * MiB and not dest.exists()
    on_disk = part.read_bytes()
    assert all(on_disk[s:e] == DATA[s:e] for s, e in kept.done)
    before = len(cdn_gets(hub))
    result = fetch(hub, dest, policy)  # space freed: the rerun asks only for the rest
    assert_complete(dest)
    assert result.resumed_from == kept.done.total
    again = requested(cdn_gets(hub)[before:])
    assert not any(kept.done.covers(s, e) for s, e in again)


def test_the_lock_waiter_sees_pieces_land_as_progress(tmp_path: Path) -> None:
    dest = tmp_path / NAME
    part = part_paths(dest)[0]
    with open(part, "wb") as handle:
        handle.truncate(SIZE)
    before = progress_mark(dest, part)
    time.sleep(0.01)
    fd = os.open(part, os.O_RDWR)
    try:
        os.pwrite(fd, b"x" * 4096, MiB)  # same size, new bytes
    finally:
        os.close(fd)
    assert progress_mark(dest, part) != before


CHILD = r"""
import sys
from pathlib import Path
from quantpick.fetch.transfer import download_file
from quantpick.fetch.segments import SegmentPolicy
from quantpick.hub.base import RemoteFile
url, dest, size, sha = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
policy = SegmentPolicy(max_connections=4, initial_connections=2, min_piece=1 << 20,
                       max_piece=1 << 20, min_split=1 << 18, single_stream_below=1 << 20)
download_file(RemoteFile("m", size, sha, url, "hf", None), dest, headers_for=lambda u: {},
              segments=policy)
"""


def test_kill_9_mid_transfer_then_the_rerun_resumes_from_the_sidecar(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.per_connection_rate = 0.5e6  # ~3 s at two connections, ~1.6 s at four
    dest = tmp_path / NAME
    part, sidecar = part_paths(dest)
    argv = [sys.executable, "-c", CHILD, remote(hub).url, str(dest), str(SIZE), SHA]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    found = None
    while found is None or not found.done:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
        found = read_sidecar(sidecar)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = read_sidecar(sidecar)
    assert killed is not None and not dest.exists()
    assert 0 < killed.done.total < SIZE
    before = len(cdn_gets(hub))
    hub.per_connection_rate = None
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    assert result.resumed_from >= killed.done.total
    again = requested(cdn_gets(hub)[before:])
    assert not any(killed.done.covers(s, e) for s, e in again)


def test_progress_counts_every_byte_once(hub: FakeHub, tmp_path: Path, policy: RetryPolicy) -> None:
    hub.per_connection_rate = 3e6
    total = [0]
    lock = threading.Lock()

    class Count(NullProgress):
        def advance(self, name: str, n_bytes: int) -> None:
            with lock:
                total[0] += n_bytes

    fetch(hub, tmp_path / NAME, policy, progress=Count())
    assert total[0] == SIZE


def test_json_document_reports_connections_and_rate(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.per_connection_rate = 3e6
    doc = fetch(hub, tmp_path / NAME, policy).as_dict()
    assert doc["connections"] >= 2
    assert doc["rate_bytes_per_s"] == pytest.approx(SIZE / doc["seconds"], rel=0.01)
    json.dumps(doc)
