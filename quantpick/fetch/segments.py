"""Segmented transfers, the pure part: which bytes are done, who fetches what next, how many
connections. No I/O, no clock of its own (callers pass `now`), no threads: quantpick.fetch.segmented
drives it under one lock.

Why pieces in order and not N big segments: the sha256 must run over the bytes in order. With the
file cut into N equal segments up front, the hash can only follow the first one, and at the end
(N-1)/N of the file is still to be read back and hashed (14 s for 20 GB at ~1.4 GiB/s, longer once
it left the page cache). Handing out pieces in file order instead keeps every connection within a
few pieces of the hashed prefix: the hash follows the transfer through the page cache and the
tail left to hash at the end is about one window (`window_bytes`), not the file.

Sources of the numbers are in SegmentPolicy; the field's practice is in
../shared/notes/serving-ecosystem.md ("How big files travel").
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

MiB = 1024 * 1024


@dataclass(frozen=True)
class SegmentPolicy:
    """How one file is split over connections. `max_connections=1` is the single stream."""

    # Cap on connections per file. Ollama fetches a blob in up to 16 parts; hf_xet adapts from 4
    # to 64 streams, but unbounded adaptive concurrency collapsed to 0.1-1 MB/s on a 25 Gbit link
    # where a fixed 4 held ~300 MB/s (huggingface/huggingface_hub#4893): adapt, under a cap.
    max_connections: int = 16
    # Connections once the first ranged answer shows the server honours Range: hf_xet's minimum.
    initial_connections: int = 4
    # Smallest piece a connection is given: one request costs about one round trip of idle
    # connection (~0.1 s to a CDN edge); 16 MiB is 0.8 s at 20 MB/s and 1.8 s at the 8.7 MB/s of
    # the slow Hugging Face edges (huggingface/xet-core#821), so the idle time stays <= ~10 %.
    min_piece: int = 16 * MiB
    # Pieces grow to ~PIECE_SECONDS of one connection's measured rate, up to this (a 20 GB file
    # at 16 connections of 60 MB/s: 256 MiB pieces, ~80 requests in all).
    max_piece: int = 256 * MiB
    # Below this a file goes as one stream: it cannot fill the initial connections with pieces
    # of min_piece, and at 20 MB/s it is done in about 3 s, one controller window or two.
    single_stream_below: int = 64 * MiB
    # A segment is split only if both halves get at least this much (aria2c: --min-split-size
    # 20M; half a minimum piece here).
    min_split: int = 8 * MiB
    # The controller measures the aggregate rate over windows of this length, each started once
    # every connection has received its first bytes: at 20 MB/s a window is ~150 TCP bursts of
    # 64 KiB per connection, and doubling from 4 to the cap of 16 takes two windows (~1 s).
    window_seconds: float = 0.5
    # A step up is kept when the aggregate rate grew by at least this fraction.
    min_gain: float = 0.10
    # Past max_connections, only when each connection is capped by the server (a CDN edge that
    # holds one TCP stream to a rate): the last doubling at least LINEAR_SHARE x doubled the
    # rate, so the link still has room and connections are what limit it. Up to this many:
    # under hf_transfer's 100 (huggingface_hub 0.x constants.HF_TRANSFER_CONCURRENCY), which
    # the issue saw go past a 16-connection cap that way; a doubling that stops paying still
    # steps back (the collapse of unbounded concurrency, huggingface/huggingface_hub#4893,
    # needs growth without that check). `--connections N` makes N the cap of both.
    capped_max_connections: int = 64

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if not 0 < self.min_split <= self.min_piece <= self.max_piece:
            raise ValueError("need 0 < min_split <= min_piece <= max_piece")

    def segmented_for(self, size: int | None) -> bool:
        """Whether a file of `size` bytes goes over several connections."""
        return self.max_connections > 1 and size is not None and size >= self.single_stream_below

    @property
    def first_connections(self) -> int:
        return max(1, min(self.initial_connections, self.max_connections))


SINGLE_STREAM = SegmentPolicy(max_connections=1, capped_max_connections=1)


def policy_for(connections: int | None) -> SegmentPolicy:
    """The policy of `--connections N` (None: the default)."""
    if connections is None:
        return SegmentPolicy()
    if connections == 1:
        return SINGLE_STREAM
    return SegmentPolicy(max_connections=connections, capped_max_connections=connections)


# A doubling of the connections that brought at least this share of a doubled rate (1.6x): each
# connection holds its own rate, so the server caps connections, not the link.
LINEAR_SHARE = 0.8
PIECE_SECONDS = 4.0  # a piece lasts ~4 s on one connection: one round trip idle in 4 s is <= 3 %
WINDOW_PIECES = 2  # new pieces start at most 2 x connections x piece past the hashed prefix


# ---------------------------------------------------------------------------------------------
# Which bytes are done


class RangeSet:
    """Disjoint, merged half-open byte ranges [start, end), sorted."""

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in ranges:
            self.add(start, end)

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        # every range that touches or overlaps [start, end) merges into one
        lo = bisect.bisect_left(self._ends, start)
        hi = bisect.bisect_right(self._starts, end)
        if lo < hi:
            start = min(start, self._starts[lo])
            end = max(end, self._ends[hi - 1])
        self._starts[lo:hi] = [start]
        self._ends[lo:hi] = [end]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends, strict=True))

    def __len__(self) -> int:
        return len(self._starts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeSet) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"RangeSet({list(self)!r})"

    def copy(self) -> RangeSet:
        out = RangeSet()
        out._starts, out._ends = list(self._starts), list(self._ends)
        return out

    @property
    def total(self) -> int:
        return sum(e - s for s, e in self)

    def prefix_end(self) -> int:
        """End of the range that starts at byte 0 (0 when byte 0 is not done)."""
        return self._ends[0] if self._starts and self._starts[0] == 0 else 0

    def covers(self, start: int, end: int) -> bool:
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def gaps(self, size: int) -> list[tuple[int, int]]:
        """What is not done in [0, size)."""
        out, at = [], 0
        for start, end in self:
            if start > at:
                out.append((at, min(start, size)))
            at = max(at, end)
        if at < size:
            out.append((at, size))
        return [(s, e) for s, e in out if e > s]


# ---------------------------------------------------------------------------------------------
# Who fetches what


@dataclass(eq=False)
class Segment:
    """A byte range one connection owns: [start, end), written up to `cursor`."""

    start: int
    end: int  # shrinks when another connection takes its upper part
    owner: int
    cursor: int = -1  # next byte to write; bytes [start, cursor) are written
    claimed: int = -1  # bytes [cursor, claimed) are being written right now (never split off)
    failures: int = 0  # consecutive failed attempts without progress

    def __post_init__(self) -> None:
        if self.cursor < 0:
            self.cursor = self.start
        if self.claimed < 0:
            self.claimed = self.cursor

    @property
    def remaining(self) -> int:
        return self.end - self.cursor

    @property
    def done(self) -> bool:
        return self.cursor >= self.end


@dataclass
class Scheduler:
    """Hands out pieces in file order, splits the slowest segment when a connection frees up.

    `done` is what is on disk; `pending` what nobody owns yet. A connection asks `take()` for
    work, and for each chunk it read calls `claim()` (how much of it to write: never past the
    segment's end, which a split may have moved) and then `commit()` once it is written.
    """

    size: int
    policy: SegmentPolicy
    done: RangeSet = field(default_factory=RangeSet)
    piece: int = 0
    segments: list[Segment] = field(default_factory=list)
    pending: list[tuple[int, int]] = field(init=False)

    def __post_init__(self) -> None:
        self.pending = self.done.gaps(self.size)
        self.piece = self.piece or self.policy.min_piece

    @property
    def finished(self) -> bool:
        return self.done.covers(0, self.size) if self.size else True

    def set_rate(self, per_connection: float) -> None:
        """Pieces of ~PIECE_SECONDS at the measured rate of one connection (bytes/s), and at
        most a share of the file that leaves two pieces per connection at the cap (so a short
        file is not done in three big pieces and a string of splits)."""
        want = min(
            int(per_connection * PIECE_SECONDS), self.size // (2 * self.policy.max_connections)
        )
        self.piece = max(self.policy.min_piece, min(self.policy.max_piece, want))

    def take(self, owner: int, rates: dict[int, float], connections: int) -> Segment | None:
        """The next segment for connection `owner` (None: nothing left it could help with).

        In order of preference: a new piece near the hashed prefix; the upper part of the
        segment that would finish last (by its connection's rate in `rates`, bytes/s); any
        piece further away. `connections` is how many are meant to run (bounds the window).
        """
        window = WINDOW_PIECES * max(1, connections) * self.piece
        if self.pending and self.pending[0][0] - self.done.prefix_end() < window:
            return self._new_piece(owner)
        split = self._split_slowest(owner, rates)
        if split is not None:
            return split
        if self.pending:
            return self._new_piece(owner)
        return None

    def _new_piece(self, owner: int) -> Segment:
        start, end = self.pending[0]
        cut = min(end, start + self.piece)
        if end - cut < self.policy.min_split:
            cut = end  # no crumb left behind for a request of its own
        if cut == end:
            self.pending.pop(0)
        else:
            self.pending[0] = (cut, end)
        segment = Segment(start, cut, owner)
        self.segments.append(segment)
        return segment

    def _split_slowest(self, owner: int, rates: dict[int, float]) -> Segment | None:
        known = [r for r in rates.values() if r > 0]
        typical = sorted(known)[len(known) // 2] if known else 0.0
        best: tuple[float, Segment] | None = None
        for seg in self.segments:
            if seg.done or seg.end - seg.claimed < 2 * self.policy.min_split:
                continue
            rate = rates.get(seg.owner, 0.0)
            finish = (seg.end - seg.claimed) / rate if rate > 0 else float("inf")
            if (
                best is None
                or finish > best[0]
                or (finish == best[0] and seg.remaining > best[1].remaining)
            ):
                best = (finish, seg)
        if best is None:
            return None
        seg = best[1]
        left = seg.end - seg.claimed
        rate = rates.get(seg.owner, 0.0)
        mine = rates.get(owner, 0.0) or typical
        # Both connections should finish together: each takes a share in proportion to its rate
        # (a stalled one keeps the minimum). Unknown rates: halves.
        share = rate / (rate + mine) if rate > 0 and mine > 0 else (0.0 if mine > 0 else 0.5)
        keep = int(left * share)
        keep = max(self.policy.min_split, min(left - self.policy.min_split, keep))
        cut = seg.claimed + keep
        upper = Segment(cut, seg.end, owner)
        seg.end = cut
        self.segments.append(upper)
        return upper

    def claim(self, seg: Segment, n: int) -> int:
        """How many of the `n` bytes read at seg.cursor to write (0: the segment is complete)."""
        n = max(0, min(n, seg.end - seg.cursor))
        seg.claimed = seg.cursor + n
        return n

    def commit(self, seg: Segment) -> None:
        """The claimed bytes are written."""
        if seg.claimed > seg.cursor:
            self.done.add(seg.cursor, seg.claimed)
            seg.cursor = seg.claimed
            seg.failures = 0
        if seg.done:
            self._forget(seg)

    def release(self, seg: Segment) -> None:
        """Its connection stops: what it did not write goes back to the pending list."""
        seg.claimed = seg.cursor
        if seg.cursor < seg.end:
            bisect.insort(self.pending, (seg.cursor, seg.end))
            self._merge_pending()
        self._forget(seg)

    def _forget(self, seg: Segment) -> None:
        if seg in self.segments:
            self.segments.remove(seg)

    def _merge_pending(self) -> None:
        merged: list[tuple[int, int]] = []
        for start, end in self.pending:
            if merged and merged[-1][1] >= start:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        self.pending = merged


# ---------------------------------------------------------------------------------------------
# How many connections


@dataclass
class Concurrency:
    """Adaptive connection count: step up while the aggregate rate grows, cap it, and step down
    when the server says it is busy (429/503).

    Steps: n -> 2n (4, 8, 16 with the default cap; 32, 64 when each connection is capped by
    the server: SegmentPolicy.capped_max_connections). A step is kept when
    the rate over the next full window grew by `min_gain`; otherwise the count goes back one
    step and stays there for the rest of the file. A busy answer sets the count to one less than
    the connections running and makes that the ceiling.
    """

    policy: SegmentPolicy
    target: int = 1
    ceiling: int = 0
    frozen: bool = False
    _previous: int = 0
    _rate_before: float | None = None
    _window_start: float | None = None
    _bytes_at_start: int = 0

    def __post_init__(self) -> None:
        self.ceiling = self.ceiling or self.policy.max_connections

    def start(self) -> None:
        """Ranges work: go to the initial count."""
        self.target = min(self.ceiling, self.policy.first_connections)
        self._window_start = None

    def observe(self, now: float, total_bytes: int, running: int) -> int:
        """Called often with the bytes written so far and the connections transferring; returns
        the count wanted from now on."""
        if running < self.target:
            self._window_start = None  # a window counts only once every connection is moving
            return self.target
        if self._window_start is None:
            self._window_start, self._bytes_at_start = now, total_bytes
            return self.target
        elapsed = now - self._window_start
        if elapsed < self.policy.window_seconds:
            return self.target
        rate = (total_bytes - self._bytes_at_start) / elapsed
        self._window_start, self._bytes_at_start = now, total_bytes
        if self.frozen:
            return self.target
        if self._rate_before is not None and rate < self._rate_before * (1 + self.policy.min_gain):
            self.target, self.frozen = self._previous, True  # the last step did not pay
            return self.target
        capped = (
            self._rate_before is not None
            and self._previous > 0
            and rate >= self._rate_before * LINEAR_SHARE * self.target / self._previous
        )
        self._rate_before = rate
        if capped and self.target >= self.ceiling:
            # each connection is capped by the server and the link has room: go on past the cap
            self.ceiling = max(self.ceiling, self.policy.capped_max_connections)
        if self.target < self.ceiling:
            self._previous = self.target
            self.target = min(self.ceiling, 2 * self.target)
        else:
            self.frozen = True
        return self.target

    def busy(self, running: int) -> int:
        """A 429/503: one connection fewer than are running, and never more than that again."""
        self.target = max(1, min(self.target, running - 1))
        self.ceiling = self.target
        self.frozen = True
        self._window_start = None
        return self.target
