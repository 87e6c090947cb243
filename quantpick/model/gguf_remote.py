"""A GGUF header read over HTTP: range requests that grow geometrically until the bounded parser in
`gguf.py` has the whole header. httpx is imported only when a header is actually read.

Every request has a connect and a read timeout and is retried with the transfer engine's backoff
(`quantpick.hub.http.RetryPolicy`: connection errors, timeouts, 5xx, 429). A read that still
fails is a RemoteHeaderError: a GGUFError (callers that fall back on a missing header keep doing
so) with the download exit code 5.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quantpick.errors import ExitCode, GGUFError
from quantpick.hub.http import (
    RetryPolicy,
    TransientError,
    default_policy,
    retry_after_seconds,
    with_retries,
)
from quantpick.model.gguf import MAX_HEADER_BYTES, GGUFHeader, parse_gguf_header

if TYPE_CHECKING:
    import httpx


class RemoteHeaderError(GGUFError):
    """The header could not be fetched (network, after retries): exit 5, like a download."""

    exit_code = ExitCode.DOWNLOAD_FAILED


HeadersFor = Callable[[str], dict[str, str]]
INITIAL_WINDOW = 4 * 1024 * 1024  # first range request; a Qwen3.6 header is ~11 MB
MAX_WINDOW = 16 * 1024 * 1024  # the largest range request (a real header needs 4 + 4 + 8 MiB)
MAX_REDIRECTS = 10


def _default_headers(url: str) -> dict[str, str]:
    from quantpick import __version__

    return {"User-Agent": f"quantpick/{__version__}"}


class RangeReader:
    """Bytes of one remote file, fetched with growing range requests.

    Redirects are followed by hand so that each hop gets `headers_for(hop_url)`: credentials
    (sources.RepoSource.request_headers) go only to the hub's own origin, never to the CDN it
    redirects to. The final URL is reused for the later ranges.

    A server that ignores Range and answers 200 with the whole body: the body is read as a stream
    only as far as the parser asks (plus one window of read-ahead) and the connection is closed
    when the header is complete, so a 20 GB file is never downloaded. ModelScope answers range
    requests with "200 + Content-Range": that is treated as a 206.
    """

    def __init__(
        self,
        url: str,
        *,
        headers_for: HeadersFor | None = None,
        client: httpx.Client | None = None,
        initial_window: int = INITIAL_WINDOW,
        timeout: float | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        import httpx

        self.url = url
        self.final_url: str | None = None
        self.headers_for = headers_for or _default_headers
        self.policy = policy or default_policy()
        read_timeout = timeout if timeout is not None else self.policy.idle_timeout
        self._own_client = client is None
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(
                read_timeout, connect=min(read_timeout, self.policy.connect_timeout)
            ),
            follow_redirects=False,
        )
        self.initial_window = initial_window
        self.requests = 0
        self.bytes_fetched = 0
        self.total_size: int | None = None
        self.range_ignored = False
        self._stream: httpx.Response | None = None
        self._stream_iter: Any = None
        self._stream_pos = 0
        self._pending = b""

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()  # closes the connection mid-body: the rest is never sent
            self._stream = None
        if self._own_client:
            self.client.close()

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, start: int, end: int) -> httpx.Response:
        import httpx

        url = self.final_url or self.url
        for _ in range(MAX_REDIRECTS + 1):
            headers = dict(self.headers_for(url))
            headers["Range"] = f"bytes={start}-{end}"
            headers["Accept-Encoding"] = "identity"  # byte offsets must be file offsets
            request = self.client.build_request("GET", url, headers=headers)
            try:
                response = self.client.send(request, stream=True)
            except httpx.UnsupportedProtocol as exc:
                raise GGUFError(f"{self.url}: cannot read the header: {exc}") from None
            except httpx.TransportError as exc:  # timeouts, refused/reset connections
                raise TransientError(f"{type(exc).__name__}: {exc}") from None
            self.requests += 1
            if response.status_code in (301, 302, 303, 307, 308):
                location = response.headers.get("location")
                response.close()
                if not location:
                    raise GGUFError(f"{url}: redirect without a Location")
                url = str(response.url.join(location))
                continue
            self.final_url = url
            return response
        raise GGUFError(f"{self.url}: more than {MAX_REDIRECTS} redirects")

    def _read_body(self, response: httpx.Response, limit: int) -> bytes:
        import httpx

        out = bytearray()
        try:
            for chunk in response.iter_raw(64 * 1024):
                out += chunk
                if len(out) >= limit:
                    break
        except httpx.TransportError as exc:  # timeouts, resets mid-body: ask again
            raise TransientError(f"{type(exc).__name__} mid-body: {exc}") from None
        self.bytes_fetched += len(out)
        del out[limit:]
        return bytes(out)

    def fill(self, offset: int, min_bytes: int) -> bytes:
        # Doubling the total: the bytes fetched stay below 2x what the parser needed (+ window),
        # each request at most MAX_WINDOW (a hostile 64 MiB header is read in 16 MiB steps, so
        # the memory held at once stays a few windows, not the whole header).
        want = max(min_bytes, min(self.initial_window if offset == 0 else offset, MAX_WINDOW))
        if self.total_size is not None:
            if offset >= self.total_size:
                return b""
            want = min(want, self.total_size - offset)
        if self._stream is not None:
            return self._fill_from_stream(offset, want)

        def error(message: str) -> Exception:
            return RemoteHeaderError(f"{self.url}: reading the header failed: {message}")

        data: bytes = with_retries(
            f"bytes {offset}-{offset + want - 1}",
            self.policy,
            lambda: self._fill_range(offset, want),
            error=error,
        )
        return data

    def _fill_range(self, offset: int, want: int) -> bytes:
        response = self._send(offset, offset + want - 1)
        status = response.status_code
        if status == 429 or status >= 500:
            after = retry_after_seconds(response.headers.get("retry-after"))
            response.close()
            raise TransientError(f"HTTP {status}", after)
        content_range = response.headers.get("content-range", "")
        if status == 416:
            response.close()
            return b""
        if status in (206, 200) and content_range.startswith("bytes "):
            span, _, total = content_range[6:].partition("/")
            first, _, _last = span.partition("-")
            if total.strip().isdigit():
                self.total_size = int(total)
            if not first.strip().isdigit() or int(first) != offset:
                response.close()
                raise GGUFError(
                    f"{self.url}: server answered range {content_range!r} to bytes={offset}-"
                )
            try:
                return self._read_body(response, want)
            finally:
                response.close()
        if status == 200:
            # Range ignored: the body is the whole file from byte 0. Keep the stream and serve
            # the parser from it; `close()` drops the connection once the header is parsed.
            self.range_ignored = True
            length = response.headers.get("content-length", "")
            if length.isdigit():
                self.total_size = int(length)
            if offset != 0:
                response.close()
                raise GGUFError(f"{self.url}: server stopped honouring Range requests")
            self._stream = response
            self._stream_iter = response.iter_raw(64 * 1024)
            return self._fill_from_stream(offset, want)
        response.close()
        hint = None
        if status in (401, 403):
            hint = "log in (`hf auth login`, `modelscope login`) or set a token"
        raise GGUFError(f"{self.url}: HTTP {status} reading the GGUF header", hint=hint)

    def _fill_from_stream(self, offset: int, want: int) -> bytes:
        if offset != self._stream_pos:  # the parser reads sequentially; anything else is a bug
            raise GGUFError(f"{self.url}: non-sequential read at {offset} of a streamed body")
        out = bytearray(self._pending)
        self._pending = b""
        import httpx

        while len(out) < want:
            try:
                chunk = next(self._stream_iter)
            except StopIteration:
                break
            except httpx.HTTPError as exc:  # a streamed whole-file body cannot be resumed
                raise RemoteHeaderError(
                    f"{self.url}: reading the header failed: {type(exc).__name__}: {exc}"
                ) from None
            out += chunk
            self.bytes_fetched += len(chunk)
        if len(out) > want:
            self._pending = bytes(out[want:])
            del out[want:]
        self._stream_pos += len(out)
        return bytes(out)


def read_gguf_url(
    url: str,
    *,
    headers_for: HeadersFor | None = None,
    client: httpx.Client | None = None,
    initial_window: int = INITIAL_WINDOW,
    max_header_bytes: int = MAX_HEADER_BYTES,
    timeout: float | None = None,
    policy: RetryPolicy | None = None,
    raw: bytearray | None = None,
) -> GGUFHeader:
    """Header of a remote GGUF, fetched with range requests (first `initial_window` bytes, then
    doubling the total). `stats` gets requests, bytes_fetched, header_bytes, file_bytes (when
    the server said) and range_ignored. `raw`: filled with the file's first `data_offset` bytes
    as read (what a stand-in for llama.cpp needs: serve/standin.py)."""
    with RangeReader(
        url,
        headers_for=headers_for,
        client=client,
        initial_window=initial_window,
        timeout=timeout,
        policy=policy,
    ) as reader:

        def fill(offset: int, min_bytes: int) -> bytes:
            data = reader.fill(offset, min_bytes)
            if raw is not None and offset <= len(raw) < offset + len(data):
                raw.extend(data[len(raw) - offset :])  # the parser reads forwards
            return data

        header = parse_gguf_header(fill, source=url, max_header_bytes=max_header_bytes)
        if raw is not None:
            # the alignment padding past the tensor infos, or what a skip jumped over
            while len(raw) < header.data_offset:
                chunk = reader.fill(len(raw), header.data_offset - len(raw))
                if not chunk:
                    raise GGUFError(f"{url}: the file ends inside its header")
                raw.extend(chunk)
            del raw[header.data_offset :]
        if reader.total_size is not None and reader.total_size < header.header_bytes:
            raise GGUFError(
                f"{url}: the server's size {reader.total_size} is smaller than the header"
            )
        header.stats.update(
            requests=reader.requests,
            bytes_fetched=reader.bytes_fetched,
            range_ignored=int(reader.range_ignored),
        )
        if reader.total_size is not None:
            header.stats["file_bytes"] = reader.total_size
        if reader.final_url and reader.final_url != url:
            header.stats["redirected"] = 1
    return header
