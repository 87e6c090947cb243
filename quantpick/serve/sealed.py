"""Cache entries that cannot be edited unnoticed: an HMAC-SHA256 of each entry under a random key
kept in the state directory (mode 0600), written in the entry's first line.

The dry-run cache (jobs.dry_run.DryRunCache) holds llama-fit-params' output for a stand-in; an entry
edited by hand (or by another user of a shared cache folder) could make the next `pick` refuse a
plan llama.cpp never refused, or accept one it would. A sha256 beside the entry detects an
accident only (whoever edits the entry can recompute it); a keyed MAC also needs the key, which
lives apart from the cache (the state directory) and is readable by its owner only. An entry
whose MAC does not verify, or that has none, is treated as absent: the dry run runs again and
its output replaces the entry. Without a readable key nothing is cached (every dry run runs).
Edge module (disk).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

KEY_BYTES = 32  # HMAC-SHA256's block-size-independent key length (RFC 2104: at least L = 32)
_PREFIX = b"hmac-sha256:"
# An entry is one llama-fit-params output (a few KB; the cap of process.STDOUT_CAP_BYTES).
MAX_ENTRY_BYTES = 4 * 1024**2 + 128


def install_key(path: Path, *, create: bool = True) -> bytes | None:
    """This install's key (created on first use, 0600, never through a link); None when it
    cannot be read or made (then nothing is cached)."""
    from quantpick.local_files import read_small

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(2):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            if not create:
                return None
            try:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(path, flags, 0o600)
            except FileExistsError:
                continue  # another quantpick made it just now: read that one
            except OSError:
                return None
            key = secrets.token_bytes(KEY_BYTES)
            try:
                os.write(fd, key)
            finally:
                os.close(fd)
            return key
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or _foreign(info):
            return None  # a link, a shared or someone else's file: not a secret of ours
        try:
            key = read_small(path, KEY_BYTES)
        except OSError:
            return None
        return key if len(key) == KEY_BYTES else None
    return None


def _foreign(info: os.stat_result) -> bool:
    getuid = getattr(os, "getuid", None)
    return getuid is not None and info.st_uid != getuid()


def _mac(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode()


def seal(key: bytes, body: bytes) -> bytes:
    """The entry as stored: `hmac-sha256:<hex>\\n` then `body`."""
    return _PREFIX + _mac(key, body) + b"\n" + body


def unseal(key: bytes, data: bytes) -> bytes | None:
    """The body of a stored entry whose MAC verifies; None for anything else."""
    first, newline, body = data.partition(b"\n")
    if not newline or not first.startswith(_PREFIX):
        return None
    if not hmac.compare_digest(first[len(_PREFIX) :], _mac(key, body)):
        return None
    return body


def read_sealed(path: Path, key: bytes) -> bytes | None:
    """The verified body of the entry at `path` (a regular file, bounded), or None."""
    from quantpick.local_files import read_small

    try:
        data = read_small(path, MAX_ENTRY_BYTES)
    except OSError:
        return None
    return unseal(key, data)


def write_sealed(path: Path, key: bytes, body: bytes) -> None:
    """Store `body` sealed at `path` (atomically; OSError when the cache cannot be written)."""
    from quantpick.fetch.atomic import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, seal(key, body), durable=False)
