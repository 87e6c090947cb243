"""Other tools' stores: where each one is (environment, settings files, platform), how a file
is found in each layout (laid out exactly as the tool lays it out), the sha256 cache, linking."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.fetch import stores
from quantpick.fetch.stores import (
    FLAT,
    HF_LAYOUT,
    OLLAMA,
    PUBLISHER,
    FileChanged,
    FileIdentity,
    HashCache,
    StoreRoot,
    find_candidates,
    hf_hub_cache,
    is_link,
    link_into,
    llama_flat_cache,
    lmstudio_models_dirs,
    ollama_models_dirs,
    owning_store,
    sha256_of,
    store_roots,
)

DATA = b"GGUF" + bytes(range(256)) * 64
SHA = hashlib.sha256(DATA).hexdigest()
NAME = "Qwen-Q4_K_M.gguf"
REPO = "unsloth/Qwen-GGUF"
COMMIT = "a" * 40


def identity(path: Path) -> FileIdentity:
    return FileIdentity.of(os.stat(path))


# -- layouts, written exactly as each tool writes them -----------------------------------------


def hf_cache_layout(root: Path, repo: str, name: str, data: bytes, commit: str = COMMIT) -> Path:
    """huggingface_hub's cache: blobs/<sha256>, snapshots/<commit>/<name> -> ../../blobs/<sha256>
    (a relative symlink, os.path.relpath as in _create_symlink), refs/main."""
    sha = hashlib.sha256(data).hexdigest()
    storage = root / ("models--" + repo.replace("/", "--"))
    blob = storage / "blobs" / sha
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    pointer = storage / "snapshots" / commit / name
    pointer.parent.mkdir(parents=True)
    os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)
    return pointer


def test_hf_layout_helper_is_what_huggingface_hub_reads(tmp_path: Path) -> None:
    from huggingface_hub import try_to_load_from_cache

    pointer = hf_cache_layout(tmp_path, REPO, NAME, DATA)
    assert try_to_load_from_cache(REPO, NAME, cache_dir=tmp_path) == str(pointer)


# -- where the stores are --------------------------------------------------------------------


def test_hf_cache_precedence_matches_huggingface_hub(tmp_path: Path) -> None:
    home = tmp_path
    env = {
        "HF_HUB_CACHE": "/a",
        "HUGGINGFACE_HUB_CACHE": "/b",
        "HF_HOME": "/c",
        "XDG_CACHE_HOME": "/d",
    }
    assert hf_hub_cache(env, home) == (Path("/a"), "HF_HUB_CACHE")
    del env["HF_HUB_CACHE"]
    assert hf_hub_cache(env, home) == (Path("/b"), "HUGGINGFACE_HUB_CACHE")
    del env["HUGGINGFACE_HUB_CACHE"]
    assert hf_hub_cache(env, home) == (Path("/c/hub"), "HF_HOME")
    del env["HF_HOME"]
    assert hf_hub_cache(env, home) == (Path("/d/huggingface/hub"), "XDG_CACHE_HOME")
    assert hf_hub_cache({}, home) == (home / ".cache" / "huggingface" / "hub", "default")


def test_hf_cache_dir_is_the_one_huggingface_hub_computes(tmp_path: Path) -> None:
    """Ground truth: huggingface_hub's own constants module, re-read under each environment."""
    import importlib

    import huggingface_hub.constants as constants

    cases = [
        {"HF_HOME": str(tmp_path / "h")},
        {"XDG_CACHE_HOME": str(tmp_path / "x")},
        {"HF_HUB_CACHE": str(tmp_path / "c"), "HF_HOME": str(tmp_path / "h")},
        {"HUGGINGFACE_HUB_CACHE": str(tmp_path / "legacy")},
        {},
    ]
    saved = dict(vars(constants))
    try:
        for env in cases:
            with pytest.MonkeyPatch.context() as mp:
                for var in ("HF_HOME", "XDG_CACHE_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
                    mp.delenv(var, raising=False)
                for key, value in env.items():
                    mp.setenv(key, value)
                importlib.reload(constants)
                ours, _ = hf_hub_cache(os.environ, Path(os.path.expanduser("~")))
                assert ours == Path(constants.HF_HUB_CACHE), env
    finally:
        vars(constants).update(saved)  # exactly the values every other module has seen


@pytest.mark.parametrize(
    ("platform", "env", "expected"),
    [
        ("linux", {}, ".cache/llama.cpp"),
        ("linux", {"XDG_CACHE_HOME": "/xdg"}, "/xdg/llama.cpp"),
        ("darwin", {"XDG_CACHE_HOME": "/xdg"}, "Library/Caches/llama.cpp"),
        ("win32", {"LOCALAPPDATA": "/local"}, "/local/llama.cpp"),
        ("linux", {"LLAMA_CACHE": "/ll", "XDG_CACHE_HOME": "/xdg"}, "/ll"),
        ("darwin", {"LLAMA_CACHE": "/ll"}, "/ll"),
    ],
)
def test_llama_flat_cache_per_platform(
    tmp_path: Path, platform: str, env: dict[str, str], expected: str
) -> None:
    path, _ = llama_flat_cache(env, tmp_path, platform)
    assert path == tmp_path / expected  # an absolute `expected` replaces the home


def test_llama_hf_layout_is_llama_cache_else_the_hf_cache(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    ll = tmp_path / "ll"
    hf.mkdir()
    ll.mkdir()
    roots = store_roots(["llama"], env={"HF_HUB_CACHE": str(hf)}, home=tmp_path)
    assert [(r.layout, r.path) for r in roots] == [(HF_LAYOUT, hf)]  # no flat dir exists
    roots = store_roots(["llama"], env={"HF_HUB_CACHE": str(hf), "LLAMA_CACHE": str(ll)})
    assert [(r.layout, r.path) for r in roots] == [(HF_LAYOUT, ll), (FLAT, ll)]
    # with hf also enabled, the shared directory is looked at once, as the hf store
    roots = store_roots(["hf", "llama"], env={"HF_HUB_CACHE": str(hf)}, home=tmp_path)
    assert [(r.store, r.path) for r in roots] == [("hf", hf)]


def test_lmstudio_home_pointer_settings_and_legacy(tmp_path: Path) -> None:
    home = tmp_path
    assert lmstudio_models_dirs(home)[0] == (home / ".lmstudio" / "models", "default")
    (home / ".cache" / "lm-studio").mkdir(parents=True)
    assert lmstudio_models_dirs(home)[0][0] == home / ".cache" / "lm-studio" / "models"
    moved = tmp_path / "elsewhere"
    (home / ".lmstudio-home-pointer").write_text(f"{moved}\n")
    assert lmstudio_models_dirs(home)[0][0] == moved / "models"
    moved.mkdir()
    (moved / "settings.json").write_text(json.dumps({"downloadsFolder": "/big/models"}))
    dirs = [d for d, _ in lmstudio_models_dirs(home)]
    assert dirs[:2] == [Path("/big/models"), moved / "models"]
    assert home / ".lmstudio" / "models" in dirs  # a relocated install leaves the old one


def test_ollama_models_env_and_linux_service(tmp_path: Path) -> None:
    assert ollama_models_dirs({"OLLAMA_MODELS": "/om"}, tmp_path, "linux") == [
        (Path("/om"), "OLLAMA_MODELS")
    ]
    dirs = [d for d, _ in ollama_models_dirs({}, tmp_path, "linux")]
    assert dirs == [tmp_path / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    assert [d for d, _ in ollama_models_dirs({}, tmp_path, "darwin")] == [
        tmp_path / ".ollama" / "models"
    ]


def test_config_overrides_replace_a_store_location(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    roots = store_roots(
        ["lmstudio", "ollama"], overrides={"lmstudio": (mine,)}, env={}, home=tmp_path
    )
    assert [(r.store, r.layout, r.path, r.origin) for r in roots] == [
        ("lmstudio", PUBLISHER, mine, "config file [stores]")
    ]  # ollama's default does not exist here, so it is left out


def test_disabled_store_has_no_root(tmp_path: Path) -> None:
    (tmp_path / ".ollama" / "models").mkdir(parents=True)
    assert store_roots([], env={}, home=tmp_path) == ()
    assert [r.store for r in store_roots(["ollama"], env={}, home=tmp_path)] == ["ollama"]
    assert store_roots(["hf"], env={}, home=tmp_path) == ()  # no HF cache dir there


# -- finding candidates ------------------------------------------------------------------------


def root(store: str, layout: str, path: Path) -> StoreRoot:
    path.mkdir(parents=True, exist_ok=True)
    return StoreRoot(store, layout, path, "test")


def test_hf_cache_found_by_blob_and_by_snapshot(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    pointer = hf_cache_layout(hub, REPO, NAME, DATA)
    (found,) = find_candidates(
        [root("hf", HF_LAYOUT, hub)], name=NAME, sha256=SHA, size=len(DATA), repos=[REPO]
    )
    assert found.match == "sha256" and found.path == pointer.resolve()
    # the same bytes re-uploaded in another repo are the same blob name: found without the repo
    (other,) = find_candidates(
        [root("hf", HF_LAYOUT, hub)], name=NAME, sha256=SHA, size=len(DATA), repos=["x/y"]
    )
    assert other.match == "sha256"


def test_hf_cache_without_symlinks_found_by_repo_and_name(tmp_path: Path) -> None:
    # huggingface_hub without symlink support moves the file into snapshots/ (Windows)
    hub = tmp_path / "hub"
    snap = hub / "models--unsloth--Qwen-GGUF" / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / NAME).write_bytes(DATA)
    (found,) = find_candidates(
        [root("hf", HF_LAYOUT, hub)], name=NAME, sha256=SHA, size=len(DATA), repos=[REPO]
    )
    assert (found.match, found.path) == ("repo+name", snap / NAME)
    assert not find_candidates(
        [root("hf", HF_LAYOUT, hub)], name=NAME, sha256=SHA, size=len(DATA), repos=["x/y"]
    )


def test_llama_flat_names(tmp_path: Path) -> None:
    flat = tmp_path / "llama.cpp"
    flat.mkdir()
    legacy = flat / "unsloth_Qwen-GGUF_sub_Qwen-Q4_K_M.gguf"  # <org>_<repo>_<file>, "/" -> "_"
    legacy.write_bytes(DATA)
    (found,) = find_candidates(
        [root("llama", FLAT, flat)],
        name=f"sub/{NAME}",
        sha256=SHA,
        size=len(DATA),
        repos=[REPO],
    )
    assert (found.match, found.path) == ("repo+name", legacy)
    legacy.unlink()
    (flat / NAME).write_bytes(DATA)  # `-mu URL`: the URL's last component
    (found,) = find_candidates(
        [root("llama", FLAT, flat)], name=f"sub/{NAME}", sha256=SHA, size=len(DATA), repos=[]
    )
    assert (found.match, found.path) == ("name", flat / NAME)


def test_lmstudio_publisher_repo_and_other_publishers(tmp_path: Path) -> None:
    models = tmp_path / "models"
    exact = models / "unsloth" / "Qwen-GGUF" / NAME
    other = models / "lmstudio-community" / "Qwen-GGUF" / NAME
    for path in (exact, other):
        path.parent.mkdir(parents=True)
        path.write_bytes(DATA)
    found = find_candidates(
        [root("lmstudio", PUBLISHER, models)], name=NAME, sha256=SHA, size=len(DATA), repos=[REPO]
    )
    assert [(c.match, c.path) for c in found] == [("repo+name", exact), ("name", other)]


def test_ollama_blob_by_hash_only(tmp_path: Path) -> None:
    models = tmp_path / "models"
    blob = models / "blobs" / f"sha256-{SHA}"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(DATA)
    (found,) = find_candidates(
        [root("ollama", OLLAMA, models)], name=NAME, sha256=SHA.upper(), size=len(DATA)
    )
    assert (found.store, found.match, found.path) == ("ollama", "sha256", blob)


def test_wrong_size_links_and_destination_are_not_candidates(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / NAME).write_bytes(DATA[:-1])  # one byte short: not even a candidate
    assert not find_candidates([root("llama", FLAT, flat)], name=NAME, sha256=SHA, size=len(DATA))
    (flat / NAME).write_bytes(DATA)
    os.link(flat / NAME, flat / "again.gguf")
    dest = tmp_path / "dest" / NAME
    dest.parent.mkdir()
    os.link(flat / NAME, dest)
    found = find_candidates(
        [root("llama", FLAT, flat)], name=NAME, sha256=SHA, size=len(DATA), exclude=[dest]
    )
    assert found == []  # the destination's own inode is never its own source
    dest.unlink()
    found = find_candidates([root("llama", FLAT, flat)], name=NAME, sha256=SHA, size=None)
    assert len(found) == 1  # one inode, one candidate


# -- sha256 cache ------------------------------------------------------------------------------


def test_hash_cache_round_trip_and_invalidation(tmp_path: Path) -> None:
    path = tmp_path / "f.gguf"
    path.write_bytes(DATA)
    cache = HashCache(tmp_path / "cache.json")
    seen: list[int] = []
    hashed = sha256_of(path, cache, on_bytes=seen.append)
    assert (hashed.sha256, hashed.from_cache) == (SHA, False)
    assert sum(seen) == len(DATA)
    cache.save()
    again = HashCache(tmp_path / "cache.json")
    again_hashed = sha256_of(path, again)
    assert (again_hashed.sha256, again_hashed.from_cache) == (SHA, True)  # a rerun: no rehash
    # a byte changed and the mtime put back: ctime still moves, so the cache does not answer
    st = path.stat()
    path.write_bytes(b"X" + DATA[1:])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert again.lookup(path) is None
    assert sha256_of(path, again).sha256 == hashlib.sha256(b"X" + DATA[1:]).hexdigest()


def test_hash_cache_ignores_garbage(tmp_path: Path) -> None:
    (tmp_path / "cache.json").write_text("{not json")
    cache = HashCache(tmp_path / "cache.json")
    assert cache.lookup(tmp_path / "cache.json") is None


@given(st.binary(max_size=3 * 1024 * 1024 // 7))
def test_sha256_of_equals_hashlib(data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f"
        path.write_bytes(data)
        assert sha256_of(path, HashCache(None)).sha256 == hashlib.sha256(data).hexdigest()


# -- linking ----------------------------------------------------------------------------------


def test_link_into_hardlinks_on_one_filesystem(tmp_path: Path) -> None:
    src = tmp_path / "store" / NAME
    src.parent.mkdir()
    src.write_bytes(DATA)
    before = src.stat()
    dest = tmp_path / "models" / NAME
    linked = link_into(src, dest, identity(src))
    action, why = linked.action, linked.why
    assert action == "hardlink" and "no extra space" in why
    assert linked.identity == FileIdentity.of(dest.stat())  # the ctime the link gave it
    assert os.path.samefile(src, dest) and is_link(dest)
    after = src.stat()
    assert (after.st_mtime_ns, after.st_size, after.st_mode) == (
        before.st_mtime_ns,
        before.st_size,
        before.st_mode,
    )


def test_link_into_symlinks_across_filesystems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "store" / NAME
    src.parent.mkdir()
    src.write_bytes(DATA)

    def cross_device(a: object, b: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(stores.os, "link", cross_device)
    dest = tmp_path / "models" / NAME
    linked = link_into(src, dest, identity(src))
    action, why = linked.action, linked.why
    assert action == "symlink" and dest.is_symlink() and dest.resolve() == src.resolve()
    assert "breaks if the other tool deletes" in why


def test_link_into_in_place_when_no_link_can_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / NAME
    src.write_bytes(DATA)

    def refuse(a: object, b: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(stores.os, "link", refuse)
    monkeypatch.setattr(stores.os, "symlink", refuse)
    linked = link_into(src, tmp_path / "models" / NAME, identity(src))
    assert linked.action == "in-place" and "EPERM" in linked.why
    assert not (tmp_path / "models" / NAME).exists()


# -- a file swapped or written while it is hashed (issue 21) ---------------------------------


def _let_ctime_move() -> None:
    """File times come from a coarse clock (one kernel tick, 1-10 ms): a write within the same
    tick as the file's creation would keep its ctime. A real store file is older than that."""
    time.sleep(0.05)


def test_a_file_written_while_hashed_with_its_mtime_put_back_has_no_hash(tmp_path: Path) -> None:
    path = tmp_path / "f.gguf"
    path.write_bytes(DATA)
    _let_ctime_move()
    before = path.stat()

    def rewrite(n: int) -> None:  # during the hash: one byte changed, the mtime set back
        with open(path, "r+b") as handle:
            handle.write(b"X")
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))

    cache = HashCache(tmp_path / "cache.json")
    with pytest.raises(FileChanged):
        sha256_of(path, cache, on_bytes=rewrite)
    assert path.stat().st_mtime_ns == before.st_mtime_ns  # the attack kept the mtime
    assert cache.lookup(path) is None  # never the old hash for the new bytes
    cache.save()
    assert HashCache(tmp_path / "cache.json").lookup(path) is None


def test_record_compares_the_full_identity_ctime_included(tmp_path: Path) -> None:
    path = tmp_path / "f.gguf"
    path.write_bytes(DATA)
    _let_ctime_move()
    st = path.stat()
    hashed_as = identity(path)
    with open(path, "r+b") as handle:
        handle.write(b"X")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    cache = HashCache(None)
    cache.record(path, SHA, hashed_as)
    assert cache.lookup(path) is None
    cache.record(path, "0" * 64)  # no `before`: what the file is now (a fresh hash of it)
    assert cache.lookup(path) == "0" * 64


def test_a_file_renamed_over_while_hashed_has_no_hash(tmp_path: Path) -> None:
    """The descriptor keeps reading the file that was opened; losing its name moves that
    inode's ctime, so the hash is refused rather than vouching for the path."""
    src = tmp_path / "store" / NAME
    src.parent.mkdir()
    src.write_bytes(DATA)
    _let_ctime_move()
    evil = tmp_path / "evil"
    evil.write_bytes(b"EVIL" + DATA[4:])
    cache = HashCache(None)
    with pytest.raises(FileChanged):
        sha256_of(src, cache, on_bytes=lambda n: os.replace(evil, src))
    assert cache.lookup(src) is None


def test_a_file_renamed_over_after_hashing_is_never_linked(tmp_path: Path) -> None:
    src = tmp_path / "store" / NAME
    src.parent.mkdir()
    src.write_bytes(DATA)
    hashed = sha256_of(src, HashCache(None))
    (tmp_path / "evil").write_bytes(b"EVIL" + DATA[4:])
    os.replace(tmp_path / "evil", src)
    dest = tmp_path / "models" / NAME
    with pytest.raises(FileChanged):
        link_into(src, dest, hashed.identity)
    assert not dest.exists()


def test_a_symlink_repointed_while_hashed_is_never_linked(tmp_path: Path) -> None:
    good, evil = tmp_path / "good", tmp_path / "evil"
    good.write_bytes(DATA)
    evil.write_bytes(b"EVIL" + DATA[4:])
    src = tmp_path / "store" / NAME
    src.parent.mkdir()
    src.symlink_to(good)

    def repoint(n: int) -> None:
        src.unlink()
        src.symlink_to(evil)

    hashed = sha256_of(src, HashCache(None), on_bytes=repoint)
    dest = tmp_path / "models" / NAME
    with pytest.raises(FileChanged):
        link_into(src, dest, hashed.identity)
    assert not dest.exists()


def test_a_rename_over_between_the_check_and_the_link_is_caught_after_linking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "store" / NAME
    src.parent.mkdir()
    src.write_bytes(DATA)
    evil = tmp_path / "evil"
    evil.write_bytes(b"EVIL" + DATA[4:])
    hashed = sha256_of(src, HashCache(None))
    real_link = os.link

    def swap_then_link(a: Any, b: Any) -> None:
        os.replace(evil, src)  # the race the re-check before linking cannot see
        real_link(a, b)

    monkeypatch.setattr(stores.os, "link", swap_then_link)
    dest = tmp_path / "models" / NAME
    with pytest.raises(FileChanged):
        link_into(src, dest, hashed.identity)
    assert not dest.exists() and list(dest.parent.iterdir()) == []  # the temporary link is gone


# -- other tools' small files: regular files only, read with a cap (issue 21) ------------------


def _finishes(call: Any, seconds: float = 10.0) -> Any:
    """call() on a thread; fails (instead of hanging the suite) when it has not returned."""
    box: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.setdefault("value", call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s"
    return box["value"]


@pytest.mark.parametrize("which", ["pointer", "settings"])
def test_lmstudio_pointer_or_settings_as_a_fifo_does_not_hang(tmp_path: Path, which: str) -> None:
    home = tmp_path / "home"
    (home / ".lmstudio").mkdir(parents=True)
    fifo = home / (".lmstudio-home-pointer" if which == "pointer" else ".lmstudio/settings.json")
    os.mkfifo(fifo)
    dirs = _finishes(lambda: lmstudio_models_dirs(home))
    assert dirs[0] == (home / ".lmstudio" / "models", "default")  # as if it were not there


def test_lmstudio_files_linked_to_dev_zero_are_not_read(tmp_path: Path) -> None:
    """A symlink to /dev/zero: read whole, it never ends (here: a 1 GiB address-space limit
    turns that into a MemoryError instead of eating the machine's memory)."""
    home = tmp_path / "home"
    (home / ".lmstudio").mkdir(parents=True)
    (home / ".lmstudio-home-pointer").symlink_to("/dev/zero")
    (home / ".lmstudio" / "settings.json").symlink_to("/dev/zero")
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from pathlib import Path\n"
        "from quantpick.fetch.stores import lmstudio_models_dirs\n"
        "print(lmstudio_models_dirs(Path(sys.argv[1]))[0][0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(home)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(home / ".lmstudio" / "models")


def test_an_oversized_lmstudio_settings_file_is_ignored(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".lmstudio").mkdir(parents=True)
    doc = json.dumps({"downloadsFolder": str(tmp_path / "elsewhere")})
    (home / ".lmstudio" / "settings.json").write_text(doc + " " * stores.SETTINGS_MAX_BYTES)
    assert lmstudio_models_dirs(home)[0] == (home / ".lmstudio" / "models", "default")
    (home / ".lmstudio" / "settings.json").write_text(doc)  # the same file, small: read
    assert lmstudio_models_dirs(home)[0][0] == tmp_path / "elsewhere"


def test_owning_store_by_path_and_through_symlinks(tmp_path: Path) -> None:
    models = tmp_path / "lms" / "models"
    (models / "org" / "repo").mkdir(parents=True)
    alias = tmp_path / "alias"
    alias.symlink_to(models / "org")
    roots = [root("lmstudio", PUBLISHER, models)]
    assert owning_store(models / "org" / "repo" / NAME, roots) == roots[0]
    assert owning_store(alias / "repo" / NAME, roots) == roots[0]  # the same folder, renamed
    assert owning_store(tmp_path / "mine" / NAME, roots) is None
    assert owning_store(tmp_path / "lms" / NAME, roots) is None  # beside it, not in it
