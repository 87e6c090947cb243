"""The one rule for a name that came from outside (a manifest, a checksum file, a hub listing) and
will become a path on disk. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from quantpick.errors import VerificationError

# "%2F", "%5c", "%00", "%2e": percent-escapes that a later unquote could turn into a path trick.
_ESCAPE = re.compile(r"%(2f|5c|00|2e)", re.IGNORECASE)

# The tightest common limits, in UTF-8 bytes: NAME_MAX is 255 on ext4, XFS, btrfs, ZFS, tmpfs,
# APFS and NTFS (255 UTF-16 units), PATH_MAX is 4096 on Linux (<linux/limits.h>; macOS: 1024).
# A relative name must leave room for the directory it lands in, so the whole name is held to
# PATH_MAX minus a 1024-byte allowance for that directory. A longer name would only fail later, as
# ENAMETOOLONG in the middle of planning or verifying; no real repository uses one.
MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096
DIR_ALLOWANCE_BYTES = 1024
MAX_NAME_BYTES = MAX_PATH_BYTES - DIR_ALLOWANCE_BYTES
# Room kept in each component for the suffixes the transfer engine adds beside a file:
# ".part.json" (10 bytes), ".lock" and ".bad-<sha12>" (17 bytes).
SUFFIX_ALLOWANCE_BYTES = 17


def safe_relative_name(name: str) -> str:
    """Return `name` if it is a safe relative path inside a repository, else raise.

    Sub-folders are allowed ("BF16/model-00001-of-00002.gguf"). Rejected: empty names, absolute
    paths, drive letters, "..", "." or empty components, backslashes, NUL/control characters,
    percent-escaped separators or dots, and names too long for a file system (a component over
    255 - 17 bytes, the whole name over 3072 bytes). Raises VerificationError (a hostile listing is
    an integrity problem, exit 4). Shared by every place that turns a remote name into a local path.
    """
    problem = name_problem(name)
    if problem is not None:
        raise VerificationError(f"refusing file name {shown(name)}: {problem}")
    return name


def shown(name: str, limit: int = 120) -> str:
    """repr(name), cut to `limit` characters: a 5,000-character name must not flood a message."""
    text = repr(name)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 20]}...' ({len(name.encode('utf-8', 'surrogatepass'))} bytes)"


def name_problem(name: str) -> str | None:
    """Why `name` is not a safe relative file name inside a repository (None when it is): the one
    rule for manifests, checksum files and hub listings alike."""
    if not name:
        return "must not be empty"
    if "\x00" in name:
        return "must not contain NUL"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "must not contain control characters"
    if "\\" in name:
        return "must not contain backslashes (use '/')"
    if name.startswith("/"):
        return "must be relative (no leading '/')"
    if re.match(r"^[A-Za-z]:", name):
        return "must be relative (no drive letter)"
    if _ESCAPE.search(name):
        return "must not contain a percent-escaped separator, dot or NUL"
    parts = name.split("/")
    if ".." in parts:
        return "must not contain '..'"
    if any(part in ("", ".") for part in parts):
        return "must not contain empty or '.' path components"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no file system stores them as given
        return "must be valid Unicode (it holds a lone surrogate)"
    if len(encoded) > MAX_NAME_BYTES:
        return (
            f"is {len(encoded)} bytes long, more than the {MAX_NAME_BYTES} bytes a path inside a "
            f"directory can hold (PATH_MAX {MAX_PATH_BYTES})"
        )
    component_limit = MAX_COMPONENT_BYTES - SUFFIX_ALLOWANCE_BYTES
    for part in parts:
        size = len(part.encode("utf-8"))
        if size > component_limit:
            return (
                f"has a {size}-byte component, more than {component_limit} bytes (file systems "
                f"allow {MAX_COMPONENT_BYTES}, and quantpick adds up to {SUFFIX_ALLOWANCE_BYTES} "
                "for .part/.lock files)"
            )
    return None


def path_conflicts(names: Iterable[str]) -> dict[str, str]:
    """Names that cannot all exist on one disk: a file that is also a folder of another name
    ("a.gguf" and "a.gguf/b.gguf"). Returns {name: why} for every name involved (both sides).

    Comparison is exact (case-sensitive): a case-insensitive disk could still collide, but two
    names differing only in case are legal in a git repository and rare enough to leave to the
    file system's own error.
    """
    files = set(names)
    problems: dict[str, str] = {}
    for name in sorted(files):
        parts = name.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder in files:
                why = f"{shown(folder)} is listed both as a file and as a folder of {shown(name)}"
                problems.setdefault(name, why)
                problems.setdefault(folder, why)
    return problems
