"""Checksums: parse coreutils SHA256SUMS files, validate repository file names, hash files.

`parse_sha256sums` is pure (names are checked by `quantpick.safe_names`). `hash_file` and
`verify_files` read files; `verify_files` hashes several files at once on threads (hashlib
releases the GIL while hashing).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from quantpick.errors import VerificationError
from quantpick.safe_names import safe_relative_name

# 1 MiB reads: the notes measured hashlib at ~1.4 GiB/s with 1-4 MiB reads, slower with 8 MiB.
HASH_CHUNK = 1024 * 1024

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


def parse_sha256sums(text: str) -> dict[str, str]:
    """Parse `sha256sum` output: `<hex>  <name>` (text mode) or `<hex> *<name>` (binary mode).

    Returns {name: lower-case hex}. Blank lines and `#` comments are skipped; a leading "./" is
    dropped. Malformed lines, coreutils' backslash-escaped names, hostile names and one name listed
    with two different hashes raise VerificationError.
    """
    result: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("\\"):
            # coreutils escapes names holding "\\" or "\n" this way: never a sane GGUF name.
            raise VerificationError(f"SHA256SUMS line {lineno}: escaped file name refused")
        digest, sep, rest = line[:64], line[64:66], line[66:]
        if not _HEX64.match(digest) or sep not in ("  ", " *") or not rest:
            raise VerificationError(
                f"SHA256SUMS line {lineno} is not `<sha256>  <name>`: {line[:120]!r}"
            )
        name = rest[2:] if rest.startswith("./") else rest
        safe_relative_name(name)
        digest = digest.lower()
        if result.get(name, digest) != digest:
            raise VerificationError(f"SHA256SUMS lists {name!r} twice with different hashes")
        result[name] = digest
    return result


def format_sha256sums(entries: Mapping[str, str]) -> str:
    """The inverse of parse_sha256sums, sorted by name (text mode, two spaces)."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(entries.items()))


def hash_file(path: Path | str, *, chunk_size: int = HASH_CHUNK) -> str:
    """sha256 hex of a file, read with a reused buffer."""
    import hashlib  # here, not at import: manifest loading uses this module for name checks

    digest = hashlib.sha256()
    buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
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
