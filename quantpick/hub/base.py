"""A hub repository as quantpick reads it: its files (name, size, sha256, the URL of the bytes)
and the headers a request to it carries. One module per hub kind subclasses `RepoSource`
(hub/huggingface.py, hub/modelscope.py, hub/mirror.py); hub/kinds.py says which kinds exist.

Hub libraries (huggingface_hub, modelscope_hub) are imported inside the methods that talk to a hub,
never at module level (130-180 ms of import each). The bytes themselves are fetched by
quantpick.fetch.transfer over plain HTTP, on the URLs a source builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from quantpick.errors import DownloadError, UsageError, VerificationError
from quantpick.hub.http import RetryPolicy, default_policy, origin, redacted
from quantpick.safe_names import name_problem, path_conflicts, safe_relative_name, shown


class SourceSpec(Protocol):
    """Where a manifest's files live (model.manifest.Source has these fields): the hub layer
    reads them without knowing the manifest."""

    @property
    def kind(self) -> str: ...
    @property
    def repo(self) -> str | None: ...
    @property
    def revision(self) -> str | None: ...
    @property
    def url_template(self) -> str | None: ...
    @property
    def name(self) -> str | None: ...


@dataclass(frozen=True)
class RemoteFile:
    name: str  # path inside the repository, validated by safe_relative_name
    size: int | None  # bytes, None when the source cannot say (plain mirrors)
    sha256: str | None  # lower-case hex from the hub listing (HF LFS oid, ModelScope Sha256)
    url: str  # GET this (it may redirect to a CDN)
    source_kind: str  # "hf" | "modelscope" | "mirror"
    revision: str | None  # the commit (hf) / revision (modelscope) the URL is pinned to


def user_agent() -> str:
    from quantpick import __version__

    return f"quantpick/{__version__}"


class RepoSource:
    """One place to fetch a repository's files from. Subclasses fill the listing."""

    kind: str = ""

    def __init__(self, label: str, revision: str | None, policy: RetryPolicy | None = None) -> None:
        self.label = label
        self.revision = revision
        self.policy = policy or default_policy()
        self._files: dict[str, RemoteFile] | None = None
        # Names the listing held but that are never written (hostile, too long, file-and-folder):
        # {name: why}. Reported by the callers, never silently dropped.
        self.refused: dict[str, str] = {}

    def _list(self) -> list[RemoteFile]:
        raise NotImplementedError

    def list_files(self) -> list[RemoteFile]:
        """Every usable file of the repository at the pinned revision; the names that cannot be
        used safely are left out and kept in `self.refused` with the reason."""
        if self._files is None:
            files: dict[str, RemoteFile] = {}
            refused: dict[str, str] = {}
            for remote in self._list():
                problem = name_problem(remote.name)
                if problem is not None:
                    refused[remote.name] = problem
                    continue
                files[remote.name] = remote
            for name, why in path_conflicts(files).items():
                refused[name] = why
                del files[name]
            self.refused = refused
            self._files = files
        return list(self._files.values())

    def refused_note(self, limit: int = 3) -> str | None:
        """One line naming the refused listing names (None when there are none)."""
        if not self.refused:
            return None
        items = sorted(self.refused.items())
        shown_items = "; ".join(f"{shown(n, 80)}: {why}" for n, why in items[:limit])
        more = f" and {len(items) - limit} more" if len(items) > limit else ""
        return (
            f"{self.label} lists {len(items)} file name(s) quantpick will not write: "
            f"{shown_items}{more}"
        )

    def resolve(self, name: str) -> RemoteFile:
        safe_relative_name(name)
        self.list_files()
        assert self._files is not None
        if name in self.refused:
            raise VerificationError(
                f"{self.label} lists {shown(name)}, which cannot be used: {self.refused[name]}"
            )
        if name not in self._files:
            raise DownloadError(f"{name} is not in {self.label}")
        return self._files[name]

    def request_headers(self, url: str) -> dict[str, str]:
        return {"User-Agent": user_agent()}

    def fetch_text(self, name: str, max_bytes: int) -> str | None:
        """A small file (SHA256SUMS, README) as text; None when the source does not have it."""
        from quantpick.hub.http import fetch_small

        try:
            remote = self.resolve(name)
        except DownloadError:
            return None
        data = fetch_small(
            remote.url, self.request_headers, max_bytes=max_bytes, policy=self.policy
        )
        return None if data is None else data.decode("utf-8", errors="replace")


_Opened = TypeVar("_Opened", bound="RepositorySource")


class RepositorySource(RepoSource):
    """A hub of repositories (hub/kinds.py `repository`): opened on a manifest source's repo at
    its revision. Subclasses take (repo, revision, policy) and pin the revision."""

    needs_repo = ""  # the usage error when the manifest source names no repo
    endpoint: str  # the hub's base URL: requests to its origin carry the credentials
    _token: str | None  # the user's token for the hub, None without one

    @classmethod
    def open(cls: type[_Opened], source: SourceSpec, policy: RetryPolicy | None = None) -> _Opened:
        if not source.repo:
            raise UsageError(cls.needs_repo)
        return cls(source.repo, source.revision, policy)

    def request_headers(self, url: str) -> dict[str, str]:
        headers = super().request_headers(url)
        if self._token and origin(url) == origin(self.endpoint):
            headers.update(self.credentials(self._token))
        return headers

    def credentials(self, token: str) -> dict[str, str]:
        """The headers that carry the user's token to the hub."""
        raise NotImplementedError


def short_error(exc: BaseException) -> str:
    """A hub library's exception as one line, credentials redacted."""
    text = str(exc).strip().splitlines()
    return redacted(f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": "))
