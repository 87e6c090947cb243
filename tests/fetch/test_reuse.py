"""The reuse step of fetch_model: copies already on disk in other tools' stores (laid out exactly
as each tool lays them out) are verified and linked in before any transfer; a bad copy is never
used and never touched; --hf-cache writes what huggingface_hub itself reads back."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from fakehub import FakeHub, gguf_bytes, make_manifest, sha256sums

from quantpick.config import load_settings
from quantpick.errors import UsageError, VerificationError
from quantpick.fetch import stores
from quantpick.fetch.download import fetch_model
from quantpick.fetch.progress import NullProgress
from quantpick.fetch.transfer import part_paths
from quantpick.hub.http import RetryPolicy
from quantpick.model.manifest import Source

SIZE = 2 * 1024 * 1024 + 77
NAME = "model-Q4_K_M.gguf"
DATA = gguf_bytes(SIZE, seed=11)
SHA = hashlib.sha256(DATA).hexdigest()
REPO = "org/model"
BAD = DATA[:1000] + bytes([DATA[1000] ^ 0xFF]) + DATA[1001:]  # same size, one byte flipped
STORES = ("hf", "llama", "llama-legacy", "lmstudio", "ollama")
FAST = RetryPolicy(attempts=2, idle_timeout=2, connect_timeout=2, sleep=lambda s: None)


def home() -> Path:
    return Path(os.environ["HOME"])  # tests/conftest.py gives every test its own


def byte_gets(hub: FakeHub, name: str = NAME) -> list[dict[str, Any]]:
    """Every GET that names the file: the hub's redirect and the CDN's bytes."""
    return [r for r in hub.requests if r.get("file") == name and r["method"] == "GET"]


def downloads(hub: FakeHub, name: str = NAME) -> int:
    """Bodies sent by the CDN: one per transfer."""
    return len([r for r in byte_gets(hub, name) if r["server"] == "cdn"])


# -- each tool's layout ------------------------------------------------------------------------


def lay_out(store: str, data: bytes, sha: str = SHA) -> Path:
    """Write `data` where and how `store` keeps NAME of REPO; returns the file's path."""
    h = home()
    if store == "hf":  # `hf download org/model NAME` (huggingface_hub 2.4)
        return hf_layout(h / ".cache" / "huggingface" / "hub", data, sha)
    if store == "llama":  # `llama-server -hf org/model:Q4_K_M` with LLAMA_CACHE set
        os.environ["LLAMA_CACHE"] = str(h / "llama-cache")
        return hf_layout(h / "llama-cache", data, sha)
    if store == "llama-legacy":  # llama.cpp before the HF-layout cache: ~/.cache/llama.cpp
        path = h / ".cache" / "llama.cpp" / f"org_model_{NAME}"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        path.with_name(path.name + ".json").write_text('{"etag": "x"}')
        return path
    if store == "lmstudio":  # LM Studio's downloader: models/<publisher>/<repo>/<file>
        path = h / ".lmstudio" / "models" / "org" / "model" / NAME
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        return path
    if store == "ollama":  # `ollama pull hf.co/org/model:Q4_K_M`: blob + manifest
        models = h / ".ollama" / "models"
        blob = models / "blobs" / f"sha256-{sha}"
        blob.parent.mkdir(parents=True)
        blob.write_bytes(data)
        manifest = models / "manifests" / "hf.co" / "org" / "model" / "Q4_K_M"
        manifest.parent.mkdir(parents=True)
        layer = {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{sha}"}
        manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [{**layer, "size": SIZE}]}))
        return blob
    raise AssertionError(store)


def hf_layout(hub: Path, data: bytes, sha: str, commit: str = "c" * 40) -> Path:
    storage = hub / "models--org--model"
    blob = storage / "blobs" / sha
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    pointer = storage / "snapshots" / commit / NAME
    pointer.parent.mkdir(parents=True)
    os.symlink(os.path.relpath(blob, pointer.parent), pointer)  # as _create_symlink does
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)
    return blob


def store_name(store: str) -> str:
    return "llama" if store.startswith("llama") else store


def snapshot(path: Path) -> tuple[bytes, int, int, int, int]:
    st = os.stat(path)
    return path.read_bytes(), st.st_mtime_ns, st.st_mode, st.st_ino, st.st_size


@pytest.fixture
def hub(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    monkeypatch.delenv("LLAMA_CACHE", raising=False)  # lay_out("llama") sets it
    fake_hub.add_repo(REPO, {NAME: DATA, "SHA256SUMS": sha256sums({NAME: DATA})})
    return fake_hub


def manifest(**kw: Any) -> Any:
    return make_manifest("test-model", {NAME: DATA}, (Source("hf", repo=REPO),), **kw)


def fetch(dest: Path | None, **kw: Any) -> Any:
    settings = kw.pop("settings", None) or load_settings()
    return fetch_model(manifest(), "Q4_K_M", settings=settings, dest_dir=dest, policy=FAST, **kw)


class Recorder(NullProgress):
    def __init__(self) -> None:
        self.messages: list[str] = []
        self.hashed: list[tuple[str, int]] = []

    def message(self, text: str) -> None:
        self.messages.append(text)

    def hash_started(self, label: str, total: int) -> None:
        self.hashed.append((label, 0))

    def hash_advance(self, label: str, n: int) -> None:
        self.hashed[-1] = (label, self.hashed[-1][1] + n)

    def hash_finished(self, label: str) -> None:
        pass


# -- reuse from each store ---------------------------------------------------------------------


@pytest.mark.parametrize("store", STORES)
def test_verified_copy_is_linked_and_nothing_downloads(
    hub: FakeHub, tmp_path: Path, store: str
) -> None:
    source = lay_out(store, DATA)
    before = snapshot(source)
    progress = Recorder()
    dest = tmp_path / "models"
    report = fetch(dest, progress=progress)
    assert byte_gets(hub) == []
    used = report.reused[NAME]
    assert used.store == store_name(store) and used.verified and used.action == "hardlink"
    assert os.path.samefile(dest / NAME, source)
    (result,) = report.results
    assert (result.reused, result.verified, result.bytes_fetched, result.path) == (
        True,
        True,
        0,
        dest / NAME,
    )
    assert (dest / "SHA256SUMS").read_text() == f"{SHA}  {NAME}\n"  # `verify DIR` works later
    assert progress.hashed == [(f"{NAME} in {store_name(store)}", SIZE)]  # shown while hashing
    assert any(m.startswith(f"Reusing {NAME} from {store_name(store)}") for m in progress.messages)
    data, mtime, mode, inode, size = snapshot(source)
    assert (data, mtime, mode, inode, size) == (before[0], before[1], before[2], before[3], SIZE)

    # a rerun verifies from the sha256 cache: no rehash, no transfer
    again = Recorder()
    report = fetch(dest, progress=again)
    assert again.hashed == [] and byte_gets(hub) == []
    assert report.results[0].reused


@pytest.mark.parametrize("store", STORES)
def test_corrupted_copy_is_not_used_and_left_untouched(
    hub: FakeHub, tmp_path: Path, store: str
) -> None:
    source = lay_out(store, BAD)  # named and placed as the right file, one byte wrong
    before = snapshot(source)
    dest = tmp_path / "models"
    report = fetch(dest)
    assert downloads(hub) == 1  # downloaded instead
    assert (dest / NAME).read_bytes() == DATA and not os.path.samefile(dest / NAME, source)
    assert NAME not in report.reused
    (rejected,) = report.rejected[NAME]
    assert rejected.path == source and "left untouched" in rejected.reason
    assert snapshot(source) == before  # bytes, mtime, mode, inode: byte-for-byte untouched
    assert not list(source.parent.glob(f"{source.name}.bad-*"))

    # next time the cache already knows it differs: listed as rejected, not hashed again
    plan = fetch(tmp_path / "other", dry_run=True).plan
    assert plan.files[0].reuse is None and plan.files[0].reuse_rejected[0].path == source


@pytest.mark.parametrize("store", ["hf", "lmstudio", "ollama"])
def test_disabled_store_is_not_looked_at(hub: FakeHub, tmp_path: Path, store: str) -> None:
    lay_out(store, DATA)
    # without LLAMA_CACHE, llama.cpp's -hf cache is the HF cache: "llama" looks there too
    off = {store, "llama"} if store == "hf" else {store}
    others = tuple(s for s in ("hf", "llama", "lmstudio", "ollama") if s not in off)
    settings = dataclasses.replace(load_settings(), reuse_stores=others)
    report = fetch(tmp_path / "models", settings=settings)
    assert all(r.store != store for r in report.plan.reuse_roots)
    assert NAME not in report.reused and downloads(hub) == 1
    report = fetch(tmp_path / "none", settings=dataclasses.replace(settings, reuse_stores=()))
    assert report.plan.reuse_roots == () and downloads(hub) == 2


def test_llama_alone_finds_the_hf_cache_it_shares(hub: FakeHub, tmp_path: Path) -> None:
    lay_out("hf", DATA)
    settings = dataclasses.replace(load_settings(), reuse_stores=("llama",))
    report = fetch(tmp_path / "models", settings=settings)
    assert report.reused[NAME].store == "llama" and byte_gets(hub) == []


def test_dry_run_reports_the_copy_and_whether_it_is_verified(hub: FakeHub, tmp_path: Path) -> None:
    source = lay_out("ollama", DATA)
    plan = fetch(tmp_path / "models", dry_run=True).plan
    choice = plan.files[0].reuse
    assert (choice.store, choice.path, choice.match, choice.verified, choice.action) == (
        "ollama",
        source,
        "sha256",
        False,  # not hashed yet: the real run hashes it before any transfer
        "hardlink",
    )
    # Not verified yet: counted as to fetch (it may not match), and as to hash first.
    assert (plan.bytes_to_fetch, plan.bytes_to_verify, plan.bytes_to_fetch_if_verified) == (
        SIZE,
        SIZE,
        0,
    )
    assert byte_gets(hub) == []
    assert not (tmp_path / "models").exists()  # a dry run writes nothing
    fetch(tmp_path / "models")
    plan = fetch(tmp_path / "second", dry_run=True).plan
    assert plan.files[0].reuse.verified  # the sha256 cache knows it now
    assert (plan.bytes_to_fetch, plan.bytes_to_verify) == (0, 0)


def test_a_partial_download_is_superseded_by_a_verified_copy(hub: FakeHub, tmp_path: Path) -> None:
    lay_out("lmstudio", DATA)
    dest = tmp_path / "models"
    part, sidecar = part_paths(dest / NAME)
    dest.mkdir()
    part.write_bytes(DATA[:1000])
    sidecar.write_text("{}")
    report = fetch(dest)
    assert report.reused[NAME].store == "lmstudio" and byte_gets(hub) == []
    assert not part.exists() and not sidecar.exists()


def test_symlink_when_no_hardlink_is_possible(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = lay_out("hf", DATA)

    def cross_device(a: object, b: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(stores.os, "link", cross_device)
    dest = tmp_path / "models"
    report = fetch(dest)
    assert report.reused[NAME].action == "symlink"
    assert (dest / NAME).is_symlink() and (dest / NAME).resolve() == source.resolve()
    assert byte_gets(hub) == []


def test_in_place_when_no_link_at_all(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = lay_out("lmstudio", DATA)

    def refuse(a: object, b: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(stores.os, "link", refuse)
    monkeypatch.setattr(stores.os, "symlink", refuse)
    report = fetch(tmp_path / "models")
    assert report.reused[NAME].action == "in-place"
    assert report.results[0].path == source and byte_gets(hub) == []


def test_in_place_is_refused_for_a_blob_without_the_file_name(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay_out("ollama", DATA)  # blobs/sha256-<hex>: llama.cpp could not find split siblings by name

    def refuse(a: object, b: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(stores.os, "link", refuse)
    monkeypatch.setattr(stores.os, "symlink", refuse)
    report = fetch(tmp_path / "models")
    assert NAME not in report.reused and downloads(hub) == 1


def test_a_linked_copy_changed_by_its_tool_is_dropped_never_written(
    hub: FakeHub, tmp_path: Path
) -> None:
    source = lay_out("lmstudio", DATA)
    dest = tmp_path / "models"
    fetch(dest)
    assert os.path.samefile(dest / NAME, source)
    source.write_bytes(DATA[: SIZE // 2])  # the other tool truncates its file (same inode)
    before = snapshot(source)
    report = fetch(dest)
    assert snapshot(source) == before  # the engine never resumed into the other tool's inode
    assert (dest / NAME).read_bytes() == DATA and not os.path.samefile(dest / NAME, source)
    assert downloads(hub) == 1 and not report.results[0].reused


# -- --hf-cache: what huggingface_hub reads back ---------------------------------------------


def hf_settings(**kw: Any) -> Any:
    return dataclasses.replace(load_settings(), hf_cache=True, **kw)


def test_hf_cache_round_trips_through_huggingface_hub(hub: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import hf_hub_download, scan_cache_dir, try_to_load_from_cache

    cache_dir = home() / ".cache" / "huggingface" / "hub"
    commit = hub.repos[REPO].commit
    report = fetch(None, settings=hf_settings(reuse_stores=()))
    pointer = cache_dir / "models--org--model" / "snapshots" / commit / NAME
    assert report.results[0].path == pointer
    assert os.readlink(pointer) == f"../../blobs/{SHA}"  # relative, as huggingface_hub writes
    assert (cache_dir / "models--org--model" / "refs" / "main").read_text() == commit
    assert (cache_dir / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d")
    assert not list((cache_dir / "models--org--model" / "blobs").glob("*.part*"))

    assert try_to_load_from_cache(REPO, NAME, cache_dir=cache_dir) == str(pointer)
    assert try_to_load_from_cache(REPO, NAME, cache_dir=cache_dir, revision=commit) == str(pointer)
    info = scan_cache_dir(cache_dir)
    assert info.warnings == []
    (repo,) = info.repos
    (revision,) = repo.revisions
    assert (repo.repo_id, revision.commit_hash, set(revision.refs)) == (REPO, commit, {"main"})
    assert {(f.file_name, f.blob_path.name) for f in revision.files} == {(NAME, SHA)}
    got = hf_hub_download(REPO, NAME, cache_dir=cache_dir, local_files_only=True)
    assert got == str(pointer) and Path(got).read_bytes() == DATA
    # online, huggingface_hub finds its blob and pointer: no byte is fetched again
    gets = len(byte_gets(hub))
    assert hf_hub_download(REPO, NAME, cache_dir=cache_dir, endpoint=hub.hf_endpoint) == str(
        pointer
    )
    assert len(byte_gets(hub)) == gets


def test_hf_cache_pinned_commit_writes_no_ref(hub: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import hf_hub_download, scan_cache_dir

    commit = hub.repos[REPO].commit
    pinned = make_manifest("test-model", {NAME: DATA}, (Source("hf", repo=REPO, revision=commit),))
    cache_dir = home() / ".cache" / "huggingface" / "hub"
    fetch_model(pinned, "Q4_K_M", settings=hf_settings(reuse_stores=()), policy=FAST)
    assert not (cache_dir / "models--org--model" / "refs").exists()  # revision == commit
    (repo,) = scan_cache_dir(cache_dir).repos
    assert [r.commit_hash for r in repo.revisions] == [commit]
    got = hf_hub_download(REPO, NAME, revision=commit, cache_dir=cache_dir, local_files_only=True)
    assert Path(got).read_bytes() == DATA


def test_hf_cache_reuses_another_store_into_the_blob(hub: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import try_to_load_from_cache

    source = lay_out("ollama", DATA)
    report = fetch(None, settings=hf_settings())
    cache_dir = home() / ".cache" / "huggingface" / "hub"
    assert byte_gets(hub) == [] and report.reused[NAME].store == "ollama"
    blob = cache_dir / "models--org--model" / "blobs" / SHA
    assert os.path.samefile(blob, source)
    assert try_to_load_from_cache(REPO, NAME, cache_dir=cache_dir) == str(report.results[0].path)


def test_hf_cache_blob_already_there_gets_its_snapshot(hub: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import try_to_load_from_cache

    cache_dir = home() / ".cache" / "huggingface" / "hub"
    blob = hf_layout(cache_dir, DATA, SHA)  # `hf download` at an older commit
    before = snapshot(blob)
    report = fetch(None, settings=hf_settings(reuse_stores=()))
    commit = hub.repos[REPO].commit
    assert byte_gets(hub) == [] and snapshot(blob) == before
    assert report.results[0].path.parent.name == commit
    assert try_to_load_from_cache(REPO, NAME, cache_dir=cache_dir) == str(report.results[0].path)


def test_hf_cache_bad_blob_is_reported_not_touched(hub: FakeHub, tmp_path: Path) -> None:
    cache_dir = home() / ".cache" / "huggingface" / "hub"
    blob = cache_dir / "models--org--model" / "blobs" / SHA
    blob.parent.mkdir(parents=True)
    blob.write_bytes(BAD)
    before = snapshot(blob)
    with pytest.raises(VerificationError, match="does not touch it|has sha256"):
        fetch(None, settings=hf_settings(reuse_stores=()))
    assert snapshot(blob) == before and byte_gets(hub) == []


def test_hf_cache_needs_a_hugging_face_source(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--dir"):
        fetch(tmp_path, settings=hf_settings())
    with pytest.raises(UsageError, match="--source modelscope"):
        fetch(None, settings=hf_settings(), source="modelscope")
    mirror_only = make_manifest(
        "m", {NAME: DATA}, (Source("mirror", url_template=f"{hub.mirror_base}/{{file}}"),)
    )
    with pytest.raises(UsageError, match="no hf source"):
        fetch_model(mirror_only, "Q4_K_M", settings=hf_settings(), policy=FAST)


@pytest.mark.llamacpp
def test_llama_server_lists_what_hf_cache_wrote(hub: FakeHub, llamacpp_bin: Path) -> None:
    """llama.cpp's own reader of the cache (`-cl`, hf_cache::get_cached_files, the lookup an
    offline `-hf org/model:Q4_K_M` uses) finds the file quantpick wrote with --hf-cache."""
    import subprocess

    fetch(None, settings=hf_settings(reuse_stores=()))
    out = subprocess.run(
        [str(llamacpp_bin / "llama-server"), "--cache-list"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),  # HF_HOME under the test's home; no LLAMA_CACHE
    )
    assert out.returncode == 0, out.stderr
    assert f"{REPO}:Q4_K_M" in out.stdout + out.stderr


def test_an_unreadable_copy_is_skipped(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = lay_out("ollama", DATA)
    real = stores.sha256_of

    def as_another_user(path: Path, *args: Any, **kw: Any) -> Any:
        if Path(path) == source:  # the Linux service's blobs, mode 0600 for user ollama
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kw)

    monkeypatch.setattr(stores, "sha256_of", as_another_user)
    report = fetch(tmp_path / "models")
    assert "unreadable" in report.rejected[NAME][0].reason and downloads(hub) == 1


# -- a copy swapped while it is hashed; another tool's folder as --dir (issue 21) -------------


class SwapWhileHashing(Recorder):
    """Runs `swap` once, after the first read of the copy being hashed (the race, made exact)."""

    def __init__(self, swap: Any) -> None:
        super().__init__()
        self.swap = swap

    def hash_advance(self, label: str, n: int) -> None:
        super().hash_advance(label, n)
        if self.swap is not None and "in place" not in label:
            swap, self.swap = self.swap, None
            swap()


def replace_with_bad(path: Path) -> None:
    bad = path.with_name(path.name + ".evil")
    bad.write_bytes(BAD)
    os.replace(bad, path)


@pytest.mark.parametrize("store", STORES)
def test_a_copy_renamed_over_while_hashed_is_never_linked(
    hub: FakeHub, tmp_path: Path, store: str
) -> None:
    source = lay_out(store, DATA)
    dest = tmp_path / "models"
    progress = SwapWhileHashing(lambda: replace_with_bad(source))
    report = fetch(dest, progress=progress)
    assert NAME not in report.reused  # never "sha256 verified" for bytes it did not hash
    assert (dest / NAME).read_bytes() == DATA and not os.path.samefile(dest / NAME, source)
    assert downloads(hub) == 1 and report.results[0].verified
    assert any("changed while it was hashed" in m for m in progress.messages)
    assert source.read_bytes() == BAD  # the other tool's file is left as it is


def test_a_copy_whose_symlink_is_repointed_while_hashed_is_never_linked(
    hub: FakeHub, tmp_path: Path
) -> None:
    good, bad = tmp_path / "disk" / "good.gguf", tmp_path / "disk" / "bad.gguf"
    good.parent.mkdir()
    good.write_bytes(DATA)
    bad.write_bytes(BAD)
    source = home() / ".lmstudio" / "models" / "org" / "model" / NAME
    source.parent.mkdir(parents=True)
    source.symlink_to(good)  # LM Studio models kept on another disk, linked in

    def repoint() -> None:
        source.unlink()
        source.symlink_to(bad)

    dest = tmp_path / "models"
    progress = SwapWhileHashing(repoint)
    report = fetch(dest, progress=progress)
    assert NAME not in report.reused
    assert (dest / NAME).read_bytes() == DATA and not os.path.samefile(dest / NAME, bad)
    assert downloads(hub) == 1
    # The next run finds the copy again, now the bad one: hashed, refused, never linked.
    again = fetch(tmp_path / "again")
    assert NAME not in again.reused and (tmp_path / "again" / NAME).read_bytes() == DATA


def lmstudio_folder(data: bytes, *, hardlinked: bool = False) -> Path:
    """LM Studio's folder for REPO holding NAME with `data` (optionally with a second name, as
    after another tool linked it); returns the folder."""
    path = lay_out("lmstudio", data)
    if hardlinked:
        os.link(path, path.with_name("imported-elsewhere.gguf"))
    return path.parent


@pytest.mark.parametrize("hardlinked", [False, True], ids=["plain", "hardlinked"])
def test_dir_inside_another_tools_folder_never_renames_its_file(
    hub: FakeHub, hardlinked: bool
) -> None:
    folder = lmstudio_folder(BAD, hardlinked=hardlinked)
    before = snapshot(folder / NAME)
    names = sorted(os.listdir(folder))
    with pytest.raises(VerificationError, match="never renames, moves or deletes") as info:
        fetch(folder)
    assert "lmstudio" in info.value.message and info.value.exit_code == 4
    assert snapshot(folder / NAME) == before  # same bytes, same inode, same name
    assert sorted(os.listdir(folder)) == names  # no .bad-*, no .part, nothing removed
    assert downloads(hub) == 0


def test_dir_inside_another_tools_folder_never_resumes_into_its_shorter_file(
    hub: FakeHub,
) -> None:
    folder = lmstudio_folder(DATA[: SIZE // 2])
    before = snapshot(folder / NAME)
    with pytest.raises(VerificationError, match="never renames, moves or deletes"):
        fetch(folder)
    assert snapshot(folder / NAME) == before and sorted(os.listdir(folder)) == [NAME]
    assert downloads(hub) == 0


def test_dir_inside_another_tools_folder_uses_its_verified_file(hub: FakeHub) -> None:
    folder = lmstudio_folder(DATA)
    before = snapshot(folder / NAME)
    report = fetch(folder)
    assert report.results[0].reused and report.results[0].path == folder / NAME
    assert snapshot(folder / NAME) == before and downloads(hub) == 0


def test_the_engine_itself_never_moves_a_file_it_does_not_own(tmp_path: Path) -> None:
    """transfer.download_file with `owner` (the guard at the root, whatever the caller planned)."""
    from quantpick.fetch.transfer import download_file
    from quantpick.hub.base import RemoteFile

    dest = tmp_path / NAME
    for data in (BAD, DATA[:1000]):
        dest.write_bytes(data)
        with pytest.raises(VerificationError, match="never renames"):
            download_file(
                RemoteFile(NAME, SIZE, SHA, "http://127.0.0.1:9/x", "hf", None),
                dest,
                headers_for=lambda url: {},
                policy=FAST,
                owner="lmstudio (/somewhere)",
            )
        left = [n for n in os.listdir(tmp_path) if n != f".{NAME}.lock"]  # quantpick's own lock
        assert dest.read_bytes() == data and left == [NAME]
