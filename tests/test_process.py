"""quantpick.process: a tool's run is bounded in time and memory, and leaves nothing running."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from quantpick.process import ToolProcess, printable, run_tool

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes (its parent, the tool, is dead and init reaps it)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, seconds: float = 3.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


def test_output_and_exit_code() -> None:
    code = "import sys; print('out'); sys.stderr.write('err\\n'); sys.exit(3)"
    result = run_tool([PY, "-c", code], timeout_s=10)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.timed_out and not result.overflowed
    assert result.max_rss_bytes is not None and result.max_rss_bytes > 1024**2


def test_a_flood_on_stdout_is_capped_and_stopped() -> None:
    # Before: read whole (subprocess.run), a tool printing without end ran into MemoryError.
    code = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    started = time.monotonic()
    result = run_tool([PY, "-c", code], timeout_s=30, stdout_cap=1024**2)
    assert time.monotonic() - started < 10
    assert result.overflowed and not result.timed_out
    assert len(result.stdout) == 1024**2
    assert result.returncode == -signal.SIGKILL
    assert "printed more than 1 MiB" in (result.bound_exceeded(30) or "")


def test_stderr_keeps_its_tail() -> None:
    code = "import sys\nfor i in range(200000): sys.stderr.write(f'line {i}\\n')"
    result = run_tool([PY, "-c", code], timeout_s=30, stderr_tail=4096)
    assert result.returncode == 0
    assert len(result.stderr) <= 4096
    assert result.stderr.endswith("line 199999\n")


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    # Before: subprocess.run's timeout killed the tool and left its children running.
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen(['sleep', '300'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n"
    )
    started = time.monotonic()
    result = run_tool([PY, "-c", code], timeout_s=1.5)
    assert time.monotonic() - started < 6
    assert result.timed_out
    assert "did not finish in 1.5 s" in (result.bound_exceeded(1.5) or "")
    assert _wait_gone(int(pidfile.read_text()))


def test_a_grandchild_holding_stdout_does_not_hold_quantpick(tmp_path: Path) -> None:
    # Before (bench): the tool exited, a grandchild kept its stdout open, and the reader waited
    # for it without a deadline.
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen(['sleep', '300'])\n"  # inherits stdout and stderr
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print('{\"done\": 1}', flush=True)\n"
    )
    started = time.monotonic()
    result = run_tool([PY, "-c", code], timeout_s=60)
    assert time.monotonic() - started < 5
    assert result.returncode == 0 and result.stdout == '{"done": 1}\n'
    assert _wait_gone(int(pidfile.read_text()))


def test_stderr_lines_reach_the_callback_printable() -> None:
    lines: list[str] = []
    code = "import sys; sys.stderr.write('\\x1b[31mred\\x1b[0m\\nplain\\n\\x1b]0;title\\x07end')"
    run_tool([PY, "-c", code], timeout_s=10, on_stderr_line=lines.append)
    assert lines == ["red", "plain", "end"]


def test_a_tool_that_cannot_start_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        run_tool([str(tmp_path / "missing")], timeout_s=1)


def test_toolprocess_stop_reaps_with_rusage_and_poll_after_exit_is_stable() -> None:
    # Before (bench --tool llama-server): Popen.poll() reaped the server, then os.wait4 found
    # "No child processes".
    tool = ToolProcess([PY, "-c", "import sys; sys.exit(4)"])
    assert tool.wait(10) == 4
    assert tool.poll() == 4
    result = tool.stop()
    assert result.returncode == 4 and result.max_rss_bytes


def test_toolprocess_stop_terminates_a_server() -> None:
    with ToolProcess([PY, "-c", "import time; time.sleep(300)"], capture_stdout=False) as tool:
        assert tool.poll() is None
        result = tool.stop(grace_s=5)
    assert result.returncode == -signal.SIGTERM


def test_printable_strips_terminal_sequences() -> None:
    raw = (
        "\x1b[1;31merror\x1b[0m: \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ "
        "\x1b]0;pwned\x07tensor 'a' has wrong shape\r\x1b[2K\x9b31m\x07\x00ok\tdone"
    )
    assert printable(raw) == "error: link tensor 'a' has wrong shapeok\tdone"
    assert printable("plain text, ünïcode ²\nnext") == "plain text, ünïcode ²\nnext"
