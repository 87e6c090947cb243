"""Answers replayed: a planning command run again with the same inputs prints what it printed,
without building the CLI or searching again.

`pick`, `max-context` and `estimate` are pure functions of their inputs when the machine is
described and nothing is asked of a hub: the argv, the environment, the terminal, and the files
they read (manifests, the config file, cached GGUF headers, the llama.cpp build in use, the
code itself). A run is recorded the way ccache's direct mode and make record a build: every
file it opens or stats, every directory it lists, is noted with its stat signature (mode,
inode, size, mtime, ctime: git's index uses the same fields to tell that a file changed; a
directory it only stats, by its mode and inode: that it is still this directory), and the output
it wrote is stored beside them. The next run with the same argv, environment and
terminal re-stats those paths; if every one still matches, the stored output and exit code
are replayed. Anything else is a new recording.

A run that asks this machine anything live is never stored: a program it starts, a socket, a
native library loaded (NVML), a read under /proc, /sys or /dev, free disk space, the CPU count
or memory size. So is a run that writes a file, fails, or is interrupted. Python's audit hooks
(PEP 578) report opens, directory listings, sockets, subprocesses and library loads; `os.stat`,
`os.access` and the host queries are wrapped while the command runs, since no audit event
reports them. `QUANTPICK_NO_ANSWER_CACHE=1` turns replay and recording off.

Only the standard library and platformdirs are imported here: the point is to answer before
typer, rich and the planner are loaded (benchmarks/startup.py).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from quantpick.app_dirs import app_dirs
from quantpick.local_files import Signature, read_small_text
from quantpick.local_files import stat_signature as signature

# Commands whose answer depends only on their inputs once nothing live is read.
COMMANDS = frozenset({"pick", "max-context", "estimate"})
DISABLE_ENV = "QUANTPICK_NO_ANSWER_CACHE"
FORMAT = 1  # of the stored file; another value is a miss
# A store holds at most this many answers; the oldest go first. One answer is ~85 KB (the goal
# row of benchmarks/startup.py: ~540 recorded paths with their signatures, and its output).
MAX_ANSWERS = 256
# A stored answer larger than this is neither written nor read (a bounded read: read_small).
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# Variables a shell changes between two identical commands: not inputs of the answer.
VOLATILE_ENV = frozenset({"_", "OLDPWD", "SHLVL"})
LIVE_PREFIXES = ("/proc/", "/sys/", "/dev/")
QUIET_DEVICES = frozenset({"/dev/null"})  # read as empty: not machine state

# os functions that read this machine's live state and raise no audit event.
_HOST_QUERIES = ("statvfs", "cpu_count", "sysconf", "getloadavg", "sched_getaffinity")
# Audit events (https://docs.python.org/3/library/audit_events.html) that make a run live.
_LIVE_EVENTS = {
    "subprocess.Popen": "runs a program",
    "os.system": "runs a program",
    "os.exec": "runs a program",
    "os.posix_spawn": "runs a program",
    "os.spawn": "runs a program",
    "os.fork": "runs a program",
    "os.forkpty": "runs a program",
    "socket.connect": "uses the network",
    "socket.bind": "uses the network",
    "socket.getaddrinfo": "uses the network",
    "socket.gethostbyname": "uses the network",
    "socket.sendto": "uses the network",
    "ctypes.dlopen": "loads a native library",
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def enabled(argv: list[str], env: dict[str, str] | os._Environ[str]) -> bool:
    """Whether this run may replay or record: a planning command, not turned off, no completion."""
    if env.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    if any(name.startswith("_QUANTPICK") and name.endswith("_COMPLETE") for name in env):
        return False
    command = next((a for a in argv if not a.startswith("-")), None)
    return command in COMMANDS and "--help" not in argv


def store_dir(env: dict[str, str] | os._Environ[str]) -> Path:
    """`answers/` in quantpick's cache directory (app_dirs, the rule config.load_settings uses)."""
    return app_dirs(env).cache / "answers"


def inputs(argv: list[str], env: dict[str, str] | os._Environ[str]) -> str:
    """Everything besides files that the answer depends on, as one string: the interpreter, the
    code's version, argv, the working directory, the environment and the terminal."""
    from quantpick import __version__

    terminal = []
    for fd in (1, 2):
        try:
            tty = os.isatty(fd)
            size = tuple(os.get_terminal_size(fd)) if tty else None
        except OSError:
            tty, size = False, None
        terminal.append([tty, size])
    return json.dumps(
        [
            FORMAT,
            __version__,
            sys.executable,
            sys.version,
            argv,
            os.getcwd(),
            sorted((k, v) for k, v in env.items() if k not in VOLATILE_ENV),
            terminal,
        ]
    )


def answer_path(store: Path, material: str) -> Path:
    data = material.encode("utf-8", "surrogateescape")
    return store / f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}.json"


def trusted(path: Path) -> bool:
    """Whether a stored answer is this user's own: the file and its folder owned by this user
    and writable by nobody else (as ssh checks its keys). A store in a shared folder that
    someone else could write to is never replayed: a planted answer would print their command."""
    if not hasattr(os, "getuid"):
        return True
    for where in (path, path.parent):
        st = os.lstat(where)  # before any recording wraps it
        if (
            st.st_uid != os.getuid()
            or st.st_mode & 0o022
            or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))
        ):
            return False
    return True


class Answer(NamedTuple):  # not a dataclass: every command imports this module, --help included
    """A stored answer whose every recorded input is as it was: what to write, and the code."""

    output: tuple[tuple[int, str], ...]  # (1 stdout / 2 stderr, text), in the order written
    exit_code: int

    def replay(self, out: TextIO, err: TextIO) -> int:
        """Write the stored output to `out` and `err` in its order; the stored exit code."""
        for fd, text in self.output:
            (out if fd == 1 else err).write(text)
        out.flush()
        err.flush()
        return self.exit_code


def noted_signature(path: str, *, listed: bool) -> Signature:
    """The signature a run depends on: a directory it only stat'ed (an ancestor that realpath
    walks, a folder tested for existence) is that it is this directory (mode, inode), not what it
    holds: its mtime moves whenever anything is created beside the run's inputs (/tmp, a shared
    home), which would spoil every recording; a directory it listed, and every file, keeps the
    whole signature."""
    sig = signature(path)
    if not listed and sig is not None and sig[0] >= 0 and stat.S_ISDIR(sig[0]):
        return sig[:2]
    return sig


def is_kind_only(sig: Signature) -> bool:
    return sig is not None and len(sig) == 2


def unchanged(path: str, sig: Signature) -> bool:
    """Whether `path` still has the signature recorded (the kind only where that was recorded)."""
    now = signature(path)
    if is_kind_only(sig) and now is not None:
        return now[:2] == sig
    return now == sig


def lookup(argv: list[str], env: dict[str, str] | os._Environ[str]) -> Answer | None:
    """The stored answer for this argv, environment and terminal when every input it recorded
    is unchanged and the store is this user's own; None otherwise (nothing is written)."""
    try:
        material = inputs(argv, env)
        path = answer_path(store_dir(env), material)
        if not trusted(path):
            return None
        stored = json.loads(read_small_text(path, MAX_ANSWER_BYTES, follow=False))
        if stored.get("format") != FORMAT or stored.get("inputs") != material:
            return None
        if not all(unchanged(p, sig) for p, sig in stored["files"]):
            return None
        return Answer(
            tuple((int(fd), str(text)) for fd, text in stored["output"]), int(stored["exit"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Tee:
    """A text stream that passes every write through and keeps a copy, in order across streams."""

    def __init__(self, inner: TextIO, fd: int, log: list[tuple[int, str]]) -> None:
        self._inner = inner
        self._fd = fd
        self._log = log

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, buffer, ...
        return getattr(self._inner, name)

    def write(self, text: str) -> int:
        written = self._inner.write(text)  # a bytes probe (click's) raises here, unrecorded
        self._log.append((self._fd, text))
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._inner.flush()


class Recorder:
    """One run's inputs and output, gathered while the command runs (see the module's text)."""

    def __init__(self, argv: list[str], env: dict[str, str] | os._Environ[str]) -> None:
        self.argv = list(argv)
        self.env = env
        self.material = inputs(argv, env)
        self.paths: dict[str, Signature] = {}  # as first seen, before the command read it
        self.why_not: str | None = None  # why this run cannot be stored (None: it can)
        self.output: list[tuple[int, str]] = []
        self.active = False
        self._saved: dict[str, Callable[..., Any]] = {}

    # -- watching
    def start(self) -> None:
        self.active = True
        sys.addaudithook(self._audit)
        for name in ("stat", "lstat", "access"):
            self._wrap(name, self._noting_path)
        for name in _HOST_QUERIES:
            if hasattr(os, name):
                self._wrap(name, self._spoiling)
        sys.stdout = Tee(sys.stdout, 1, self.output)  # type: ignore[assignment]
        sys.stderr = Tee(sys.stderr, 2, self.output)  # type: ignore[assignment]

    def stop(self) -> None:
        self.active = False  # an audit hook cannot be removed: it goes quiet
        for name, original in self._saved.items():
            setattr(os, name, original)
        self._saved.clear()

    def _wrap(
        self, name: str, make: Callable[[str, Callable[..., Any]], Callable[..., Any]]
    ) -> None:
        original = getattr(os, name)
        self._saved[name] = original
        setattr(os, name, make(name, original))

    def _noting_path(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            if self.active:
                if kwargs.get("dir_fd") is not None:
                    self.spoil(f"reads a path relative to a directory descriptor (os.{name})")
                else:
                    self._note(path, listed=False)
            return original(path, *args, **kwargs)

        return call

    def _spoiling(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.spoil(f"reads this machine's state (os.{name})")
            return original(*args, **kwargs)

        return call

    def spoil(self, why: str) -> None:
        if self.active and self.why_not is None:
            self.why_not = why

    def _note(self, path: Any, *, listed: bool = True) -> None:
        if isinstance(path, int) or self.why_not is not None:
            return
        try:
            text = os.path.abspath(os.fsdecode(path))
        except (TypeError, ValueError):
            return
        if text.startswith(LIVE_PREFIXES) and text not in QUIET_DEVICES:
            self.spoil(f"reads {text}")
        elif text not in self.paths or (listed and is_kind_only(self.paths[text])):
            self.paths[text] = noted_signature(text, listed=listed)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and path not in QUIET_DEVICES:
                self.spoil(f"writes {path}")
            elif path is not None:
                self._note(path)
        elif event in ("os.listdir", "os.scandir"):
            self._note(args[0] if args and args[0] is not None else ".")
        elif event in _LIVE_EVENTS:
            self.spoil(_LIVE_EVENTS[event])

    # -- storing
    def save(self, exit_code: int) -> Path | None:
        """Store the answer when the run was pure, ended with a documented answer's exit code and
        read no input that changed while it ran; the path written, or None (`why_not` says)."""
        self.stop()
        if self.why_not is None and exit_code not in (0, 3):
            self.why_not = f"exit {exit_code}"
        if self.why_not is None:
            changed = next((p for p, sig in self.paths.items() if not unchanged(p, sig)), None)
            if changed is not None:
                self.why_not = f"{changed} changed while the command ran"
        if self.why_not is not None:
            return None
        files = dict(self.paths)
        for module in list(sys.modules.values()):
            source = getattr(module, "__file__", None)
            if isinstance(source, str):
                code = os.path.abspath(source)
                files.setdefault(code, signature(code))
        record: dict[str, Any] = {
            "format": FORMAT,
            "inputs": self.material,
            "files": sorted([p, sig] for p, sig in files.items()),
            "output": self.output,
            "exit": exit_code,
        }
        from quantpick.outputs import write_atomic

        try:
            store = store_dir(self.env)
            store.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = answer_path(store, self.material)
            data = json.dumps(record).encode()
            if len(data) > MAX_ANSWER_BYTES:
                self.why_not = f"the answer is over {MAX_ANSWER_BYTES} bytes"
                return None
            write_atomic(path, data, durable=False, mode=0o600)
            prune(store)
        except OSError as exc:
            self.why_not = f"cannot store it: {exc.strerror or exc}"
            return None
        return path


def prune(store: Path, keep: int = MAX_ANSWERS) -> None:
    """Remove the oldest answers beyond `keep`."""
    try:
        entries = [e for e in os.scandir(store) if e.name.endswith(".json")]
        if len(entries) <= keep:
            return
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
        for entry in entries[: len(entries) - keep]:
            os.unlink(entry.path)
    except OSError:
        pass
