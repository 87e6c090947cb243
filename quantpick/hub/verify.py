"""Checksums: parse coreutils SHA256SUMS files, validate repository file names, hash files.

`parse_sha256sums` is pure (names are checked by `quantpick.safe_names`). `hash_file` and
`verify_files` read files; `verify_files` hashes several files at once on threads (hashlib
releases the GIL while hashing).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from quantpick.errors import VerificationError
from quantpick.safe_names import name_problem, path_conflicts, safe_relative_name, shown

# 1 MiB reads: the notes measured hashlib at ~1.4 GiB/s with 1-4 MiB reads, slower with 8 MiB.
HASH_CHUNK = 1024 * 1024

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


# A checksums file is read whole into memory, so its size is capped: 8 MiB holds ~60,000 lines of
# 66 hex+separator bytes and a 70-byte name, orders of magnitude more than a GGUF repository has
# files (a hundred or so). A larger file is not an error: it is ignored with a note, and the hub
# listing and the manifest still vouch for the hashes.
CHECKSUMS_MAX_BYTES = 8 * 1024 * 1024
MAX_REPORTED_PROBLEMS = 20  # lines named in a report; the count says how many more there were


@dataclass(frozen=True)
class ChecksumsFile:
    """A parsed SHA256SUMS: the usable entries, and one message per line that was refused."""

    entries: dict[str, str]  # name -> lower-case hex
    problems: tuple[str, ...]  # "<label> line N: why", at most MAX_REPORTED_PROBLEMS
    refused_lines: int = 0  # every refused line, reported or not

    def summary(self) -> str | None:
        """One line for the refused lines (None when every line was usable)."""
        if not self.refused_lines:
            return None
        more = self.refused_lines - 1
        return self.problems[0] + (f" (and {more} more refused line(s))" if more else "")


def read_sha256sums(text: str, label: str = "SHA256SUMS") -> ChecksumsFile:
    """Parse `sha256sum` output leniently: every good line is kept, every bad one reported.

    Line format: `<hex>  <name>` (text mode) or `<hex> *<name>` (binary mode); blank lines and
    `#` comments are skipped; a leading "./" is dropped. Refused: malformed lines, coreutils'
    backslash-escaped names, names `quantpick.safe_names` refuses (hostile, too long), a name
    listed with two different hashes (both lines), a name that is also a folder of another
    (both). `verify` checks the rest and reports these; a download refuses the file outright
    (`parse_sha256sums`).
    """
    result: dict[str, str] = {}
    line_of: dict[str, int] = {}
    problems: list[str] = []
    refused = 0
    conflicting: set[str] = set()

    def refuse(lineno: int, why: str) -> None:
        nonlocal refused
        refused += 1
        if len(problems) < MAX_REPORTED_PROBLEMS:
            problems.append(f"{label} line {lineno}: {why}")

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("\\"):
            # coreutils escapes names holding "\\" or "\n" this way: never a sane GGUF name.
            refuse(lineno, "escaped file name refused")
            continue
        digest, sep, rest = line[:64], line[64:66], line[66:]
        if not _HEX64.match(digest) or sep not in ("  ", " *") or not rest:
            refuse(lineno, f"not `<sha256>  <name>`: {shown(line, 120)}")
            continue
        name = rest[2:] if rest.startswith("./") else rest
        problem = name_problem(name)
        if problem is not None:
            refuse(lineno, f"refusing file name {shown(name)}: {problem}")
            continue
        digest = digest.lower()
        if name in conflicting:
            refuse(lineno, f"{shown(name)} is listed again")
            continue
        if result.get(name, digest) != digest:
            first = line_of[name]
            refuse(lineno, f"lists {shown(name)} twice with different hashes (line {first})")
            del result[name]
            conflicting.add(name)
            continue
        result[name] = digest
        line_of.setdefault(name, lineno)
    for name, why in sorted(path_conflicts(result).items(), key=lambda item: line_of[item[0]]):
        refuse(line_of[name], why)
        del result[name]
    return ChecksumsFile(result, tuple(problems), refused)


def parse_sha256sums(text: str, label: str = "SHA256SUMS") -> dict[str, str]:
    """Parse `sha256sum` output strictly: {name: lower-case hex}, or VerificationError naming the
    first refused line (see `read_sha256sums` for the rules)."""
    parsed = read_sha256sums(text, label)
    summary = parsed.summary()
    if summary is not None:
        raise VerificationError(summary)
    return parsed.entries


def format_sha256sums(entries: Mapping[str, str]) -> str:
    """The inverse of parse_sha256sums, sorted by name (text mode, two spaces)."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(entries.items()))


def hash_file(
    path: Path | str,
    *,
    chunk_size: int = HASH_CHUNK,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """sha256 hex of a regular file (quantpick.local_files.open_regular: a FIFO or a device is
    refused, never read); `on_bytes(n)` after each read (progress)."""
    from quantpick.local_files import open_regular

    fd = open_regular(path)
    try:
        return hash_open_file(fd, chunk_size=chunk_size, on_bytes=on_bytes)
    finally:
        os.close(fd)


def hash_open_file(
    fd: int,
    *,
    chunk_size: int = HASH_CHUNK,
    on_bytes: Callable[[int], None] | None = None,
) -> str:
    """sha256 hex of what an open descriptor reads from its current offset to the end, with a
    reused buffer. Hashing a descriptor, not a path, is what ties the hash to one inode: a
    rename over the path while it is read changes nothing here (the caller compares fstat()
    before and after, and links only that inode)."""
    import hashlib  # here, not at import: manifest loading uses this module for name checks

    digest = hashlib.sha256()
    buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    with open(fd, "rb", buffering=0, closefd=False) as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileCheck:
    name: str
    status: str  # "ok" | "mismatch" | "missing"
    expected: str
    actual: str | None  # None when missing
    size: int | None


@dataclass(frozen=True)
class Verification:
    root: str
    files: tuple[FileCheck, ...]

    @property
    def ok(self) -> bool:
        """No mismatch (missing files are ignored, as with `sha256sum -c --ignore-missing`)."""
        return not self.mismatched

    @property
    def mismatched(self) -> tuple[FileCheck, ...]:
        return tuple(f for f in self.files if f.status == "mismatch")

    @property
    def checked(self) -> tuple[FileCheck, ...]:
        return tuple(f for f in self.files if f.status != "missing")


def default_workers() -> int:
    """Threads for hashing: one per core, at most 4 (disk-bound beyond that)."""
    return max(1, min(4, os.cpu_count() or 1))


def verify_files(
    root: Path | str, expected: Mapping[str, str], workers: int | None = None
) -> Verification:
    """Hash each listed file under `root` (in parallel) and compare with `expected`."""
    from concurrent.futures import ThreadPoolExecutor  # not at import: manifests load this module

    base = Path(root)
    names = sorted(expected)
    for name in names:
        safe_relative_name(name)

    def check(name: str) -> FileCheck:
        path = base / name
        want = expected[name].lower()
        if not path.is_file():
            return FileCheck(name, "missing", want, None, None)
        size = path.stat().st_size
        got = hash_file(path)
        return FileCheck(name, "ok" if got == want else "mismatch", want, got, size)

    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        results = tuple(pool.map(check, names))
    return Verification(root=str(base), files=results)
