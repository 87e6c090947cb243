"""Remote header reads (HTTP range requests), the header cache and layouts.layout_for."""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakehub import FakeHub
from gguf_fixtures import FULL, TINY, RangeServer, gguf_str, kv, raw_gguf, write_gguf, write_split

from quantpick.arch.registry import architecture
from quantpick.config import load_settings
from quantpick.errors import ExitCode, GGUFError
from quantpick.hub.http import RetryPolicy
from quantpick.model.gguf import read_gguf_file, read_gguf_split
from quantpick.model.gguf_remote import RemoteHeaderError, read_gguf_url
from quantpick.model.headers import header_cache_dir, layout_for
from quantpick.model.manifest import Manifest, ModelFile, Source

MiB = 1024 * 1024


@pytest.fixture
def server() -> Iterator[RangeServer]:
    srv = RangeServer()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("remote") / "Tiny-Q8_0.gguf"
    write_gguf(path, TINY, big="Q8_0", mtp=True, data="random")
    return path


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("remote") / "Full-Q4_K_M.gguf"
    write_gguf(path, FULL, big="Q4_K", mtp=True)  # sparse: ~20 GB apparent, ~11 MB on disk
    return path


def _same(a: object, b: object) -> None:
    for attr in ("version", "metadata", "tensors", "alignment", "data_offset", "tensor_offsets"):
        assert getattr(a, attr) == getattr(b, attr), attr


def test_remote_read_matches_local_read(server: RangeServer, tiny: Path) -> None:
    server.files["/tiny.gguf"] = tiny
    remote = read_gguf_url(server.url("/tiny.gguf"))
    _same(remote, read_gguf_file(tiny))
    assert remote.stats["requests"] == 1
    assert remote.stats["file_bytes"] == tiny.stat().st_size
    assert remote.stats["range_ignored"] == 0
    assert server.log[0]["range"] == "bytes=0-4194303"


def test_full_size_header_over_http_costs_under_twice_the_header(
    server: RangeServer, full: Path
) -> None:
    server.files["/full.gguf"] = full
    header = read_gguf_url(server.url("/full.gguf"))
    _same(header, read_gguf_file(full))
    stats = header.stats
    print(f"\nfull-size header: {stats}")  # the figure quoted in the report (pytest -s)
    assert stats["bytes_fetched"] <= 2 * stats["header_bytes"]
    assert stats["requests"] <= 3
    assert stats["file_bytes"] == full.stat().st_size
    assert sum(e["sent"] for e in server.log) == stats["bytes_fetched"]


@pytest.mark.parametrize("mode", ["ignore-range", "modelscope"])
def test_servers_that_answer_200(server: RangeServer, full: Path, mode: str) -> None:
    server.mode = mode
    server.files["/full.gguf"] = full
    header = read_gguf_url(server.url("/full.gguf"))
    _same(header, read_gguf_file(full))
    assert header.stats["range_ignored"] == (1 if mode == "ignore-range" else 0)
    # Never the whole (20 GB) file: the client stops after the header and closes the connection.
    assert header.stats["bytes_fetched"] <= 2 * header.stats["header_bytes"]
    sent = sum(e["sent"] for e in server.log)
    assert sent < header.stats["bytes_fetched"] + 16 * MiB  # socket buffers, not the file


def test_endless_body_is_cut_at_the_cap(server: RangeServer) -> None:
    # Plausible fields forever: an array of 100k strings whose bytes never run out.
    prefix = raw_gguf([kv("a", 9, struct.pack("<IQ", 8, 100_000))], n_kv=1)
    server.mode = "endless"
    server.files["/endless.gguf"] = prefix + gguf_str("x" * 200) * 20_000
    with pytest.raises(GGUFError, match="2097152"):
        read_gguf_url(
            server.url("/endless.gguf"), max_header_bytes=2 * MiB, initial_window=256 * 1024
        )


def test_stalled_server_times_out_and_is_retried_with_backoff(
    server: RangeServer, tiny: Path
) -> None:
    server.mode = "stall"
    server.files["/stall.gguf"] = tiny
    sleeps: list[float] = []
    policy = RetryPolicy(attempts=3, sleep=sleeps.append, jitter=lambda: 0)
    start = time.perf_counter()
    with pytest.raises(RemoteHeaderError, match="reading the header failed.*gave up after 3") as e:
        read_gguf_url(server.url("/stall.gguf"), timeout=0.3, policy=policy)
    assert time.perf_counter() - start < 4
    assert e.value.exit_code == ExitCode.DOWNLOAD_FAILED  # a network failure, like a download
    assert isinstance(e.value, GGUFError)  # planners that fall back on a missing header still do
    assert len(server.log) == 3 and sleeps == [0.5, 1.0]  # the transfer engine's backoff


def test_a_5xx_is_retried_then_the_header_is_read(server: RangeServer, tiny: Path) -> None:
    server.files["/tiny.gguf"] = tiny
    server.fail_next["/tiny.gguf"] = [503, 429]
    policy = RetryPolicy(attempts=3, sleep=lambda s: None)
    header = read_gguf_url(server.url("/tiny.gguf"), policy=policy)
    _same(header, read_gguf_file(tiny))
    assert [e["status"] for e in server.log] == [503, 429, 206]


def test_a_hub_that_never_answers_is_bounded(tiny: Path) -> None:
    from fakehub import SilentServer

    policy = RetryPolicy(attempts=2, idle_timeout=0.3, connect_timeout=0.3, sleep=lambda s: None)
    with SilentServer() as silent:
        start = time.perf_counter()
        with pytest.raises(RemoteHeaderError, match="gave up after 2"):
            read_gguf_url(f"{silent.url}/x.gguf", policy=policy)
        assert time.perf_counter() - start < 2 * policy.worst_case_seconds() + 2
        assert silent.connections == 2


def test_truncated_remote_file(server: RangeServer, tiny: Path) -> None:
    header = read_gguf_file(tiny)
    server.files["/cut.gguf"] = tiny.read_bytes()[: header.header_bytes // 2]
    with pytest.raises(GGUFError, match="truncated"):
        read_gguf_url(server.url("/cut.gguf"), initial_window=4096)


def test_growing_windows_cross_every_field(server: RangeServer, tiny: Path) -> None:
    # A 1 KiB first window forces many requests that split strings and arrays at odd places.
    server.files["/tiny.gguf"] = tiny
    header = read_gguf_url(server.url("/tiny.gguf"), initial_window=1024)
    _same(header, read_gguf_file(tiny))
    assert header.stats["requests"] > 5


def test_redirect_drops_credentials_on_another_origin(server: RangeServer, tiny: Path) -> None:
    server.files["/cdn/tiny.gguf"] = tiny
    cdn = server.url("/cdn/tiny.gguf", host="localhost")  # same port, another origin
    server.redirects["/hub/tiny.gguf"] = cdn
    hub_origin = server.url("")

    def headers_for(url: str) -> dict[str, str]:
        return {"Authorization": "Bearer secret"} if url.startswith(hub_origin) else {}

    header = read_gguf_url(server.url("/hub/tiny.gguf"), headers_for=headers_for)
    _same(header, read_gguf_file(tiny))
    hub_hits = [e for e in server.log if e["path"] == "/hub/tiny.gguf"]
    cdn_hits = [e for e in server.log if e["path"] == "/cdn/tiny.gguf"]
    assert hub_hits and all(e["authorization"] == "Bearer secret" for e in hub_hits)
    assert cdn_hits and all(e["authorization"] is None for e in cdn_hits)
    assert header.stats["redirected"] == 1


@pytest.mark.parametrize(("path", "match"), [("/missing.gguf", "HTTP 404"), ("/auth", "HTTP 401")])
def test_http_errors(server: RangeServer, tiny: Path, path: str, match: str) -> None:
    server.files["/auth"] = tiny
    server.require_auth["/auth"] = "Bearer x"
    with pytest.raises(GGUFError, match=match):
        read_gguf_url(server.url(path))


def test_not_a_gguf_over_http(server: RangeServer) -> None:
    server.files["/page.gguf"] = b"<html>" + b"x" * 5000
    with pytest.raises(GGUFError, match="not a GGUF file"):
        read_gguf_url(server.url("/page.gguf"))


# ----------------------------------------------------------------------------------------------
# layouts.layout_for: fake hubs, cache, offline, split files

TINY_ARCH = architecture("qwen35moe", block_count=9, nextn_predict_layers=1, context_length=32768,
    embedding_length=256, head_count=4, head_count_kv=2, key_length=64, value_length=64,
    expert_count=16, expert_used_count=4, expert_feed_forward_length=128,
    expert_shared_feed_forward_length=128, ssm_conv_kernel=4, ssm_state_size=32,
    ssm_group_count=4, ssm_time_step_rank=8, ssm_inner_size=256, full_attention_interval=4,
    vocab_size=1024,
)  # fmt: skip


def _manifest(paths: list[Path], sources: tuple[Source, ...], sha: bool = True) -> Manifest:
    import hashlib

    files = []
    for i, p in enumerate(paths):
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if sha and i == 0 else None
        split = len(paths) > 1
        files.append(
            ModelFile(p.name, "Q8_0", p.stat().st_size, True, digest, quality_rank=1,
                      shard=i + 1 if split else None, shard_count=len(paths) if split else None)
        )  # fmt: skip
    return Manifest("tiny", "Tiny", None, TINY_ARCH, sources, tuple(files))


def test_layout_for_remote_then_cache_then_offline(fake_hub: FakeHub, tiny: Path) -> None:
    repo = fake_hub.add_repo("org/tiny-GGUF", {tiny.name: tiny})
    manifest = _manifest([tiny], (Source("hf", "org/tiny-GGUF", repo.commit),))
    settings = load_settings()

    remote = layout_for(manifest, "Q8_0", settings=settings, network=True, require_exact=True)
    assert remote.basis.startswith("gguf-remote:" + fake_hub.hf_endpoint)
    assert remote.exact
    assert remote.tensors == read_gguf_file(tiny).tensors
    # the header carries every key; the ones the manifest gives agree
    assert all(remote.architecture.keys[k] == v for k, v in TINY_ARCH.hparams)
    assert remote.view.kv_layers == (3, 7)
    assert list(header_cache_dir(settings).glob("sha256-*.json"))

    n_requests = len(fake_hub.requests)
    cached = layout_for(manifest, "Q8_0", settings=settings, network=True, require_exact=True)
    assert cached.basis.startswith("gguf-cache:sha256-")
    assert cached.tensors == remote.tensors
    assert len(fake_hub.requests) == n_requests  # planning again needs no network

    offline = layout_for(manifest, "Q8_0", settings=settings, network=False, require_exact=True)
    assert offline.tensors == remote.tensors


def test_layout_for_without_header(tmp_path: Path, tiny: Path) -> None:
    manifest = _manifest([tiny], (Source("hf", "org/never-contacted", "a" * 40),))
    settings = load_settings()
    with pytest.raises(GGUFError, match="not cached and network access is off"):
        layout_for(manifest, "Q8_0", settings=settings, network=False, require_exact=True)
    synth = layout_for(manifest, "Q8_0", settings=settings, network=False, require_exact=False)
    assert synth.basis.startswith("synthesized:")
    assert not synth.exact
    assert synth.file_bytes == tiny.stat().st_size


def test_layout_for_modelscope_split_and_repo_key(fake_hub: FakeHub, tmp_path: Path) -> None:
    paths = write_split(tmp_path, "Tiny-Q8_0", 3, TINY, big="Q8_0", mtp=True)
    fake_hub.add_repo("org/split-GGUF", {p.name: p for p in paths}, revision="v1")
    manifest = _manifest(paths, (Source("modelscope", "org/split-GGUF", "v1"),), sha=False)
    settings = load_settings()
    layout = layout_for(manifest, "Q8_0", settings=settings, network=True, require_exact=True)
    assert layout.basis.startswith("gguf-remote:" + fake_hub.ms_endpoint)
    assert layout.tensors == read_gguf_split(paths[0]).tensors
    assert layout.file_bytes == sum(p.stat().st_size for p in paths)
    # no sha256 in the manifest: the repo@revision/name key finds it offline
    offline = layout_for(manifest, "Q8_0", settings=settings, network=False, require_exact=True)
    assert offline.basis.startswith("gguf-cache:modelscope-")


def test_layout_for_refuses_a_file_whose_hash_moved(fake_hub: FakeHub, tiny: Path) -> None:
    repo = fake_hub.add_repo("org/tiny-GGUF", {tiny.name: tiny})
    manifest = _manifest([tiny], (Source("hf", "org/tiny-GGUF", repo.commit),))
    files = (dataclasses.replace(manifest.files[0], sha256="0" * 64),)
    manifest = dataclasses.replace(manifest, files=files)
    settings = load_settings()
    with pytest.raises(GGUFError, match="the manifest pins 000000000000"):
        layout_for(manifest, "Q8_0", settings=settings, network=True, require_exact=True)
    fallback = layout_for(manifest, "Q8_0", settings=settings, network=True, require_exact=False)
    assert fallback.basis.startswith("synthesized:") and "pins" in fallback.basis


def test_damaged_cache_entry_is_a_miss(fake_hub: FakeHub, tiny: Path) -> None:
    repo = fake_hub.add_repo("org/tiny-GGUF", {tiny.name: tiny})
    manifest = _manifest([tiny], (Source("hf", "org/tiny-GGUF", repo.commit),))
    settings = load_settings()
    layout_for(manifest, "Q8_0", settings=settings, network=True, require_exact=True)
    for entry in header_cache_dir(settings).glob("*.json"):
        entry.write_text("{not json")
    again = layout_for(manifest, "Q8_0", settings=settings, network=True, require_exact=True)
    assert again.basis.startswith("gguf-remote:")


def test_private_repo_token_goes_to_the_hub_not_the_cdn(
    fake_hub: FakeHub, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = fake_hub.add_repo("org/private-GGUF", {tiny.name: tiny}, private=True, token="hf_tok")
    manifest = _manifest([tiny], (Source("hf", "org/private-GGUF", repo.commit),))
    settings = load_settings()
    with pytest.raises(GGUFError, match="org/private-GGUF"):  # no token: refused, clearly
        layout_for(manifest, "Q8_0", settings=settings, network=True, require_exact=True)
    monkeypatch.setenv("HF_TOKEN", "hf_tok")
    layout = layout_for(manifest, "Q8_0", settings=settings, network=True, require_exact=True)
    assert layout.tensors == read_gguf_file(tiny).tensors
    byte_hits = [r for r in fake_hub.requests if r.get("file") == tiny.name and r["range"]]
    hub_hits = [r for r in byte_hits if r["server"] == "hub"]
    cdn_hits = [r for r in byte_hits if r["server"] == "cdn"]
    assert hub_hits and cdn_hits
    redirects = [r for r in hub_hits if r["status"] == 302]
    assert redirects and all(r["authorization"] for r in redirects)
    assert not any(r["authorization"] for r in cdn_hits)


@pytest.mark.parametrize("window", [1024, 4 * MiB])
def test_raw_capture_is_the_file_up_to_its_data(
    server: RangeServer, tiny: Path, window: int
) -> None:
    """What a stand-in for llama.cpp is made of: the file's first data_offset bytes, exactly."""
    server.files["/tiny.gguf"] = tiny
    raw = bytearray()
    header = read_gguf_url(server.url("/tiny.gguf"), initial_window=window, raw=raw)
    assert bytes(raw) == tiny.read_bytes()[: header.data_offset]


def test_raw_headers_read_once_then_from_the_cache(fake_hub: FakeHub, tiny: Path) -> None:
    from quantpick.model.headers import load_raw_header, raw_header_dir, raw_headers

    repo = fake_hub.add_repo("org/tiny-raw-GGUF", {tiny.name: tiny})
    manifest = _manifest([tiny], (Source("hf", "org/tiny-raw-GGUF", repo.commit),))
    settings = load_settings()
    with pytest.raises(GGUFError, match="not cached and network access is off"):
        raw_headers(manifest, "Q8_0", settings=settings, network=False)
    ((name, data, size),) = raw_headers(manifest, "Q8_0", settings=settings, network=True)
    offset = read_gguf_file(tiny).data_offset
    assert (name, data, size) == (tiny.name, tiny.read_bytes()[:offset], tiny.stat().st_size)
    n_requests = len(fake_hub.requests)
    assert raw_headers(manifest, "Q8_0", settings=settings, network=False)[0][1] == data
    assert len(fake_hub.requests) == n_requests
    # a damaged cache entry is a miss, never a wrong stand-in
    for path in raw_header_dir(settings).glob("*.gguf.gz"):
        path.write_bytes(b"\x1f\x8b garbage")
        assert load_raw_header(settings, path.name.removesuffix(".gguf.gz")) is None
    assert load_raw_header(settings, "../escape") is None
