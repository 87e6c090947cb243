"""HTTP for the transfer engine: connections, redirects, retries, small GETs. Stdlib http.client.

Why http.client and not httpx: on loopback the notes measured ~900 MiB/s with sha256 for
http.client `readinto(1 MiB)` against ~300 MiB/s for httpx (pure-Python h11 in 64 KiB reads).
Redirects are followed by hand so that `Authorization`/`Cookie` are dropped when the origin changes.
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

from quantpick.errors import DownloadError, redacted

_REDIRECTS = {301, 302, 303, 307, 308}
_CREDENTIAL_HEADERS = ("authorization", "cookie")

HeadersFor = Callable[[str], dict[str, str]]


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port): what "same origin" means for sending credentials."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. `sleep` and `jitter` are injectable so fault tests run in milliseconds."""

    attempts: int = 6  # consecutive failed attempts without progress before giving up
    base_delay: float = 1.0
    max_delay: float = 60.0
    max_retry_after: float = 300.0
    idle_timeout: float = 30.0  # seconds without a byte before a connection counts as stalled
    connect_timeout: float = 15.0
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random
    # Progress lines from with_retries (a slow first answer, each retry); None: silent.
    notify: Callable[[str], None] | None = None

    def backoff(self, failures: int) -> float:
        delay = min(self.max_delay, self.base_delay * 2 ** max(0, failures - 1))
        return delay * (0.5 + 0.5 * self.jitter())  # "equal jitter": never below half

    def worst_case_seconds(self) -> float:
        """The longest a call that never gets an answer can take: every attempt waits for its
        connect and read timeouts, and every pause between attempts is at its longest."""
        waits = sum(
            min(self.max_delay, self.base_delay * 2 ** (i - 1)) for i in range(1, self.attempts)
        )
        return self.attempts * (self.connect_timeout + self.idle_timeout) + waits


# The policy every network call uses unless its caller passes one. One module attribute, read at
# call time, so that a test can make the whole program give up in a second (monkeypatch it).
DEFAULT_POLICY = RetryPolicy()


def default_policy() -> RetryPolicy:
    return DEFAULT_POLICY


# A call that can take minutes (up to worst_case_seconds) says so once it has waited this long
# for its first answer: a healthy hub answers a listing in well under a second, so 5 s without
# one is worth a line, and short enough that nobody stares at a silent terminal.
SLOW_ANSWER_NOTICE = 5.0

# All of `pick`'s optional exact-header read (listing + header ranges, every attempt) gets this
# long, then the plan goes on with the manifest's table (a note says so; --exact waits for the
# header instead). A budget chosen for an interactive answer, not measured: a 4 MiB first window
# arrives within it from ~7 Mbit/s up, the whole 11 MB Qwen3.6 header from ~18 Mbit/s up.
PLANNING_DEADLINE = 5.0


class DeadlineExceeded(DownloadError):
    """An optional call did not finish within its deadline (call_within): go on without it."""


def call_within(seconds: float, what: str, call: Callable[[], Any]) -> Any:
    """`call()` on a worker thread, waited for at most `seconds` in total; DeadlineExceeded
    after that. The call's own exception is raised here. A call past its deadline goes on in
    the background until its own timeouts end it, and its result is dropped: only for reads a
    caller can do without (daemon thread: it never keeps the process alive)."""
    import threading

    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"quantpick: {what}", daemon=True).start()
    if not done.wait(seconds):
        raise DeadlineExceeded(f"{what}: no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def planning_policy() -> RetryPolicy:
    """For a read a plan can do without (the exact header `pick` tries once, falling back to the
    manifest): two attempts, shorter timeouts and a short pause, so a hub that never answers
    delays the answer by at most 2 x (5 + 10) + 0.2 s instead of minutes, and an unreachable one
    (offline, DNS failure) by well under a second. Derived from DEFAULT_POLICY."""
    from dataclasses import replace

    base = default_policy()
    return replace(
        base,
        attempts=min(base.attempts, 2),
        base_delay=min(base.base_delay, 0.2),
        connect_timeout=min(base.connect_timeout, 5.0),
        idle_timeout=min(base.idle_timeout, 10.0),
    )


# ---------------------------------------------------------------------------------------------
# HTTP primitives


class UnreachableError(DownloadError):
    """A host whose name does not resolve: no network (or no DNS) here. Not retried: offline
    means offline, and it fails fast and short (exit 5)."""

    def __init__(self, host: str) -> None:
        super().__init__(
            f"cannot reach {host}: its name does not resolve (no network?)",
            hint="--offline plans from the manifest and uses the files already in place",
        )
        self.host = host


_NAME_RESOLUTION = (
    "Name or service not known",
    "Temporary failure in name resolution",
    "nodename nor servname",
    "No address associated with hostname",
    "getaddrinfo failed",
)


def name_unresolved(exc: BaseException) -> bool:
    """Is `exc` (or what it wraps) a failed name lookup? socket.gaierror, or httpx's ConnectError
    around one (huggingface_hub's client)."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        if isinstance(cur, socket.gaierror):
            return True
        if any(text in str(cur) for text in _NAME_RESOLUTION):
            return True
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return False


class TransientError(Exception):
    """Worth retrying (connection error, stall, 5xx, 429, short body)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(redacted(message))
        self.retry_after = retry_after


class ConnectionRefused(TransientError):
    """Nothing listens at the host and port (ECONNREFUSED), or a firewall says so: not retried by
    `with_retries` (docs/download.md: a refused connection fails at once). A transfer that had
    already received bytes from that host retries it like any break (a restarting server)."""


def connection_refused(exc: BaseException) -> bool:
    """Is `exc` (or what it wraps: httpx's ConnectError around the OSError) a refused
    connection?"""
    import errno

    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        if isinstance(cur, ConnectionRefusedError):
            return True
        if isinstance(cur, OSError) and cur.errno == errno.ECONNREFUSED:
            return True
        if "Connection refused" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return False


def network_error(exc: BaseException, url: str) -> TransientError:
    """The TransientError for a failed connection or request to `url` (ConnectionRefused when it
    was refused), its message without credentials."""
    kind = ConnectionRefused if connection_refused(exc) else TransientError
    return kind(f"{type(exc).__name__}: {exc} ({url_label(url)})")


class BodyTooLarge(DownloadError):
    """A small file (SHA256SUMS) larger than its cap: the caller decides whether to go on."""


class RestartTransfer(Exception):
    """The server's answer to a resume cannot be trusted: start the file again from byte 0."""


def _proxy_for(url: str) -> str | None:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host in ("localhost", "127.0.0.1", "::1") or urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _connect(url: str, policy: RetryPolicy) -> tuple[http.client.HTTPConnection, str]:
    """A connected HTTP(S) connection and the request target (honours *_proxy / no_proxy)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise DownloadError(f"unsupported URL scheme in {parts.scheme}://...")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    proxy = _proxy_for(url)
    conn: http.client.HTTPConnection
    tls = parts.scheme == "https"
    if proxy:
        p = urlsplit(proxy)
        conn = _connection(p.hostname or "", p.port or 80, tls=tls, policy=policy)
        if tls:
            conn.set_tunnel(parts.hostname or "", parts.port or 443)
        else:
            target = url  # absolute-form for a forward proxy
    else:
        port = parts.port or (443 if tls else 80)
        conn = _connection(parts.hostname or "", port, tls=tls, policy=policy)
    conn.connect()
    if conn.sock is not None:
        conn.sock.settimeout(policy.idle_timeout)  # per recv(): a stall, not a total cap
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    return conn, target


def _connection(
    host: str, port: int, *, tls: bool, policy: RetryPolicy
) -> http.client.HTTPConnection:
    """An unopened connection to host:port (TLS with the system's trust store when `tls`)."""
    if tls:
        return http.client.HTTPSConnection(
            host, port, timeout=policy.connect_timeout, context=ssl.create_default_context()
        )
    return http.client.HTTPConnection(host, port, timeout=policy.connect_timeout)


def open_url(
    url: str,
    headers_for: HeadersFor,
    *,
    extra_headers: dict[str, str] | None = None,
    policy: RetryPolicy | None = None,
    method: str = "GET",
    max_redirects: int = 10,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
    """Send one request, following redirects; returns (connection, response, final URL).

    Credentials come from headers_for(url) for each hop, and are dropped anyway once a redirect
    has left the origin of the previous hop (hub -> CDN). Network errors raise TransientError.
    """
    policy = policy or default_policy()
    previous_origin = origin(url)
    dropped = False
    for _hop in range(max_redirects + 1):
        headers = dict(headers_for(url))
        headers.update(extra_headers or {})
        if dropped or origin(url) != previous_origin:
            dropped = True
            headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIAL_HEADERS}
        try:
            conn, target = _connect(url, policy)
            conn.request(method, target, headers=headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            if name_unresolved(exc):
                raise UnreachableError(urlsplit(url).hostname or url_label(url)) from None
            raise network_error(exc, url) from None
        location = response.getheader("Location")
        if response.status in _REDIRECTS and location:
            response.read()
            conn.close()
            previous_origin = origin(url)
            url = urljoin(url, location)
            continue
        return conn, response, url
    raise DownloadError(f"too many redirects from {url_label(url)}")


class KeepAlive:
    """One persistent HTTP/1.1 connection for a series of requests (a segment worker's pieces):
    reused while the origin is the same and the previous answer was read to its end, so a piece
    costs one round trip, not a TCP (and TLS) handshake. Redirects are followed as open_url does.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.conn: http.client.HTTPConnection | None = None
        self._origin: tuple[str, str, int] | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn, self._origin = None, None

    def abort(self) -> None:
        """From another thread: make a blocked read on this connection return now."""
        conn = self.conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def get(
        self,
        url: str,
        headers_for: HeadersFor,
        extra_headers: dict[str, str],
        *,
        credentials_for: str | None = None,
        max_redirects: int = 10,
    ) -> tuple[http.client.HTTPResponse, str]:
        """GET `url`; returns (response, final URL). Network errors raise TransientError.

        Credentials (Authorization, Cookie) go only to the origin of `credentials_for` (default:
        `url`'s), and never again once a redirect has left it, whatever headers_for returns."""
        previous_origin = origin(credentials_for or url)
        dropped = False
        for _hop in range(max_redirects + 1):
            headers = dict(headers_for(url))
            headers.update(extra_headers)
            if dropped or origin(url) != previous_origin:
                dropped = True
                headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIAL_HEADERS}
            response = self._send(url, headers)
            location = response.getheader("Location")
            if response.status in _REDIRECTS and location:
                response.read()
                previous_origin = origin(url)
                url = urljoin(url, location)
                continue
            return response, url
        raise DownloadError(f"too many redirects from {url_label(url)}")

    def _send(self, url: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        # sock is None once the server said "Connection: close" (http.client dropped it)
        reused = (
            self.conn is not None and self.conn.sock is not None and self._origin == origin(url)
        )
        if not reused:
            self.close()
        for attempt in (1, 2):
            try:
                if self.conn is None:
                    self.conn, target = _connect(url, self.policy)
                    self._origin = origin(url)
                else:
                    target = _target(url, proxied=_proxy_for(url) is not None)
                self.conn.request("GET", target, headers=headers)
                return self.conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if name_unresolved(exc):
                    raise UnreachableError(urlsplit(url).hostname or url_label(url)) from None
                if reused and attempt == 1:
                    continue  # the server closed an idle keep-alive connection: one new one
                raise network_error(exc, url) from None
        raise AssertionError("unreachable")  # pragma: no cover


def _target(url: str, *, proxied: bool) -> str:
    """The request target of `url` on a connection already open (absolute for a plain proxy)."""
    parts = urlsplit(url)
    if proxied and parts.scheme == "http":
        return url
    target = parts.path or "/"
    return target + ("?" + parts.query if parts.query else "")


def url_label(url: str) -> str:
    """Scheme://host/path without the query string (signed CDN URLs carry secrets there) and
    without a password (`http://user:pw@host` is shown as `http://user:***@host`)."""
    parts = urlsplit(url)
    return redacted(f"{parts.scheme}://{parts.netloc}{parts.path}")


def retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def status_error(
    status: int, url: str, what: str, response: http.client.HTTPResponse | None = None
) -> Exception:
    if status == 429 or status >= 500:
        return TransientError(f"HTTP {status} from {url_label(url)}")
    code = response.getheader("X-Error-Code") if response is not None else None
    if code == "GatedRepo":
        return DownloadError(
            f"{what}: the repository is gated (HTTP {status} from {url_label(url)})",
            hint="accept its conditions on the hub's web page, then log in with "
            "`hf auth login` or set HF_TOKEN",
        )
    if status in (401, 403):
        return DownloadError(
            f"{what}: access denied (HTTP {status}) by {url_label(url)}",
            hint="the repository may be gated or private: log in (`hf auth login` / HF_TOKEN, "
            "`modelscope login` / MODELSCOPE_API_TOKEN) with an account that has access",
        )
    if status == 404:
        return DownloadError(f"{what}: not found (HTTP 404) at {url_label(url)}")
    return DownloadError(f"{what}: unexpected HTTP {status} from {url_label(url)}")


def with_retries(
    what: str,
    policy: RetryPolicy,
    attempt: Callable[[], Any],
    *,
    error: Callable[[str], Exception] = DownloadError,
) -> Any:
    """Call `attempt` until it returns; a TransientError is retried after a backoff (Retry-After
    honoured), `policy.attempts` times at most, then `error("<what>: <why> (gave up ...)")`.
    A refused connection is not retried (ConnectionRefused). No password of a URL in `what` or in
    an error reaches a line (`redacted`)."""
    what = redacted(what)
    failures = 0
    while True:
        timer = _slow_answer_timer(what, policy) if failures == 0 else None
        try:
            return attempt()
        except ConnectionRefused as exc:
            raise error(
                f"{what}: {exc} (connection refused: nothing listens there; not retried)"
            ) from None
        except TransientError as exc:
            failures += 1
            if failures >= policy.attempts:
                raise error(f"{what}: {exc} (gave up after {failures} attempts)") from None
            delay = policy.backoff(failures)
            if exc.retry_after is not None:
                delay = max(delay, min(exc.retry_after, policy.max_retry_after))
            if policy.notify is not None:
                policy.notify(
                    f"{what}: {exc}; retrying in {delay:.1f} s "
                    f"(attempt {failures + 1} of {policy.attempts})"
                )
            policy.sleep(delay)
        finally:
            if timer is not None:
                timer.cancel()


def _slow_answer_timer(what: str, policy: RetryPolicy) -> Any:
    """With policy.notify: one line once the first attempt has waited SLOW_ANSWER_NOTICE s."""
    if policy.notify is None:
        return None
    import threading

    notice = (
        f"{what}: no answer after {SLOW_ANSWER_NOTICE:g} s; still waiting (it gives up after "
        f"about {policy.worst_case_seconds():.0f} s without an answer)"
    )
    timer = threading.Timer(SLOW_ANSWER_NOTICE, policy.notify, args=(notice,))
    timer.daemon = True
    timer.start()
    return timer


def fetch_small(
    url: str, headers_for: HeadersFor, *, max_bytes: int, policy: RetryPolicy | None = None
) -> bytes | None:
    """GET a small file (SHA256SUMS) into memory; None on 404; retries like a download."""
    policy = policy or default_policy()

    def attempt() -> bytes | None:
        conn, response, final = open_url(url, headers_for, policy=policy)
        try:
            if response.status == 404:
                return None
            if response.status != 200:
                raise status_error(response.status, final, url_label(url), response)
            try:
                data = response.read(max_bytes + 1)
            except (OSError, http.client.HTTPException) as exc:
                raise TransientError(f"{type(exc).__name__}: {exc}") from None
            if len(data) > max_bytes:
                raise BodyTooLarge(f"{url_label(url)} is larger than {max_bytes} bytes")
            return data
        finally:
            conn.close()

    result: bytes | None = with_retries(url_label(url), policy, attempt)
    return result


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$", re.IGNORECASE)


def parse_content_range(value: str | None) -> tuple[int, int, int] | None:
    """`bytes a-b/N` -> (a, b, N); None for anything else (including `bytes */N`)."""
    match = _CONTENT_RANGE.match(value or "")
    if not match:
        return None
    start, end, total = (int(g) for g in match.groups())
    return (start, end, total) if start <= end < total else None
