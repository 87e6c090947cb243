"""Any GGUF repository as a model, with no manifest written: `quantpick pick OWNER/REPO`.

The repository is listed at a revision pinned to its commit, its GGUF files grouped into quants
(split parts together, `mmproj-*` set aside for --vision, files without a quant tag named by
their header's general.file_type), and every quant's header read by range requests
(from_repo.HEADER_READERS at a time) and cached by commit and file; the result is the same
Manifest `manifest add` would write, kept in the cache (settings.cache_dir / "repos") instead of
the user's manifest directory. Planning then finds every quant's exact header in the header
cache: the plan rests on the files themselves, and `get` downloads what was planned (the
manifest pins the commit).

Offline (--offline, QUANTPICK_OFFLINE, HF_HUB_OFFLINE): a repository described before is used
from the cache; one never seen is a one-line error. Online, a revision that is a commit is used
from the cache as it is (immutable); a branch is listed again (it may have moved), and headers
already read for its commit cost nothing. Edge module (network, disk).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from quantpick.errors import ManifestError, UnknownModelError
from quantpick.hub.kinds import KINDS

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.model.manifest import Manifest
    from quantpick.model.repo_ref import RepoRef
    from quantpick.model.speculative import DraftModel

ORIGIN_CACHED = "cached repository"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# `ms:owner/name` or `modelscope:owner/name` names a ModelScope repository (a bare owner/name is
# Hugging Face's, as llama.cpp's -hf reads it).
_PREFIXES = {prefix: k.name for k in KINDS.values() for prefix in k.prefixes}

Progress = Callable[[int, int], None]
# A repository's notes (files left out, a name its header contradicts), kept beside its cached
# manifest and said again on every use: a few lines; more than this is not ours.
MAX_NOTES_BYTES = 256 * 1024


def repo_cache_dir(settings: Settings) -> Path:
    return settings.cache_dir / "repos"


def split_kind(model: str) -> tuple[str | None, str]:
    """("modelscope", "owner/name") for "ms:owner/name"; (None, model) without a prefix."""
    for prefix, kind in _PREFIXES.items():
        if model.lower().startswith(prefix):
            return kind, model[len(prefix) :]
    return None, model


def is_repo_name(model: str) -> bool:
    """Whether `model` could name a hub repository (owner/name, a prefix, or a hub URL)."""
    from quantpick.model.repo_ref import looks_like_url

    _kind, rest = split_kind(model.strip())
    return looks_like_url(rest) or re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", rest) is not None


def _cache_path(
    settings: Settings, kind: str, repo: str, revision: str | None, named: tuple[str, ...] = ()
) -> Path:
    key = f"{kind}:{repo.lower()}@{revision or ''}" + "".join(f"#{n}" for n in named)
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return repo_cache_dir(settings) / f"{kind}-{digest}.toml"


def _load(path: Path) -> Manifest | None:
    from quantpick.model.registry import load_manifest_file

    if not path.is_file():
        return None
    try:
        return load_manifest_file(path, origin=ORIGIN_CACHED)
    except ManifestError:
        return None  # damaged: described again


def _notes_path(path: Path) -> Path:
    return path.with_suffix(".notes.json")


def _load_notes(path: Path) -> list[str]:
    import json

    from quantpick.local_files import read_small

    try:
        notes = json.loads(read_small(_notes_path(path), MAX_NOTES_BYTES))
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(notes, list):
        return []
    return [n for n in notes if isinstance(n, str)]


def _store(path: Path, text: str) -> None:
    """Atomic, best effort: a cache that cannot be written costs the next run a listing."""
    from quantpick.outputs import write_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode("utf-8"), durable=False)  # never through a link
    except OSError:
        return


def repo_manifest(
    model: str,
    *,
    settings: Settings,
    network: bool,
    progress: Progress | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Manifest:
    """The Manifest of the repository `model` names (see the module docstring). Raises
    UnknownModelError when offline and never described, and the hub's errors (exit 5) when it
    cannot be listed. `on_note` hears the repository's notes (files left out and why, a name
    its header contradicts), from the cache too."""
    from quantpick.model.from_repo import build_manifest
    from quantpick.model.gguf_names import parse_gguf_name
    from quantpick.model.repo_ref import looks_like_url, parse_repo_ref

    kind_prefix, rest = split_kind(model.strip())
    ref: RepoRef = parse_repo_ref(rest)
    named: tuple[str, ...] = ()
    parsed = parse_gguf_name(ref.path) if ref.path is not None else None
    if parsed is not None and parsed.quant is None:
        named = (ref.path or "",)  # an untagged GGUF: read its header first (from_repo's cap)
    elif looks_like_url(rest) and ref.path is not None:
        from quantpick.errors import UsageError

        raise UsageError(
            f"{model} names one file ({ref.path}) of {ref.repo}",
            hint=f"give the repository and the quant: {ref.repo} --quant Q",
        )
    kind = kind_prefix or ref.kind or "hf"
    revision = ref.revision
    path = _cache_path(settings, kind, ref.repo, revision, named)
    cached = _load(path)
    offline = not network or settings.offline
    if cached is not None and (offline or (revision is not None and _COMMIT.match(revision))):
        if on_note is not None:
            for note in _load_notes(path):
                on_note(note)
        return cached
    if offline:
        raise UnknownModelError(
            f"{ref.repo} is not described here and planning is offline: its listing and headers "
            "are not cached",
            hint=f"run once with the network (quantpick pick {model} ...), or "
            f"`quantpick manifest add {model}`",
        )
    new = build_manifest(
        ref.repo, kind=kind, revision=revision, manifest_id=None, settings=settings,
        all_headers=True, on_header=progress, named=named,
    )  # fmt: skip
    import json

    from quantpick.process import printable

    notes = [printable(w) for w in new.warnings]  # file names from a listing: no escapes
    _store(_notes_path(path), json.dumps(notes))
    _store(path, new.toml)
    if on_note is not None:
        for note in notes:
            on_note(note)
    loaded = _load(path)
    if loaded is not None:
        return loaded
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib

    from quantpick.model.manifest import parse_manifest

    return parse_manifest(tomllib.loads(new.toml), f"<{ref.repo}>")


def cached_repos(settings: Settings) -> list[Manifest]:
    """Every repository described before (`quantpick models` lists them)."""
    out = []
    try:
        paths = sorted(repo_cache_dir(settings).glob("*.toml"))
    except OSError:
        return []
    for path in paths:
        manifest = _load(path)
        if manifest is not None:
            out.append(manifest)
    return out


# A draft's quant where `--draft OWNER/REPO` names none: the first of these the repository has
# (a draft's cost is its bytes, its value its acceptance: llama.cpp's own --fim-qwen-*-spec
# presets draft with Q8_0, common/arg.cpp), else the repository's best-ranked quant.
DRAFT_QUANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")


def hub_draft(ref: str, *, settings: Settings, network: bool) -> DraftModel:
    """A draft model on a hub (`--draft OWNER/REPO[:QUANT]`): the repository listed and the
    quant's exact header read (cached) as for MODEL; its vocabulary from the header's tokenizer
    keys (the token texts are not read remotely, so llama.cpp's text comparison is left to it).
    llama-server fetches it itself (`-hfd OWNER/REPO:QUANT`)."""
    from quantpick.errors import UsageError
    from quantpick.model.headers import LayoutSource
    from quantpick.model.speculative import DraftModel, vocabulary_of

    name, tag = ref, ""
    head, sep, tail = ref.rpartition(":")
    if sep and "/" not in tail and "/" in head:  # OWNER/REPO:QUANT (not ms:OWNER/REPO, a URL)
        name, tag = head, tail
    manifest = repo_manifest(name, settings=settings, network=network)
    if any(s.kind != "hf" for s in manifest.sources[:1]):
        raise UsageError(
            f"--draft {ref}: llama-server fetches a draft from Hugging Face only (-hfd)",
            hint="download it and give its path",
        )
    quants = {q.upper(): q for q in manifest.quants}
    if tag:
        quant = quants.get(tag.upper())
        if quant is None:
            raise UsageError(
                f"--draft {ref}: no quant {tag} in {name}",
                hint="use one of " + ", ".join(manifest.quants),
            )
    else:
        quant = next((quants[q] for q in DRAFT_QUANTS if q in quants), manifest.quants[0])
    layout = LayoutSource(manifest, exact=True, network=network, settings=settings)(quant)
    repo = next((s.repo for s in manifest.sources if s.repo), name)
    label = f"{repo}:{quant}"
    vocab = vocabulary_of(layout.metadata, layout.architecture.vocab_size)
    return DraftModel(layout, vocab, label, label, hub=True)
