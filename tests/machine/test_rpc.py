"""machine.rpc: reading an llama.cpp RPC worker, against fake workers (exact bytes, every failure)
and, marked `llamacpp`, against real ggml-rpc-server processes."""

from __future__ import annotations

import re
import socket
import struct
import time
from pathlib import Path

import pytest
from fake_rpc import FakeWorker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantpick.errors import ExitCode, RpcWorkerError, UsageError
from quantpick.machine import rpc
from quantpick.machine.rpc import parse_endpoint, query_worker
from quantpick.machine.spec import MAX_MEMORY_BYTES

GiB = 1024**3

# The messages as llama.cpp b11312 frames them (ggml-rpc.cpp send_rpc_cmd: cmd u8, size u64 LE,
# payload), written out byte by byte.
HELLO_BYTES = bytes.fromhex("0e1800000000000000") + bytes(24)
COUNT_BYTES = bytes.fromhex("0f0000000000000000")


def memory_bytes(device: int) -> bytes:
    return bytes.fromhex("0b0400000000000000") + device.to_bytes(4, "little")


def test_the_messages_are_llamacpps() -> None:
    assert rpc.HELLO == HELLO_BYTES
    assert rpc.KNOCK == HELLO_BYTES[:-1]
    assert rpc.DEVICE_COUNT == COUNT_BYTES
    assert rpc.device_memory_request(3) == bytes.fromhex("0b040000000000000003000000")
    assert rpc.LEGACY_HELLO == bytes.fromhex("0e0000000000000000")


def test_query_reads_version_devices_and_memory_then_hangs_up() -> None:
    devices = [(20 * GiB, 24 * GiB), (14 * GiB + 5, 15 * GiB)]
    with FakeWorker(devices) as fake:
        report = query_worker("127.0.0.1", fake.port, timeout_s=2)
        deadline = time.monotonic() + 2
        while len(fake.received) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert report.version == (7, 0, 0) and report.version_text == "7.0.0"
    assert [(d.free_bytes, d.total_bytes) for d in report.devices] == devices
    assert report.address == "127.0.0.1" and report.head_address == "127.0.0.1"
    assert 0 < report.rtt_s < 2 and report.notes == ()
    # Two connections: the knock (an incomplete HELLO, then the client's half-close), and the
    # conversation, byte for byte. The client closed first, with nothing left unanswered.
    knock, talk = fake.received
    assert knock == HELLO_BYTES[:-1]
    assert talk == HELLO_BYTES + COUNT_BYTES + memory_bytes(0) + memory_bytes(1)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.integers(0, MAX_MEMORY_BYTES).flatmap(
            lambda total: st.tuples(st.integers(0, total), st.just(total))
        ),
        min_size=1,
        max_size=5,
    )
)
def test_any_possible_memory_figures_come_back_unchanged(devices: list[tuple[int, int]]) -> None:
    with FakeWorker(devices) as fake:
        report = query_worker("127.0.0.1", fake.port, timeout_s=2)
    assert [(d.free_bytes, d.total_bytes) for d in report.devices] == devices


@pytest.mark.parametrize("total", [2**63, 2**64 - 1, MAX_MEMORY_BYTES + 1])
def test_memory_no_device_has_is_exit_6(total: int) -> None:
    """A u64 of 2^63 or more is a broken worker, never planned on."""
    with (
        FakeWorker([(8 * GiB, 16 * GiB), (0, total)]) as fake,
        pytest.raises(RpcWorkerError) as err,
    ):
        query_worker("127.0.0.1", fake.port, timeout_s=2)
    assert err.value.exit_code == 6
    assert f"device 1 reports {total:,} bytes" in err.value.message
    assert err.value.hint is not None and "--rpc-device 127.0.0.1:" in err.value.hint


def test_free_above_total_is_planned_as_the_total_with_a_note() -> None:
    """Issue 21: 34.65 GiB was planned onto a "1 GiB" device. llama.cpp's CUDA backend reports
    the host's available RAM as free with unified memory, so the reply is clamped, and said."""
    with FakeWorker([(int(34.65 * GiB), GiB)]) as fake:
        report = query_worker("127.0.0.1", fake.port, timeout_s=2)
    assert (report.devices[0].free_bytes, report.devices[0].total_bytes) == (GiB, GiB)
    (note,) = report.notes
    assert "device 0 reports 34.65 GiB free of 1.00 GiB total" in note
    assert "planned with its total, 1.00 GiB" in note


def test_another_major_version_is_refused_naming_both() -> None:
    with FakeWorker(version=(8, 1, 0)) as fake, pytest.raises(RpcWorkerError) as err:
        query_worker("127.0.0.1", fake.port, timeout_s=2)
    assert err.value.exit_code == ExitCode.RPC_WORKER == 6
    assert "speaks RPC protocol 8.1.0" in err.value.message
    assert "7.x" in err.value.message and "7.0.0" in err.value.message


def test_a_pre_4_worker_is_recognised_by_its_old_hello() -> None:
    with (
        FakeWorker(version=(3, 6, 0), behaviour="v3") as fake,
        pytest.raises(RpcWorkerError) as err,
    ):
        query_worker("127.0.0.1", fake.port, timeout_s=2)
    assert "speaks RPC protocol 3.6.0" in err.value.message
    # knock, the 7.x HELLO it hung up on, then the payload-less HELLO it answers
    assert fake.received[-1] == bytes.fromhex("0e0000000000000000")


def test_a_newer_minor_version_is_read_with_a_note() -> None:
    with FakeWorker(version=(7, 2, 1)) as fake:
        report = query_worker("127.0.0.1", fake.port, timeout_s=2)
    assert report.version == (7, 2, 1)
    assert "7.2.1" in report.notes[0] and "refuses" in report.notes[0]


def test_busy_worker_that_does_not_accept() -> None:
    # A worker serving llama-server: the kernel completes our connection, nobody reads it.
    with FakeWorker(behaviour="busy") as fake:
        start = time.monotonic()
        with pytest.raises(RpcWorkerError, match="is busy") as err:
            query_worker("127.0.0.1", fake.port, timeout_s=0.5)
        assert time.monotonic() - start < 3
    assert "one client at a time" in err.value.message


def test_a_worker_that_accepts_and_never_answers_is_busy_and_left_no_full_hello() -> None:
    with FakeWorker(behaviour="mute") as fake:
        with pytest.raises(RpcWorkerError, match="is busy"):
            query_worker("127.0.0.1", fake.port, timeout_s=0.5)
        left = fake.drain_held()
    # When a real worker finally reads this connection it finds an incomplete HELLO and the end
    # of the stream, so it hangs up without replying to a socket nobody holds (the SIGPIPE that
    # kills ggml-rpc-server: see machine/rpc.py).
    assert left == [HELLO_BYTES[:-1]]


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("cut-count", "closed the connection in the middle of its DEVICE_COUNT reply"),
        ("cut-memory", "closed the connection in the middle of its GET_DEVICE_MEMORY reply"),
        ("bad-count-size", "DEVICE_COUNT reply is 8 bytes, protocol 7.x sends 4"),
        ("banner", "something else listens there"),
        ("hangup-hello", "closed the connection on HELLO"),
    ],
)
def test_broken_replies_are_one_clear_error(behaviour: str, message: str) -> None:
    with FakeWorker(behaviour=behaviour) as fake, pytest.raises(RpcWorkerError) as err:
        query_worker("127.0.0.1", fake.port, timeout_s=1)
    assert message in err.value.message
    assert err.value.message.startswith(f"RPC worker 127.0.0.1:{fake.port}")


def test_no_devices_is_an_error() -> None:
    with FakeWorker(devices=[]) as fake, pytest.raises(RpcWorkerError, match="serves no device"):
        query_worker("127.0.0.1", fake.port, timeout_s=1)


def test_refused_and_unresolvable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(RpcWorkerError, match="connection refused") as err:
            query_worker("127.0.0.1", port, timeout_s=1)
    assert err.value.hint is not None and f"-p {port}" in err.value.hint
    with pytest.raises(RpcWorkerError, match="cannot resolve"):
        query_worker("no-such-host.invalid", 50052, timeout_s=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("192.168.1.20:50052", ("192.168.1.20", 50052)),
        (" box.lan:1 ", ("box.lan", 1)),
        ("127.0.0.1:65535", ("127.0.0.1", 65535)),
    ],
)
def test_parse_endpoint(text: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(text) == expected


@pytest.mark.parametrize(
    "text",
    ["box", "box:", ":50052", "box:0", "box:65536", "box:5x", "[::1]:50052", "::1:1", "a b:1"],
)
def test_parse_endpoint_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_endpoint(text)


@given(st.ip_addresses(v=4), st.integers(1, 65535))
def test_parse_endpoint_round_trips(address: object, port: int) -> None:
    assert parse_endpoint(f"{address}:{port}") == (str(address), port)


# ---- real workers (llama.cpp's ggml-rpc-server) ----------------------------------------------


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """TCP may deliver a reply in pieces: read until `n` bytes are in."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.llamacpp
def test_real_worker_is_read_and_survives_a_busy_probe(llamacpp_bin: Path, tmp_path: Path) -> None:
    from rpc_workers import rpc_workers

    with rpc_workers(llamacpp_bin, 1, log_dir=tmp_path) as (endpoint,):
        host, port = parse_endpoint(endpoint)
        report = query_worker(host, port)
        assert report.version == rpc.PROTOCOL_VERSION
        (device,) = report.devices
        # The worker printed its device at start: "  CPU: <desc> (<total> MiB, <free> MiB free)"
        log = next(tmp_path.glob("rpc-*.log")).read_text()
        printed = re.search(r"^\s+\S+: .* \((\d+) MiB, (\d+) MiB free\)$", log, re.M)
        assert printed is not None, log
        assert device.total_bytes // 1024**2 == int(printed.group(1))

        # Hold the worker as llama-server would, then probe: busy, and the worker lives on.
        with socket.create_connection((host, port), timeout=5) as holder:
            holder.sendall(HELLO_BYTES)
            (size,) = struct.unpack("<Q", recv_exact(holder, 8))
            assert len(recv_exact(holder, size)) == size  # the worker's HELLO reply
            with pytest.raises(RpcWorkerError, match="is busy"):
                query_worker(host, port, timeout_s=0.5)
            holder.sendall(COUNT_BYTES)
            assert struct.unpack("<QI", recv_exact(holder, 12)) == (4, 1)
        time.sleep(0.5)  # the worker now reads the abandoned knock, and must drop it quietly
        again = query_worker(host, port)
        assert again.version == rpc.PROTOCOL_VERSION
        assert [d.total_bytes for d in again.devices] == [device.total_bytes]


def test_a_trickling_worker_gets_one_deadline_for_the_whole_exchange() -> None:
    """Before: 3 s per read, so a worker sending one byte a second was followed for 71 s and
    its figures taken. Now one deadline covers knock, HELLO, count and every memory query."""
    with FakeWorker(behaviour="trickle", trickle_s=0.2) as fake:
        start = time.monotonic()
        with pytest.raises(RpcWorkerError, match="within the 1 s the whole exchange may take"):
            query_worker("127.0.0.1", fake.port, timeout_s=1)
        assert time.monotonic() - start < 2


def test_many_workers_are_read_at_once() -> None:
    """Several slow workers cost one deadline together, not one each."""
    from quantpick.machine.rpc import query_workers

    fakes = [FakeWorker(behaviour="trickle", trickle_s=0.3) for _ in range(6)]
    good = FakeWorker()
    with good:
        for f in fakes:
            f.__enter__()
        try:
            start = time.monotonic()
            results = query_workers([("127.0.0.1", f.port) for f in [*fakes, good]], timeout_s=1.5)
            elapsed = time.monotonic() - start
        finally:
            for f in fakes:
                f.__exit__(None, None, None)
    assert elapsed < 4  # sequential: 6 x 1.5 s
    assert all(isinstance(r, RpcWorkerError) for r in results[:-1])
    assert not isinstance(results[-1], RpcWorkerError) and results[-1].port == good.port


def test_resolve_rpc_workers_refuses_one_worker_named_twice_before_reading_it() -> None:
    from quantpick.errors import UsageError
    from quantpick.machine.describe import resolve_rpc_workers

    with FakeWorker(behaviour="mute") as fake:  # reading it would take the whole timeout
        start = time.monotonic()
        with pytest.raises(UsageError, match="are the same worker"):
            resolve_rpc_workers([f"localhost:{fake.port}", f"127.0.0.1:{fake.port}"])
        assert time.monotonic() - start < 1
