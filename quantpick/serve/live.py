"""Reading a live llama-server: `/props`, `/slots`, `/metrics`, and an opt-in short timed request.

What the pinned tree (b11312, tools/server) answers:
- `/props` (server-context.cpp:4579 get_res_props): `default_generation_settings.n_ctx` (the
  context of one slot), `total_slots` (-np), `model_path`, `model_alias`, `build_info`,
  `is_sleeping`. A router without a loaded model answers `model_path: "none"`, `n_ctx: 0`
  (server-models.cpp:1942).
- `/slots` (on by default, `--no-slots` turns it off: common/common.h:673): one object per slot
  with `id`, `n_ctx`, `is_processing`.
- `/metrics` (only with `--metrics`, common/common.h:675; else 501): Prometheus text with
  `llamacpp:` counters and gauges (server-task.cpp:1523 to_metrics), among them
  `tokens_predicted_total`, `tokens_predicted_seconds_total` (decode tokens and the seconds
  they took, since start) and `predicted_tokens_seconds` (the recent average).
- `POST /completion` answers `timings.predicted_per_second` (decode tok/s of that request).

Everything is bounded: each answer is read in chunks up to a size cap and an overall deadline
(a server that drips one byte at a time is cut at the deadline), and /metrics is read only up to
`METRICS_MAX_LINES`. What could not be read is a problem in words, never an exception; only a URL
that does not answer at all, or answers but is not a llama-server, raises (one `Error:` line).
The Prometheus lines are parsed by hand: a dozen `name value` lines of llama-server's own;
prometheus_client's parser would be a new dependency for them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quantpick.errors import ServerError, UsageError

if TYPE_CHECKING:
    import httpx

# /props carries the chat template (a few KiB to ~100 KiB for the largest Jinja templates);
# /slots one object per slot: 4 MiB is far beyond both.
JSON_MAX_BYTES = 4 * 1024**2
# llama-server's /metrics is ~2 KiB (15 metrics with HELP/TYPE lines); anything past these caps
# is not llama-server's page.
METRICS_MAX_BYTES = 256 * 1024
METRICS_MAX_LINES = 2000
CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0
DEADLINE_S = 15.0  # all endpoints together
# The opt-in timed request: a short decode, long enough to average over a few dozen tokens.
SPEED_PROMPT = "Count from one to one hundred:"
SPEED_TOKENS = 32
SPEED_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Props:
    n_ctx_slot: int  # default_generation_settings.n_ctx
    total_slots: int
    model_path: str | None
    model_alias: str | None
    build_info: str | None
    sleeping: bool = False

    @property
    def n_ctx(self) -> int:
        """The whole context (every slot's share)."""
        return self.n_ctx_slot * max(1, self.total_slots)


@dataclass(frozen=True)
class Slot:
    id: int
    n_ctx: int
    processing: bool


@dataclass(frozen=True)
class Metrics:
    values: tuple[tuple[str, float], ...]  # llamacpp:<name> -> value (labels dropped)

    def get(self, name: str) -> float | None:
        return dict(self.values).get(name)

    @property
    def decode_tps(self) -> float | None:
        """Decode tok/s over the server's life: tokens predicted / seconds spent predicting."""
        tokens = self.get("tokens_predicted_total")
        seconds = self.get("tokens_predicted_seconds_total")
        if tokens and seconds and tokens > 0 and seconds > 0:
            return tokens / seconds
        return None

    @property
    def tokens_predicted(self) -> int:
        return int(self.get("tokens_predicted_total") or 0)


@dataclass(frozen=True)
class LiveServer:
    base_url: str
    props: Props
    slots: tuple[Slot, ...] = ()
    metrics: Metrics | None = None
    timed_decode_tps: float | None = None  # the opt-in timed request's decode speed
    timed_tokens: int = 0
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def decode_tps(self) -> tuple[float, str] | None:
        """(tok/s, where from): the timed request first, else /metrics."""
        if self.timed_decode_tps:
            return self.timed_decode_tps, f"a timed request of {self.timed_tokens} tokens"
        if self.metrics is not None and self.metrics.decode_tps:
            n = self.metrics.tokens_predicted
            return self.metrics.decode_tps, f"/metrics ({n} tokens decoded so far)"
        return None


def check_url(url: str) -> str:
    """A base URL (`http://host:port`, no trailing slash) or UsageError."""
    import urllib.parse

    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UsageError(
            f"{url}: not an http(s) URL of a llama-server",
            hint="give e.g. http://127.0.0.1:8080, or the alias of a server `serve` started",
        )
    try:
        _ = parsed.port
    except ValueError:
        raise UsageError(f"{url}: bad port") from None
    return url.rstrip("/")


class _Clock:
    def __init__(self, deadline_s: float, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.end = clock() + deadline_s

    def left(self) -> float:
        return self.end - self.clock()


class _TooBig(Exception):
    pass


def _read_capped(response: httpx.Response, cap: int, clock: _Clock) -> tuple[bytes, bool]:
    """(body, complete): at most `cap` bytes, stopping at the deadline."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes(chunk_size=65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > cap or clock.left() <= 0:
            return b"".join(chunks)[:cap], False
    return b"".join(chunks), True


def _fetch(
    client: httpx.Client, url: str, cap: int, clock: _Clock
) -> tuple[int, bytes, bool] | str:
    """(status, body, complete) or, when nothing usable came back, why (a phrase)."""
    import httpx

    if clock.left() <= 0:
        return "no time left"
    try:
        with client.stream("GET", url) as response:
            body, complete = _read_capped(response, cap, clock)
            return response.status_code, body, complete
    except httpx.TimeoutException:
        return "no answer in time"
    except httpx.ConnectError as exc:
        return f"cannot connect ({exc})"
    except httpx.HTTPError as exc:
        return f"no usable answer ({exc})"


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _int(value: Any, default: int = 0) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
    )


def parse_props(data: Any) -> Props | None:
    """llama-server's /props, or None when it is not one."""
    if not isinstance(data, dict):
        return None
    settings = data.get("default_generation_settings")
    if not isinstance(settings, dict) or "n_ctx" not in settings:
        return None

    def text(key: str) -> str | None:
        value = data.get(key)
        return value[:4096] if isinstance(value, str) else None

    path = text("model_path")
    return Props(
        n_ctx_slot=_int(settings.get("n_ctx")),
        total_slots=_int(data.get("total_slots"), 1),
        model_path=None if path in (None, "", "none") else path,
        model_alias=text("model_alias"),
        build_info=text("build_info"),
        sleeping=data.get("is_sleeping") is True,
    )


def parse_slots(data: Any) -> tuple[Slot, ...]:
    if not isinstance(data, list):
        return ()
    out = []
    for item in data[:4096]:
        if isinstance(item, dict):
            out.append(
                Slot(
                    _int(item.get("id")), _int(item.get("n_ctx")), item.get("is_processing") is True
                )
            )
    return tuple(out)


def parse_metrics(text: str, max_lines: int = METRICS_MAX_LINES) -> tuple[Metrics, bool]:
    """(llamacpp: values, complete): `complete` is False when the page had more lines."""
    values: dict[str, float] = {}
    lines = text.split("\n", max_lines)
    complete = len(lines) <= max_lines
    for line in lines[:max_lines]:
        if not line.startswith("llamacpp:") or len(line) > 512:
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].removeprefix("llamacpp:")
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number) and name not in values:
            values[name] = number
    return Metrics(tuple(values.items())), complete


def read_server(
    base_url: str,
    *,
    timed_request: bool = False,
    deadline_s: float = DEADLINE_S,
    clock: Callable[[], float] = time.monotonic,
    transport: httpx.BaseTransport | None = None,
) -> LiveServer:
    """Read /props (required: it says this is a llama-server), /slots and /metrics (optional),
    and with `timed_request` a short /completion's decode speed. Raises ServerError when the
    URL does not answer or is not a llama-server."""
    import httpx

    base_url = check_url(base_url)
    timer = _Clock(deadline_s, clock)
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    problems: list[str] = []
    with httpx.Client(timeout=timeout, transport=transport, follow_redirects=False) as client:
        got = _fetch(client, base_url + "/props", JSON_MAX_BYTES, timer)
        if isinstance(got, str):
            raise ServerError(
                f"{base_url}: {got}", hint="is a llama-server running at that address?"
            )
        status, body, complete = got
        props = parse_props(_json(body)) if status == 200 and complete else None
        if props is None:
            what = f"HTTP {status}" if status != 200 else "an answer that is not llama-server's"
            if status == 200 and not complete:
                what = "an answer too large or too slow"
            raise ServerError(f"{base_url} is not a llama-server: /props gave {what}")
        slots: tuple[Slot, ...] = ()
        got = _fetch(client, base_url + "/slots", JSON_MAX_BYTES, timer)
        if isinstance(got, str):
            problems.append(f"/slots: {got}")
        elif got[0] == 200 and got[2]:
            slots = parse_slots(_json(got[1]))
        elif got[0] != 200:
            problems.append(f"/slots: HTTP {got[0]} (llama-server runs with --no-slots?)")
        else:
            problems.append("/slots: the answer was too large or too slow: not read")
        metrics: Metrics | None = None
        got = _fetch(client, base_url + "/metrics", METRICS_MAX_BYTES, timer)
        if isinstance(got, str):
            problems.append(f"/metrics: {got}")
        elif got[0] == 200:
            metrics, all_lines = parse_metrics(got[1].decode("utf-8", "replace"))
            if not got[2] or not all_lines:
                problems.append(
                    f"/metrics: the page is longer than {METRICS_MAX_BYTES // 1024} KiB or "
                    f"{METRICS_MAX_LINES} lines: read its beginning only"
                )
        elif got[0] == 501:
            problems.append("/metrics is off (llama-server without --metrics): no decode speed")
        else:
            problems.append(f"/metrics: HTTP {got[0]}")
        timed, timed_tokens = None, 0
        if timed_request:
            timed, timed_tokens, why = _timed_decode(client, base_url)
            if why:
                problems.append(why)
    return LiveServer(base_url, props, slots, metrics, timed, timed_tokens, tuple(problems))


def _timed_decode(client: httpx.Client, base_url: str) -> tuple[float | None, int, str | None]:
    """POST a short /completion; (decode tok/s, tokens, problem)."""
    import httpx

    payload = {"prompt": SPEED_PROMPT, "n_predict": SPEED_TOKENS, "cache_prompt": False,
               "temperature": 0, "ignore_eos": True}  # fmt: skip
    try:
        response = client.post(
            base_url + "/completion", json=payload, timeout=httpx.Timeout(SPEED_TIMEOUT_S)
        )
    except httpx.HTTPError as exc:
        return None, 0, f"the timed request failed: {type(exc).__name__}"
    if response.status_code != 200 or len(response.content) > JSON_MAX_BYTES:
        return None, 0, f"the timed request: HTTP {response.status_code}"
    data = _json(response.content)
    timings = data.get("timings") if isinstance(data, dict) else None
    if not isinstance(timings, dict):
        return None, 0, "the timed request: no timings in the answer"
    tps = timings.get("predicted_per_second")
    n = timings.get("predicted_n")
    if not isinstance(tps, (int, float)) or not math.isfinite(tps) or tps <= 0:
        return None, 0, "the timed request: no decode speed in the answer"
    return float(tps), _int(n), None
