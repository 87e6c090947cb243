"""Read an llama.cpp RPC worker (`ggml-rpc-server`): its protocol version, devices and memory.

Written by hand because no Python package speaks ggml's RPC protocol, and a planner needs only
three fixed-size messages of it. The ground truth is llama.cpp b11312
(`ggml/src/ggml-rpc/ggml-rpc.cpp`, `ggml/src/ggml-rpc/transport.cpp`, `ggml/include/ggml-rpc.h`,
`tools/rpc/rpc-server.cpp`); line numbers below are at that commit (076c11381b64).

Framing (ggml-rpc.cpp:307-340), little-endian:
    request  = cmd u8 | payload size u64 | payload
    response = payload size u64 | payload
Messages (rpc_cmd enum, ggml-rpc.cpp:61-82; structs 89-201):
    HELLO (14)              payload: conn_caps[24] (RDMA capabilities; zeros = plain TCP)
                            reply 28: major u8, minor u8, patch u8, pad u8, conn_caps[24]
    DEVICE_COUNT (15)       payload: none                  reply 4: count u32
    GET_DEVICE_MEMORY (11)  payload: device u32            reply 16: free u64, total u64
HELLO must come first and be exactly 24 bytes, or the worker hangs up without a word
(rpc_serve_client, ggml-rpc.cpp:1820-1850). llama-server accepts a worker whose major equals its
own and whose minor is not newer (negotiate_hello, ggml-rpc.cpp:356). Before protocol 4 HELLO had
no payload and a 3-byte reply (major, minor, patch), which is how an old worker is recognised.

What the protocol does not say: a device's name or description. llama-server calls the devices
RPC0, RPC1, ... (one counter over all workers in --rpc order) and describes each by the worker's
"host:port" (ggml_backend_rpc_add_server, ggml-rpc.cpp:2346-2360); only the worker's own console
shows "CUDA0: NVIDIA ...". Memory is read live: ggml_backend_dev_memory on the worker, whose
backends (and their CUDA context) already exist when it listens (ggml-rpc.cpp:2100-2115).

One client at a time: the worker accepts, serves that client until it leaves, then accepts the
next (ggml_backend_rpc_start_server, ggml-rpc.cpp:2142-2152; listen backlog 1, transport.cpp:736).
A worker serving llama-server still completes a new TCP connection (the kernel queues it) but
reads nothing from it. So this module never holds a connection, and it "knocks" before saying
HELLO: the worker writes with send() without MSG_NOSIGNAL (transport.cpp:552) and rpc-server
does not ignore SIGPIPE, so a client that sends a complete HELLO and leaves before the reply
kills the worker (SIGPIPE) the moment the worker gets to that connection. The knock is a HELLO
missing its last payload byte, followed by a half-close: a free worker reads it, meets the end of
the stream and hangs up at once (no reply, no log line); a busy one leaves it queued and, when
it gets to it, drops it the same way. Only after the knock is answered does the real HELLO go.

Usage:
    report = query_worker("192.168.1.20", 50052)     # RpcWorkerError (exit 6) on any problem
    report.devices[0].free_bytes, report.version     # (..., (7, 0, 0))
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time
from dataclasses import dataclass

from quantpick.errors import RpcWorkerError, UsageError
from quantpick.machine.spec import MAX_MEMORY_BYTES

# ggml/include/ggml-rpc.h: RPC_PROTO_MAJOR/MINOR/PATCH_VERSION at b11312.
PROTOCOL_VERSION = (7, 0, 0)
PROTOCOL_MAJOR = PROTOCOL_VERSION[0]
# tools/rpc/rpc-server.cpp:87 rpc_server_params.port
DEFAULT_PORT = 50052
# One deadline for the whole exchange with a worker (knock, connect, HELLO, DEVICE_COUNT, every
# GET_DEVICE_MEMORY): a worker answers each message in well under a millisecond on a LAN (0.17 ms
# measured on loopback), so the exchange takes milliseconds; seconds of silence, or of a reply
# trickling in, mean busy, firewalled, down or not a worker. Several workers are read at once
# (query_workers), so the whole probe is bounded by one such deadline.
DEFAULT_TIMEOUT_S = 3.0
# Workers read at the same time (each is one TCP exchange of a few hundred bytes).
MAX_PARALLEL_QUERIES = 64

CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CONN_CAPS_SIZE = 24  # transport.h RPC_CONN_CAPS_SIZE
HELLO_REPLY_SIZE = 4 + CONN_CAPS_SIZE
LEGACY_HELLO_REPLY_SIZE = 3  # protocol < 4: major, minor, patch
# A worker claiming more devices than this is not one (guards the per-device loop).
MAX_DEVICES = 64


@dataclass(frozen=True)
class DeviceMemory:
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class WorkerReport:
    host: str
    port: int
    version: tuple[int, int, int]
    devices: tuple[DeviceMemory, ...]  # the worker's device order (GET_DEVICE_MEMORY's index)
    address: str  # the worker's IPv4 address as this machine reached it
    head_address: str  # this machine's address on that link
    rtt_s: float  # the quickest request/response round trip seen (DEVICE_COUNT, memory queries)
    notes: tuple[str, ...] = ()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def version_text(self) -> str:
        return ".".join(str(v) for v in self.version)


def request(cmd: int, payload: bytes = b"") -> bytes:
    """One framed request: cmd u8 | size u64 LE | payload."""
    return struct.pack("<BQ", cmd, len(payload)) + payload


HELLO = request(CMD_HELLO, bytes(CONN_CAPS_SIZE))
# The knock: HELLO without its last byte (see the module docstring).
KNOCK = HELLO[:-1]
LEGACY_HELLO = request(CMD_HELLO)
DEVICE_COUNT = request(CMD_DEVICE_COUNT)


def device_memory_request(device: int) -> bytes:
    return request(CMD_GET_DEVICE_MEMORY, struct.pack("<I", device))


def parse_endpoint(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port), as llama-server's --rpc reads it (IPv4 or a host name).

    llama.cpp splits at the first ':' and connects over IPv4 only (parse_endpoint,
    ggml-rpc.cpp:293; socket_t::connect, transport.cpp: AF_INET + gethostbyname), so IPv6
    addresses cannot name a worker.
    """
    value = text.strip()
    host, sep, port_text = value.partition(":")
    hint = "write HOST:PORT, e.g. 192.168.1.20:50052 (ggml-rpc-server's default port is 50052)"
    if value.startswith("[") or port_text.count(":"):
        raise UsageError(
            f"RPC worker {text!r}: llama.cpp reaches workers over IPv4 only", hint=hint
        )
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"cannot read RPC worker {text!r}", hint=hint)
    if any(c.isspace() or c in ",=/" for c in host):
        raise UsageError(f"RPC worker {text!r}: {host!r} is not a host name", hint=hint)
    return host, int(port_text)


def is_ipv4(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False


def is_loopback(host: str) -> bool:
    return host == "localhost" or (is_ipv4(host) and ipaddress.ip_address(host).is_loopback)


def resolve_ipv4(host: str) -> str | None:
    """The IPv4 address llama-server would connect to for `host` (None: it does not resolve)."""
    if is_ipv4(host):
        return host
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    return str(infos[0][4][0]) if infos else None


def local_address_towards(address: str, port: int = DEFAULT_PORT) -> str | None:
    """This machine's source address for traffic to `address` (a routing lookup: a UDP socket's
    connect() picks the route and sends nothing). None when there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((address, port))
            return str(sock.getsockname()[0])
    except OSError:
        return None


# ---- the conversation ------------------------------------------------------------------------


class _Silent(Exception):
    """No (complete) answer within the timeout."""

    def __init__(self, got: int) -> None:
        self.got = got


class _Closed(Exception):
    """The worker hung up (EOF or reset) after `got` bytes of the expected answer."""

    def __init__(self, got: int) -> None:
        self.got = got


class _Deadline:
    """The one deadline of an exchange: every connect, send and receive gets what is left."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s

    def left(self) -> float:
        return self.at - time.monotonic()

    def arm(self, sock: socket.socket) -> None:
        """Give `sock` what is left of the deadline; _Silent when nothing is."""
        left = self.left()
        if left <= 0:
            raise _Silent(0)
        sock.settimeout(left)


def _connect(host: str, port: int, deadline: _Deadline) -> socket.socket:
    where = f"RPC worker {host}:{port}"
    timeout_s = deadline.timeout_s
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise RpcWorkerError(
            f"{where}: cannot resolve {host!r}", hint="use the worker's IPv4 address"
        ) from None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(max(0.001, deadline.left()))
    # As llama.cpp's own client (transport.cpp set_no_delay): small messages go out at once.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.connect(infos[0][4])
    except ConnectionRefusedError:
        sock.close()
        raise RpcWorkerError(
            f"{where}: connection refused (nothing listens on port {port})",
            hint=f"start it there: ggml-rpc-server -H <its LAN address> -p {port}",
        ) from None
    except TimeoutError:
        sock.close()
        raise RpcWorkerError(
            f"{where}: no answer to connect within {timeout_s:g} s (down, firewalled, or so busy "
            "that its accept queue is full)",
            hint="check the address, the worker's firewall, and that no client holds it",
        ) from None
    except OSError as exc:
        sock.close()
        raise RpcWorkerError(f"{where}: cannot connect ({exc.strerror or exc})") from None
    return sock


def _recv_exact(sock: socket.socket, n: int, deadline: _Deadline) -> bytes:
    data = bytearray()
    while len(data) < n:
        try:
            deadline.arm(sock)
        except _Silent:
            raise _Silent(len(data)) from None
        try:
            chunk = sock.recv(n - len(data))
        except TimeoutError:
            raise _Silent(len(data)) from None
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            raise _Closed(len(data)) from None
        if not chunk:
            raise _Closed(len(data))
        data += chunk
    return bytes(data)


def _reply(sock: socket.socket, size: int, what: str, where: str, deadline: _Deadline) -> bytes:
    """One framed reply whose payload must be `size` bytes, within the exchange's deadline."""
    try:
        header = _recv_exact(sock, 8, deadline)
        (got_size,) = struct.unpack("<Q", header)
        if got_size != size:
            raise RpcWorkerError(
                f"{where}: its {what} reply is {got_size} bytes, protocol "
                f"{PROTOCOL_MAJOR}.x sends {size}: not a ggml-rpc-server of that protocol"
            )
        return _recv_exact(sock, size, deadline)
    except _Silent as exc:
        raise RpcWorkerError(
            f"{where}: no {what} reply within the {deadline.timeout_s:g} s the whole exchange "
            "may take" + (f" (stopped after {exc.got} bytes)" if exc.got else "")
        ) from None
    except _Closed as exc:
        raise RpcWorkerError(
            f"{where}: closed the connection in the middle of its {what} reply"
            if exc.got
            else f"{where}: closed the connection instead of answering {what}"
        ) from None


def _device_memory(
    free: int, total: int, device: int, host: str, port: int, notes: list[str]
) -> DeviceMemory:
    """A GET_DEVICE_MEMORY reply as planned on. A size no device has (a u64 of 2^63 or more, past
    spec.MAX_MEMORY_BYTES) is a broken worker: exit 6. Free above total is clamped to the total,
    with a note: llama.cpp's CUDA backend reports the host's MemAvailable as a device's free
    memory on unified-memory systems, and on any GPU when GGML_CUDA_ENABLE_UNIFIED_MEMORY is set
    (ggml-cuda.cu ggml_backend_cuda_device_get_memory), so a real worker can say 34 GiB free of
    a 1 GiB card; the card still holds 1 GiB at GPU speed, and more only by paging to its host."""
    where = f"RPC worker {host}:{port}"
    if total > MAX_MEMORY_BYTES:
        raise RpcWorkerError(
            f"{where}: device {device} reports {total:,} bytes of memory, more than any device "
            "has: not a reply to plan on",
            hint=f"describe the device instead: --rpc-device {host}:{port}=GPU",
        )
    if free > total:
        notes.append(
            f"{where}: device {device} reports {free / 1024**3:.2f} GiB free of "
            f"{total / 1024**3:.2f} GiB total (unified memory counts the host's RAM as free): "
            f"planned with its total, {total / 1024**3:.2f} GiB"
        )
        free = total
    return DeviceMemory(free_bytes=free, total_bytes=total)


def _knock(host: str, port: int, deadline: _Deadline) -> None:
    """Is the worker free? It hangs up on the knock at once if so (module docstring)."""
    where = f"RPC worker {host}:{port}"
    timeout_s = deadline.timeout_s
    with _connect(host, port, deadline) as sock:
        try:
            deadline.arm(sock)
            sock.sendall(KNOCK)
            sock.shutdown(socket.SHUT_WR)
        except (OSError, _Silent):
            pass  # it hung up before the knock was complete: what it said (if anything) tells
        try:
            deadline.arm(sock)
            answer = sock.recv(64)
        except (TimeoutError, _Silent):
            raise RpcWorkerError(
                f"{where} is busy: it accepted the connection but did not read it within "
                f"{timeout_s:g} s. ggml-rpc-server serves one client at a time: is a "
                "llama-server (or another probe) connected to it?",
                hint="probe it before starting llama-server, or describe it with "
                f"--rpc-device {host}:{port}=GPU",
            ) from None
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
            return  # it read the knock and hung up: free
        if answer:
            raise RpcWorkerError(
                f"{where}: something else listens there (it answered an incomplete HELLO with "
                f"{answer[:16]!r}): not a ggml-rpc-server",
                hint="check the port (ggml-rpc-server's default is 50052)",
            )


def _legacy_version(host: str, port: int, deadline: _Deadline) -> tuple[int, int, int] | None:
    """The version of a worker older than protocol 4 (payload-less HELLO), or None."""
    try:
        with _connect(host, port, deadline) as sock:
            deadline.arm(sock)
            sock.sendall(LEGACY_HELLO)
            header = _recv_exact(sock, 8, deadline)
            if struct.unpack("<Q", header)[0] != LEGACY_HELLO_REPLY_SIZE:
                return None
            major, minor, patch = _recv_exact(sock, LEGACY_HELLO_REPLY_SIZE, deadline)
            return major, minor, patch
    except (RpcWorkerError, _Silent, _Closed, OSError):
        return None


def _send(sock: socket.socket, data: bytes, what: str, where: str, deadline: _Deadline) -> None:
    """One request, within the exchange's deadline."""
    try:
        deadline.arm(sock)
        sock.sendall(data)
    except (_Silent, TimeoutError):
        raise RpcWorkerError(
            f"{where}: {what} could not be sent within the {deadline.timeout_s:g} s the whole "
            "exchange may take"
        ) from None
    except OSError as exc:
        raise RpcWorkerError(
            f"{where}: the connection broke while sending {what} ({exc.strerror or exc})"
        ) from None


def _version_error(where: str, version: tuple[int, int, int]) -> RpcWorkerError:
    theirs = ".".join(str(v) for v in version)
    ours = ".".join(str(v) for v in PROTOCOL_VERSION)
    return RpcWorkerError(
        f"{where} speaks RPC protocol {theirs}; quantpick reads protocol {PROTOCOL_MAJOR}.x "
        f"(llama.cpp b11312 speaks {ours}), and llama-server refuses a worker of another major "
        "version",
        hint="run the ggml-rpc-server of the same llama.cpp build as the head's llama-server",
    )


def query_worker(host: str, port: int, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> WorkerReport:
    """Knock, say HELLO, count the devices, read each one's memory, hang up: all of it within
    `timeout_s` (one deadline for the exchange, however slowly the worker trickles its replies
    and however many devices it claims).

    Raises RpcWorkerError (exit 6) with one line saying what is wrong: unresolvable, refused,
    no answer, busy, another program on the port, another protocol version, a reply cut short,
    too slow.
    """
    where = f"RPC worker {host}:{port}"
    deadline = _Deadline(timeout_s)
    _knock(host, port, deadline)
    rtts: list[float] = []
    with _connect(host, port, deadline) as sock:
        address, head_address = sock.getpeername()[0], sock.getsockname()[0]
        _send(sock, HELLO, "HELLO", where, deadline)
        try:
            hello = _reply(sock, HELLO_REPLY_SIZE, "HELLO", where, deadline)
        except RpcWorkerError as exc:
            if "instead of answering" not in exc.message:
                raise
            sock.close()
            # It hung up on a well-formed HELLO: a worker of protocol < 4 does that.
            legacy = _legacy_version(host, port, deadline)
            if legacy is not None:
                raise _version_error(where, legacy) from None
            raise RpcWorkerError(
                f"{where}: closed the connection on HELLO (protocol {PROTOCOL_MAJOR}.x); "
                "it is not a ggml-rpc-server quantpick can read",
                hint="run the ggml-rpc-server of the same llama.cpp build as the head's "
                "llama-server",
            ) from None
        version = (hello[0], hello[1], hello[2])
        if version[0] != PROTOCOL_MAJOR:
            raise _version_error(where, version)

        start = time.perf_counter()
        _send(sock, DEVICE_COUNT, "DEVICE_COUNT", where, deadline)
        (count,) = struct.unpack("<I", _reply(sock, 4, "DEVICE_COUNT", where, deadline))
        rtts.append(time.perf_counter() - start)
        if count == 0:
            raise RpcWorkerError(f"{where} serves no device", hint="check its -d list")
        if count > MAX_DEVICES:
            raise RpcWorkerError(f"{where} claims {count} devices: not a ggml-rpc-server")
        devices = []
        notes: list[str] = []
        for device in range(count):
            start = time.perf_counter()
            _send(sock, device_memory_request(device), "GET_DEVICE_MEMORY", where, deadline)
            reply = _reply(sock, 16, "GET_DEVICE_MEMORY", where, deadline)
            free, total = struct.unpack("<QQ", reply)
            rtts.append(time.perf_counter() - start)
            devices.append(_device_memory(free, total, device, host, port, notes))
    if version[1] > PROTOCOL_VERSION[1]:
        notes.append(
            f"{where} speaks RPC protocol {'.'.join(map(str, version))}: a llama-server of an "
            f"older {PROTOCOL_MAJOR}.x protocol refuses it (ggml-rpc.cpp negotiate_hello: a newer "
            "minor version is a mismatch)"
        )
    return WorkerReport(
        host=host,
        port=port,
        version=version,
        devices=tuple(devices),
        address=str(address),
        head_address=str(head_address),
        rtt_s=min(rtts),
        notes=tuple(notes),
    )


def query_workers(
    endpoints: list[tuple[str, int]], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[WorkerReport | RpcWorkerError]:
    """`query_worker` for every endpoint at once (up to MAX_PARALLEL_QUERIES in flight): the
    whole probe takes about one exchange's deadline, not one per worker. One result per
    endpoint, in order: its report, or the error that worker gave."""
    from concurrent.futures import ThreadPoolExecutor

    def one(endpoint: tuple[str, int]) -> WorkerReport | RpcWorkerError:
        try:
            return query_worker(endpoint[0], endpoint[1], timeout_s=timeout_s)
        except RpcWorkerError as exc:
            return exc

    if len(endpoints) <= 1:
        return [one(e) for e in endpoints]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_QUERIES, len(endpoints))) as pool:
        return list(pool.map(one, endpoints))
