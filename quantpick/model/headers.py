"""The planner's ModelLayout for a manifest quant: exact from a GGUF header (on-disk cache, then a
remote range read), else synthesized from the manifest's architecture block and the file size.

Edge module (disk + network). Cache: Settings.cache_dir / "headers" / <key>.json, where <key> is
"sha256-<hex>" of the (first shard's) file when known -- the same bytes always have the same
header -- and otherwise "<kind>-<digest of repo@revision/name>" for a revision-pinned hub source.
A header is only cached under keys that identify immutable content, so a cache hit is never stale.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.errors import GGUFError, QuantpickError, UsageError
from quantpick.hub.kinds import KINDS, is_repository
from quantpick.model.layout import ModelLayout, NoTensorTable, can_synthesize, synthesize_layout
from quantpick.units import GiB

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.hub.base import RepoSource
    from quantpick.hub.http import RetryPolicy
    from quantpick.model.gguf import GGUFHeader
    from quantpick.model.manifest import Manifest, ModelFile

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,100}$")
# Later shards carry only split keys + their tensor infos: a small first window suffices.
SHARD_WINDOW = 256 * 1024


def header_cache_dir(settings: Settings) -> Path:
    return settings.cache_dir / "headers"


def sha256_key(sha256: str) -> str:
    return f"sha256-{sha256.lower()}"


def source_key(kind: str, repo: str, revision: str, name: str) -> str:
    digest = hashlib.sha256(f"{kind}:{repo}@{revision}/{name}".encode()).hexdigest()[:40]
    return f"{kind}-{digest}"


def cache_keys_for(
    kind: str, repo: str, revision: str | None, name: str, sha256: str | None
) -> list[str]:
    """Keys for one file of a hub repository (most specific first): its sha256, and the
    revision when it is pinned (a commit)."""
    keys = [sha256_key(sha256)] if sha256 else []
    if revision and pinned_revision(kind, revision):
        keys.append(source_key(kind, repo, revision, name))
    return keys


def cache_keys(manifest: Manifest, files: tuple[ModelFile, ...]) -> list[str]:
    """Keys that may hold this quant's header (its first file's), most specific first."""
    return file_cache_keys(manifest, files[0])


def file_cache_keys(manifest: Manifest, file: ModelFile) -> list[str]:
    """Keys that may hold one file's header: its sha256, then each pinned repository source."""
    keys = [sha256_key(file.sha256)] if file.sha256 else []
    for source in manifest.sources:
        if (
            is_repository(source.kind)
            and source.repo
            and pinned_revision(source.kind, source.revision)
        ):
            assert source.revision is not None
            keys.append(source_key(source.kind, source.repo, source.revision, file.name))
    return keys


def pinned_revision(kind: str, revision: str | None) -> bool:
    """Whether `revision` names immutable content: a commit, or a ModelScope tag (not a branch).

    HF revisions in manifests are commits; ModelScope manifests pin tags or commits, but "master"
    moves (ModelScope listings always carry the sha256, which is the preferred key anyway).
    """
    found = KINDS.get(kind)
    return found.pinned(revision) if found is not None else bool(_COMMIT_RE.match(revision or ""))


def cached_header_path(settings: Settings, key: str) -> Path | None:
    """Where the header cache keeps `key`'s header (None: not a key it keeps)."""
    return header_cache_dir(settings) / f"{key}.json" if _KEY_RE.match(key) else None


def load_cached_header(settings: Settings, key: str) -> GGUFHeader | None:
    path = cached_header_path(settings, key)
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        # imported on a hit: a plan from synthesized tables never loads the GGUF reader
        from quantpick.model.gguf import header_from_json

        return header_from_json(doc)
    except (OSError, ValueError, GGUFError):
        return None  # missing or damaged: a miss (the next remote read rewrites it)


def store_cached_header(settings: Settings, keys: list[str], header: GGUFHeader) -> None:
    """Write the header under every key, atomically; best effort."""
    from quantpick.model.gguf import header_to_json

    text = json.dumps(header_to_json(header), separators=(",", ":"))
    _store_under_keys(header_cache_dir(settings), keys, ".json", text.encode("utf-8"))


def _store_under_keys(directory: Path, keys: list[str], suffix: str, data: bytes) -> None:
    """`data` as directory/<key><suffix> for every valid key (temp file + rename, not fsynced:
    a cache entry lost in a crash is only a miss). A read-only cache must not break planning."""
    from quantpick.outputs import write_atomic

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    for key in dict.fromkeys(keys):
        if _KEY_RE.match(key):
            try:
                write_atomic(directory / f"{key}{suffix}", data, durable=False)
            except OSError:
                continue


def read_remote_header(
    source: RepoSource, names: list[str], *, policy: RetryPolicy | None = None
) -> tuple[GGUFHeader, str]:
    """Every shard's header through one RepoSource (its URLs, auth and redirects), merged.
    `policy`: the retries of these reads (default: the source's).

    Returns (header, url of the first shard).
    """
    from quantpick.errors import redacted
    from quantpick.model.gguf import merge_split_headers
    from quantpick.model.gguf_remote import INITIAL_WINDOW, read_gguf_url

    headers = []
    first_url = ""
    for i, name in enumerate(names):
        remote = source.resolve(name)
        if i == 0:
            first_url = remote.url
        headers.append(
            read_gguf_url(
                remote.url,
                headers_for=source.request_headers,
                initial_window=INITIAL_WINDOW if i == 0 else SHARD_WINDOW,
                policy=policy or source.policy,
            )
        )
    # the URL is shown (a plan's basis, --json): never with a password from HF_ENDPOINT
    return merge_split_headers(headers), redacted(first_url)


def layout_for(
    manifest: Manifest,
    quant: str,
    *,
    settings: Settings,
    network: bool,
    require_exact: bool,
    policy: RetryPolicy | None = None,
) -> ModelLayout:
    """The layout of one quant of `manifest`.

    Order: the header cache (no network); then, when `network`, a remote header read from each
    source in manifest order (cached on success); else `synthesize_layout`. With `require_exact`
    an exact header is mandatory: GGUFError says why none could be had.
    Basis: "gguf-cache:<key>", "gguf-remote:<url>" or "synthesized: ...".
    """
    files = manifest.quant_files(quant)
    if not files:
        raise UsageError(
            f"{manifest.id} has no quant {quant!r}", hint="available: " + ", ".join(manifest.quants)
        )
    file_bytes = sum(f.size_bytes for f in files)
    quant_name = files[0].quant
    names = [f.name for f in files]
    keys = cache_keys(manifest, files)
    problems: list[str] = []

    for key in keys:
        header = load_cached_header(settings, key)
        if header is None:
            continue
        from quantpick.model.gguf import layout_from_header

        try:
            return layout_from_header(
                header, basis=f"gguf-cache:{key}", file_bytes=file_bytes, quant=quant_name
            )
        except GGUFError as exc:
            problems.append(f"cached header {key}: {exc.message}")

    if network:
        from quantpick.hub.sources import open_source
        from quantpick.model.gguf import layout_from_header

        for source in manifest.sources:
            label = source.repo or source.name or source.kind
            try:
                repo = open_source(source, settings=settings, policy=policy)
                remote_first = repo.resolve(names[0])
                pinned, listed = files[0].sha256, remote_first.sha256
                if pinned and listed and listed != pinned:
                    problems.append(
                        f"{label}: {names[0]} has sha256 {listed[:12]}..., the manifest "
                        f"pins {pinned[:12]}..."
                    )
                    continue
                header, url = read_remote_header(repo, names)
                layout = layout_from_header(
                    header, basis=f"gguf-remote:{url}", file_bytes=file_bytes, quant=quant_name
                )
            except QuantpickError as exc:
                problems.append(f"{label}: {exc.message}")
                continue
            store = list(keys)
            if remote_first.sha256:
                store.insert(0, sha256_key(remote_first.sha256))
            store_cached_header(settings, store, header)
            return layout
    elif require_exact:
        problems.append("the header is not cached and network access is off")

    reason = "; ".join(problems) or "no source to read the header from"
    if require_exact:
        raise GGUFError(
            f"no exact GGUF header for {manifest.id} {quant_name}: {reason}",
            hint="allow network access once (the header is then cached), or drop --exact",
        )
    try:
        layout = synthesize_layout(manifest.architecture, quant_name, file_bytes)
    except NoTensorTable as exc:
        raise GGUFError(
            f"no GGUF header for {manifest.id} {quant_name} ({reason}), and {exc}",
            hint="allow network access once (the header is then cached)",
        ) from None
    if problems:
        layout = replace(layout, basis=f"{layout.basis} (exact header unavailable: {reason})")
    return layout


# A header whose weights differ from the manifest's size by more than this factor is not the file
# the manifest describes (a GGUF is its tensors plus a header of 0.1-12 MB; a size written by
# hand or from a model card rounds to a few percent, not a factor of 1.25).
SIZE_CONTRADICTION = 1.25


def manifest_contradictions(manifest: Manifest, quant: str, layout: ModelLayout) -> list[str]:
    """One line per fact of the exact header (`layout`) that the manifest contradicts: the block
    count, or weights far from the manifest's size (a hub that now serves another file under
    that name, or a manifest written for another model). Pure."""
    if not layout.exact:
        return []
    out = []
    files = manifest.quant_files(quant)
    want = manifest.architecture.block_count
    got = layout.architecture.block_count
    if got != want:
        out.append(
            f"{manifest.id} {quant}: the hub's GGUF header has {got} blocks, the manifest "
            f"{want}; planned on the header"
        )
    size = sum(f.size_bytes for f in files)
    weights = sum(t.n_bytes for t in layout.tensors)
    if (
        size > 0
        and weights > 0
        and not 1 / SIZE_CONTRADICTION <= weights / size <= (SIZE_CONTRADICTION)
    ):
        out.append(
            f"{manifest.id} {quant}: the hub's GGUF header holds {weights / GiB:.2f} GiB of "
            f"weights, the manifest says the file is {size / GiB:.2f} GiB; planned on the header"
        )
    return out


def header_summary(header: GGUFHeader) -> dict[str, Any]:
    """JSON-ready facts about a header read (for --json outputs and reports)."""
    return {
        "source": header.source,
        "version": header.version,
        "tensors": len(header.tensors),
        "data_offset": header.data_offset,
        "stats": dict(header.stats),
    }


class LayoutSource:
    """quant -> ModelLayout for the planner, memoised.

    Candidates are planned from the header cache or the manifest's synthesized table; with
    --exact every candidate's header is required (read over the network when not cached). Without
    --exact, the chosen quant's header is read once over the network (then cached) and the plan
    is redone on it, so the answer rests on the exact table whenever it can be had.
    """

    def __init__(
        self,
        manifest: Manifest,
        *,
        exact: bool,
        network: bool,
        settings: Settings | None = None,
        local_copy: Callable[[str], Path | None] | None = None,
    ) -> None:
        from quantpick.config import load_settings

        self.settings = settings or load_settings()
        self.manifest = manifest
        self.exact = exact
        self.network = network and not self.settings.offline
        # A quant's verified file already on disk (where `get` keeps the files), or None: it is
        # upgraded from its own header, with no hub. The caller (jobs/plan.py) knows the stores.
        self.local_copy = local_copy
        self._cache: dict[str, ModelLayout] = {}
        self._deferred: set[str] = set()
        self.problems: list[str] = []

    def layouts(self, quants: tuple[str, ...] | None = None) -> PlanLayouts:
        """Every quant's layout the planner may weigh (all of the manifest's by default), from
        the cache or synthesized; a quant with neither (an architecture whose family cannot list
        its tensors, header not cached) is left out, with its reason in `problems`.
        A synthesized layout is built when the planner first reads it: a pick weighs a few of a
        manifest's quants (the policy skips the tiers below the best that fits)."""
        found: list[str] = []
        for quant in quants if quants is not None else self.manifest.quants:
            try:
                self._find(quant)
                found.append(quant)
            except GGUFError as exc:
                if self.exact:
                    raise
                if exc.message not in self.problems:
                    self.problems.append(exc.message)
        return PlanLayouts(self, tuple(found))

    def _find(self, quant: str) -> None:
        """`quant`'s layout into the cache, unless all it can be is a synthesized one (no
        header to read: not --exact, none cached, a family that lists its tensors): that one is
        left to build when first read, with the same outcome (`layout_for` then finds nothing
        else either)."""
        if quant in self._cache or quant in self._deferred:
            return
        files = self.manifest.quant_files(quant)
        if (
            files
            and not self.exact
            and can_synthesize(self.manifest.architecture)
            and not any(
                path is not None and path.exists()
                for path in (
                    cached_header_path(self.settings, key)
                    for key in cache_keys(self.manifest, files)
                )
            )
        ):
            self._deferred.add(quant)
            return
        self._cache[quant] = self._layout(quant)

    def _layout(self, quant: str) -> ModelLayout:
        return layout_for(
            self.manifest,
            quant,
            settings=self.settings,
            network=self.network and self.exact,
            require_exact=self.exact,
        )

    def __call__(self, quant: str) -> ModelLayout:
        if quant not in self._cache:
            self._find(quant)
            if quant in self._deferred:
                self._cache[quant] = self._layout(quant)
                self._deferred.discard(quant)
        return self._cache[quant]

    def upgrade(self, quant: str) -> bool:
        """Replace quant's synthesized layout by the exact header when it can be fetched."""
        from quantpick.errors import GGUFError

        if self(quant).exact:
            return False
        if self.local_copy is not None:
            from quantpick.model.local import local_layout

            path = self.local_copy(quant)
            if path is not None:
                try:
                    self._cache[quant] = local_layout(path, quant)
                    return True
                except QuantpickError:
                    pass  # unreadable after all: the hub, as for any other quant
        if not self.network:
            return False
        # imported here, not above: an offline plan never loads the HTTP stack
        from quantpick.hub.http import (
            PLANNING_DEADLINE,
            DeadlineExceeded,
            call_within,
            planning_policy,
        )

        try:
            # Optional: never minutes of retries, nor more than PLANNING_DEADLINE s in all.
            layout = call_within(
                PLANNING_DEADLINE,
                f"the exact {quant} header",
                lambda: layout_for(
                    self.manifest,
                    quant,
                    settings=self.settings,
                    network=True,
                    require_exact=True,
                    policy=planning_policy(),
                ),
            )
        except (GGUFError, DeadlineExceeded) as exc:
            self.problems.append(exc.message)
            # One failed round per run: the other quants' headers sit on the same hubs.
            self.network = False
            return False
        self._cache[quant] = layout
        return True


class PlanLayouts(Mapping[str, ModelLayout]):
    """The quants a LayoutSource can give the planner, each layout built on first read (and an
    upgraded one, LayoutSource.upgrade, read from then on)."""

    def __init__(self, source: LayoutSource, quants: tuple[str, ...]) -> None:
        self._source = source
        self._quants = quants

    def __getitem__(self, quant: str) -> ModelLayout:
        if quant not in self._quants:
            raise KeyError(quant)
        return self._source(quant)

    def __contains__(self, quant: object) -> bool:
        return quant in self._quants

    def __iter__(self) -> Iterator[str]:
        return iter(self._quants)

    def __len__(self) -> int:
        return len(self._quants)


# ----------------------------------------------------------------------------------------------
# The raw header bytes (llama.cpp's dry run on a stand-in: serve/standin.py)

# A real header is 0.1-12 MB (a 248k-token vocabulary: ~11 MB); gzip keeps 30-40% of it.
RAW_HEADER_MAX_BYTES = 64 * 1024 * 1024  # gguf.MAX_HEADER_BYTES: nothing larger is parsed


def raw_header_dir(settings: Settings) -> Path:
    return settings.cache_dir / "headers-raw"


def load_raw_header(settings: Settings, key: str) -> bytes | None:
    import gzip

    if not _KEY_RE.match(key):
        return None
    path = raw_header_dir(settings) / f"{key}.gguf.gz"
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read(RAW_HEADER_MAX_BYTES + 1)
    except (OSError, EOFError):
        return None
    return data if 0 < len(data) <= RAW_HEADER_MAX_BYTES and data[:4] == b"GGUF" else None


def store_raw_header(settings: Settings, keys: list[str], data: bytes) -> None:
    """Atomic, best effort (a read-only cache only costs the next dry run a range read)."""
    import gzip

    packed = gzip.compress(data, compresslevel=6)
    _store_under_keys(raw_header_dir(settings), keys, ".gguf.gz", packed)


def raw_headers(
    manifest: Manifest, quant: str, *, settings: Settings, network: bool
) -> list[tuple[str, bytes, int]]:
    """(file name, its first data_offset bytes, its size) for every shard of `quant`: what a
    sparse stand-in of the file needs. From the raw header cache, else read by range requests
    from the manifest's hub sources (and cached). GGUFError when neither can be had."""
    files = manifest.quant_files(quant)
    if not files:
        raise UsageError(f"{manifest.id} has no quant {quant!r}")
    out: list[tuple[str, bytes, int]] = []
    problems: list[str] = []
    for f in files:
        keys = file_cache_keys(manifest, f)
        data = next((d for d in (load_raw_header(settings, k) for k in keys) if d), None)
        if data is None and network and not settings.offline:
            data = _read_raw(manifest, f.name, settings, problems)
            if data is not None:
                store_raw_header(settings, keys, data)
        if data is None:
            why = "; ".join(problems) or "not cached and network access is off"
            raise GGUFError(f"no header bytes for {f.name}: {why}")
        out.append((f.name, data, f.size_bytes))
    return out


def _read_raw(
    manifest: Manifest, name: str, settings: Settings, problems: list[str]
) -> bytes | None:
    from quantpick.hub.http import planning_policy
    from quantpick.hub.sources import open_source
    from quantpick.model.gguf_remote import read_gguf_url

    for source in manifest.sources:
        if not is_repository(source.kind):
            continue
        label = source.repo or source.kind
        try:
            repo = open_source(source, settings=settings, policy=planning_policy())
            remote = repo.resolve(name)
            raw = bytearray()
            read_gguf_url(remote.url, headers_for=repo.request_headers, policy=repo.policy, raw=raw)
            return bytes(raw)
        except QuantpickError as exc:
            problems.append(f"{label}: {exc.message}")
    return None
