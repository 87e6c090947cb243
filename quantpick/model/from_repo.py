"""A manifest for any GGUF repository: the hub listing plus one remote header (`manifest add`).

`add` lists the repository (sizes + sha256 from the hub listing), groups its GGUF files into quants
by file name (quantpick.model.gguf_names), reads ONE header remotely for the architecture block and
the parameter count, takes SHA256SUMS when the repo has one, and writes a validated TOML manifest
into the user manifest directory (atomically).

Quality rank: by bits per weight = total bytes of the quant x 8 / parameters of the header (all
quants of a repo share the parameter count, so this is size order). Bigger files keep more bits per
weight and llama.cpp's KLD tables rank them better; it is a proxy (an imatrix IQ3_M can beat a
plain Q3_K_S of similar size), which a hand-edited manifest can override.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.arch.base import Architecture
from quantpick.errors import ManifestError, QuantpickError, UsageError

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.hub.base import RemoteFile
    from quantpick.model.gguf import GGUFHeader


CHECKSUM_NAMES = ("SHA256SUMS", "SHA256SUMS.txt", "sha256sums.txt", "SHA256SUM")


@dataclass
class NewManifest:
    """What `manifest add` built: the TOML text plus facts for the summary."""

    manifest_id: str
    toml: str
    quants: list[dict[str, Any]]
    projectors: list[str]
    skipped: list[tuple[str, str]]
    header: dict[str, Any]
    checksums_file: str | None
    warnings: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# TOML writing (the manifest format is small: scalars, one array of strings, tables)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are a subset of TOML basic strings'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _table(name: str, values: dict[str, Any], array: bool = False) -> str:
    head = f"[[{name}]]" if array else f"[{name}]"
    lines = [head] + [f"{k} = {_toml(v)}" for k, v in values.items() if v is not None]
    return "\n".join(lines) + "\n"


def architecture_table(arch: Architecture) -> dict[str, Any]:
    """The [architecture] table: the header's `<arch>.*` keys llama.cpp reads (arch/keys.py),
    written as TOML dotted keys (`attention.head_count_kv = 8`)."""
    from quantpick.arch.keys import ARCH_KEYS

    table: dict[str, Any] = {"name": arch.name, "vocab_size": arch.vocab_size}
    for key, value in arch.hparams:
        if key in ARCH_KEYS and key != "vocab_size":
            table[key] = list(value) if isinstance(value, tuple) else value
    table["has_output_tensor"] = arch.has_output_tensor
    return table


def default_id(repo: str) -> str:
    """'unsloth/Qwen3.6-35B-A3B-GGUF' -> 'qwen3.6-35b-a3b-unsloth' (the bundled ids' style)."""
    import re

    owner, _, name = repo.partition("/")
    name = re.sub(r"[-_.]gguf$", "", name, flags=re.IGNORECASE)
    text = f"{name}-{owner}".lower()
    text = re.sub(r"[^a-z0-9._-]+", "-", text).strip("-._")
    return text[:128] or "model"


# ----------------------------------------------------------------------------------------------
# Building a manifest from a repository


def _checksums(
    files: list[RemoteFile], fetch: Any, warnings: list[str]
) -> tuple[str | None, dict[str, str]]:
    """The repository's checksums file, if it has a usable one. A file over the size cap or with
    a refused line is left out with a warning: the hub listing still gives every LFS sha256."""
    from quantpick.hub.http import BodyTooLarge
    from quantpick.hub.verify import CHECKSUMS_MAX_BYTES, parse_sha256sums

    names = {f.name for f in files}
    for candidate in CHECKSUM_NAMES:
        if candidate not in names:
            continue
        try:
            text = fetch(candidate, CHECKSUMS_MAX_BYTES)
        except BodyTooLarge:
            warnings.append(
                f"{candidate} ignored: larger than {CHECKSUMS_MAX_BYTES} bytes; the hub "
                "listing's sha256 values are used"
            )
            return None, {}
        if text is None:
            continue
        try:
            return candidate, parse_sha256sums(text, candidate)
        except QuantpickError as exc:
            warnings.append(f"{candidate} ignored: {exc.message}")
            return None, {}
    return None, {}


# general.file_type -> the quant name llama.cpp gives it (include/llama.h enum llama_ftype at
# b11312): names a file whose name carries no quant tag.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
    39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}  # fmt: skip
_FTYPE_NAMES = {name.upper() for name in FILE_TYPES.values()}
# LLAMA_FTYPE_GUESSED (include/llama.h): set when a loader guessed the type, not llama-quantize.
_FTYPE_GUESSED = 1024


def header_quant(file_type: object) -> str | None:
    """The quant llama-quantize wrote into a header's general.file_type; None when it is
    missing, guessed or unknown."""
    if not isinstance(file_type, int) or isinstance(file_type, bool) or file_type & _FTYPE_GUESSED:
        return None
    return FILE_TYPES.get(file_type)


def named_quant_disagrees(name_quant: str, file_type: object) -> str | None:
    """The header's quant when a file's name tags another llama.cpp file type (`-Q8_0.gguf`
    holding Q4_0 tensors): the header wins. None when they agree, or when the name's tag is not
    a llama.cpp file type itself (`UD-Q4_K_XL`, `Q4_K_L`, `MXFP4` are recipes over one)."""
    actual = header_quant(file_type)
    named = name_quant.upper()
    if actual is None or named not in _FTYPE_NAMES or named == actual.upper():
        return None
    return actual


# Header reads at once when every quant of a repository is read (`pick OWNER/REPO`): enough to
# hide round trips, few enough not to look like a crawler to the hub (each read is 1-4 ranged
# requests of at most 16 MiB).
HEADER_READERS = 4
# GGUF files whose names carry no quant tag, read per repository to name them by their header:
# each costs a first 4 MiB window (gguf_remote.INITIAL_WINDOW) and a parsed header in memory,
# and such files are rare in real repositories (a `model.gguf` or two). A hostile repository of
# 3,000 of them cost 115 s and 11.7 GiB before this cap (benchmarks/hostile_repo.py). The ones
# left out are named in a note; a URL naming one (`.../blob/REV/FILE.gguf`) has it read first.
MAX_UNTAGGED_HEADERS = 16


def _list_within_deadline(open_it: Any, label: str) -> tuple[Any, list[Any]]:
    """The repository opened (its revision pinned) and listed within hub.http.PLANNING_DEADLINE
    s in all, the bound `pick` of a bundled model gives its optional header read: a hub that
    accepts connections and never answers costs seconds, not the download policy's minutes of
    retries (about 200 s). The listing is a small JSON document a healthy hub sends in well
    under a second, so a hub that has not answered it by then is down for this purpose."""
    from quantpick.errors import DownloadError
    from quantpick.hub.http import PLANNING_DEADLINE, DeadlineExceeded, call_within

    def open_and_list() -> tuple[Any, list[Any]]:
        source = open_it()
        return source, source.list_files()

    try:
        opened: tuple[Any, list[Any]] = call_within(
            PLANNING_DEADLINE, f"listing {label}", open_and_list
        )
    except DeadlineExceeded as exc:
        raise DownloadError(
            f"{exc.message} (the hub accepts the connection but does not answer; gave up)",
            hint="try again later (a repository planned before still plans with --offline)",
        ) from None
    return opened


def build_manifest(
    repo: str,
    *,
    kind: str,
    revision: str | None,
    manifest_id: str | None,
    settings: Settings,
    all_headers: bool = False,
    on_header: Any = None,
    named: tuple[str, ...] = (),
) -> NewManifest:
    """List `repo`, read one header, and return a validated manifest (not yet written).

    `all_headers`: read (and cache) every model quant's header too, HEADER_READERS at a time,
    and name the GGUF files whose names carry no quant tag by their header's general.file_type
    (`pick OWNER/REPO`); `on_header(done, total)` follows the reads. Untagged files are read
    MAX_UNTAGGED_HEADERS at most, those in `named` (a URL naming one file) first."""
    from quantpick.hub.kinds import REPOSITORY_KINDS, is_repository
    from quantpick.hub.sources import open_source
    from quantpick.model.gguf import layout_from_header, n_parameters
    from quantpick.model.gguf_names import group_gguf_files
    from quantpick.model.headers import (
        pinned_revision,
        sha256_key,
        source_key,
        store_cached_header,
    )
    from quantpick.model.manifest import Source, parse_manifest

    if not is_repository(kind):
        raise UsageError(f"--source must be {' or '.join(REPOSITORY_KINDS)}, got {kind!r}")
    source, listing = _list_within_deadline(
        lambda: open_source(Source(kind=kind, repo=repo, revision=revision), settings=settings),
        f"{kind}:{repo}",
    )
    by_name = {f.name: f for f in listing}
    groups, skipped = group_gguf_files(list(by_name))
    models = [g for g in groups if g.role == "model"]
    if not models:
        raise ManifestError(
            f"{source.label} has no GGUF model files with a recognisable quant tag",
            hint="file names should end like -Q4_K_M.gguf, -UD-Q4_K_XL.gguf or -BF16.gguf",
        )
    warnings: list[str] = []
    refused = source.refused_note()
    if refused is not None:  # hostile, overlong or file-and-folder names: never in a manifest
        warnings.append(refused)
    missing = [m.name for g in groups for m in g.files if by_name[m.name].size is None]
    if missing:
        raise ManifestError(f"{source.label}: the listing gives no size for {missing[0]}")

    def total(group: Any) -> int:
        return sum(by_name[m.name].size or 0 for m in group.files)

    # One header: the smallest quant's (the header is the same size for all; fewer shards); a
    # file whose header cannot be used is left out, and the next one read.
    header: GGUFHeader
    for probe in sorted(models, key=lambda g: (len(g.files), total(g))):
        try:
            header, url = cached_or_remote_header(
                source, kind, repo, [m.name for m in probe.files], by_name, settings
            )
            layout = layout_from_header(header, basis=f"gguf-remote:{url}")
            break
        except QuantpickError as exc:
            if len(models) == 1 or not all_headers:
                raise
            warnings.append(f"{probe.files[0].name}: not planned: {exc.message}")
            skipped.append((probe.files[0].name, f"its header cannot be used: {exc.message}"))
            models = [g for g in models if g is not probe]
    else:  # pragma: no cover - the loop breaks or raises on the last one
        raise ManifestError(f"{source.label}: no GGUF header can be read")
    params = n_parameters(header)
    if params <= 0:
        raise ManifestError(f"{probe.files[0].name}: the header lists no tensors")
    models = _relabel(models, {probe.quant: header}, warnings, skipped)

    sums_name, sums = _checksums(listing, source.fetch_text, warnings)
    # Keep the header: planning this quant later needs no network (layouts.layout_for's cache).
    first = by_name[probe.files[0].name]
    keys = []
    if source.revision and pinned_revision(kind, source.revision):
        keys.append(source_key(kind, repo, source.revision, first.name))
    if first.sha256:
        keys.insert(0, sha256_key(first.sha256))
    store_cached_header(settings, keys, header)
    if all_headers:
        from_headers, unreadable, headers = _read_all_headers(
            source, kind, repo, models, skipped, by_name, settings, on_header, warnings, named
        )
        skipped += [(g.files[0].name, unreadable[g.quant]) for g in models if g.quant in unreadable]
        models = [g for g in models if g.quant not in unreadable]
        models = _relabel(models, headers, warnings, skipped) + from_headers
        now_named = {m.name for g in from_headers for m in g.files}
        skipped = [(n, why) for n, why in skipped if n not in now_named]

    def sha_of(name: str) -> str | None:
        listed = by_name[name].sha256
        from_sums = sums.get(name)
        if listed and from_sums and listed != from_sums:
            # Whole hashes: two prefixes can look identical; the reader compares them.
            warnings.append(
                f"{name}: {sums_name} says {from_sums}, the hub listing {listed}; keeping the "
                "listing's (computed by the hub from the bytes)"
            )
        return listed or from_sums

    def file_entry(m: Any, quant: str, **role: Any) -> str:
        """A [[files]] table: what every file says, with what its role adds before the shard."""
        row = {"name": m.name, "quant": quant, "size_bytes": by_name[m.name].size,
               "size_exact": True, "sha256": sha_of(m.name), **role, "shard": m.shard,
               "shard_count": m.shard_count}  # fmt: skip
        return "\n" + _table("files", row, True)

    meta = header.metadata
    display = meta.get("general.name") if isinstance(meta.get("general.name"), str) else None
    lic = meta.get("general.license") if isinstance(meta.get("general.license"), str) else None
    manifest_id = manifest_id or default_id(repo)
    title = f"{display or repo.partition('/')[2]} ({repo})"
    parts = [
        "# Written by `quantpick manifest add` from the repository listing and one GGUF header\n"
        f"# ({probe.files[0].name}: {header.stats.get('bytes_fetched', 0)} bytes in "
        f"{header.stats.get('requests', 0)} requests).\n"
        "# quality_rank: by bits per weight (size x 8 / parameters), higher is better.\n"
        f"schema = 1\nid = {_toml(manifest_id)}\n"
        f"display_name = {_toml(title)}\n"
        + (f"license = {_toml(lic)}\n" if lic else "")
        + f"checksums_file = {_toml(sums_name or '')}\n\n"
    ]
    parts.append(_table("architecture", architecture_table(layout.architecture)) + "\n")
    sampling_keys = {"temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p"}
    sampling = {k: meta.get(f"general.sampling.{v}") for k, v in sampling_keys.items()}
    numbers = {k: v for k, v in sampling.items() if isinstance(v, (int, float))}
    if len(numbers) == len(sampling) and not any(isinstance(v, bool) for v in numbers.values()):
        sampling = {k: int(v) if k == "top_k" else round(float(v), 6) for k, v in numbers.items()}
        parts.append(_table("sampling", sampling) + "\n")
    parts.append(_table("sources", {"kind": kind, "repo": repo, "revision": source.revision}, True))

    quants: list[dict[str, Any]] = []
    ranked = sorted(models, key=lambda g: (total(g), g.quant))  # rank 1 = fewest bits per weight
    for rank, group in enumerate(ranked, start=1):
        size = total(group)
        bpw = round(size * 8 / params, 2)
        quants.append(
            {
                "quant": group.quant,
                "files": [m.name for m in group.files],
                "size_bytes": size,
                "bits_per_weight": bpw,
                "quality_rank": rank,
            }  # fmt: skip
        )
        for m in group.files:
            bits = bpw if 0.5 <= bpw <= 64 else None
            parts.append(file_entry(m, group.quant, bits_per_weight=bits, quality_rank=rank))
    projectors = []
    for group in groups:
        if group.role != "mmproj":
            continue
        for m in group.files:
            projectors.append(m.name)
            parts.append(file_entry(m, group.quant, role="mmproj"))
    text = "".join(parts)
    # Validate with the loader every other command uses: never write a manifest it would refuse.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - 3.10 only
        import tomli as tomllib

    parse_manifest(tomllib.loads(text), f"<manifest for {repo}>")
    return NewManifest(
        manifest_id=manifest_id,
        toml=text,
        quants=list(reversed(quants)),
        projectors=projectors,
        skipped=skipped,
        header={"file": probe.files[0].name, "url": url, **header.stats},
        checksums_file=sums_name,
        warnings=warnings,
    )


def _file_url(kind: str, repo: str, revision: str | None) -> str:
    """The page URL of a file FILE.gguf of `repo`, as the hub's web pages write it."""
    rev = revision or ("master" if kind == "modelscope" else "main")
    if kind == "modelscope":
        return f"https://www.modelscope.cn/models/{repo}/file/view/{rev}/FILE.gguf"
    return f"https://huggingface.co/{repo}/blob/{rev}/FILE.gguf"


def _relabel(
    models: list[Any],
    headers: dict[str, Any],
    warnings: list[str],
    skipped: list[tuple[str, str]],
) -> list[Any]:
    """`models` with each quant whose header's general.file_type disagrees with its name named
    by the header (a note says so); left out (in `skipped`) when that quant is already another
    file set of the repository."""
    import dataclasses

    out = []
    taken = {g.quant.upper() for g in models}
    for group in models:
        header = headers.get(group.quant)
        actual = (
            named_quant_disagrees(group.quant, header.metadata.get("general.file_type"))
            if header is not None
            else None
        )
        if actual is None:
            out.append(group)
            continue
        first = group.files[0].name
        said = f"{first}: named {group.quant}, but its header's general.file_type is {actual}"
        if actual.upper() in taken:
            warnings.append(f"{said}, already a quant of this repository: not planned")
            skipped.append((first, f"its header says {actual}, not {group.quant}"))
            continue
        warnings.append(f"{said}: planned as {actual} (the header is what llama.cpp loads)")
        taken.discard(group.quant.upper())
        taken.add(actual.upper())
        files = tuple(dataclasses.replace(m, quant=actual) for m in group.files)
        out.append(dataclasses.replace(group, quant=actual, files=files))
    return out


def _read_all_headers(
    source: Any,
    kind: str,
    repo: str,
    models: list[Any],
    skipped: list[tuple[str, str]],
    by_name: dict[str, Any],
    settings: Settings,
    on_header: Any,
    warnings: list[str],
    first: tuple[str, ...] = (),
) -> tuple[list[Any], dict[str, str], dict[str, Any]]:
    """Read and cache every model quant's header (cache hits cost nothing); returns the groups
    named by their header's file type for GGUF files the names did not tag, the quants
    whose header cannot be read (each with why: left out of the plan, the others still are),
    and each tagged quant's header (by quant)."""
    from concurrent.futures import ThreadPoolExecutor

    from quantpick.hub.http import planning_policy
    from quantpick.model.gguf_names import GGUFName, QuantGroup

    untagged = [n for n, why in skipped if why == "no quant tag in the file name"]
    untagged.sort(key=lambda n: n not in first)  # a file the user named is read first
    left_out = untagged[MAX_UNTAGGED_HEADERS:]
    untagged = untagged[:MAX_UNTAGGED_HEADERS]
    if left_out:
        shown = ", ".join(left_out[:5]) + (
            f" and {len(left_out) - 5} more" if len(left_out) > 5 else ""
        )
        warnings.append(
            f"{len(left_out)} GGUF files without a quant tag in their names were not read "
            f"(at most {MAX_UNTAGGED_HEADERS} per repository): {shown}; to plan one, give its "
            f"URL: quantpick pick {_file_url(kind, repo, source.revision)}"
        )
    # an untagged file is optional (the plan goes on without it): two attempts, short pauses,
    # not the six a download gets (a hub that cuts every answer short cost 31 s per file)
    optional = planning_policy()
    jobs: list[tuple[str, list[str]]] = [(g.quant, [m.name for m in g.files]) for g in models]
    jobs += [(f"?{name}", [name]) for name in untagged]
    total = len(jobs)
    done = 0

    def read(job: tuple[str, list[str]]) -> tuple[str, list[str], Any]:
        quant, names = job
        policy = optional if quant.startswith("?") else None
        try:
            header, _url = cached_or_remote_header(
                source, kind, repo, names, by_name, settings, policy=policy
            )
        except QuantpickError as exc:
            return (*job, exc)
        return (*job, header)

    named: list[Any] = []
    unreadable: dict[str, str] = {}
    headers: dict[str, Any] = {}
    taken = {g.quant.upper() for g in models}
    with ThreadPoolExecutor(max_workers=HEADER_READERS) as pool:
        for quant, names, header in pool.map(read, jobs):
            done += 1
            if on_header is not None:
                on_header(done, total)
            if isinstance(header, QuantpickError):
                warnings.append(f"{names[0]}: not planned: {header.message}")
                if not quant.startswith("?"):
                    unreadable[quant] = f"its header cannot be used: {header.message}"
                continue
            if not quant.startswith("?"):
                headers[quant] = header
                continue
            ftype = header.metadata.get("general.file_type")
            tag = header_quant(ftype)
            if tag is None or tag.upper() in taken:
                why = "already a quant of this repository" if tag else "no known file type"
                warnings.append(f"{names[0]}: not planned: its header names {tag or ftype} ({why})")
                continue
            taken.add(tag.upper())
            named.append(QuantGroup(tag, "model", (GGUFName(names[0], tag, "model"),)))
    return named, unreadable, headers


def cached_or_remote_header(
    source: Any,
    kind: str,
    repo: str,
    names: list[str],
    by_name: dict[str, Any],
    settings: Settings,
    *,
    policy: Any = None,
) -> tuple[GGUFHeader, str]:
    """The header of one quant (all its shards): from the header cache when a key for this
    commit or sha256 holds it, else read by range requests (`policy`: their retries), checked
    usable, and cached."""
    from quantpick.model.gguf import layout_from_header
    from quantpick.model.headers import (
        cache_keys_for,
        load_cached_header,
        read_remote_header,
        store_cached_header,
    )

    first = by_name[names[0]]
    keys = cache_keys_for(kind, repo, source.revision, names[0], first.sha256)
    for key in keys:
        cached = load_cached_header(settings, key)
        if cached is not None:
            return cached, f"gguf-cache:{key}"
    header, url = read_remote_header(source, names, policy=policy)
    layout_from_header(header, basis=url)  # a header the planner can use, or an error now
    store_cached_header(settings, keys, header)
    return header, url


def write_manifest(new: NewManifest, settings: Settings, *, force: bool) -> Path:
    """Write into the user manifest directory atomically; refuse an existing id unless force."""

    from quantpick.model.registry import list_manifests

    directory = settings.user_manifest_dir
    target = directory / f"{new.manifest_id}.toml"
    if not force:
        existing = [m for m in list_manifests(settings, errors=[]) if m.id == new.manifest_id]
        if existing or target.exists():
            where = existing[0].path if existing else str(target)
            raise ManifestError(
                f"a manifest with id {new.manifest_id!r} already exists ({where})",
                hint="pass --force to replace it (in the user directory), or choose --id",
            )
    from quantpick.outputs import write_atomic

    directory.mkdir(parents=True, exist_ok=True)
    # quantpick.outputs' policy: never through a link, never over a FIFO or device
    write_atomic(target, new.toml.encode("utf-8"), durable=False)
    return target
