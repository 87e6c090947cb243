"""The one rule for a name that came from outside (a manifest, a checksum file, a hub listing) and
will become a path on disk. Pure.
"""

from __future__ import annotations

import re

from quantpick.errors import VerificationError

# "%2F", "%5c", "%00", "%2e": percent-escapes that a later unquote could turn into a path trick.
_ESCAPE = re.compile(r"%(2f|5c|00|2e)", re.IGNORECASE)


def safe_relative_name(name: str) -> str:
    """Return `name` if it is a safe relative path inside a repository, else raise.

    Sub-folders are allowed ("BF16/model-00001-of-00002.gguf"). Rejected: empty names, absolute
    paths, drive letters, "..", "." or empty components, backslashes, NUL/control characters and
    percent-escaped separators or dots. Raises VerificationError (a hostile listing is an integrity
    problem, exit 4). Shared by every place that turns a remote name into a local path.
    """
    problem = name_problem(name)
    if problem is not None:
        raise VerificationError(f"refusing file name {name!r}: {problem}")
    return name


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
    return None
