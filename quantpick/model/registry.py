"""The known manifests: bundled with quantpick, the user's (config dir), QUANTPICK_MANIFESTS; read
from TOML files and found by id, alias or repository.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from quantpick.errors import ManifestError, UnknownModelError, UsageError
from quantpick.model.manifest import (
    MANIFEST_HINT,
    ORIGIN_BUNDLED,
    ORIGIN_ENV,
    ORIGIN_USER,
    Manifest,
    parse_manifest,
)

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.model.repo_ref import RepoRef


def load_manifest_file(path: Path, *, origin: str | None = None) -> Manifest:
    """Parse and validate one manifest file; ManifestError names the file and the field. Read
    as config files are: a regular file of at most MAX_MANIFEST_BYTES, nested at most
    config.MAX_NESTING levels (a 20,000-deep one is one error, not a RecursionError)."""
    from quantpick.config import load_toml_text, read_bounded_text
    from quantpick.model.manifest import MAX_MANIFEST_BYTES

    label = str(path)
    try:
        text = read_bounded_text(Path(path), MAX_MANIFEST_BYTES)
    except OSError as exc:
        raise ManifestError(f"{label}: cannot read: {exc.strerror or exc}", path=label) from None
    except UnicodeDecodeError:
        raise ManifestError(f"{label}: not UTF-8 text", hint=MANIFEST_HINT, path=label) from None
    try:
        data = load_toml_text(text)
    except ValueError as exc:
        raise ManifestError(
            f"{label}: invalid TOML: {exc}", hint=MANIFEST_HINT, path=label
        ) from None
    manifest = parse_manifest(data, label)
    if origin is not None:
        from dataclasses import replace

        manifest = replace(manifest, origin=origin)
    return manifest


def bundled_manifest_dir() -> Path:
    """The shipped manifests: `quantpick/_manifests` in a wheel, else `<repo>/manifests`."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "_manifests"
    if packaged.is_dir():
        return packaged
    return package.parent / "manifests"


def manifest_dirs(settings: Settings | None = None) -> list[tuple[str, Path]]:
    """(origin, directory) in precedence order, lowest first: bundled, user, QUANTPICK_MANIFESTS."""
    if settings is None:
        from quantpick.config import load_settings

        settings = load_settings()
    dirs = [(ORIGIN_BUNDLED, bundled_manifest_dir()), (ORIGIN_USER, settings.user_manifest_dir)]
    dirs += [(ORIGIN_ENV, d) for d in settings.extra_manifest_dirs]
    return dirs


def _manifest_paths(origin: str, where: Path) -> list[Path]:
    if origin == ORIGIN_ENV:
        if where.is_file():  # QUANTPICK_MANIFESTS may name single files too
            return [where]
        if not where.is_dir():
            raise ManifestError(
                f"QUANTPICK_MANIFESTS: {where}: no such directory",
                hint="QUANTPICK_MANIFESTS lists manifest directories or .toml files, "
                "separated by the path separator",
            )
    elif not where.is_dir():
        return []
    return sorted(where.glob("*.toml"))


def list_manifests(
    settings: Settings | None = None, *, errors: list[ManifestError] | None = None
) -> list[Manifest]:
    """Every manifest, sorted by id: bundled, then the user's, then QUANTPICK_MANIFESTS'.

    A later directory's manifest replaces an earlier one with the same id (silently: that is how
    users override a bundled manifest). A file that does not validate raises ManifestError, unless
    `errors` is given: then it is appended there and the others are still returned.
    """
    found: dict[str, Manifest] = {}
    for origin, where in manifest_dirs(settings):
        in_this_dir: dict[str, str] = {}
        try:
            paths = _manifest_paths(origin, where)
        except ManifestError as exc:
            if errors is None:
                raise
            errors.append(exc)
            continue
        for path in paths:
            try:
                manifest = load_manifest_file(path, origin=origin)
                if manifest.id in in_this_dir:
                    raise ManifestError(
                        f"{path}: id: {manifest.id!r} is also the id of {in_this_dir[manifest.id]}",
                        hint="ids must be unique within one directory; rename or remove one",
                    )
            except ManifestError as exc:
                if errors is None:
                    raise
                exc.path = exc.path or str(path)
                errors.append(exc)
                continue
            in_this_dir[manifest.id] = str(path)
            found[manifest.id] = manifest
    return sorted(found.values(), key=lambda m: m.id)


def _check_url_fits(ref: RepoRef, manifest: Manifest) -> None:
    """A pasted URL that names a revision other than the manifest's, or one file of it, is one
    line saying what to write instead (the MODEL argument names a repository, the quant
    comes from --quant)."""
    pinned = {s.revision for s in manifest.sources if s.repo and s.repo.lower() == ref.repo.lower()}
    if ref.revision is not None and ref.revision not in {*pinned, "main", "master"}:
        raise UsageError(
            f"{ref.url} names revision {ref.revision}; manifest {manifest.id} pins "
            f"{', '.join(sorted(r for r in pinned if r)) or 'its own'}",
            hint=f"`quantpick manifest add {ref.url}` describes that revision",
        )
    if ref.path is not None:
        quants = sorted({f.quant for f in manifest.files if f.name == ref.path})
        quant = f" --quant {quants[0]}" if quants else " --quant Q"
        raise UsageError(
            f"{ref.url} names one file ({ref.path}) of {manifest.id}",
            hint=f"give the model and the quant: {manifest.id}{quant}",
        )


def _names(error: ManifestError, want: str) -> bool:
    """Whether the manifest file that failed to load is the one `want` names: its file name
    (`<id>.toml`, as `manifest add` writes it) or an `id = "..."` line in its first 64 KiB."""
    if error.path is None:
        return False
    path = Path(error.path)
    if path.stem.lower() == want:
        return True
    from quantpick.local_files import read_small

    try:
        head = read_small(path, 4 * 1024**2)[: 64 * 1024].decode("utf-8", "replace")
    except OSError:
        return False
    found = re.search(r"""(?m)^\s*id\s*=\s*["']([^"'\n]+)["']""", head)
    return found is not None and found.group(1).strip().lower() == want


def find_manifest(
    model: str,
    settings: Settings | None = None,
    *,
    on_note: Callable[[str], None] | None = None,
) -> Manifest:
    """A manifest by id (case-insensitive), alias, or the repo id of an hf/modelscope source,
    also pasted as the repository's URL (model.repo_ref: /tree/main, a ModelScope page, ...).

    A manifest file that does not load is skipped (`on_note` hears which and why) unless it is
    the one `model` names: then its error is raised."""
    from quantpick.model.repo_ref import looks_like_url, parse_repo_ref

    errors: list[ManifestError] = []
    manifests = list_manifests(settings, errors=errors)
    ref = parse_repo_ref(model) if looks_like_url(model) else None
    want = ref.repo.lower() if ref is not None else model.strip().lower().strip("/")
    for error in errors:
        if _names(error, want):
            raise error
    if on_note is not None:
        for error in errors:
            on_note(f"skipped a manifest that does not load: {error.message}")
    for m in manifests:
        if m.id == want:
            return m
    matches = [
        m
        for m in manifests
        if want in {a.lower() for a in m.aliases}
        or want in {s.repo.lower() for s in m.sources if s.repo is not None}
    ]
    if len(matches) == 1:
        if ref is not None:
            _check_url_fits(ref, matches[0])
        return matches[0]
    if len(matches) > 1:
        raise ManifestError(
            f"{model!r} names several manifests: {', '.join(m.id for m in matches)}",
            hint="use the manifest id",
        )
    known = ", ".join(m.id for m in manifests) or "(none)"
    import difflib  # only on errors: not on the start-up path

    close = difflib.get_close_matches(want, [m.id for m in manifests], n=1)
    suggestion = f"did you mean {close[0]}? " if close else ""
    add = ""
    if ref is not None or re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", model.strip()):
        # An owner/name repo id: any GGUF repository of a modelled architecture can be added.
        add = f"`quantpick manifest add {model.strip()}` describes that repository; "
    raise UnknownModelError(
        f"unknown model {model!r}",
        hint=f"{suggestion}{add}known models: {known} (`quantpick models` lists them)",
    )
