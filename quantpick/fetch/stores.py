"""Other tools' GGUF stores: where each keeps its files, how it names them, and using one of
them instead of downloading the same bytes again.

Stores (names as in quantpick.config.STORE_NAMES; each can be turned off, or moved with the
config file's [stores] table):

* `hf`: the Hugging Face cache, as huggingface_hub 2.4 computes it (`constants.py`):
  HF_HUB_CACHE > HUGGINGFACE_HUB_CACHE > $HF_HOME/hub > $XDG_CACHE_HOME/huggingface/hub >
  ~/.cache/huggingface/hub. Layout: `models--<org>--<repo>/snapshots/<commit>/<file>`, a
  relative symlink to `blobs/<etag>`, where the etag of an LFS file (every GGUF) is its sha256.
* `llama`: llama.cpp's caches, at commit 0c1e57098. `-hf` writes the Hugging Face layout
  (`common/hf-cache.cpp:33-62` `get_cache_directory`: LLAMA_CACHE first, then the same chain as
  huggingface_hub), so without LLAMA_CACHE it is the `hf` store itself. `-mu URL` and `-dr` write
  flat files into `fs_get_cache_directory()` (`common/common.cpp:985-1004`): LLAMA_CACHE, else
  `%LOCALAPPDATA%\\llama.cpp` (Windows), `~/Library/Caches/llama.cpp` (macOS),
  `$XDG_CACHE_HOME/llama.cpp` or `~/.cache/llama.cpp`. Builds before the 2026 move to the HF
  layout (llama.cpp#20935) kept `-hf` files there too, named `<org>_<repo>_<file>` with every
  "/" turned into "_" (`common/arg.cpp` of those builds).
* `lmstudio`: LM Studio's models folder, `<home>/models/<publisher>/<repo>/<file>` (LM Studio's
  "Import Models" docs). The home is the path in `~/.lmstudio-home-pointer`, else
  `~/.cache/lm-studio` when it exists, else `~/.lmstudio` (lmstudio-js `findLMStudioHome`); its
  `settings.json` key `downloadsFolder` moves the models folder (read when present).
* `ollama`: Ollama's blob store: OLLAMA_MODELS, else `~/.ollama/models` and, on Linux, the
  system service's `/usr/share/ollama/.ollama/models`. Blobs are named by content,
  `blobs/sha256-<hex>` (`server/modelpath.go` `GetBlobsPath`; older builds used `sha256:<hex>`):
  exactly the sha256 a SHA256SUMS pins, so a GGUF layer is found by its hash alone.

A candidate is matched by its sha256 when the store names files by it (HF blobs, Ollama blobs),
else by its file name (and repository where the layout has one), and only ever used after its
sha256 is computed and equals the pinned one. Nothing here writes inside a store.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantpick.errors import VerificationError
from quantpick.local_files import read_small_text

HF_LAYOUT = "hf-cache"  # models--org--repo/{blobs,snapshots,refs}
FLAT = "flat"  # llama.cpp's own cache: files side by side
PUBLISHER = "publisher/repo"  # LM Studio: <publisher>/<repo>/<file>
OLLAMA = "ollama-blobs"  # blobs/sha256-<hex>

# Caps on what is read of LM Studio's own files (quantpick.local_files: regular files only, never
# read past the cap; a larger one is ignored like a missing one). The pointer holds one path:
# PATH_MAX is 4096 bytes on Linux (<linux/limits.h>), 1024 on macOS. settings.json is a flat
# object of a few dozen keys, a few KiB: 1 MiB leaves two orders of magnitude.
POINTER_MAX_BYTES = 4096
SETTINGS_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class StoreRoot:
    store: str  # "hf" | "llama" | "lmstudio" | "ollama"
    layout: str  # HF_LAYOUT | FLAT | PUBLISHER | OLLAMA
    path: Path
    origin: str  # what put it here: an environment variable, a settings file, "default", ...

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "layout": self.layout,
            "path": str(self.path),
            "origin": self.origin,
        }


def _env_path(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name, "")
    return Path(os.path.expandvars(os.path.expanduser(value))) if value else None


def hf_hub_cache(env: Mapping[str, str], home: Path) -> tuple[Path, str]:
    """huggingface_hub's cache directory and the variable that chose it (constants.py, 2.4)."""
    for name, sub in (("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""), ("HF_HOME", "hub")):
        path = _env_path(env, name)
        if path is not None:
            return (path / sub if sub else path), name
    xdg = _env_path(env, "XDG_CACHE_HOME")
    if xdg is not None:
        return xdg / "huggingface" / "hub", "XDG_CACHE_HOME"
    return home / ".cache" / "huggingface" / "hub", "default"


def hf_cache_for_writing(
    overrides: Mapping[str, tuple[Path, ...]] | None = None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Path:
    """Where --hf-cache writes: the config file's [stores] hf (first path), else the cache
    huggingface_hub itself would use."""
    if overrides and overrides.get("hf"):
        return overrides["hf"][0]
    env = os.environ if env is None else env
    return hf_hub_cache(env, home if home is not None else Path(os.path.expanduser("~")))[0]


def llama_flat_cache(env: Mapping[str, str], home: Path, platform: str) -> tuple[Path, str]:
    """llama.cpp's fs_get_cache_directory() (common/common.cpp:985-1004 at 0c1e57098)."""
    explicit = _env_path(env, "LLAMA_CACHE")
    if explicit is not None:
        return explicit, "LLAMA_CACHE"
    if platform.startswith("win"):
        local = _env_path(env, "LOCALAPPDATA") or home / "AppData" / "Local"
        return local / "llama.cpp", "default"
    if platform == "darwin":
        return home / "Library" / "Caches" / "llama.cpp", "default"
    xdg = _env_path(env, "XDG_CACHE_HOME")
    if xdg is not None:
        return xdg / "llama.cpp", "XDG_CACHE_HOME"
    return home / ".cache" / "llama.cpp", "default"


def lmstudio_models_dirs(home: Path) -> list[tuple[Path, str]]:
    """LM Studio's models folder(s): the current home's (or its downloadsFolder setting), then
    the two default homes' folders (a relocated install often leaves the old one behind)."""
    found: list[tuple[Path, str]] = []
    pointer = home / ".lmstudio-home-pointer"
    lms_home: Path | None = None
    origin = "default"
    try:
        text = read_small_text(pointer, POINTER_MAX_BYTES).strip()
        if text:
            lms_home = Path(text) if Path(text).is_absolute() else home / text
            origin = str(pointer)
    except (OSError, UnicodeDecodeError):
        pass
    if lms_home is None:
        legacy = home / ".cache" / "lm-studio"
        lms_home = legacy if legacy.is_dir() else home / ".lmstudio"
    settings = lms_home / "settings.json"
    try:
        folder = json.loads(read_small_text(settings, SETTINGS_MAX_BYTES)).get("downloadsFolder")
        if isinstance(folder, str) and folder:
            found.append((Path(folder).expanduser(), f"{settings} downloadsFolder"))
    except (OSError, ValueError, AttributeError):
        pass
    found.append((lms_home / "models", origin))
    for default in (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"):
        found.append((default, "default"))
    return found


def ollama_models_dirs(env: Mapping[str, str], home: Path, platform: str) -> list[tuple[Path, str]]:
    explicit = _env_path(env, "OLLAMA_MODELS")
    if explicit is not None:
        return [(explicit, "OLLAMA_MODELS")]
    found = [(home / ".ollama" / "models", "default")]
    if platform.startswith("linux"):
        # The install script's systemd service runs as user `ollama`, home /usr/share/ollama.
        found.append((Path("/usr/share/ollama/.ollama/models"), "default (Linux service)"))
    return found


def store_roots(
    stores: Iterable[str],
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, tuple[Path, ...]] | None = None,
    home: Path | None = None,
    platform: str | None = None,
) -> tuple[StoreRoot, ...]:
    """Where the enabled stores are, in the order given; each directory once (first store wins).

    `overrides` (the config file's [stores]) replaces a tool's own locations. Directories that do
    not exist are kept out, so the answer lists only places that can hold something.
    """
    env = os.environ if env is None else env
    home = home if home is not None else Path(os.path.expanduser("~"))
    platform = platform or sys.platform
    overrides = overrides or {}
    roots: list[StoreRoot] = []
    for store in stores:
        if store in overrides:
            layouts = {
                "hf": (HF_LAYOUT,),
                "llama": (HF_LAYOUT, FLAT),
                "lmstudio": (PUBLISHER,),
                "ollama": (OLLAMA,),
            }[store]
            roots += [
                StoreRoot(store, lay, p, "config file [stores]")
                for p in overrides[store]
                for lay in layouts
            ]
            continue
        if store == "hf":
            path, origin = hf_hub_cache(env, home)
            roots.append(StoreRoot("hf", HF_LAYOUT, path, origin))
        elif store == "llama":
            # llama.cpp -hf: the HF layout at LLAMA_CACHE, else at the HF cache itself.
            explicit = _env_path(env, "LLAMA_CACHE")
            if explicit is not None:
                roots.append(StoreRoot("llama", HF_LAYOUT, explicit, "LLAMA_CACHE"))
            else:
                path, origin = hf_hub_cache(env, home)
                roots.append(StoreRoot("llama", HF_LAYOUT, path, f"{origin} (llama.cpp -hf)"))
            path, origin = llama_flat_cache(env, home, platform)
            roots.append(StoreRoot("llama", FLAT, path, origin))
        elif store == "lmstudio":
            roots += [StoreRoot("lmstudio", PUBLISHER, p, o) for p, o in lmstudio_models_dirs(home)]
        elif store == "ollama":
            roots += [
                StoreRoot("ollama", OLLAMA, p, o)
                for p, o in ollama_models_dirs(env, home, platform)
            ]
    unique: list[StoreRoot] = []
    seen: set[tuple[str, str]] = set()
    for root in roots:
        key = (os.path.normpath(str(root.path)), root.layout)
        if key in seen or not root.path.is_dir():
            continue
        seen.add(key)
        unique.append(root)
    return tuple(unique)


def owning_store(path: Path, roots: Iterable[StoreRoot]) -> StoreRoot | None:
    """The store whose folder holds `path` (as written, or once symlinks are resolved), or None.

    A file there belongs to that tool: quantpick may read it, verify it and link it, and never
    renames, moves, truncates or deletes it, even with `--dir` pointed inside that folder.
    """
    here = Path(os.path.abspath(path))
    real = Path(os.path.realpath(here.parent)) / here.name
    for root in roots:
        base = Path(os.path.abspath(root.path))
        for candidate in (here, real):
            for folder in {base, Path(os.path.realpath(base))}:
                if candidate != folder and candidate.is_relative_to(folder):
                    return root
    return None


# ---------------------------------------------------------------------------------------------
# Candidates


@dataclass(frozen=True)
class Candidate:
    store: str
    path: Path  # the path as the store has it (a snapshot symlink, a blob, a plain file)
    match: str  # "sha256" (named by its hash) | "repo+name" | "name"
    size: int
    device: int  # st_dev of the file itself (decides hardlink vs symlink)
    inode: int


def hf_repo_folder(repo: str) -> str:
    """huggingface_hub's repo_folder_name for a model: "org/name" -> "models--org--name"."""
    return "--".join(["models", *repo.split("/")])


def _paths_for(
    root: StoreRoot, name: str, sha256: str, repos: tuple[str, ...]
) -> list[tuple[Path, str]]:
    base = name.rsplit("/", 1)[-1]
    out: list[tuple[Path, str]] = []
    if root.layout == HF_LAYOUT:
        # A blob named by the pinned sha256, in any repository (the same file re-uploaded to a
        # mirror repo is the same blob); then the snapshots of the manifest's own repositories,
        # for caches written without symlinks (files moved into snapshots/, Windows).
        try:
            with os.scandir(root.path) as entries:
                folders = sorted(e.name for e in entries if e.name.startswith("models--"))
        except OSError:
            folders = []
        out += [(root.path / f / "blobs" / sha256, "sha256") for f in folders]
        for repo in repos:
            snapshots = root.path / hf_repo_folder(repo) / "snapshots"
            try:
                with os.scandir(snapshots) as entries:
                    commits = sorted(e.name for e in entries)
            except OSError:
                continue
            out += [(snapshots / c / name, "repo+name") for c in commits]
    elif root.layout == FLAT:
        for repo in repos:
            # `-hf` of llama.cpp before the HF-layout cache: "<org>/<repo>" + "_" + file, "/"->"_"
            out.append((root.path / f"{repo}_{name}".replace("/", "_"), "repo+name"))
        out.append((root.path / base, "name"))  # `-mu URL`: the URL's last component
    elif root.layout == PUBLISHER:
        out += [(root.path / repo / name, "repo+name") for repo in repos]
        # Any publisher/repo folder holding a file of that name: LM Studio users import files
        # under names of their choosing; the hash decides.
        try:
            publishers = sorted(d for d in root.path.iterdir() if d.is_dir())
        except OSError:
            publishers = []
        for publisher in publishers:
            try:
                repo_dirs = sorted(r for r in publisher.iterdir() if r.is_dir())
            except OSError:
                continue
            out += [(folder / base, "name") for folder in repo_dirs]
    elif root.layout == OLLAMA:
        out.append((root.path / "blobs" / f"sha256-{sha256}", "sha256"))
        out.append((root.path / "blobs" / f"sha256:{sha256}", "sha256"))
    return out


def find_candidates(
    roots: Iterable[StoreRoot],
    *,
    name: str,
    sha256: str,
    size: int | None,
    repos: Iterable[str] = (),
    exclude: Iterable[Path] = (),
) -> list[Candidate]:
    """Files in the stores that may be `name`: the right size, each real file once (hardlinks
    and symlinks to one inode count once), in store order. Only stat() is called: nothing is
    read yet. `exclude` are paths that are the destination itself."""
    sha256 = sha256.lower()
    repo_list = tuple(dict.fromkeys(repos))
    skip: set[tuple[int, int]] = set()
    for path in exclude:
        try:
            st = os.stat(path)
            skip.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    found: list[Candidate] = []
    for root in roots:
        for path, match in _paths_for(root, name, sha256, repo_list):
            try:
                st = os.stat(path)  # follows symlinks: the bytes are what counts
            except (OSError, ValueError):
                continue
            if not _is_regular(st.st_mode) or (size is not None and st.st_size != size):
                continue
            key = (st.st_dev, st.st_ino)
            if key in skip:
                continue
            skip.add(key)
            found.append(Candidate(root.store, path, match, st.st_size, st.st_dev, st.st_ino))
    return found


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


# ---------------------------------------------------------------------------------------------
# The sha256 cache: a 20 GB file is hashed once, not on every run


HASH_CACHE_VERSION = 1
HASH_CACHE_MAX_ENTRIES = 512


@dataclass(frozen=True)
class FileIdentity:
    """What says a file is still the one that was hashed: the same inode, the same size, and
    unchanged mtime and ctime.

    ctime matters because mtime can be set back (`touch -d`, os.utime): a file rewritten with
    its mtime restored still gets a new ctime, which no user call can set. (A hardlink also
    moves the inode's ctime: after linking, the identity is taken again.)
    """

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def same_inode(self, st: os.stat_result) -> bool:
        """`st` is this inode with these bytes (size, mtime); ctime is not compared, for a
        second name made by a hardlink, which moves it."""
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (
            self.device,
            self.inode,
            self.size,
            self.mtime_ns,
        )


class FileChanged(VerificationError):
    """A file was replaced, repointed or written while it was hashed or before it was linked:
    its hash describes no version of what the path names now. The copy is not used (exit 4 if
    a caller lets it through)."""


@dataclass(frozen=True)
class HashedFile:
    sha256: str
    from_cache: bool
    identity: FileIdentity  # of the inode that was hashed (read through one descriptor)


class HashCache:
    """sha256 of files already hashed, keyed by (device, inode) and valid only while size,
    mtime and ctime are unchanged (FileIdentity).

    A link to the same inode (quantpick's hardlink into its directory) finds the same entry.
    An entry is only written for a file whose identity was the same before and after it was
    hashed. Stored as JSON in the cache dir; a lost or unreadable cache only costs a rehash.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        self._dirty = False
        if path is not None:
            try:
                doc = json.loads(path.read_text())
                if doc.get("version") == HASH_CACHE_VERSION and isinstance(doc["entries"], dict):
                    self._entries = doc["entries"]
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                self._entries = {}

    @staticmethod
    def _key(identity: FileIdentity) -> str:
        return f"{identity.device}:{identity.inode}"

    def get(self, identity: FileIdentity) -> str | None:
        """The sha256 hashed earlier for this inode, if it is unchanged since."""
        entry = self._entries.get(self._key(identity))
        if (
            isinstance(entry, dict)
            and entry.get("size") == identity.size
            and entry.get("mtime_ns") == identity.mtime_ns
            and entry.get("ctime_ns") == identity.ctime_ns
            and isinstance(entry.get("sha256"), str)
        ):
            return str(entry["sha256"])
        return None

    def lookup(self, path: Path) -> str | None:
        """The sha256 hashed earlier for the file `path` names now, if it has not changed."""
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None
        return self.get(FileIdentity.of(st))

    def put(self, path: Path, identity: FileIdentity, sha256: str) -> None:
        """Remember that the inode of `identity`, as it was then, has `sha256` (`path`: for a
        reader of the cache file only)."""
        key = self._key(identity)
        self._entries.pop(key, None)
        self._entries[key] = {
            "path": str(path),
            "size": identity.size,
            "mtime_ns": identity.mtime_ns,
            "ctime_ns": identity.ctime_ns,
            "sha256": sha256,
        }
        while len(self._entries) > HASH_CACHE_MAX_ENTRIES:
            self._entries.pop(next(iter(self._entries)))
        self._dirty = True

    def record(self, path: Path, sha256: str, before: FileIdentity | None = None) -> None:
        """Remember the sha256 of the file `path` names now. With `before` (the identity taken
        when hashing started), nothing is stored unless the file is still exactly that one:
        same inode, size, mtime and ctime (a change while hashing leaves no entry, never a
        wrong one)."""
        try:
            now = FileIdentity.of(os.stat(path))
        except (OSError, ValueError):
            return
        if before is not None and now != before:
            return
        self.put(path, now, sha256)

    def save(self) -> None:
        if not self._dirty or self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            from quantpick.outputs import write_atomic

            document = {"version": HASH_CACHE_VERSION, "entries": self._entries}
            write_atomic(self.path, json.dumps(document).encode(), durable=False)
            self._dirty = False
        except OSError:
            pass  # a cache: losing it costs a rehash, never a wrong answer


def hash_cache_path(cache_dir: Path) -> Path:
    return cache_dir / "sha256-cache.json"


def sha256_of(
    path: Path,
    cache: HashCache,
    *,
    on_bytes: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> HashedFile:
    """The sha256 of the file `path` names, read through one descriptor: the cached value when
    that inode is unchanged, else hashed now (`on_start(size)` first, `on_bytes(n)` per read)
    and recorded.

    Only a regular file is opened (quantpick.local_files.open_regular: a FIFO never blocks).
    fstat() before and after hashing must give the same FileIdentity, else FileChanged: a file
    written while it was read (even with its mtime put back) has no hash. The result names the
    inode that was hashed, so a caller links that one (link_into) and not whatever the path
    names by then.
    """
    from quantpick.hub.verify import hash_open_file
    from quantpick.local_files import open_regular

    fd = open_regular(path)
    try:
        before = FileIdentity.of(os.fstat(fd))
        cached = cache.get(before)
        if cached is not None:
            return HashedFile(cached, True, before)
        if on_start is not None:
            on_start(before.size)
        value = hash_open_file(fd, on_bytes=on_bytes)
        after = FileIdentity.of(os.fstat(fd))
    finally:
        os.close(fd)
    if after != before:
        raise FileChanged(f"{path} changed while it was hashed")
    cache.put(path, before, value)
    return HashedFile(value, False, before)


# ---------------------------------------------------------------------------------------------
# Using a verified file


LINK_WHY = {
    "hardlink": "same filesystem: a second name for the same bytes, no extra space; it stays "
    "valid if the other tool deletes its copy",
    "symlink": "another filesystem (or the store refuses hardlinks): a pointer to the "
    "store's file, no extra space; it breaks if the other tool deletes its copy",
    "in-place": "no link can be made in the destination: the command uses the store's path",
}


def _existing_parent(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def predict_link(candidate: Candidate, dest: Path) -> str:
    """What link_into would most likely do (for a dry run, which writes nothing)."""
    try:
        same = os.stat(_existing_parent(dest.parent)).st_dev == candidate.device
    except OSError:
        same = False
    return "hardlink" if same else "symlink"


@dataclass(frozen=True)
class Linked:
    action: str  # "hardlink" | "symlink" | "in-place"
    why: str
    # The linked inode as `dest` names it now (a hardlink moves its ctime); None for in-place.
    identity: FileIdentity | None


def link_into(source: Path, dest: Path, hashed: FileIdentity) -> Linked:
    """Give `dest` the bytes of `source` without copying: a hardlink when the filesystem allows
    it, else a symlink to the real file; "in-place" means neither could be made, nothing was
    written, and the command uses `source` itself. `source` is only read (link creation never
    changes the linked file's bytes, owner or mode). An existing `dest` is replaced atomically.

    `hashed` is the identity of the inode whose sha256 was checked (sha256_of). The path is
    resolved again here, so it is checked again: before linking, `source` must still name that
    inode, unchanged (ctime included); after linking, the new name must be that inode with the
    same size and mtime (a rename over `source` or a repointed symlink in between is caught
    here). Otherwise the temporary link is removed and FileChanged raised: what would be linked
    is not what was verified.
    """
    real = Path(os.path.realpath(source))
    _check_unchanged(real, hashed, source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.quantpick-link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(real, tmp)
        action, why = "hardlink", LINK_WHY["hardlink"]
    except OSError as exc:
        reason = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        try:
            os.symlink(real, tmp)
        except OSError as exc2:
            reason2 = errno.errorcode.get(exc2.errno or 0, str(exc2.errno))
            _check_unchanged(real, hashed, source)  # the command will name `source` itself
            return Linked(
                "in-place",
                f"{LINK_WHY['in-place']} (hardlink: {reason}, symlink: {reason2})",
                None,
            )
        why = LINK_WHY["symlink"]
        if exc.errno != errno.EXDEV:
            why += f" (hardlink refused: {reason})"
        action = "symlink"
    try:
        st = os.stat(tmp)  # through the symlink: the file the new name reaches
        linked = hashed.same_inode(st) and (action == "hardlink" or FileIdentity.of(st) == hashed)
        if not linked:
            raise FileChanged(f"{source} was replaced or repointed after it was hashed; not linked")
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    st = os.stat(dest)  # the rename moved the inode's ctime once more: the identity from now on
    if not hashed.same_inode(st):
        dest.unlink(missing_ok=True)  # quantpick's own name, just made
        raise FileChanged(f"{dest} was replaced right after it was linked; removed")
    return Linked(action, why, FileIdentity.of(st))


def _check_unchanged(real: Path, hashed: FileIdentity, source: Path) -> None:
    try:
        now = FileIdentity.of(os.stat(real))
    except OSError:
        now = None
    if now != hashed:
        raise FileChanged(f"{source} was replaced or written after it was hashed; not used")


def is_link(path: Path) -> bool:
    """A symlink, or a file with other names (a hardlink): its bytes may belong to another tool,
    so quantpick never writes into it (it drops its own name instead)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISLNK(st.st_mode) or st.st_nlink > 1
