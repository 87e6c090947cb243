"""Running another program with bounds on time and memory: llama.cpp's tools.

Every llama.cpp tool quantpick runs (`llama-server --version/--help`, `llama-fit-params`,
`llama-bench`, `llama-server` for a bench) goes through `run_tool` or `ToolProcess`:

- it starts in a session of its own (setsid), so the tool and everything it starts form one
  process group, and a timeout kills the whole group (SIGKILL to the group; a tool that forked a
  helper leaves nothing running);
- stdout is kept up to a cap (a tool that floods it is stopped there, not read into memory until
  MemoryError); stderr keeps only its last bytes (llama.cpp logs a lot over an hour);
- one deadline covers the run; after the tool itself exits, whatever still holds its pipes (a
  grandchild) gets a short grace, then its group is killed and the pipes are left: quantpick
  never waits without a deadline;
- the child is reaped here with wait4(2), which gives its peak RSS (bench) and never leaves a
  "No child processes" race with subprocess' own waiting.

`printable` strips terminal control sequences (ANSI colours, OSC titles and hyperlinks, cursor
moves) and other control characters from tool text before it is shown.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# What a tool may print on stdout before it is stopped. llama.cpp's largest stdout here is
# `llama-server --help` (43 KB at b11312, tests/data/llama-server-help-current.txt); a
# llama-fit-params table or a llama-bench JSON document is a few KB. 64x the largest.
STDOUT_CAP_BYTES = 4 * 1024**2
# The end of stderr kept for error messages (llama.cpp's reason is among its last lines).
STDERR_TAIL_BYTES = 64 * 1024
# A stderr line longer than this reaches the line callback cut (progress lines are ~100 bytes).
LINE_CAP_BYTES = 4096
# After the tool exits: how long whatever still holds its pipes may keep them open.
PIPE_GRACE_S = 1.0
# After SIGKILL: how long the kernel may take to end the process (uninterruptible I/O).
KILL_WAIT_S = 5.0
# After SIGTERM (ToolProcess.stop): how long a server may take to shut down cleanly.
TERM_GRACE_S = 10.0
_POLL_S = 0.02

_CONTROL = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC ... BEL/ST (titles, hyperlinks)
    r"|\x1b[P^_X][^\x1b]*(?:\x1b\\)?"  # DCS, PM, APC, SOS strings
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor moves, erase)
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
    r"|\x1b[ -/]*[0-~]?"  # other escapes (and a lone ESC)
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # C0 (but \t, \n) and C1 controls, DEL
    r"|[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"  # bidi marks, embeddings, overrides
)
# What `escaped` writes as a visible escape: every C0/C1 control and DEL (newline and tab too:
# one value is one line), and the Unicode bidi controls (UAX #9: ALM, LRM, RLM, LRE..RLO,
# LRI..PDI), which reorder what follows on a terminal ("Trojan Source", CVE-2021-42574).
_UNSAFE_CHAR = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without terminal control sequences or control characters (tabs and newlines
    kept): what a tool printed, safe to show on a terminal."""
    return _CONTROL.sub("", text)


def escaped(text: str) -> str:
    """`text` with every control character and bidi control written as a visible escape
    (`\\x1b`, `\\u202e`): a value from a file (an alias, a path in a record) shown as it is,
    without letting it move the cursor, recolour or reorder the terminal."""

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group(0))
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _UNSAFE_CHAR.sub(escape, text)


@dataclass(frozen=True)
class ToolResult:
    argv: tuple[str, ...]
    returncode: int  # negative: killed by that signal (by quantpick when timed_out/overflowed)
    stdout: str  # at most the cap (decoded, errors replaced)
    stderr: str  # its last STDERR_TAIL_BYTES
    seconds: float
    timed_out: bool = False  # stopped at the deadline
    overflowed: bool = False  # stopped for printing more than the cap on stdout
    max_rss_bytes: int | None = None  # the tool's own peak RSS (wait4's rusage)
    stdout_cap: int = STDOUT_CAP_BYTES

    @property
    def name(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv else "?"

    def bound_exceeded(self, timeout_s: float) -> str | None:
        """Why quantpick stopped the tool, as a phrase ("did not finish in 10 s"), or None."""
        if self.overflowed:
            return f"printed more than {self.stdout_cap // 1024**2} MiB on stdout and was stopped"
        if self.timed_out:
            return f"did not finish in {timeout_s:g} s and was stopped"
        return None

    def last_lines(self, n: int = 40) -> list[str]:
        """The last non-empty lines of stderr then stdout, printable."""
        lines = [printable(ln).strip() for ln in (self.stderr + "\n" + self.stdout).splitlines()]
        return [ln for ln in lines if ln][-n:]


def _max_rss_bytes(ru_maxrss: int) -> int:
    # Linux reports KiB, macOS bytes (getrusage(2)).
    return ru_maxrss if sys.platform == "darwin" else ru_maxrss * 1024


class ToolProcess:
    """One tool, started in its own session, its output read by a background thread.

    with ToolProcess(argv, env=env) as tool:   # leaving the block kills what is left
        ...; tool.poll()                        # exit code or None
        result = tool.stop()                    # SIGTERM, then SIGKILL: a ToolResult
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        capture_stdout: bool = True,
        stdout_cap: int = STDOUT_CAP_BYTES,
        stderr_tail: int = STDERR_TAIL_BYTES,
        on_stderr_line: Callable[[str], None] | None = None,
    ) -> None:
        self.argv = tuple(str(a) for a in argv)
        self.stdout_cap = stdout_cap
        self._stderr_tail = stderr_tail
        self._on_line = on_stderr_line
        self._out = bytearray()
        self._err = bytearray()
        self._partial = bytearray()
        self.overflowed = threading.Event()
        self._stop_reading = threading.Event()
        self.returncode: int | None = None
        self.max_rss_bytes: int | None = None
        self.timed_out = False
        self.started = time.monotonic()
        # Raises OSError (FileNotFoundError, PermissionError, ...) like subprocess.
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture_stdout else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, **env} if env is not None else None,
            start_new_session=True,
        )
        self.pid = self._proc.pid
        pipes = [p for p in (self._proc.stdout, self._proc.stderr) if p is not None]
        for pipe in pipes:
            os.set_blocking(pipe.fileno(), False)
        self._reader = threading.Thread(
            target=self._read, args=(pipes,), name=f"{self.argv[0]}-output", daemon=True
        )
        self._reader.start()

    # ---- output ------------------------------------------------------------------------------

    def _read(self, pipes: list) -> None:
        sel = selectors.DefaultSelector()
        for pipe in pipes:
            sel.register(pipe.fileno(), selectors.EVENT_READ, pipe is self._proc.stdout)
        try:
            while sel.get_map() and not self._stop_reading.is_set():
                for key, _ in sel.select(timeout=0.1):
                    try:
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(key.fd)
                    elif key.data:
                        self._stdout_chunk(chunk)
                    else:
                        self._stderr_chunk(chunk)
        finally:
            sel.close()
            if self._partial:
                self._emit_line(bytes(self._partial))
                self._partial.clear()

    def _stdout_chunk(self, chunk: bytes) -> None:
        room = self.stdout_cap - len(self._out)
        if room > 0:
            self._out += chunk[:room]
        if len(chunk) > room:
            self.overflowed.set()  # the rest is read and dropped, so the tool never blocks

    def _stderr_chunk(self, chunk: bytes) -> None:
        self._err += chunk
        if len(self._err) > self._stderr_tail:
            del self._err[: len(self._err) - self._stderr_tail]
        if self._on_line is None:
            return
        self._partial += chunk
        while True:
            cut = self._partial.find(b"\n")
            if cut < 0:
                break
            self._emit_line(bytes(self._partial[:cut]))
            del self._partial[: cut + 1]
        if len(self._partial) > LINE_CAP_BYTES:
            self._emit_line(bytes(self._partial[:LINE_CAP_BYTES]))
            self._partial.clear()

    def _emit_line(self, raw: bytes) -> None:
        if self._on_line is None:
            return
        line = printable(raw[:LINE_CAP_BYTES].decode("utf-8", "replace")).strip()
        if line:
            try:
                self._on_line(line)
            except Exception:  # a failing progress display must not stop the reading
                self._on_line = None

    # ---- the process -------------------------------------------------------------------------

    def poll(self) -> int | None:
        """The exit code once the tool has ended (reaped here, with its rusage), else None."""
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: the code is lost, not the run
            self.returncode = -1
            self._proc.returncode = -1
            return -1
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        self._proc.returncode = self.returncode  # subprocess must not wait for it again
        self.max_rss_bytes = _max_rss_bytes(usage.ru_maxrss)
        return self.returncode

    def wait(self, timeout_s: float | None) -> int | None:
        """Wait up to `timeout_s` (None: without limit) for the tool to end, or until it
        overflows stdout; the exit code, or None when it is still running."""
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        while True:
            code = self.poll()
            if code is not None or self.overflowed.is_set():
                return code
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_S)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL to the whole group, then reap the tool (bounded)."""
        self._signal_group(signal.SIGKILL)
        self.wait(KILL_WAIT_S)

    def stop(self, *, grace_s: float = TERM_GRACE_S) -> ToolResult:
        """SIGTERM to the group; after `grace_s` SIGKILL; then the result."""
        if self.poll() is None:
            self._signal_group(signal.SIGTERM)
            if self.wait(grace_s) is None:
                self.kill()
        return self.finish()

    def finish(self, *, pipe_grace_s: float = PIPE_GRACE_S) -> ToolResult:
        """The result once the tool has ended: its pipes get `pipe_grace_s` to reach their end,
        then whatever is left of its group is killed and the pipes are closed."""
        self._reader.join(pipe_grace_s)
        if self._reader.is_alive():
            self._signal_group(signal.SIGKILL)  # a grandchild holding the pipes
            self._reader.join(0.5)
            self._stop_reading.set()
            self._reader.join(0.5)
        if self.returncode is None:
            self.kill()
        if not self._reader.is_alive():
            for pipe in (self._proc.stdout, self._proc.stderr):
                if pipe is not None:
                    pipe.close()
        return ToolResult(
            argv=self.argv,
            returncode=self.returncode if self.returncode is not None else -signal.SIGKILL,
            stdout=bytes(self._out).decode("utf-8", "replace"),
            stderr=bytes(self._err).decode("utf-8", "replace"),
            seconds=time.monotonic() - self.started,
            timed_out=self.timed_out,
            overflowed=self.overflowed.is_set(),
            max_rss_bytes=self.max_rss_bytes,
            stdout_cap=self.stdout_cap,
        )

    def __enter__(self) -> ToolProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.poll() is None:
            self.kill()
        self._stop_reading.set()


def run_tool(
    argv: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    stdout_cap: int = STDOUT_CAP_BYTES,
    stderr_tail: int = STDERR_TAIL_BYTES,
    on_stderr_line: Callable[[str], None] | None = None,
) -> ToolResult:
    """Run `argv` to its end within `timeout_s` (the whole group is killed at the deadline or when
    stdout passes `stdout_cap`). Raises OSError when it cannot be started; never hangs."""
    tool = ToolProcess(
        argv, env=env, stdout_cap=stdout_cap, stderr_tail=stderr_tail,
        on_stderr_line=on_stderr_line,
    )  # fmt: skip
    try:
        deadline = tool.started + max(0.0, timeout_s)
        code = tool.wait(timeout_s)
        if code is None:
            tool.timed_out = not tool.overflowed.is_set()
            tool.kill()
        remaining = max(0.0, deadline - time.monotonic())
        return tool.finish(pipe_grace_s=min(PIPE_GRACE_S, remaining))
    finally:
        if tool.poll() is None:  # an exception (Ctrl-C) on the way: nothing is left running
            tool.kill()


def tool_stdout(argv: Sequence[str], *, timeout_s: float, stdout_cap: int, shown: str) -> str:
    """`argv`'s stdout when it ran to a clean end within its bounds; ValueError naming the tool
    (`shown`) when it cannot start, is slow, floods stdout or fails."""
    try:
        done = run_tool(argv, timeout_s=timeout_s, stdout_cap=stdout_cap)
    except OSError as exc:
        raise ValueError(f"{shown}: {exc.strerror or exc}") from None
    if done.timed_out:
        raise ValueError(f"{shown}: no answer in {timeout_s:g} s")
    if done.overflowed:
        raise ValueError(f"{shown}: more than {stdout_cap} bytes")
    if done.returncode != 0:
        raise ValueError(f"{shown}: exit status {done.returncode}")
    return done.stdout
