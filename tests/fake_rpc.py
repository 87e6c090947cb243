"""Fake llama.cpp RPC workers: real TCP servers on 127.0.0.1 that speak (or break) the subset of
the ggml RPC protocol quantpick reads, written from llama.cpp b11312's rpc_serve_client
(ggml/src/ggml-rpc/ggml-rpc.cpp), independently of quantpick.machine.rpc.

Every connection's received bytes are recorded (`FakeWorker.received`), so tests can assert the
exact messages the client sent.

    with FakeWorker(devices=[(free, total)]) as w:       # a protocol 7.0.0 worker
        query_worker("127.0.0.1", w.port)
    FakeWorker(behaviour="busy")        # listens, never accepts (serving another client)
    FakeWorker(behaviour="mute")        # accepts, never reads or answers
    FakeWorker(behaviour="v3")          # protocol 3.x: payload-less HELLO, 3-byte reply
    FakeWorker(version=(8, 0, 0))       # another major version
    FakeWorker(behaviour="cut-count")   # closes in the middle of the DEVICE_COUNT reply
    FakeWorker(behaviour="trickle")     # every reply one byte at a time, `trickle_s` apart
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY = 14, 15, 11
CAPS = 24


def _read_exact(conn: socket.socket, n: int, log: bytearray) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        try:
            chunk = conn.recv(n - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
        log += chunk
    return bytes(data)


def _send(conn: socket.socket, payload: bytes, trickle_s: float = 0.0) -> None:
    data = struct.pack("<Q", len(payload)) + payload
    if not trickle_s:
        conn.sendall(data)
        return
    import time

    for i in range(len(data)):  # one byte at a time: each read waits less than any timeout
        conn.sendall(data[i : i + 1])
        time.sleep(trickle_s)


class FakeWorker:
    def __init__(
        self,
        devices: list[tuple[int, int]] | None = None,
        *,
        version: tuple[int, int, int] = (7, 0, 0),
        behaviour: str = "ok",
        trickle_s: float = 1.0,
    ) -> None:
        self.devices = devices if devices is not None else [(20 * 1024**3, 24 * 1024**3)]
        self.version = version
        self.behaviour = behaviour
        self.trickle_s = trickle_s if behaviour == "trickle" else 0.0
        self.received: list[bytes] = []  # one entry per finished connection
        self.connections = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FakeWorker:
        if self.behaviour != "busy":
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        for conn in self._held:
            conn.close()
        self._sock.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def drain_held(self) -> list[bytes]:
        """What the client left on the connections a 'mute' worker never read (as a worker that
        finally gets to them would read it): bytes until EOF, per connection."""
        out = []
        for conn in self._held:
            conn.settimeout(2)
            data = bytearray()
            while True:
                try:
                    chunk = conn.recv(4096)
                except OSError:
                    break
                if not chunk:
                    break
                data += chunk
            out.append(bytes(data))
        return out

    # -- the server ----------------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            self._sock.settimeout(0.1)
        except OSError:  # closed before the thread got here (a test that ends at once)
            return
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            if self.behaviour == "mute":
                self._held.append(conn)  # accepted, never read: as a worker stuck elsewhere
                continue
            self._one_client(conn)  # one client at a time, as ggml-rpc-server

    def _one_client(self, conn: socket.socket) -> None:
        log = bytearray()
        conn.settimeout(5)
        try:
            self._client(conn, log)
        except OSError:
            pass  # the client left (a trickling reply it gave up on)
        finally:
            conn.close()
            self.received.append(bytes(log))

    def _client(self, conn: socket.socket, log: bytearray) -> None:
        if self.behaviour == "banner":
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            while _read_exact(conn, 1, log) is not None:
                pass  # until the client gives up
            return
        head = _read_exact(conn, 9, log)
        if head is None:
            return
        cmd, size = struct.unpack("<BQ", head)
        if cmd != HELLO:
            return
        if self.behaviour == "v3":
            # protocol 3: HELLO has no payload; any other size ends the connection
            if size != 0:
                return
            _send(conn, bytes(self.version))
            return
        if size != CAPS or _read_exact(conn, CAPS, log) is None:
            return  # the knock, or a client of another protocol: hang up without a word
        if self.behaviour == "hangup-hello":
            return
        _send(conn, bytes(self.version) + b"\0" + bytes(CAPS), self.trickle_s)
        while True:
            head = _read_exact(conn, 9, log)
            if head is None:
                return
            cmd, size = struct.unpack("<BQ", head)
            payload = _read_exact(conn, size, log) if size else b""
            if payload is None:
                return
            if cmd == DEVICE_COUNT:
                if self.behaviour == "cut-count":
                    conn.sendall(struct.pack("<Q", 4) + b"\x01\x00")  # 2 of the 4 bytes
                    return
                if self.behaviour == "bad-count-size":
                    _send(conn, struct.pack("<Q", len(self.devices)))  # 8 bytes, not 4
                    continue
                _send(conn, struct.pack("<I", len(self.devices)), self.trickle_s)
            elif cmd == GET_DEVICE_MEMORY:
                (device,) = struct.unpack("<I", payload)
                if device >= len(self.devices):
                    return  # rpc_server::get_device_memory fails: the worker hangs up
                free, total = self.devices[device]
                reply = struct.pack("<QQ", free, total)
                if self.behaviour == "cut-memory":
                    conn.sendall(struct.pack("<Q", 16) + reply[:5])
                    return
                _send(conn, reply, self.trickle_s)
            else:
                return
