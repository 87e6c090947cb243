"""quantpick.fetch.http: retries and timeouts, and the promise built on them: no network call hangs.

A hub that accepts connections and never answers (`fakehub.SilentServer`) must make `download`,
`get` and `manifest add` end with exit 5 and one error line, and a default `pick` (which tries one
header read) fall back to the manifest with a note, each within a bounded time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fakehub import SMALL_ARCH_TOML, FakeHub, SilentServer
from typer.testing import CliRunner

import quantpick.cli.download  # noqa: F401 - registers the commands
import quantpick.fetch.http as http
from quantpick.cli import app
from quantpick.errors import DownloadError
from quantpick.fetch.http import RetryPolicy, TransientError, with_retries

runner = CliRunner()

# A policy that gives up within about a second: two attempts, 0.3 s timeouts, no pause.
FAST = RetryPolicy(attempts=2, idle_timeout=0.3, connect_timeout=0.3, sleep=lambda s: None)


def test_backoff_doubles_with_equal_jitter_and_caps() -> None:
    policy = RetryPolicy(base_delay=1, max_delay=8, jitter=lambda: 1)
    assert [policy.backoff(n) for n in range(1, 6)] == [1, 2, 4, 8, 8]
    assert RetryPolicy(jitter=lambda: 0).backoff(3) == 2  # never below half
    # 6 attempts x (15 + 30 s) + 1 + 2 + 4 + 8 + 16 s of pauses
    assert RetryPolicy().worst_case_seconds() == 6 * 45 + 31


def test_with_retries_gives_up_with_one_line_and_the_chosen_error() -> None:
    sleeps: list[float] = []
    calls: list[int] = []

    def attempt() -> None:
        calls.append(1)
        raise TransientError("ReadTimeout: timed out", retry_after=5)

    policy = RetryPolicy(attempts=3, sleep=sleeps.append, jitter=lambda: 0)
    with pytest.raises(DownloadError, match=r"^hub: ReadTimeout: timed out \(gave up after 3"):
        with_retries("hub", policy, attempt)
    assert len(calls) == 3 and sleeps == [5, 5]  # Retry-After beats a shorter backoff

    class Custom(Exception):
        pass

    with pytest.raises(Custom):
        with_retries("hub", RetryPolicy(attempts=1), attempt, error=Custom)


# -- the hub that never answers ----------------------------------------------------------------


@pytest.fixture
def silent_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[SilentServer]:
    """HF_ENDPOINT at a silent server, the fast policy everywhere, a manifest `tiny-hf` with only
    that source (found through QUANTPICK_MANIFESTS)."""
    with SilentServer() as silent:
        monkeypatch.setattr(http, "DEFAULT_POLICY", FAST)
        monkeypatch.setenv("HF_ENDPOINT", silent.url)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_HUB_DOWNLOAD_TIMEOUT", raising=False)
        monkeypatch.delenv("QUANTPICK_OFFLINE", raising=False)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        (manifests / "tiny-hf.toml").write_text(
            'schema = 1\nid = "tiny-hf"\ndisplay_name = "Tiny"\nchecksums_file = "SHA256SUMS"\n'
            + SMALL_ARCH_TOML
            + '\n[[sources]]\nkind = "hf"\nrepo = "org/tiny"\n\n'
            + '[[files]]\nname = "Tiny-Q4_K_M.gguf"\nquant = "Q4_K_M"\n'
            + "size_bytes = 400000\nsize_exact = true\nquality_rank = 1\n"
        )
        monkeypatch.setenv("QUANTPICK_MANIFESTS", str(manifests))
        yield silent


def _timed(args: list[str]) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    result = runner.invoke(app, args)
    return result.exit_code, result.stdout, result.stderr, time.perf_counter() - start


# Generous: a loaded 2-core machine. The point is "ends", against "hangs forever" before the fix.
BOUND = 8 * FAST.worst_case_seconds() + 20


@pytest.mark.parametrize(
    "args",
    [
        ["download", "tiny-hf", "--quant", "Q4_K_M"],
        ["get", "tiny-hf", "--quant", "Q4_K_M", "--gpu", "3090", "--ram", "64G"],
        ["manifest", "add", "org/tiny"],
    ],
    ids=["download", "get", "manifest-add"],
)
def test_a_hub_that_never_answers_ends_with_exit_5(
    silent_hub: SilentServer, tmp_path: Path, args: list[str]
) -> None:
    code, out, err, seconds = _timed(
        [*args, *(["--dir", str(tmp_path / "d")] if args[0] != "manifest" else [])]
    )
    assert code == 5, err
    assert seconds < BOUND
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "gave up after 2 attempts" in errors[0], err
    assert "Traceback" not in err
    assert silent_hub.connections >= FAST.attempts  # it did try, and retried


def test_a_default_pick_falls_back_to_the_manifest_with_a_note(
    silent_hub: SilentServer,
) -> None:
    code, out, err, seconds = _timed(
        ["pick", "tiny-hf", "--gpu", "3090", "--ram", "64G", "--ctx-size", "4096", "--json"]
    )
    assert code == 0, err
    assert seconds < BOUND
    document = json.loads(out)
    assert "synthesized" in json.dumps(document)  # planned on the manifest's own table
    assert "gave up after 2 attempts" in err  # the note says why the exact header is missing
    assert silent_hub.connections >= FAST.attempts


def test_the_planning_policy_is_short_and_follows_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from quantpick.fetch.http import planning_policy

    policy = planning_policy()
    assert (policy.attempts, policy.connect_timeout, policy.idle_timeout) == (2, 5.0, 10.0)
    # what a silent hub can cost a `pick`
    assert policy.worst_case_seconds() == pytest.approx(2 * 15 + 0.2)
    monkeypatch.setattr(http, "DEFAULT_POLICY", FAST)
    # already shorter: unchanged, but for the short pause between the two attempts
    assert planning_policy() == replace(FAST, base_delay=0.2)


def test_a_name_that_does_not_resolve_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network (no DNS): one line at once, not minutes of backoff."""
    import socket

    from quantpick.fetch.http import UnreachableError, fetch_small

    def no_dns(*args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    sleeps: list[float] = []
    policy = RetryPolicy(attempts=6, sleep=sleeps.append)
    with pytest.raises(UnreachableError) as info:
        fetch_small("http://hub.example/org/repo/SHA256SUMS", lambda url: {}, max_bytes=1024,
                    policy=policy)  # fmt: skip
    assert sleeps == [] and info.value.exit_code == 5
    assert info.value.message == "cannot reach hub.example: its name does not resolve (no network?)"


def test_download_dry_run_without_network_is_fast_and_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`download --dry-run` with no network: every source fails its name lookup once; the error is
    one short line naming the hosts (it took 19-29 s and 400 characters)."""
    import socket
    import time

    def no_dns(*args: object, **kwargs: object) -> object:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    # (huggingface_hub reads HF_ENDPOINT once, at import: set it, do not only unset it)
    monkeypatch.setenv("HF_ENDPOINT", "https://huggingface.co")
    start = time.monotonic()
    result = runner.invoke(
        app, ["download", "qwen3.8-35b-a3b-distill", "--quant", "Q4_K_M", "--dry-run"]
    )
    assert time.monotonic() - start < 10
    assert result.exit_code == 5
    error = next(line for line in result.stderr.splitlines() if line.startswith("Error:"))
    assert error == (
        "Error: no source reachable (huggingface.co, gitcode.com): the names do not resolve "
        "(no network?)"
    )
    # `download` has no --offline (the hint written for the planning commands is not shown)
    assert "--offline" not in result.stderr
    assert result.stderr.splitlines()[-1] == "Hint: see `quantpick download --help`"


# -- a verified local copy needs no hub; a slow hub says so; pick's header read is bounded ------


def _local_copy(tmp_path: Path, manifests: Path) -> Path:
    """`tiny-hf`'s file and the SHA256SUMS an earlier `get` leaves beside it, in a --dir; the
    manifest is rewritten with that file's size (it pins no sha256: SHA256SUMS does)."""
    import hashlib

    from gguf_fixtures import TINY, write_gguf

    dest = tmp_path / "d"
    dest.mkdir()
    size = write_gguf(dest / "Tiny-Q4_K_M.gguf", TINY, big="Q8_0", data="random")
    digest = hashlib.sha256((dest / "Tiny-Q4_K_M.gguf").read_bytes()).hexdigest()
    (dest / "SHA256SUMS").write_text(f"{digest}  Tiny-Q4_K_M.gguf\n")
    toml = manifests / "tiny-hf.toml"
    toml.write_text(toml.read_text().replace("size_bytes = 400000", f"size_bytes = {size}"))
    return dest


GET = ["get", "tiny-hf", "--gpu", "3090", "--ram", "64G", "-c", "4096", "--no-confirm"]


def test_get_with_a_verified_local_copy_asks_no_hub(
    silent_hub: SilentServer, tmp_path: Path
) -> None:
    dest = _local_copy(tmp_path, tmp_path / "manifests")
    code, out, err, _ = _timed([*GET, "--dir", str(dest)])
    assert code == 0, err
    assert "sha256 verified; no hub contacted" in err
    first = silent_hub.connections  # only planning's optional header read (bounded)
    assert first <= FAST.attempts
    code, out, err, _ = _timed([*GET, "--dir", str(dest)])  # its sha256 is known now
    assert code == 0, err
    assert silent_hub.connections == first  # no hub at all: planned on the file's own header
    assert f"-m {dest / 'Tiny-Q4_K_M.gguf'}" in out


def test_get_tells_about_a_hub_that_does_not_answer(
    silent_hub: SilentServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "SLOW_ANSWER_NOTICE", 0.05, raising=False)
    code, out, err, _ = _timed([*GET, "--dir", str(tmp_path / "empty")])
    assert code == 5
    assert "no answer after 0.05 s; still waiting (it gives up after about" in err
    assert "retrying in" in err and "(attempt 2 of 2)" in err


def test_pick_waits_on_a_silent_hub_no_longer_than_its_deadline(
    silent_hub: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real default policy (a silent hub costs the header read 2 x (5 + 10) s of timeouts),
    with the deadline on the whole read shortened to 1 s: the answer comes from the manifest."""
    monkeypatch.setattr(http, "DEFAULT_POLICY", RetryPolicy())
    monkeypatch.setattr(http, "PLANNING_DEADLINE", 1.0, raising=False)
    code, out, err, seconds = _timed(
        ["pick", "tiny-hf", "--gpu", "3090", "--ram", "64G", "--ctx-size", "4096", "--json"]
    )
    assert code == 0, err
    assert "synthesized" in out and "no answer within 1 s" in err
    assert seconds < 10  # 20 s and more without the deadline


# -- credentials in HF_ENDPOINT, refused connections ------------------------------------------


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed on exit: connecting there is refused


def test_a_refused_connection_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: retried 6 times with backoff (26 s), although docs/download.md says it fails at
    once. Counted in connection attempts and pauses, not in seconds."""
    connects: list[str] = []
    real_connect = http._connect

    def counting(url: str, policy: RetryPolicy):  # type: ignore[no-untyped-def]
        connects.append(url)
        return real_connect(url, policy)

    monkeypatch.setattr(http, "_connect", counting)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    sleeps: list[float] = []
    url = f"http://127.0.0.1:{_closed_port()}/SHA256SUMS"
    with pytest.raises(DownloadError, match="connection refused") as info:
        http.fetch_small(url, lambda u: {}, max_bytes=100, policy=RetryPolicy(sleep=sleeps.append))
    assert "gave up" not in info.value.message
    assert len(connects) <= 2 and sleeps == []


HOSTILE_ENDPOINT_SECRET = "s3cr3t-pw"


@pytest.mark.parametrize("json_", [False, True], ids=["text", "json"])
def test_a_password_in_hf_endpoint_is_never_printed_when_refused(
    silent_hub: SilentServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, json_: bool
) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(http, "DEFAULT_POLICY", replace(FAST, attempts=6, sleep=sleeps.append))
    port = _closed_port()
    monkeypatch.setenv("HF_ENDPOINT", f"http://user:{HOSTILE_ENDPOINT_SECRET}@127.0.0.1:{port}")
    result = runner.invoke(app, ["download", "tiny-hf", "--quant", "Q4_K_M", "--dir",
                                 str(tmp_path / "d"), *(["--json"] if json_ else [])])  # fmt: skip
    assert result.exit_code == 5, result.output
    assert HOSTILE_ENDPOINT_SECRET not in result.stdout + result.stderr
    assert "refused" in result.stderr and sleeps == []  # not retried
    if json_:
        assert "refused" in json.loads(result.stdout)["error"]["message"]


def test_a_password_in_hf_endpoint_is_not_in_retry_lines(
    silent_hub: SilentServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A hub that never answers: every attempt is announced on stderr, then one Error line;
    before, each named HF_ENDPOINT with its password."""
    monkeypatch.setenv(
        "HF_ENDPOINT", silent_hub.url.replace("//", f"//me:{HOSTILE_ENDPOINT_SECRET}@")
    )
    result = runner.invoke(app, ["download", "tiny-hf", "--quant", "Q4_K_M", "--dir",
                                 str(tmp_path / "d"), "--json"])  # fmt: skip
    assert result.exit_code == 5, result.output
    assert "retrying" in result.stderr and "http://***@127.0.0.1" in result.stderr
    assert HOSTILE_ENDPOINT_SECRET not in result.stdout + result.stderr


# -- OWNER/REPO: the listing gets the planning bound, not the download policy's minutes ---------


@pytest.mark.parametrize(
    "args",
    [
        ["pick", "org/silent-GGUF", "--gpu", "3090", "--ram", "64G", "-c", "4096"],
        ["get", "org/silent-GGUF", "--gpu", "3090", "--ram", "64G", "-c", "4096"],
        ["manifest", "add", "org/silent-GGUF"],
    ],
    ids=["pick", "get", "manifest-add"],
)
def test_a_repository_on_a_silent_hub_gives_up_at_the_planning_bound(
    silent_hub: SilentServer, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """The bound asserted is the one configured (fetch.http.PLANNING_DEADLINE, the bundled-model
    path's 5 s), set short here; the download policy would wait its own (2 s) and say "gave up
    after 1 attempts" instead. No wall-clock assertion."""
    monkeypatch.setattr(http, "DEFAULT_POLICY", replace(FAST, attempts=1, idle_timeout=2.0))
    monkeypatch.setattr(http, "PLANNING_DEADLINE", 0.25)
    result = runner.invoke(app, args)
    assert result.exit_code == 5, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: listing hf:org/silent-GGUF: no answer within 0.25 s (the hub accepts the "
        "connection but does not answer; gave up)"
    ], result.stderr
    assert "Traceback" not in result.stderr


def test_the_repository_bound_is_the_bundled_models() -> None:
    assert http.PLANNING_DEADLINE == 5.0


def test_a_password_in_hf_endpoint_is_not_in_a_plan(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A working hub reached with credentials: nothing printed, nor the repository's cached
    description, carries the password."""
    from gguf_fixtures import TINY, write_gguf

    path = tmp_path / "Tiny-Q8_0.gguf"
    write_gguf(path, TINY, big="Q8_0")
    fake_hub.add_repo("org/Tiny-GGUF", {path.name: path})
    endpoint = fake_hub.hf_endpoint.replace("//", f"//me:{HOSTILE_ENDPOINT_SECRET}@")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    result = runner.invoke(app, ["pick", "org/Tiny-GGUF", "-c", "4096", "--gpu", "3090",
                                 "--ram", "64G", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert HOSTILE_ENDPOINT_SECRET not in result.stdout + result.stderr
    from quantpick.config import load_settings

    described = load_settings().cache_dir / "repos"
    assert all(HOSTILE_ENDPOINT_SECRET not in f.read_text() for f in described.iterdir())
