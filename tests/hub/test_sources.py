"""Source adapters through the real huggingface_hub / modelscope-hub clients, on the fake hub."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from fakehub import FakeHub, gguf_bytes, make_manifest, sha256sums

from quantpick.config import load_settings
from quantpick.errors import DownloadError, VerificationError
from quantpick.fetch.download import fetch_model
from quantpick.hub.http import RetryPolicy
from quantpick.hub.sources import open_source
from quantpick.model.manifest import Source

NAME = "sub/m-Q4_K_M.gguf"
DATA = gguf_bytes(200_000, seed=2)
SHA = hashlib.sha256(DATA).hexdigest()
SUMS = sha256sums({NAME: DATA})
FAST = RetryPolicy(attempts=2, sleep=lambda s: None, idle_timeout=2)


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": SUMS, "README.md": b"# hi"})
    return fake_hub


def test_hf_pins_the_commit_and_lists_lfs_sha256(hub: FakeHub) -> None:
    repo = open_source(Source("hf", repo="org/model"))
    commit = hub.repos["org/model"].commit
    assert repo.revision == commit and repo.label == f"hf:org/model@{commit[:12]}"
    files = {f.name: f for f in repo.list_files()}
    assert set(files) == {NAME, "SHA256SUMS", "README.md"}
    remote = files[NAME]
    assert (remote.size, remote.sha256, remote.source_kind) == (len(DATA), SHA, "hf")
    assert remote.url == f"{hub.hf_endpoint}/org/model/resolve/{commit}/sub/m-Q4_K_M.gguf"
    assert files["README.md"].sha256 is None  # not LFS: no sha256 from the hub
    assert repo.fetch_text("SHA256SUMS", 10_000) == SUMS.decode()
    assert repo.fetch_text("NOPE", 10_000) is None


def test_hf_token_goes_to_the_hub_origin_only(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    repo = open_source(Source("hf", repo="org/model"))
    assert repo.request_headers(f"{hub.hf_endpoint}/x")["Authorization"] == "Bearer hf_abc"
    assert "Authorization" not in repo.request_headers(f"{hub.cdn_url}/lfs/x")
    assert all(r["authorization"] for r in hub.requests if r["server"] == "hub")


def test_hf_private_repo_needs_a_token(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("org/private", {NAME: DATA}, private=True, token="hf_ok")
    with pytest.raises(DownloadError, match="not found") as info:
        open_source(Source("hf", repo="org/private"))
    assert "HF_TOKEN" in (info.value.hint or "")
    monkeypatch.setenv("HF_TOKEN", "hf_ok")
    assert [f.name for f in open_source(Source("hf", repo="org/private")).list_files()] == [NAME]


def test_hf_gated_repo_error_says_what_to_do(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("org/gated", {NAME: DATA}, gated=True, token="hf_ok")
    manifest = make_manifest(
        "gated", {NAME: DATA}, (Source("hf", repo="org/gated"),), checksums_file=None
    )
    with pytest.raises(DownloadError, match="gated") as info:
        fetch_model(manifest, "Q4_K_M", settings=load_settings(), dest_dir=tmp_path, policy=FAST)
    assert "hf auth login" in (info.value.hint or "")


def test_hf_unknown_revision(hub: FakeHub) -> None:
    with pytest.raises(DownloadError, match="no revision"):
        open_source(Source("hf", repo="org/model", revision="f" * 40))


def test_hf_offline_mode_is_a_clear_error(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE"):
        open_source(Source("hf", repo="org/model"))
    assert hub.requests == []


def test_hostile_names_in_a_listing_are_never_exposed(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/evil", {"../../evil.gguf": b"GGUF", "ok.gguf": b"GGUF"})
    for kind in ("hf", "modelscope"):
        repo = open_source(Source(kind, repo="org/evil"))
        assert [f.name for f in repo.list_files()] == ["ok.gguf"]
        assert set(repo.refused) == {"../../evil.gguf"}


def test_overlong_and_file_and_folder_names_are_refused_and_reported(fake_hub: FakeHub) -> None:
    long_component = "c" * 300 + ".gguf"
    long_path = "d/" * 2500 + "x.gguf"
    fake_hub.add_repo(
        "org/odd",
        {
            "ok.gguf": b"GGUF",
            long_component: b"GGUF",
            long_path: b"GGUF",
            "a.gguf": b"GGUF",
            "a.gguf/b.gguf": b"GGUF",
        },
    )
    for kind in ("hf", "modelscope"):
        repo = open_source(Source(kind, repo="org/odd"))
        assert [f.name for f in repo.list_files()] == ["ok.gguf"]
        assert set(repo.refused) == {long_component, long_path, "a.gguf", "a.gguf/b.gguf"}
        note = repo.refused_note()
        assert note is not None and "4 file name(s)" in note and len(note) < 1000
        with pytest.raises(VerificationError, match="listed both as a file and as a folder"):
            repo.resolve("a.gguf")


def test_modelscope_lists_sha256_and_builds_download_urls(hub: FakeHub) -> None:
    repo = open_source(Source("modelscope", repo="org/model"))
    files = {f.name: f for f in repo.list_files()}
    remote = files[NAME]
    assert (remote.size, remote.sha256, repo.revision) == (len(DATA), SHA, "master")
    assert remote.url == (
        f"{hub.ms_endpoint}/api/v1/models/org/model/repo?Revision=master&FilePath=sub%2Fm-Q4_K_M.gguf"
    )
    assert repo.fetch_text("SHA256SUMS", 10_000) == SUMS.decode()


def test_modelscope_token_is_a_session_cookie_for_its_origin(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-secret")
    repo = open_source(Source("modelscope", repo="org/model"))
    assert repo.request_headers(f"{hub.ms_endpoint}/api")["Cookie"] == "m_session_id=ms-secret"
    assert "Cookie" not in repo.request_headers("https://cdn.example/x")


def test_modelscope_domain_variable_is_honoured(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MODELSCOPE_ENDPOINT")
    monkeypatch.setenv("MODELSCOPE_DOMAIN", hub.ms_endpoint)
    with pytest.warns(FutureWarning):
        repo = open_source(Source("modelscope", repo="org/model"))
    assert NAME in {f.name for f in repo.list_files()}


def test_modelscope_unknown_repo(hub: FakeHub) -> None:
    with pytest.raises(DownloadError, match="org/nope"):
        open_source(Source("modelscope", repo="org/nope")).list_files()


def test_fetch_from_modelscope_end_to_end(hub: FakeHub, tmp_path: Path) -> None:
    manifest = make_manifest(
        "m", {NAME: DATA}, (Source("hf", repo="org/model"), Source("modelscope", repo="org/model"))
    )
    report = fetch_model(
        manifest,
        "Q4_K_M",
        settings=load_settings(),
        dest_dir=tmp_path,
        source="modelscope",
        policy=FAST,
    )
    assert report.plan.source == "modelscope:org/model@master"
    assert (tmp_path / NAME).read_bytes() == DATA
    assert not any(r["path"].startswith("/api/models") for r in hub.requests)  # HF not asked


def test_mirror_template(hub: FakeHub) -> None:
    template = f"{hub.mirror_base}/org/model/{{file}}"
    repo = open_source(Source("mirror", url_template=template, name="lan"))
    assert repo.label == "mirror:lan" and repo.list_files() == []
    remote = repo.resolve(NAME)
    assert remote.url == f"{hub.mirror_base}/org/model/sub/m-Q4_K_M.gguf"
    assert (remote.size, remote.sha256) == (None, None)
    assert repo.fetch_text("SHA256SUMS", 10_000) == SUMS.decode()
    assert repo.fetch_text("absent.txt", 10_000) is None


def test_hub_libraries_are_not_imported_at_module_level() -> None:
    code = (
        "import sys, quantpick.hub.sources, quantpick.fetch.download, quantpick.hub.verify, "
        "quantpick.cli.download; "
        "print([m for m in ('huggingface_hub', 'modelscope', 'modelscope_hub', 'httpx') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_modelscope_against_a_hub_that_never_answers_ends(tmp_path: Path) -> None:
    """ModelScope's library brings its own timeouts and retries (quantpick relies on them, see
    open_source): with its knobs turned down, a silent hub ends in a DownloadError (exit 5).
    Its constants are read at import, hence a subprocess."""
    import os
    import time

    from fakehub import SilentServer

    script = (
        "from quantpick.hub.sources import open_source\n"
        "from quantpick.model.manifest import Source\n"
        "from quantpick.errors import DownloadError\n"
        "try:\n"
        "    open_source(Source('modelscope', repo='org/x')).list_files()\n"
        "except DownloadError as exc:\n"
        "    print('DownloadError', exc.exit_code)\n"
    )
    with SilentServer() as silent:
        env = dict(
            os.environ,
            MODELSCOPE_ENDPOINT=silent.url,
            MODELSCOPE_API_TOKEN="",
            MODELSCOPE_CACHE=str(tmp_path / "c"),
            MODELSCOPE_HOME=str(tmp_path / "h"),
            MODELSCOPE_DOWNLOAD_INTRA_CLOUD="false",
            MODELSCOPE_API_TIMEOUT="1",
            MODELSCOPE_API_CONNECT_TIMEOUT="1",
            MODELSCOPE_REPO_TREE_PAGE_TIMEOUT_SECONDS="1",
            MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS="2",
            MODELSCOPE_REPO_TREE_PAGE_RETRY_MAX_DELAY_SECONDS="1",
            NO_PROXY="127.0.0.1",
        )
        start = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.stdout.strip() == "DownloadError 5", out.stderr
        assert time.monotonic() - start < 60
        assert silent.connections >= 2
