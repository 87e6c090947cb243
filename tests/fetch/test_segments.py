"""quantpick.fetch.segments: done ranges, who fetches what next, how many connections (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantpick.fetch.segments import (
    SINGLE_STREAM,
    Concurrency,
    MiB,
    RangeSet,
    Scheduler,
    SegmentPolicy,
)


def test_rangeset_merges_touching_and_overlapping_ranges() -> None:
    done = RangeSet([(10, 20), (30, 40)])
    done.add(20, 25)  # touches the first
    done.add(35, 50)  # overlaps the second
    assert list(done) == [(10, 25), (30, 50)]
    done.add(0, 100)
    assert list(done) == [(0, 100)]
    done.add(5, 5)  # empty: ignored
    assert list(done) == [(0, 100)] and done.total == 100


def test_rangeset_prefix_gaps_and_cover() -> None:
    done = RangeSet([(0, 10), (20, 30)])
    assert done.prefix_end() == 10
    assert RangeSet([(5, 10)]).prefix_end() == 0
    assert done.gaps(40) == [(10, 20), (30, 40)]
    assert RangeSet().gaps(7) == [(0, 7)]
    assert done.covers(20, 30) and done.covers(2, 8)
    assert not done.covers(5, 15) and not done.covers(30, 31)


POLICY = SegmentPolicy(
    max_connections=4,
    initial_connections=2,
    min_piece=10 * MiB,
    max_piece=40 * MiB,
    min_split=2 * MiB,
    single_stream_below=20 * MiB,
)


def test_policy_threshold_and_single_stream() -> None:
    assert not POLICY.segmented_for(None)  # no size: no ranges to ask for
    assert not POLICY.segmented_for(20 * MiB - 1)
    assert POLICY.segmented_for(20 * MiB)
    assert not SINGLE_STREAM.segmented_for(10**12)
    assert SegmentPolicy(max_connections=3).first_connections == 3
    with pytest.raises(ValueError):
        SegmentPolicy(max_connections=0)
    with pytest.raises(ValueError):
        SegmentPolicy(min_split=2 * MiB, min_piece=MiB)


def test_pieces_go_out_in_file_order_and_the_last_one_takes_the_crumb() -> None:
    sched = Scheduler(31 * MiB + 5, POLICY)
    pieces = [sched.take(i, {}, 4) for i in range(3)]
    assert [(p.start, p.end) for p in pieces if p] == [
        (0, 10 * MiB),
        (10 * MiB, 20 * MiB),
        # 11 MiB + 5 left: a 10 MiB piece would leave 1 MiB + 5, under min_split: taken whole
        (20 * MiB, 31 * MiB + 5),
    ]
    assert sched.pending == []


def test_resume_hands_out_only_what_is_missing() -> None:
    done = RangeSet([(0, 10 * MiB), (20 * MiB, 30 * MiB)])
    sched = Scheduler(30 * MiB, POLICY, done)
    first = sched.take(0, {}, 4)
    assert first is not None and (first.start, first.end) == (10 * MiB, 20 * MiB)
    second = sched.take(1, {}, 4)  # nothing else is missing: half of that one (rates unknown)
    assert second is not None and (first.end, second.start, second.end) == (15 * MiB,) * 2 + (
        20 * MiB,
    )
    for seg in (first, second):
        sched.claim(seg, 5 * MiB)
        sched.commit(seg)
    assert sched.finished and sched.segments == []


def test_a_free_connection_splits_the_segment_that_would_finish_last() -> None:
    sched = Scheduler(20 * MiB, POLICY)
    fast = sched.take(0, {}, 4)
    slow = sched.take(1, {}, 4)
    assert fast is not None and slow is not None and sched.pending == []
    sched.claim(fast, 8 * MiB)
    sched.commit(fast)  # 2 MiB left at 10 MB/s: done soon
    # Connection 1 moves at 1 MB/s with 10 MiB to go: the slowest. The freed connection 2 runs
    # at 9 MB/s, so connection 1 keeps a tenth of what is left (both finish together).
    rates = {0: 10e6, 1: 1e6, 2: 9e6}
    upper = sched.take(2, rates, 4)
    assert upper is not None and upper.owner == 2
    assert slow.end == upper.start == 10 * MiB + 2 * MiB  # a tenth is 1 MiB: min_split wins
    assert upper.end == 20 * MiB
    # A fourth (rate unknown: taken as the median, 9 MB/s) halves the helper's 8 MiB.
    fourth = sched.take(3, rates, 4)
    assert fourth is not None and (upper.end, fourth.start) == (16 * MiB, 16 * MiB)
    # Splits go on until no segment has two min_splits left.
    owner = 4
    while sched.take(owner, rates, 4) is not None:
        owner += 1
    assert owner == 6  # 4 MiB + 4 MiB split once each
    assert all(s.end - s.claimed < 2 * POLICY.min_split for s in sched.segments)


def test_a_split_never_takes_bytes_being_written() -> None:
    sched = Scheduler(10 * MiB, POLICY)
    seg = sched.take(0, {}, 4)
    assert seg is not None
    assert sched.claim(seg, 3 * MiB) == 3 * MiB  # read, not yet written
    upper = sched.take(1, {}, 4)  # rates unknown: halves of what is not claimed
    assert upper is not None and upper.start == 3 * MiB + (7 * MiB) // 2
    sched.commit(seg)
    # The owner read past its new end: only what is still its own is written.
    assert sched.claim(seg, 8 * MiB) == upper.start - 3 * MiB
    sched.commit(seg)
    assert seg.done and seg not in sched.segments


def test_released_segment_goes_back_first() -> None:
    sched = Scheduler(30 * MiB, POLICY)
    a = sched.take(0, {}, 4)
    assert a is not None
    sched.claim(a, MiB)
    sched.commit(a)
    sched.release(a)  # its connection went away after 1 MiB
    again = sched.take(1, {}, 4)
    assert again is not None and (again.start, again.end) == (MiB, 10 * MiB + MiB)


def test_window_bounds_how_far_new_pieces_run_ahead_of_the_prefix() -> None:
    policy = SegmentPolicy(min_piece=MiB, max_piece=MiB, min_split=MiB // 4, max_connections=2)
    sched = Scheduler(100 * MiB, policy)
    stuck = sched.take(0, {}, 2)
    assert stuck is not None
    for i in range(1, 4):  # window: 2 pieces x 2 connections = 4 MiB past the prefix (0)
        seg = sched.take(i, {}, 2)
        assert seg is not None and seg.start == i * MiB
        sched.claim(seg, MiB)
        sched.commit(seg)
    # The prefix is stuck at 0 behind connection 0: the next free one helps it instead of
    # running further ahead.
    helper = sched.take(4, {0: 1e3, 4: 1e6}, 2)
    assert helper is not None and helper.start < MiB and helper.end == MiB


def test_concurrency_steps_up_while_the_rate_grows_then_steps_back() -> None:
    policy = SegmentPolicy(max_connections=16, initial_connections=4, window_seconds=1.0)
    c = Concurrency(policy)
    assert c.target == 1  # the first piece, alone, finds out whether ranges work
    c.start()
    assert c.target == 4
    t, total = 0.0, 0
    assert c.observe(t, total, running=4) == 4  # the window opens
    t, total = 1.0, total + 80
    assert c.observe(t, total, running=4) == 8  # first measure: step up
    assert c.observe(t + 0.1, total, running=5) == 8  # not all moving yet: no window
    t = 2.0
    assert c.observe(t, total, running=8) == 8  # all eight moving: the window opens
    t, total = 3.0, total + 160  # doubled
    assert c.observe(t, total, running=8) == 16
    t = 4.0
    c.observe(t, total, running=16)
    t, total = 5.0, total + 165  # +3 %: the step did not pay
    assert c.observe(t, total, running=16) == 8 and c.frozen
    t, total = 6.0, total + 500
    assert c.observe(t, total, running=8) == 8  # frozen for the rest of the file


def test_concurrency_backs_off_when_the_server_is_busy() -> None:
    c = Concurrency(SegmentPolicy(max_connections=16, initial_connections=4))
    c.start()
    assert c.busy(running=4) == 3
    assert c.busy(running=3) == 2
    assert c.busy(running=1) == 1  # never below one
    assert c.ceiling == 1 and c.frozen


def test_cap_bounds_everything() -> None:
    c = Concurrency(SegmentPolicy(max_connections=2, initial_connections=4, window_seconds=0.1))
    c.start()
    assert c.target == 2
    c.observe(0.0, 0, 2)
    assert c.observe(0.2, 100, 2) == 2 and c.frozen


# -- a hub that caps each connection (issue 30): the policy, on a simulated link ---------------


def simulate(
    policy: SegmentPolicy, cap: float, link: float, seconds: float = 60.0
) -> tuple[int, float]:
    """Concurrency on a link of `link` bytes/s shared by connections the server holds to `cap`
    bytes/s each: every connection asked for runs at once (ticks of 50 ms). Returns the
    connections at the end and the rate they then move."""
    c = Concurrency(policy)
    c.start()
    now, total, dt = 0.0, 0.0, 0.05
    while now < seconds:
        rate = min(link, c.target * cap)
        now, total = now + dt, total + rate * dt
        c.observe(now, int(total), running=c.target)
    return c.target, min(link, c.target * cap)


def test_connections_grow_past_16_when_each_one_is_capped() -> None:
    """Before: 16 connections at most, so a CDN capping each at 20 MB/s gave 320 MB/s on a link
    with room for 1.28 GB/s (hf_transfer went past it with ~100 connections)."""
    policy = SegmentPolicy()
    n, rate = simulate(policy, cap=20e6, link=10e9)
    assert n == policy.capped_max_connections > policy.max_connections
    assert rate >= 0.9 * policy.capped_max_connections * 20e6


def test_an_explicit_connections_count_stays_the_cap() -> None:
    from quantpick.fetch.segments import policy_for

    n, _ = simulate(policy_for(8), cap=20e6, link=10e9)
    assert n == 8


def test_a_link_limited_transfer_does_not_grow_past_16() -> None:
    n, rate = simulate(SegmentPolicy(), cap=100e6, link=1e9)  # 10 connections fill the link
    assert n <= 16 and rate >= 0.9 * 1e9


@settings(max_examples=200, deadline=None)
@given(st.floats(1e5, 1e8), st.floats(1.0, 200.0))
def test_a_capped_link_reaches_90_percent_of_its_ceiling(cap: float, room: float) -> None:
    """Whatever the per-connection cap and the link (room = link / cap), the connections settle
    at >= 90 % of the most the link and the policy's connections can carry, never past it."""
    policy = SegmentPolicy()
    link = cap * room
    n, rate = simulate(policy, cap, link)
    ceiling = min(link, policy.capped_max_connections * cap)
    assert n <= policy.capped_max_connections
    assert rate >= 0.9 * ceiling
