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
from quantpick.fetch.http import (
    RetryPolicy,
    TransientError,
    default_policy,
    origin,
    url_label,
    with_retries,
)
from quantpick.safe_names import name_problem, path_conflicts, safe_relative_name, shown

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
        from quantpick.fetch.http import fetch_small

        try:
            remote = self.resolve(name)
        except DownloadError:
            return None
        data = fetch_small(
            remote.url, self.request_headers, max_bytes=max_bytes, policy=self.policy
        )
        return None if data is None else data.decode("utf-8", errors="replace")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


class HFSource(RepoSource):
    """Hugging Face: one `repo_info(files_metadata=True)` call pins the revision to a commit and
    lists every file with its size and LFS sha256 (the same commit, so the two cannot disagree).

    Timeouts: huggingface_hub 2.x creates its httpx client with `timeout=None`, and `repo_info`
    and `list_repo_tree` pass `timeout=None` explicitly on each request, which overrides any
    client-wide default (so `set_client_factory` cannot bound them; measured: a hub that accepts
    and never answers hangs both forever). `repo_info` takes a per-call `timeout`, which is the
    library's own knob: it gets an `httpx.Timeout` (from `huggingface_hub.utils.httpx`, the
    library's HTTP module) with quantpick's connect and read timeouts, and the call is retried
    with the transfer engine's backoff (`with_retries`). `HF_HUB_DOWNLOAD_TIMEOUT`, when set,
    replaces the read timeout, as it does for the library's own downloads.
    """

    kind = "hf"

    def __init__(self, repo: str, revision: str | None, policy: RetryPolicy | None = None) -> None:
        import huggingface_hub
        from huggingface_hub import constants

        # Read at call time: huggingface_hub reads HF_ENDPOINT/HF_HUB_OFFLINE once, at import.
        self.endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self.shown_endpoint = url_label(self.endpoint)  # no password in any line
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
        policy = policy or default_policy()
        wanted = revision or "main"

        def attempt() -> Any:
            return self._call(
                lambda timeout: self._api.repo_info(
                    repo, revision=wanted, repo_type="model", files_metadata=True, timeout=timeout
                ),
                policy,
            )

        info = with_retries(f"Hugging Face {repo} ({self.shown_endpoint})", policy, attempt)
        commit = getattr(info, "sha", None) or wanted
        super().__init__(f"hf:{repo}@{commit[:12]}", commit, policy)
        self._siblings = list(getattr(info, "siblings", None) or [])

    def _call(self, call: Any, policy: RetryPolicy) -> Any:
        """One hub call with timeouts; transient failures become TransientError (retried)."""
        from huggingface_hub.errors import HfHubHTTPError
        from huggingface_hub.utils import httpx as hx  # the HTTP library huggingface_hub uses

        from quantpick.fetch.http import (
            ConnectionRefused,
            UnreachableError,
            connection_refused,
            name_unresolved,
            retry_after_seconds,
        )

        read = _env_seconds("HF_HUB_DOWNLOAD_TIMEOUT") or policy.idle_timeout
        timeout = hx.Timeout(read, connect=policy.connect_timeout)
        try:
            return call(timeout)
        except hx.UnsupportedProtocol as exc:
            raise self._error(exc) from None
        except hx.TransportError as exc:  # timeouts, refused/reset connections, proxy errors
            if name_unresolved(exc):
                raise UnreachableError(urlsplit(self.endpoint).hostname or "the hub") from None
            if connection_refused(exc):
                raise ConnectionRefused(_short(exc) or type(exc).__name__) from None
            raise TransientError(_short(exc) or type(exc).__name__) from None
        except HfHubHTTPError as exc:
            response = getattr(exc, "response", None)
            status = getattr(response, "status_code", None)
            if isinstance(status, int) and (status in (408, 429) or status >= 500):
                after = response.headers.get("Retry-After") if response is not None else None
                raise TransientError(f"HTTP {status}", retry_after_seconds(after)) from None
            raise self._error(exc) from None
        except Exception as exc:  # noqa: BLE001 - mapped to one clear message
            raise self._error(exc) from None

    def _list(self) -> list[RemoteFile]:
        files = []
        for sibling in self._siblings:
            name = getattr(sibling, "rfilename", None)
            if not isinstance(name, str):
                continue
            lfs = getattr(sibling, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
            if sha is None and isinstance(lfs, dict):
                sha = lfs.get("sha256")
            url = (
                f"{self.endpoint}/{self.repo}/resolve/{quote(self.revision or 'main', safe='')}/"
                f"{quote(name)}"
            )
            size = getattr(sibling, "size", None)
            files.append(
                RemoteFile(
                    name,
                    size if isinstance(size, int) else None,
                    sha.lower() if isinstance(sha, str) else None,
                    url,
                    "hf",
                    self.revision,
                )
            )
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

        page = f"{self.shown_endpoint}/{self.repo}"
        if isinstance(exc, GatedRepoError):
            return DownloadError(
                f"{self.repo} is gated on Hugging Face",
                hint=f"accept its conditions at {page}, then log in with `hf auth login` "
                "or set HF_TOKEN",
            )
        if isinstance(exc, RepositoryNotFoundError):
            logged = "with the token you have" if self._token else "without a token"
            return DownloadError(
                f"{self.repo} was not found on {self.shown_endpoint} ({logged})",
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

    def __init__(self, repo: str, revision: str | None, policy: RetryPolicy | None = None) -> None:
        from modelscope_hub.api import HubApi
        from modelscope_hub.config import HubConfig

        # A fresh config each time: MODELSCOPE_ENDPOINT (or the deprecated MODELSCOPE_DOMAIN)
        # and MODELSCOPE_API_TOKEN / the `modelscope login` credentials, read now.
        config = HubConfig()
        self.endpoint = str(config.endpoint).rstrip("/")
        self._token: str | None = config.token or None
        self._api = HubApi(config=config)
        self.repo = repo
        super().__init__(f"modelscope:{repo}@{revision or 'master'}", revision or "master", policy)

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


def _env_seconds(name: str) -> float | None:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def _short(exc: BaseException) -> str:
    from quantpick.fetch.http import redacted

    text = str(exc).strip().splitlines()
    return redacted(f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": "))


def open_source(
    source: Source, *, settings: Settings | None = None, policy: RetryPolicy | None = None
) -> RepoSource:
    """A RepoSource for one manifest source. Hub sources contact the hub (revision pinning).

    Every network call made through it has connect and read timeouts and retries with backoff
    (`policy`, default `http.default_policy()`); ModelScope's library brings its own (connect
    10 s, read 60 s, 15 s per listing page, retried: modelscope_hub.constants). Raises
    DownloadError when the hub cannot be reached or refuses the repository.
    """
    del settings  # reserved: a per-user listing cache would live in settings.cache_dir
    if source.kind == "hf":
        if not source.repo:
            raise UsageError("an hf source needs a repo")
        return HFSource(source.repo, source.revision, policy)
    if source.kind == "modelscope":
        if not source.repo:
            raise UsageError("a modelscope source needs a repo")
        return ModelScopeSource(source.repo, source.revision, policy)
    if source.kind == "mirror":
        if not source.url_template:
            raise UsageError("a mirror source needs a url_template")
        return MirrorSource(source.url_template, source.revision, source.name, policy)
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
