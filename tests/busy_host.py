"""A pytest plugin that makes this machine look busy, to show that no test reads the live host.

    python -m pytest -p busy_host tests/cli      # from the repository root (tests/ is on sys.path)

For the whole run, every read of the real /proc/meminfo reports 2 GiB available (other processes
hold the rest), and a child process spins on one core. Nothing is allocated and no cgroup is
needed, so it is safe on a shared machine. tests/conftest.py's `_recorded_host` points the probe at
recorded files instead, so the suite passes under it; a test that still read the live host would
plan against 2 GiB and fail.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

BUSY_AVAILABLE_KIB = 2 * 1024 * 1024
LIVE_MEMINFO = pathlib.Path("/proc/meminfo")


def busy_meminfo(text: str) -> str:
    """/proc/meminfo with MemAvailable and MemFree cut to 2 GiB."""
    for key in ("MemAvailable", "MemFree"):
        text = re.sub(rf"^{key}:\s+\d+ kB$", f"{key}: {BUSY_AVAILABLE_KIB} kB", text, flags=re.M)
    return text


@pytest.fixture(autouse=True, scope="session")
def _busy_host() -> Iterator[None]:
    real_read_text = pathlib.Path.read_text

    def read_text(self: pathlib.Path, *args: object, **kwargs: object) -> str:
        text = real_read_text(self, *args, **kwargs)  # type: ignore[arg-type]
        return busy_meminfo(text) if self == LIVE_MEMINFO else text

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    pathlib.Path.read_text = read_text  # type: ignore[method-assign]
    try:
        yield
    finally:
        pathlib.Path.read_text = real_read_text  # type: ignore[method-assign]
        spinner.kill()
        spinner.wait()
