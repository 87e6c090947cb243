"""The address llama-server listens on: a host checked, a port found free (bound without
SO_REUSEPORT, which cpp-httplib sets: see serve/server.py), and the address a client connects to
for a wildcard listen address."""

from __future__ import annotations

import errno
import socket

from quantpick.errors import UsageError


def connect_host(host: str) -> str:
    """The address to reach a server listening on `host` from this machine."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "::1"
    return host.strip("[]")


def check_host(host: str) -> None:
    if host.endswith(".sock"):
        raise UsageError(
            f"--host {host}: quantpick serve waits for /health over TCP",
            hint="give an IP address (127.0.0.1 by default); run a socket with `quantpick get`",
        )


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind host:port now. SO_REUSEADDR (a closed connection's
    TIME_WAIT must not count as busy) but not SO_REUSEPORT (which would share a live port)."""
    address = host.strip("[]") or "0.0.0.0"
    with socket.socket(_family(address), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise UsageError(f"--host {host}: cannot listen there ({exc.strerror})") from None
    return True


def free_port(host: str) -> int:
    """A port the kernel says is free on `host` now."""
    address = host.strip("[]") or "0.0.0.0"
    with socket.socket(_family(address), socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def choose_port(host: str, port: int) -> tuple[int, str | None]:
    """(the port to use, a note when it is not the one asked for)."""
    if port == 0:
        chosen = free_port(host)
        return chosen, f"--port 0: using free port {chosen}"
    if port_is_free(host, port):
        return port, None
    chosen = free_port(host)
    return chosen, f"port {port} is in use on {host}: using free port {chosen}"
