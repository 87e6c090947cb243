"""The transfer engine against the fake hub: resume, retries, faults, verification, locking."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
from fakehub import FakeHub, gguf_bytes, make_manifest, sha256sums

from quantpick.config import load_settings
from quantpick.errors import DownloadError, ExitCode, UsageError, VerificationError
from quantpick.fetch.download import fetch_model
from quantpick.fetch.http import RetryPolicy
from quantpick.fetch.sources import RemoteFile
from quantpick.fetch.transfer import DiskSpaceError, download_file, part_paths
from quantpick.model.manifest import Source

SIZE = 3 * 1024 * 1024 + 123
NAME = "m-Q4_K_M.gguf"
DATA = gguf_bytes(SIZE, seed=1)
SHA = hashlib.sha256(DATA).hexdigest()
Usage = namedtuple("Usage", "total used free")


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def policy(sleeps: Sleeps) -> RetryPolicy:
    return RetryPolicy(
        attempts=4, idle_timeout=0.5, connect_timeout=2, sleep=sleeps, jitter=lambda: 0
    )


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": sha256sums({NAME: DATA})})
    return fake_hub


def remote(hub: FakeHub, name: str = NAME) -> RemoteFile:
    commit = hub.repos["org/model"].commit
    url = f"{hub.hf_endpoint}/org/model/resolve/{commit}/{name}"
    return RemoteFile(name, SIZE, SHA, url, "hf", commit)


def no_auth(url: str) -> dict[str, str]:
    return {"User-Agent": "quantpick-test"}


def fetch(hub: FakeHub, dest: Path, policy: RetryPolicy, **kw: Any) -> Any:
    return download_file(remote(hub), dest, headers_for=no_auth, policy=policy, **kw)


def byte_gets(hub: FakeHub) -> list[dict[str, Any]]:
    return [r for r in hub.requests_for(NAME) if r["server"] == "cdn"]


def seed_part(hub: FakeHub, dest: Path, n: int, *, sha: str = SHA) -> None:
    """A .part holding the first n bytes, with the sidecar a previous run would have left."""
    part, sidecar = part_paths(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part.write_bytes(DATA[:n])
    sidecar.write_text(
        json.dumps(
            {"version": 1, "url": remote(hub).url, "size": SIZE, "sha256": sha, "commit": "x"}
        )
    )


def assert_complete(dest: Path) -> None:
    assert dest.read_bytes() == DATA
    part, sidecar = part_paths(dest)
    assert not part.exists() and not sidecar.exists()


def test_plain_download_follows_redirect_and_verifies(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    dest = tmp_path / NAME
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    assert (result.sha256, result.size, result.verified, result.bytes_fetched) == (
        SHA,
        SIZE,
        True,
        SIZE,
    )
    assert [r["status"] for r in hub.requests_for(NAME)] == [302, 200]


def test_connection_cut_resumes_with_range(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.faults.add(NAME, "cut", after=1_000_000)
    dest = tmp_path / NAME
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    gets = byte_gets(hub)
    assert gets[0]["cut"] and gets[0]["sent"] == 1_000_000
    assert gets[1]["range"] == "bytes=1000000-" and gets[1]["status"] == 206
    assert result.bytes_fetched == SIZE  # nothing fetched twice


def test_500_then_success(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, sleeps: Sleeps
) -> None:
    hub.faults.add(NAME, "status", status=500)
    fetch(hub, tmp_path / NAME, policy)
    assert_complete(tmp_path / NAME)
    assert [r["status"] for r in byte_gets(hub)] == [500, 200]
    assert sleeps == [0.5]  # base 1 s, "equal jitter" with jitter()=0


def test_429_honours_retry_after(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, sleeps: Sleeps
) -> None:
    hub.faults.add(NAME, "429", retry_after=7)
    fetch(hub, tmp_path / NAME, policy)
    assert_complete(tmp_path / NAME)
    assert sleeps == [7.0]


def test_stalled_body_hits_idle_timeout_and_resumes(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.faults.add(NAME, "stall", after=2_500_000, seconds=3)
    fetch(hub, tmp_path / NAME, policy)  # idle_timeout=0.5 s
    assert_complete(tmp_path / NAME)
    # Reads are whole 1 MiB chunks: the partial third chunk is dropped, the first two kept.
    assert [r["range"] for r in byte_gets(hub)] == [None, "bytes=2097152-"]


def test_short_body_resumes(hub: FakeHub, tmp_path: Path, policy: RetryPolicy) -> None:
    hub.faults.add(NAME, "short", after=2_000_000)
    fetch(hub, tmp_path / NAME, policy)
    assert_complete(tmp_path / NAME)
    assert byte_gets(hub)[-1]["range"] == "bytes=2000000-"


def test_wrong_content_length_is_retried(hub: FakeHub, tmp_path: Path, policy: RetryPolicy) -> None:
    hub.faults.add(NAME, "wrong_length", delta=-10)
    fetch(hub, tmp_path / NAME, policy)
    assert_complete(tmp_path / NAME)
    assert len(byte_gets(hub)) == 2


def test_persistent_wrong_content_length_fails_with_exit_5(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.faults.add(NAME, "wrong_length", delta=100, times=None)
    with pytest.raises(DownloadError, match="Content-Length") as info:
        fetch(hub, tmp_path / NAME, policy)
    assert info.value.exit_code == ExitCode.DOWNLOAD_FAILED
    assert not (tmp_path / NAME).exists()
    # retried, then given up (under load a retry may fail before reaching the server: <=)
    assert 2 <= len(byte_gets(hub)) <= policy.attempts


def test_flipped_byte_is_exit_4_and_never_at_final_name(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.faults.add(NAME, "flip", at=1_234_567, times=None)
    dest = tmp_path / NAME
    with pytest.raises(VerificationError, match="expected from") as info:
        fetch(hub, dest, policy, expected_from="SHA256SUMS")
    assert info.value.exit_code == ExitCode.VERIFY_FAILED
    assert "SHA256SUMS" in info.value.message
    assert not dest.exists()
    assert not part_paths(dest)[0].exists()
    bad = list(tmp_path.glob(f"{NAME}.bad-*"))
    assert len(bad) == 1 and bad[0].stat().st_size == SIZE


def test_wrong_content_range_restarts_from_zero(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    dest = tmp_path / NAME
    seed_part(hub, dest, 1_500_000)
    hub.faults.add(NAME, "wrong_range", delta=4096)
    fetch(hub, dest, policy)
    assert_complete(dest)
    ranges = [r["range"] for r in byte_gets(hub)]
    assert ranges == ["bytes=1500000-", None]


def test_200_instead_of_206_restarts_cleanly(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    dest = tmp_path / NAME
    seed_part(hub, dest, 1_500_000)
    hub.faults.add(NAME, "ignore_range")
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    gets = byte_gets(hub)
    assert len(gets) == 1 and gets[0]["status"] == 200 and gets[0]["range"] == "bytes=1500000-"
    assert result.bytes_fetched == SIZE


def test_resume_rehashes_the_prefix_on_disk(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    """A corrupted prefix is caught by the final hash even though only the tail was fetched."""
    dest = tmp_path / NAME
    seed_part(hub, dest, 1_000_000)
    part = part_paths(dest)[0]
    corrupted = bytearray(part.read_bytes())
    corrupted[10] ^= 1
    part.write_bytes(bytes(corrupted))
    with pytest.raises(VerificationError):
        fetch(hub, dest, policy)
    assert byte_gets(hub)[0]["range"] == "bytes=1000000-"
    assert not dest.exists()


def test_sidecar_for_other_content_means_restart(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    dest = tmp_path / NAME
    seed_part(hub, dest, 1_000_000, sha="0" * 64)
    fetch(hub, dest, policy)
    assert_complete(dest)
    assert [r["range"] for r in byte_gets(hub)] == [None]


def test_modelscope_200_with_content_range_is_a_valid_resume(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    fake_hub.add_repo("org/model", {NAME: DATA})
    fake_hub.ms_range_status = 200
    dest = tmp_path / NAME
    seed_part(fake_hub, dest, 2_000_000)
    url = f"{fake_hub.ms_endpoint}/api/v1/models/org/model/repo?Revision=master&FilePath={NAME}"
    result = download_file(
        RemoteFile(NAME, SIZE, SHA, url, "modelscope", "master"),
        dest,
        headers_for=no_auth,
        policy=policy,
    )
    assert_complete(dest)
    (get,) = fake_hub.requests_for(NAME)
    assert (get["status"], get["range"], get["sent"]) == (200, "bytes=2000000-", SIZE - 2_000_000)
    assert result.resumed_from == 2_000_000


def test_disk_space_precheck(hub: FakeHub, tmp_path: Path, policy: RetryPolicy) -> None:
    with pytest.raises(DiskSpaceError, match="not enough free space") as info:
        fetch(hub, tmp_path / NAME, policy, disk_usage=lambda p: Usage(10**12, 0, SIZE))
    assert info.value.exit_code == ExitCode.ERROR
    assert byte_gets(hub) == []


def test_enospc_mid_write_keeps_the_part(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import quantpick.fetch.transfer as engine

    class FullDisk:
        """The .part handle of a disk that fills up after 1 MiB."""

        def __init__(self, path: Path) -> None:
            self._f = open(path, "r+b", buffering=0)  # noqa: SIM115

        def write(self, data: Any) -> int:
            if self._f.tell() + len(data) > 1_048_576:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self._f.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._f, name)

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self._f.close()

    monkeypatch.setattr(engine, "_open_part", FullDisk)
    dest = tmp_path / NAME
    with pytest.raises(DiskSpaceError, match="No space left") as info:
        fetch(hub, dest, policy)
    assert info.value.exit_code == ExitCode.ERROR
    part = part_paths(dest)[0]
    assert part.read_bytes() == DATA[:1_048_576] and not dest.exists()
    monkeypatch.undo()
    fetch(hub, dest, policy)  # space freed: the rerun resumes
    assert_complete(dest)
    assert byte_gets(hub)[-1]["range"] == "bytes=1048576-"


def test_present_file_is_verified_not_trusted(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    dest = tmp_path / NAME
    dest.write_bytes(DATA)
    assert fetch(hub, dest, policy).reused
    assert byte_gets(hub) == []
    # Same size, one byte altered: moved aside and fetched again.
    altered = bytearray(DATA)
    altered[-1] ^= 1
    dest.write_bytes(bytes(altered))
    result = fetch(hub, dest, policy)
    assert not result.reused and result.bytes_fetched == SIZE
    assert_complete(dest)
    assert len(list(tmp_path.glob(f"{NAME}.bad-*"))) == 1


def test_truncated_final_file_is_resumed(hub: FakeHub, tmp_path: Path, policy: RetryPolicy) -> None:
    dest = tmp_path / NAME
    dest.write_bytes(DATA[:1_000_000])
    result = fetch(hub, dest, policy)
    assert_complete(dest)
    assert byte_gets(hub)[0]["range"] == "bytes=1000000-"
    assert result.bytes_fetched == SIZE - 1_000_000


def test_second_download_of_same_file_waits_then_gives_up(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.faults.add(NAME, "throttle", rate=2_000_000)  # first run takes ~1.6 s
    dest = tmp_path / NAME
    errors: list[BaseException] = []

    def first() -> None:
        try:
            fetch(hub, dest, policy)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    while not byte_gets(hub):
        threading.Event().wait(0.02)
    with pytest.raises(DownloadError, match="another quantpick process"):
        fetch(hub, dest, policy, lock_timeout=0.2)
    # A patient second run gets the lock after the first, finds the file and verifies it.
    late = fetch(hub, dest, policy, lock_timeout=30)
    thread.join()
    assert errors == []
    assert late.reused and late.bytes_fetched == 0
    assert len(byte_gets(hub)) == 1


def test_authorization_is_dropped_on_the_cdn(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    fake_hub.add_repo("org/gated", {NAME: DATA}, gated=True, token="hf_secret")
    commit = fake_hub.repos["org/gated"].commit
    url = f"{fake_hub.hf_endpoint}/org/gated/resolve/{commit}/{NAME}"

    def with_token(u: str) -> dict[str, str]:
        return {"Authorization": "Bearer hf_secret", "User-Agent": "t"}

    dest = tmp_path / NAME
    download_file(
        RemoteFile(NAME, SIZE, SHA, url, "hf", commit), dest, headers_for=with_token, policy=policy
    )
    assert_complete(dest)
    hub_req, cdn_req = fake_hub.requests_for(NAME)
    assert (hub_req["server"], hub_req["authorization"]) == ("hub", True)
    assert (cdn_req["server"], cdn_req["authorization"]) == ("cdn", False)


def test_gated_without_token_is_a_clear_error(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    fake_hub.add_repo("org/gated", {NAME: DATA}, gated=True, token="hf_secret")
    commit = fake_hub.repos["org/gated"].commit
    url = f"{fake_hub.hf_endpoint}/org/gated/resolve/{commit}/{NAME}"
    with pytest.raises(DownloadError, match="gated") as info:
        download_file(
            RemoteFile(NAME, SIZE, SHA, url, "hf", commit),
            tmp_path / NAME,
            headers_for=no_auth,
            policy=policy,
        )
    assert "hf auth login" in (info.value.hint or "")


# -- fetch_model: a manifest quant, cross-checks before any transfer ---------------------------


def hf_manifest(**kw: Any) -> Any:
    return make_manifest("test-model", {NAME: DATA}, (Source("hf", repo="org/model"),), **kw)


def test_fetch_model_downloads_and_records_checksums(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    report = fetch_model(
        hf_manifest(), "q4_k_m", settings=load_settings(), dest_dir=tmp_path, policy=policy
    )
    (result,) = report.results
    assert result.verified and result.path == tmp_path / NAME
    assert report.plan.source.startswith("hf:org/model@")
    assert set(report.plan.files[0].sha256_from) == {
        f"SHA256SUMS ({report.plan.source})",
        f"{report.plan.source} listing",
        "manifest test-model",
    }
    assert (tmp_path / "SHA256SUMS").read_text() == f"{SHA}  {NAME}\n"


def test_sha256sums_disagreeing_with_hub_fails_before_transfer(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    wrong = {NAME: b"not the model"}
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": sha256sums(wrong)})
    with pytest.raises(VerificationError, match="disagree") as info:
        fetch_model(
            hf_manifest(), "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy
        )
    assert info.value.exit_code == ExitCode.VERIFY_FAILED
    assert byte_gets(fake_hub) == []


def test_lying_hub_sha_fails_before_transfer(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    hub.lie_sha("org/model", NAME)
    with pytest.raises(VerificationError, match="listing says"):
        fetch_model(
            hf_manifest(), "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy
        )
    assert byte_gets(hub) == []


def test_hostile_name_in_sha256sums_is_refused(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    sums = sha256sums({NAME: DATA}) + f"{SHA}  ../../evil.gguf\n".encode()
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": sums})
    with pytest.raises(VerificationError, match="refusing file name"):
        fetch_model(
            hf_manifest(), "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy
        )
    assert list(tmp_path.iterdir()) == []


def test_no_hash_anywhere_needs_allow_unverified(
    fake_hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    fake_hub.add_repo("org/model", {NAME: DATA}, lfs_suffixes=())  # no LFS oid in the listing
    manifest = hf_manifest(checksums_file=None, manifest_sha={NAME: None})
    with pytest.raises(VerificationError, match="no sha256 known") as info:
        fetch_model(manifest, "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy)
    assert "--allow-unverified" in (info.value.hint or "")
    report = fetch_model(
        manifest,
        "Q4_K_M",
        settings=load_settings(),
        dest_dir=tmp_path,
        policy=policy,
        allow_unverified=True,
    )
    assert not report.results[0].verified and (tmp_path / NAME).read_bytes() == DATA


def test_dry_run_fetches_nothing_and_reports_space(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    report = fetch_model(
        hf_manifest(),
        "Q4_K_M",
        settings=load_settings(),
        dest_dir=tmp_path,
        dry_run=True,
        disk_usage=lambda p: Usage(10**12, 0, 1000),
    )
    assert report.results == ()
    assert (report.plan.bytes_to_fetch, report.plan.enough_space) == (SIZE, False)
    assert byte_gets(hub) == []


def test_auto_falls_back_to_the_next_source(
    hub: FakeHub, tmp_path: Path, policy: RetryPolicy
) -> None:
    sources = (
        Source("hf", repo="org/missing"),
        Source("mirror", url_template=f"{hub.mirror_base}/org/model/{{file}}", name="local"),
    )
    manifest = make_manifest("test-model", {NAME: DATA}, sources)
    report = fetch_model(
        manifest, "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=policy
    )
    assert report.plan.source == "mirror:local"
    assert "org/missing" in report.skipped_sources[0]
    assert (tmp_path / NAME).read_bytes() == DATA


def test_unknown_quant_is_a_usage_error(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="Q8_0") as info:
        fetch_model(hf_manifest(), "Q8_0", settings=load_settings(), dest_dir=tmp_path)
    assert "Q4_K_M" in (info.value.hint or "")
