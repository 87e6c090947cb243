"""Opening a manifest source: the hub kind's module (hub/kinds.py) builds its `RepoSource`.

Contract used by other modules: RemoteFile, RepoSource, open_source, describe.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from quantpick.errors import UsageError
from quantpick.hub.base import RemoteFile, RepoSource
from quantpick.hub.kinds import KINDS, SOURCE_KINDS
from quantpick.json_view import attrs

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.hub.base import SourceSpec
    from quantpick.hub.http import RetryPolicy

__all__ = ["RemoteFile", "RepoSource", "describe", "open_source"]


def open_source(
    source: SourceSpec, *, settings: Settings | None = None, policy: RetryPolicy | None = None
) -> RepoSource:
    """A RepoSource for one manifest source. Hub sources contact the hub (revision pinning).

    Every network call made through it has connect and read timeouts and retries with backoff
    (`policy`, default `http.default_policy()`); ModelScope's library brings its own (connect
    10 s, read 60 s, 15 s per listing page, retried: modelscope_hub.constants). Raises
    DownloadError when the hub cannot be reached or refuses the repository.
    """
    del settings  # reserved: a per-user listing cache would live in settings.cache_dir
    kind = KINDS.get(source.kind)
    if kind is None:
        raise UsageError(
            f"unknown source kind {source.kind!r}", hint=f"one of {', '.join(SOURCE_KINDS)}"
        )
    cls = getattr(importlib.import_module(f"quantpick.hub.{kind.module}"), kind.source_class)
    opened: RepoSource = cls.open(source, policy)
    return opened


def describe(source: SourceSpec) -> dict[str, Any]:
    """A JSON-ready view of a manifest source (no credentials ever)."""
    return attrs(source, "kind repo revision url_template name")
