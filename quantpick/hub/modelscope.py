"""ModelScope: a repository listed through modelscope_hub (Size, Sha256), bytes from its /repo
route over plain HTTP."""

from __future__ import annotations

from urllib.parse import quote_plus

from quantpick.errors import DownloadError
from quantpick.hub.base import RemoteFile, RepositorySource, short_error
from quantpick.hub.http import RetryPolicy


class ModelScopeSource(RepositorySource):
    """ModelScope: listing with Size and Sha256 via modelscope_hub, bytes from the /repo route."""

    kind = "modelscope"
    needs_repo = "a modelscope source needs a repo"

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

    def credentials(self, token: str) -> dict[str, str]:
        # modelscope authenticates with its session cookie, as its own client does.
        return {"Cookie": f"m_session_id={token}"}

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
        return DownloadError(f"ModelScope {self.repo}: {short_error(exc)}")
