"""Source adapters: where a manifest's files live and how to ask for them.

Hugging Face and ModelScope are read through their own libraries for metadata, auth and endpoint
resolution (imported inside the methods that talk to a hub, never at module level: 130-180 ms of
import each). The bytes themselves are fetched by quantpick.fetch.transfer over plain HTTP, on the
URLs built here, with the headers `request_headers(url)` gives.

Contract used by other modules: RemoteFile, RepoSource, open_source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_plus, urlsplit

from quantpick.errors import DownloadError, UsageError, VerificationError
from quantpick.fetch.http import origin
from quantpick.safe_names import safe_relative_name

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.model.manifest import Source

SOURCE_KINDS = ("hf", "modelscope", "mirror")
HF_DEFAULT_ENDPOINT = "https://huggingface.co"


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

    def __init__(self, label: str, revision: str | None) -> None:
        self.label = label
        self.revision = revision
        self._files: dict[str, RemoteFile] | None = None

    def _list(self) -> list[RemoteFile]:
        raise NotImplementedError

    def list_files(self) -> list[RemoteFile]:
        """Every file of the repository at the pinned revision (hostile names dropped)."""
        if self._files is None:
            files: dict[str, RemoteFile] = {}
            for remote in self._list():
                try:
                    safe_relative_name(remote.name)
                except VerificationError:
                    continue  # never exposed, so never written
                files[remote.name] = remote
            self._files = files
        return list(self._files.values())

    def resolve(self, name: str) -> RemoteFile:
        safe_relative_name(name)
        self.list_files()
        assert self._files is not None
        if name not in self._files:
            raise DownloadError(f"{name} is not in {self.label}")
        return self._files[name]

    def request_headers(self, url: str) -> dict[str, str]:
        return {"User-Agent": user_agent()}

    def fetch_text(self, name: str, max_bytes: int) -> str | None:
        """A small file (SHA256SUMS, README) as text; None when the source does not have it."""
        from quantpick.fetch.http import fetch_small

        try:
            remote = self.resolve(name)
        except DownloadError:
            return None
        data = fetch_small(remote.url, self.request_headers, max_bytes=max_bytes)
        return None if data is None else data.decode("utf-8", errors="replace")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


class HFSource(RepoSource):
    """Hugging Face: revision pinned to a commit, listing via the tree API (sizes, LFS sha256)."""

    kind = "hf"

    def __init__(self, repo: str, revision: str | None) -> None:
        import huggingface_hub
        from huggingface_hub import constants

        # Read at call time: huggingface_hub reads HF_ENDPOINT/HF_HUB_OFFLINE once, at import.
        self.endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self.repo = repo
        self.revision = revision or "main"  # until repo_info pins it to the commit
        if _truthy(os.environ.get("HF_HUB_OFFLINE")) or constants.HF_HUB_OFFLINE:
            raise DownloadError(
                f"cannot reach {repo} on Hugging Face: offline mode is on (HF_HUB_OFFLINE)",
                hint="unset HF_HUB_OFFLINE to download; `quantpick verify DIR` checks files "
                "already on disk",
            )
        self._token = huggingface_hub.get_token()  # HF_TOKEN, else the `hf auth login` token
        self._api = huggingface_hub.HfApi(endpoint=self.endpoint, token=self._token or False)
        wanted = revision or "main"
        try:
            info = self._api.repo_info(repo, revision=wanted, repo_type="model")
        except Exception as exc:  # noqa: BLE001 - mapped to one clear message below
            raise self._error(exc) from None
        commit = getattr(info, "sha", None) or wanted
        super().__init__(f"hf:{repo}@{commit[:12]}", commit)

    def _list(self) -> list[RemoteFile]:
        from huggingface_hub.hf_api import RepoFile

        try:
            entries = list(
                self._api.list_repo_tree(
                    self.repo, revision=self.revision, recursive=True, repo_type="model"
                )
            )
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc) from None
        files = []
        for entry in entries:
            if not isinstance(entry, RepoFile):
                continue
            sha = entry.lfs.sha256.lower() if entry.lfs is not None else None
            url = (
                f"{self.endpoint}/{self.repo}/resolve/{quote(self.revision or 'main', safe='')}/"
                f"{quote(entry.path)}"
            )
            files.append(RemoteFile(entry.path, entry.size, sha, url, "hf", self.revision))
        return files

    def request_headers(self, url: str) -> dict[str, str]:
        headers = super().request_headers(url)
        if self._token and origin(url) == origin(self.endpoint):
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _error(self, exc: Exception) -> DownloadError:
        from huggingface_hub.errors import (
            GatedRepoError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        page = f"{self.endpoint}/{self.repo}"
        if isinstance(exc, GatedRepoError):
            return DownloadError(
                f"{self.repo} is gated on Hugging Face",
                hint=f"accept its conditions at {page}, then log in with `hf auth login` "
                "or set HF_TOKEN",
            )
        if isinstance(exc, RepositoryNotFoundError):
            logged = "with the token you have" if self._token else "without a token"
            return DownloadError(
                f"{self.repo} was not found on {self.endpoint} ({logged})",
                hint="check the repo id; if it is private, log in with `hf auth login` or set "
                "HF_TOKEN to a token that can read it",
            )
        if isinstance(exc, RevisionNotFoundError):
            return DownloadError(f"{self.repo} has no revision {self.revision!r}")
        if isinstance(exc, OfflineModeIsEnabled):
            return DownloadError("Hugging Face offline mode is on (HF_HUB_OFFLINE)")
        return DownloadError(f"Hugging Face {self.repo}: {_short(exc)}")


class ModelScopeSource(RepoSource):
    """ModelScope: listing with Size and Sha256 via modelscope_hub, bytes from the /repo route."""

    kind = "modelscope"

    def __init__(self, repo: str, revision: str | None) -> None:
        from modelscope_hub.api import HubApi
        from modelscope_hub.config import HubConfig

        # A fresh config each time: MODELSCOPE_ENDPOINT (or the deprecated MODELSCOPE_DOMAIN)
        # and MODELSCOPE_API_TOKEN / the `modelscope login` credentials, read now.
        config = HubConfig()
        self.endpoint = str(config.endpoint).rstrip("/")
        self._token: str | None = config.token or None
        self._api = HubApi(config=config)
        self.repo = repo
        super().__init__(f"modelscope:{repo}@{revision or 'master'}", revision or "master")

    def _list(self) -> list[RemoteFile]:
        try:
            entries = self._api.list_repo_files(
                self.repo, "model", revision=self.revision, recursive=True
            )
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc) from None
        files = []
        for entry in entries:
            if entry.is_dir or not entry.path:
                continue
            url = (
                f"{self.endpoint}/api/v1/models/{self.repo}/repo?"
                f"Revision={quote_plus(self.revision or 'master')}"
                f"&FilePath={quote_plus(entry.path)}"
            )
            sha = (entry.sha256 or "").lower() or None
            files.append(RemoteFile(entry.path, entry.size, sha, url, "modelscope", self.revision))
        return files

    def request_headers(self, url: str) -> dict[str, str]:
        headers = super().request_headers(url)
        if self._token and origin(url) == origin(self.endpoint):
            # modelscope authenticates with its session cookie, as its own client does.
            headers["Cookie"] = f"m_session_id={self._token}"
        return headers

    def _error(self, exc: Exception) -> DownloadError:
        from modelscope_hub import errors

        if isinstance(exc, (errors.AuthenticationError, errors.PermissionDeniedError)):
            return DownloadError(
                f"ModelScope refused access to {self.repo}",
                hint="log in with `modelscope login` or set MODELSCOPE_API_TOKEN",
            )
        if isinstance(exc, errors.NotExistError):
            return DownloadError(
                f"{self.repo} (revision {self.revision}) was not found on ModelScope"
            )
        return DownloadError(f"ModelScope {self.repo}: {_short(exc)}")


class MirrorSource(RepoSource):
    """A plain URL template ("https://host/path/{file}"): no listing, no hashes of its own."""

    kind = "mirror"

    def __init__(self, template: str, revision: str | None, name: str | None) -> None:
        if "{file}" not in template:
            raise UsageError(f"mirror URL template {template!r} has no {{file}} placeholder")
        self.template = template
        host = urlsplit(template).hostname or template
        super().__init__(f"mirror:{name or host}", revision)

    def _list(self) -> list[RemoteFile]:
        return []

    def resolve(self, name: str) -> RemoteFile:
        safe_relative_name(name)
        url = self.template.replace("{file}", quote(name)).replace(
            "{revision}", quote(self.revision or "main", safe="")
        )
        return RemoteFile(name, None, None, url, "mirror", self.revision)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def open_source(source: Source, *, settings: Settings | None = None) -> RepoSource:
    """A RepoSource for one manifest source. Hub sources contact the hub (revision pinning).

    Raises DownloadError when the hub cannot be reached or refuses the repository.
    """
    del settings  # reserved: a per-user listing cache would live in settings.cache_dir
    if source.kind == "hf":
        if not source.repo:
            raise UsageError("an hf source needs a repo")
        return HFSource(source.repo, source.revision)
    if source.kind == "modelscope":
        if not source.repo:
            raise UsageError("a modelscope source needs a repo")
        return ModelScopeSource(source.repo, source.revision)
    if source.kind == "mirror":
        if not source.url_template:
            raise UsageError("a mirror source needs a url_template")
        return MirrorSource(source.url_template, source.revision, source.name)
    raise UsageError(
        f"unknown source kind {source.kind!r}", hint=f"one of {', '.join(SOURCE_KINDS)}"
    )


def describe(source: Source) -> dict[str, Any]:
    """A JSON-ready view of a manifest source (no credentials ever)."""
    return {
        "kind": source.kind,
        "repo": source.repo,
        "revision": source.revision,
        "url_template": source.url_template,
        "name": source.name,
    }
