"""GGUF file names -> quant tag, role (model / mmproj projector) and split shard. Pure.

Follows the conventions gguf-parser-go and llama.cpp's `-hf repo:TAG` rely on: the quant tag is the
last `-`/`.`/`_`-separated token sequence that looks like a llama.cpp file type
(`...-Q4_K_M.gguf`, `...-UD-Q4_K_XL.gguf`, `...-IQ2_M.gguf`, `...-BF16.gguf`, `MXFP4_MOE`); a split
file ends in `-00001-of-00003.gguf`; vision projectors start with (or contain) `mmproj`.
Files in a per-quant folder (`BF16/Model-BF16-00001-of-00002.gguf`) take the tag from the file
name, else from the folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Order matters inside the alternation only through the optional suffixes, which are greedy.
_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])"
    r"((?:UD-)?(?:"
    r"IQ[1-4]_(?:XXS|XS|S|M|NL)(?:_XL)?"
    r"|TQ[12]_0"
    r"|Q[2-8]_K(?:_(?:XXS|XS|S|M|L|XL))?"
    r"|Q[4-8]_[01](?:_L|_XL)?"
    r"|Q8_K_XL"
    r"|MXFP4(?:_MOE)?"
    r"|BF16|F16|F32|FP16|FP32"
    r"))"
    r"(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})$", re.IGNORECASE)
_MMPROJ_RE = re.compile(r"(?:^|[-_.])mmproj(?:[-_.]|$)", re.IGNORECASE)


@dataclass(frozen=True)
class GGUFName:
    name: str  # the path inside the repository
    quant: str | None  # "Q4_K_M", "UD-Q4_K_XL", "BF16"; None when no tag is recognisable
    role: str  # "model" | "mmproj"
    shard: int | None = None  # 1-based
    shard_count: int | None = None


def quant_tag(text: str) -> str | None:
    """The last quant tag in `text`, upper-cased ("FP16" is spelled "F16"), or None."""
    matches = list(_QUANT_RE.finditer(text))
    if not matches:
        return None
    tag = matches[-1].group(1).upper()
    return {"FP16": "F16", "FP32": "F32"}.get(tag, tag)


def parse_gguf_name(name: str) -> GGUFName | None:
    """Quant, role and shard of one repository file; None when it is not a GGUF file."""
    if not name.lower().endswith(".gguf"):
        return None
    folder, _, base = name.rpartition("/")
    stem = base[: -len(".gguf")]
    shard = shard_count = None
    split = _SPLIT_RE.search(stem)
    if split:
        shard, shard_count = int(split.group(1)), int(split.group(2))
        stem = stem[: split.start()]
        if not 1 <= shard <= shard_count:
            return GGUFName(name, None, "model")  # "-00004-of-00003": not a usable shard
    role = "mmproj" if _MMPROJ_RE.search(stem) else "model"
    quant = quant_tag(stem)
    if quant is None and folder:
        quant = quant_tag(folder.rpartition("/")[2])
    if role == "mmproj" and quant is None:
        quant = "F16"  # llama.cpp's converters write projectors in F16 unless told otherwise
    return GGUFName(name, quant, role, shard, shard_count)


def quant_sort_key(quant: str) -> tuple[str, str]:
    """Stable display order helper: "UD-Q4_K_XL" sorts next to "Q4_K_M"."""
    upper = quant.upper()
    return (upper.removeprefix("UD-"), upper)


@dataclass(frozen=True)
class QuantGroup:
    quant: str
    role: str  # "model" | "mmproj"
    files: tuple[GGUFName, ...]  # one file, or every shard in order


def group_gguf_files(names: list[str]) -> tuple[list[QuantGroup], list[tuple[str, str]]]:
    """Group a repository's file names into quants.

    Returns (groups, skipped): non-GGUF files are ignored silently; GGUF files that cannot be used
    are listed in `skipped` with the reason (no quant tag, an incomplete split set, a second file
    set with the same model quant -- the first by name wins).
    """
    sets: dict[tuple[str, str, str], list[GGUFName]] = {}
    skipped: list[tuple[str, str]] = []
    for name in sorted(names):
        parsed = parse_gguf_name(name)
        if parsed is None:
            continue
        if parsed.quant is None:
            skipped.append((name, "no quant tag in the file name"))
            continue
        stem = _SPLIT_RE.sub("", name[: -len(".gguf")]) if parsed.shard else name
        sets.setdefault((parsed.role, parsed.quant, stem), []).append(parsed)
    groups: list[QuantGroup] = []
    taken: dict[str, str] = {}
    for (role, quant, _stem), members in sets.items():
        members.sort(key=lambda m: m.shard or 0)
        first = members[0]
        if first.shard is not None:
            counts = {m.shard_count for m in members}
            shards = [m.shard for m in members]
            if len(counts) != 1 or shards != list(range(1, (first.shard_count or 0) + 1)):
                for m in members:
                    skipped.append((m.name, f"incomplete split set ({len(members)} shards)"))
                continue
        elif len(members) > 1:  # pragma: no cover - names are unique, stems too
            continue
        if role == "model":
            if quant.upper() in taken:
                for m in members:
                    skipped.append((m.name, f"{quant} is already {taken[quant.upper()]}"))
                continue
            taken[quant.upper()] = first.name
        groups.append(QuantGroup(quant, role, tuple(members)))
    return groups, skipped
