"""A mirror: a plain URL template ("https://host/path/{file}"), no listing, no hashes of its own."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from quantpick.errors import UsageError
from quantpick.hub.base import RemoteFile, RepoSource
from quantpick.hub.http import RetryPolicy
from quantpick.safe_names import safe_relative_name

if TYPE_CHECKING:
    from quantpick.hub.base import SourceSpec


class MirrorSource(RepoSource):
    """A plain URL template ("https://host/path/{file}"): no listing, no hashes of its own."""

    kind = "mirror"

    @classmethod
    def open(cls, source: SourceSpec, policy: RetryPolicy | None = None) -> MirrorSource:
        if not source.url_template:
            raise UsageError("a mirror source needs a url_template")
        return cls(source.url_template, source.revision, source.name, policy)

    def __init__(
        self,
        template: str,
        revision: str | None,
        name: str | None,
        policy: RetryPolicy | None = None,
    ) -> None:
        if "{file}" not in template:
            raise UsageError(f"mirror URL template {template!r} has no {{file}} placeholder")
        self.template = template
        host = urlsplit(template).hostname or template
        super().__init__(f"mirror:{name or host}", revision, policy)

    def _list(self) -> list[RemoteFile]:
        return []

    def resolve(self, name: str) -> RemoteFile:
        safe_relative_name(name)
        url = self.template.replace("{file}", quote(name)).replace(
            "{revision}", quote(self.revision or "main", safe="")
        )
        return RemoteFile(name, None, None, url, "mirror", self.revision)
