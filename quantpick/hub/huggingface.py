"""Hugging Face: a repository listed and pinned through huggingface_hub, bytes over plain HTTP."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote, urlsplit

from quantpick.errors import DownloadError
from quantpick.hub.base import RemoteFile, RepositorySource, short_error
from quantpick.hub.http import (
    RetryPolicy,
    TransientError,
    default_policy,
    url_label,
    with_retries,
)

HF_DEFAULT_ENDPOINT = "https://huggingface.co"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _env_seconds(name: str) -> float | None:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return None
    return value if value > 0 else None


class HFSource(RepositorySource):
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
    needs_repo = "an hf source needs a repo"

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

        from quantpick.hub.http import (
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
                raise ConnectionRefused(short_error(exc) or type(exc).__name__) from None
            raise TransientError(short_error(exc) or type(exc).__name__) from None
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

    def credentials(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

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
        return DownloadError(f"Hugging Face {self.repo}: {short_error(exc)}")
