"""What a file transfer reports: `ProgressSink` (the messages and byte counts the CLI's bars
show; `NullProgress` shows nothing) and `DownloadResult` (one file, as `--json` lists it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class ProgressSink(Protocol):
    def message(self, text: str) -> None: ...
    def total_started(self, n_files: int, total_bytes: int) -> None: ...
    def file_started(self, name: str, total: int | None, done: int) -> None: ...
    def advance(self, name: str, n_bytes: int) -> None: ...
    def file_finished(self, name: str, result: DownloadResult) -> None: ...

    # Optional (looked up with getattr): `connections(name, n)`, the connection count of a
    # segmented transfer when it changes (quantpick.cli.download's terminal bars show it).


class NullProgress:
    def message(self, text: str) -> None:
        pass

    def total_started(self, n_files: int, total_bytes: int) -> None:
        pass

    def file_started(self, name: str, total: int | None, done: int) -> None:
        pass

    def advance(self, name: str, n_bytes: int) -> None:
        pass

    def file_finished(self, name: str, result: DownloadResult) -> None:
        pass


@dataclass(frozen=True)
class DownloadResult:
    name: str
    path: Path
    size: int
    sha256: str
    verified: bool  # the sha256 matched a known hash (False only with --allow-unverified)
    bytes_fetched: int  # bytes transferred by this run (0 when the file was already there)
    resumed_from: int  # bytes of an earlier run kept (0: started from scratch)
    source: str  # label of the source used, e.g. "hf:org/name@1a2b3c4d5e6f"
    reused: bool  # the final file was already present and verified
    connections: int = 0  # most connections used at once (0: nothing transferred)
    seconds: float = 0.0  # wall time of the transfer, verification and fsync included

    @property
    def rate(self) -> float | None:
        """Bytes per second of this run's transfer (None when nothing was transferred)."""
        if not self.bytes_fetched or self.seconds <= 0:
            return None
        return self.bytes_fetched / self.seconds

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (`--json` of download and get)."""
        rate = self.rate
        return {
            "name": self.name,
            "path": str(self.path),
            "size": self.size,
            "sha256": self.sha256,
            "verified": self.verified,
            "bytes_fetched": self.bytes_fetched,
            "resumed_from": self.resumed_from,
            "reused": self.reused,
            "source": self.source,
            "connections": self.connections,
            "seconds": round(self.seconds, 3),
            "rate_bytes_per_s": round(rate) if rate is not None else None,
        }
