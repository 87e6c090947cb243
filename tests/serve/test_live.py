"""serve/live.py: a live llama-server's /props, /slots, /metrics, bounded. Answers recorded from
the pinned build (tests/data/server-endpoints/, scripts/record_server_logs.py) are served through
httpx's MockTransport; hostile servers are generators, so a reader that does not stop would
pull them forever."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from quantpick.errors import ServerError, UsageError
from quantpick.serve.live import (
    METRICS_MAX_BYTES,
    check_url,
    parse_metrics,
    parse_props,
    read_server,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "server-endpoints"
PROPS = (DATA / "cpu-tiny-props.json").read_bytes()
SLOTS = (DATA / "cpu-tiny-slots.json").read_bytes()
METRICS = (DATA / "cpu-tiny-metrics.txt").read_bytes()
URL = "http://127.0.0.1:8080"


def _transport(routes: dict[str, Callable[[], httpx.Response]]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        make = routes.get(request.url.path)
        return make() if make else httpx.Response(404, text="File Not Found")

    return httpx.MockTransport(handler)


def _ok(body: bytes) -> Callable[[], httpx.Response]:
    return lambda: httpx.Response(200, content=body)


def test_recorded_answers_of_the_pinned_build() -> None:
    live = read_server(URL, transport=_transport(
        {"/props": _ok(PROPS), "/slots": _ok(SLOTS), "/metrics": _ok(METRICS)}))  # fmt: skip
    assert live.props.n_ctx_slot == 4096 and live.props.total_slots == 1
    assert live.props.build_info == "b11312-0c1e57098"
    assert [(s.id, s.n_ctx, s.processing) for s in live.slots] == [(0, 4096, False)]
    assert live.metrics is not None and live.metrics.tokens_predicted == 16
    tps, where = live.decode_tps  # type: ignore[misc]
    assert tps == pytest.approx(16 / 9.97159) and "/metrics" in where
    assert live.problems == ()


def test_metrics_off_is_a_problem_not_an_error() -> None:
    # llama-server without --metrics answers 501 (common/common.h endpoint_metrics = false)
    live = read_server(URL, transport=_transport({"/props": _ok(PROPS), "/slots": _ok(SLOTS),
                       "/metrics": lambda: httpx.Response(501, text="not supported")}))  # fmt: skip
    assert live.metrics is None and live.decode_tps is None
    assert "without --metrics" in live.problems[0]


def test_not_a_llama_server_is_one_error() -> None:
    with pytest.raises(ServerError, match="is not a llama-server: /props gave HTTP 404"):
        read_server(URL, transport=_transport({}))
    garbage = {"/props": _ok(b"<html>hello</html>")}
    with pytest.raises(ServerError, match="not llama-server's"):
        read_server(URL, transport=_transport(garbage))
    other_json = {"/props": _ok(json.dumps({"model": "x"}).encode())}
    with pytest.raises(ServerError, match="not llama-server's"):
        read_server(URL, transport=_transport(other_json))


def test_unreachable_url_is_one_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(ServerError, match="cannot connect"):
            read_server(f"http://127.0.0.1:{port}")


@pytest.mark.parametrize("url", ["ftp://x", "127.0.0.1:8080", "http://", "http://h:99999"])
def test_bad_urls_are_usage_errors(url: str) -> None:
    with pytest.raises(UsageError):
        check_url(url)


def test_a_million_line_metrics_page_is_cut() -> None:
    pulled = []

    def lines() -> Iterator[bytes]:
        for i in range(1_000_000):
            pulled.append(i)
            yield b"llamacpp:tokens_predicted_total 16\n" if i == 0 else b"# padding line\n"

    routes = {"/props": _ok(PROPS), "/slots": _ok(SLOTS),
              "/metrics": lambda: httpx.Response(200, content=lines())}  # fmt: skip
    live = read_server(URL, transport=_transport(routes))
    assert live.metrics is not None and live.metrics.tokens_predicted == 16
    assert "read its beginning only" in live.problems[0]
    # bounded: it stopped after about METRICS_MAX_BYTES, not after a million lines
    assert len(pulled) * 15 < 2 * METRICS_MAX_BYTES + 65536


def test_a_server_that_drips_is_cut_at_the_deadline() -> None:
    ticks = iter(range(1_000_000))

    def drip() -> Iterator[bytes]:
        while True:
            yield b" "

    routes = {"/props": _ok(PROPS), "/slots": lambda: httpx.Response(200, content=drip())}
    # each clock reading is one second later: the deadline passes after ~15 chunks
    live = read_server(URL, transport=_transport(routes), clock=lambda: float(next(ticks)))
    assert live.slots == ()
    assert any("too large or too slow" in p for p in live.problems)
    assert any("no time left" in p for p in live.problems)  # /metrics was not even asked


def test_a_slow_props_is_not_a_llama_server() -> None:
    def drip() -> Iterator[bytes]:
        while True:
            yield b" "

    ticks = iter(range(1_000_000))
    routes = {"/props": lambda: httpx.Response(200, content=drip())}
    with pytest.raises(ServerError, match="too large or too slow"):
        read_server(URL, transport=_transport(routes), clock=lambda: float(next(ticks)))


def test_timed_request() -> None:
    answer = {"content": "...", "timings": {"predicted_n": 32, "predicted_per_second": 41.5}}
    routes = {"/props": _ok(PROPS), "/slots": _ok(SLOTS), "/metrics": _ok(METRICS),
              "/completion": _ok(json.dumps(answer).encode())}  # fmt: skip
    live = read_server(URL, timed_request=True, transport=_transport(routes))
    assert live.decode_tps == (41.5, "a timed request of 32 tokens")


def test_props_of_a_router_without_a_model() -> None:
    # server-models.cpp:1942: model_path "none", n_ctx 0
    props = parse_props({"default_generation_settings": {"n_ctx": 0}, "model_path": "none"})
    assert props is not None and props.model_path is None and props.n_ctx_slot == 0


def test_metrics_parser_ignores_what_is_not_a_number() -> None:
    metrics, complete = parse_metrics(
        'llamacpp:a 1\nllamacpp:b nan\nllamacpp:c x\nother 3\nllamacpp:d{x="1"} 4\n'
    )
    assert dict(metrics.values) == {"a": 1.0, "d": 4.0} and complete
