"""Shared fixtures: every test runs isolated from the user's config, tokens and colours."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# llama.cpp's tools a user may have on PATH: a test sees them only where it puts them itself
# (QUANTPICK_TEST_LLAMA_BIN, --llama-bin, tests/test_readme.py's PATH), never the host's.
LLAMA_TOOLS = ("llama-server", "llama-fit-params", "llama-bench", "ggml-rpc-server", "llama-cli")


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = os.environ.get("PATH", "").split(os.pathsep)
    kept = [
        d for d in path if d and not any(os.path.exists(os.path.join(d, t)) for t in LLAMA_TOOLS)
    ]
    monkeypatch.setenv("PATH", os.pathsep.join(kept))
    monkeypatch.setenv("QUANTPICK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("QUANTPICK_MANIFESTS", raising=False)
    monkeypatch.delenv("QUANTPICK_MODELS_DIR", raising=False)
    monkeypatch.delenv("QUANTPICK_DEBUG", raising=False)
    # Other tools' model stores (quantpick.fetch.stores looks in them before downloading) and the
    # config file: a test sees only what it lays out under its own fake home.
    userhome = tmp_path / "userhome"
    monkeypatch.setenv("HOME", str(userhome))
    for var in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "LLAMA_CACHE",
        "XDG_CACHE_HOME",
        "LOCALAPPDATA",
        "QUANTPICK_REUSE",
        "QUANTPICK_HF_CACHE",
        "QUANTPICK_CONFIG",
        "QUANTPICK_LLAMACPP_CACHE",  # quantpick's own llama.cpp build cache (machine.llamacpp)
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(userhome / ".cache" / "huggingface"))
    monkeypatch.setenv("OLLAMA_MODELS", str(userhome / ".ollama" / "models"))


# Fake HF/ModelScope hub + CDN (tests/fakehub.py): the `fake_hub` fixture for download, remote
# header reads, `get` and `manifest add` tests.
try:
    from fakehub import fake_hub  # noqa: E402,F401
except ImportError:  # tests/ imported as a package
    from tests.fakehub import fake_hub  # noqa: E402,F401


# No test sees this machine's real GPUs unless marked `gpu`: by default `import pynvml` yields a
# fake whose nvmlInit() fails like a machine without libnvidia-ml (tests/fake_nvml.py), so every
# un-described probe is CPU-only and deterministic. Tests install their own FakeNvml on top.
@pytest.fixture(autouse=True)
def _no_real_nvml(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    if request.node.get_closest_marker("gpu") is not None:
        return
    try:
        from fake_nvml import FakeNvml, NVMLError_LibraryNotFound
    except ImportError:  # tests/ imported as a package
        from tests.fake_nvml import FakeNvml, NVMLError_LibraryNotFound
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=NVMLError_LibraryNotFound))


# No test reads this machine's live RAM, cores or load unless marked `real_host`: the host probe
# (quantpick.machine.probe) reads a recorded machine instead of /proc and /sys: a 2-core, 24 GiB
# Linux box (AMD EPYC) in a cgroup-v1 container without a memory limit, its /proc/meminfo,
# /proc/cpuinfo and memory cgroup files copied verbatim at rest into tests/data/host/ (MemAvailable
# 22.5 GiB). A test that plans without --gpu/--ram/--cpu-only/--hardware then gets the same answer
# on a busy 24 GB box as on an idle 256 GB one. Real llama.cpp tools get a deadline a loaded 2-core
# box meets (RECORDED_TOOL_TIMEOUT_S instead of the 10 s default a user gets).
RECORDED_HOST = Path(__file__).parent / "data" / "host"
RECORDED_HOST_THREADS = 2  # os.cpu_count() on the recorded box (its cpuinfo lists 2 processors)
RECORDED_TOOL_TIMEOUT_S = 120.0


@pytest.fixture(autouse=True)
def _recorded_host(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("real_host") is not None:
        return
    from quantpick.machine import probe

    monkeypatch.setattr(probe, "MEMINFO", RECORDED_HOST / "meminfo")
    monkeypatch.setattr(probe, "CPUINFO", RECORDED_HOST / "cpuinfo")
    monkeypatch.setattr(probe, "CGROUP_ROOT", RECORDED_HOST / "cgroup")
    monkeypatch.setattr(probe, "cpu_threads", lambda: RECORDED_HOST_THREADS)
    monkeypatch.setattr("quantpick.cli.options.TOOL_TIMEOUT_S", RECORDED_TOOL_TIMEOUT_S)


# Real llama.cpp tools (tests marked `llamacpp`): a directory holding llama-server,
# llama-fit-params, llama-bench and ggml-rpc-server, as scripts/build-llamacpp.sh builds them.
# QUANTPICK_TEST_LLAMA_BIN names it (QUANTPICK_TEST_LLAMA_SERVER, a llama-server path, or PATH also
# work). Without it these tests skip, saying how to run them; .ci/run builds the tools and sets
# QUANTPICK_REQUIRE_LLAMACPP=1, which turns a missing tool into a failure instead.
LLAMACPP_TOOLS = ("llama-server", "llama-fit-params", "llama-bench", "ggml-rpc-server")


def _llamacpp_dir() -> Path | None:
    import os
    import shutil

    explicit = os.environ.get("QUANTPICK_TEST_LLAMA_BIN")
    if explicit:
        return Path(explicit)
    server = os.environ.get("QUANTPICK_TEST_LLAMA_SERVER") or shutil.which("llama-server")
    return Path(server).parent if server else None


@pytest.fixture
def llamacpp_bin() -> Path:
    """The directory of the real llama.cpp tools; skips (or, in CI, fails) when absent."""
    import os

    where = _llamacpp_dir()
    missing = [t for t in LLAMACPP_TOOLS if where is None or not (where / t).is_file()]
    if missing:
        reason = (
            f"no llama.cpp tools ({', '.join(missing)} not found"
            + (f" in {where}" if where else "")
            + "): run scripts/build-llamacpp.sh and set QUANTPICK_TEST_LLAMA_BIN to the directory "
            "it prints (CI does this in .ci/run)"
        )
        if os.environ.get("QUANTPICK_REQUIRE_LLAMACPP", "") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    assert where is not None
    return where
