"""Exit codes and the expected-failure exceptions every module raises (no typer/click here)."""

from __future__ import annotations

import re
from enum import IntEnum
from typing import TypeVar

# `scheme://user:password@host` (or `scheme://token@host`): what a URL with credentials looks like
# inside any text (an exception's message, httpx's "for url '...'", a retry line).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s'\"<>]*@")


def redacted(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by `***`
    (`http://user:pw@host` -> `http://***@host`): HF_ENDPOINT's password is never printed."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1  # any QuantpickError without a more specific code
    USAGE = 2  # bad flags or arguments (click's own code for usage errors)
    NO_FIT = 3  # planner: nothing fits the machine at the requested context
    VERIFY_FAILED = 4  # a checksum or size mismatch
    DOWNLOAD_FAILED = 5  # network / hub failure after retries
    RPC_WORKER = 6  # an llama.cpp RPC worker is unreachable, busy or speaks another protocol
    MODEL_REJECTED = 7  # llama.cpp itself cannot load the model file (its own reason is shown)
    SERVER = 8  # llama-server missing, too old for the model, failed to load it or to answer
    DIFFERS = 9  # check: the server runs, but not as planned, at a cost in speed or memory
    INTERRUPTED = 130  # 128 + SIGINT
    TERMINATED = 143  # 128 + SIGTERM


E = TypeVar("E", bound="QuantpickError")


class QuantpickError(Exception):
    """An expected failure: one line for the user, no traceback.

    `path` and `os_errno`: the file the failure is about and the OS error met on it, when there
    is one. The CLI boundary then exits 2 (usage), as for a bare OSError, when that path is one
    the user gave on the command line and the error says it is plainly wrong (missing,
    read-only, ...): `--gguf missing.gguf`, `--dir /read-only`.
    """

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        path: str | None = None,
        os_errno: int | None = None,
    ) -> None:
        # every expected failure's line: a URL's password in it (HF_ENDPOINT) is never shown
        message, hint = redacted(message), redacted(hint) if hint is not None else None
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.path = path
        self.os_errno = os_errno

    @classmethod
    def unreadable(cls: type[E], what: str, path: object, exc: OSError) -> E:
        """The file `what path` could not be read: one line with the OS's reason, and the path
        and errno the CLI boundary reads (exit 2 for a path the user gave that is plainly
        wrong)."""
        return cls(
            f"cannot read {what} {path}: {exc.strerror or exc}", path=str(path), os_errno=exc.errno
        )


class UsageError(QuantpickError):
    """Flags or arguments that cannot be honoured (exit 2)."""

    exit_code = ExitCode.USAGE


class ManifestError(QuantpickError):
    """A manifest that does not load or does not validate."""


class UnknownModelError(ManifestError):
    """A MODEL that names no manifest: a bad argument, like an unknown quant (exit 2)."""

    exit_code = ExitCode.USAGE


class HardwareError(QuantpickError):
    """A described machine that cannot be read."""


class GGUFError(QuantpickError):
    """A GGUF header that is missing, truncated, hostile or of an unknown architecture."""


class NoFitError(QuantpickError):
    """No candidate fits the machine (exit 3)."""

    exit_code = ExitCode.NO_FIT


class VerificationError(QuantpickError):
    """A file whose sha256 or size does not match what was expected (exit 4)."""

    exit_code = ExitCode.VERIFY_FAILED


class DownloadError(QuantpickError):
    """A transfer or hub failure after retries (exit 5)."""

    exit_code = ExitCode.DOWNLOAD_FAILED


class RpcWorkerError(QuantpickError):
    """An llama.cpp RPC worker (ggml-rpc-server) that cannot be read (exit 6): unreachable, busy
    with another client, or speaking another protocol version."""

    exit_code = ExitCode.RPC_WORKER


class ModelRejectedError(QuantpickError):
    """llama.cpp cannot load the model file (exit 7): its own reason, e.g. a tensor of the wrong
    shape or an architecture the build does not know. Nothing is written for such a file."""

    exit_code = ExitCode.MODEL_REJECTED


class ServerError(QuantpickError):
    """llama-server could not serve the model (exit 8): none found, a build too old for the
    architecture, a load that failed (its own log lines are in `log_lines`), or no answer on
    /health in time."""

    exit_code = ExitCode.SERVER

    def __init__(
        self, message: str, *, hint: str | None = None, log_lines: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, hint=hint)
        self.log_lines = log_lines
