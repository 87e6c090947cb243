"""Finding llama-server: --llama-server, --llama-bin, beside the plan's tools, PATH, and
quantpick's own build cache (scripts/build-llamacpp.sh's layout)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantpick.machine.llamacpp import (
    BUILD_CACHE_ORIGIN,
    build_cache_root,
    cached_builds,
    find_llama_server,
    locate_llama_server,
    not_found_message,
    remembered_llama_server,
)
from quantpick.machine.spec import LlamaServer


def _tool(directory: Path, name: str = "llama-server") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def _build(root: Path, key: str, *, complete: bool = True) -> Path:
    """One build the way scripts/build-llamacpp.sh leaves it: <root>/<key>/bin/{tools,.complete}."""
    bin_dir = root / key / "bin"
    _tool(bin_dir)
    if complete:
        (bin_dir / ".complete").touch()
    return bin_dir


def test_cache_root_follows_the_build_script(tmp_path: Path) -> None:
    home = tmp_path / "h"
    assert build_cache_root({"HOME": str(home)}) == home / ".cache/quantpick/llama.cpp"
    assert build_cache_root({"HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "x")}) == (
        tmp_path / "x/quantpick/llama.cpp"
    )
    explicit = {"HOME": str(home), "QUANTPICK_LLAMACPP_CACHE": str(tmp_path / "c")}
    assert build_cache_root(explicit) == tmp_path / "c"


def test_only_finished_builds_count_newest_build_first(tmp_path: Path) -> None:
    env = {"QUANTPICK_LLAMACPP_CACHE": str(tmp_path)}
    old = _build(tmp_path, "0.3.20-b9000-aaaaaaaaaaaa")
    new = _build(tmp_path, "0.3.36-b11312-7fa9b96e2626")
    _build(tmp_path, "0.3.40-b12000-bbbbbbbbbbbb", complete=False)  # still building
    (tmp_path / "stray-file").write_text("x")
    assert cached_builds(env) == [new, old]


def test_locate_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cached = _build(cache, "0.3.36-b11312-7fa9b96e2626") / "llama-server"
    env = {"QUANTPICK_LLAMACPP_CACHE": str(cache)}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = locate_llama_server(env=env)
    assert found is not None and (found.path, found.origin) == (cached, BUILD_CACHE_ORIGIN)

    on_path = _tool(tmp_path / "path")
    monkeypatch.setenv("PATH", str(on_path.parent))
    found = locate_llama_server(env=env)
    assert found is not None and (found.path, found.origin) == (on_path, "PATH")

    fit = _tool(tmp_path / "tools", "llama-fit-params")
    beside = _tool(tmp_path / "tools")
    found = locate_llama_server(beside=[fit], env=env)
    assert found is not None and (found.path, found.origin) == (beside, "beside llama-fit-params")

    in_bin = _tool(tmp_path / "bin")
    found = locate_llama_server(llama_bin=in_bin.parent, beside=[fit], env=env)
    assert found is not None and (found.path, found.origin) == (in_bin, "--llama-bin")
    explicit = _tool(tmp_path / "mine")
    found = locate_llama_server(explicit, llama_bin=in_bin.parent, env=env)
    assert found is not None and (found.path, found.origin) == (explicit, "--llama-server")


def test_a_named_binary_that_is_missing_is_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tool(tmp_path / "path")
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    assert locate_llama_server(tmp_path / "nope") is None
    assert locate_llama_server(llama_bin=tmp_path / "empty") is None
    assert "--llama-bin" in not_found_message(None, tmp_path / "empty")


def test_find_llama_server_falls_back_to_the_build_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_llama_server() is None
    assert "not on PATH" in not_found_message() and str(build_cache_root()) in not_found_message()
    cached = _build(build_cache_root(), "0.3.36-b11312-7fa9b96e2626") / "llama-server"
    assert find_llama_server() == cached
    assert os.access(cached, os.X_OK)


def test_beside_a_tool_of_the_build_cache_names_the_cache(tmp_path: Path) -> None:
    bin_dir = _build(tmp_path, "0.3.36-b11312-7fa9b96e2626")
    fit = _tool(bin_dir, "llama-fit-params")
    found = locate_llama_server(beside=[fit], env={"QUANTPICK_LLAMACPP_CACHE": str(tmp_path)})
    assert found is not None and found.origin == BUILD_CACHE_ORIGIN


class CountingInspect:
    """inspect_llama_server's stand-in: answers `build` and counts the runs it would have cost."""

    def __init__(self, build: int | None = 11312, error: str | None = None) -> None:
        self.calls = 0
        self.build, self.error = build, error

    def __call__(self, path: Path) -> LlamaServer:
        self.calls += 1
        return LlamaServer(path=str(path), version="0.3.36", build=self.build, commit="7fa9b96",
                           error=self.error)  # fmt: skip


def test_a_binary_is_asked_its_build_once_while_it_is_unchanged(tmp_path: Path) -> None:
    binary, memo = tmp_path / "llama-server", tmp_path / "cache" / "builds.json"
    binary.write_bytes(b"\x7fELF one")
    inspect = CountingInspect()
    first = remembered_llama_server(binary, memo, inspect=inspect)
    second = remembered_llama_server(binary, memo, inspect=inspect)
    assert inspect.calls == 1 and first == second
    assert (second.build, second.version, second.commit) == (11312, "0.3.36", "7fa9b96")


def test_a_rebuilt_binary_is_asked_again(tmp_path: Path) -> None:
    binary, memo = tmp_path / "llama-server", tmp_path / "builds.json"
    binary.write_bytes(b"\x7fELF one")
    remembered_llama_server(binary, memo, inspect=CountingInspect(11312))
    binary.write_bytes(b"\x7fELF two, longer")  # another build in its place
    newer = CountingInspect(11400)
    assert remembered_llama_server(binary, memo, inspect=newer).build == 11400
    assert newer.calls == 1


def test_a_failed_answer_or_a_damaged_memo_is_not_trusted(tmp_path: Path) -> None:
    binary, memo = tmp_path / "llama-server", tmp_path / "builds.json"
    binary.write_bytes(b"\x7fELF")
    failing = CountingInspect(None, error="--version did not finish in 5 s")
    remembered_llama_server(binary, memo, inspect=failing)
    remembered_llama_server(binary, memo, inspect=failing)
    assert failing.calls == 2 and not memo.exists()
    memo.write_text("[not a dict")
    ok = CountingInspect()
    assert remembered_llama_server(binary, memo, inspect=ok).build == 11312 and ok.calls == 1
    assert remembered_llama_server(binary, memo, inspect=ok).build == 11312 and ok.calls == 1


def test_the_memo_is_bounded_and_never_read_through_a_link(tmp_path: Path) -> None:
    from quantpick.machine.llamacpp import MEMO_BINARIES, MEMO_BYTES

    memo = tmp_path / "builds.json"
    binaries = []
    for i in range(MEMO_BINARIES + 3):
        binary = tmp_path / f"llama-server-{i}"
        binary.write_bytes(b"\x7fELF" + bytes([i]))
        binaries.append(binary)
        remembered_llama_server(binary, memo, inspect=CountingInspect())
    import json

    kept = json.loads(memo.read_text())
    assert len(kept) == MEMO_BINARIES and str(binaries[-1].resolve()) in kept
    assert str(binaries[0].resolve()) not in kept  # the oldest went first
    # a memo over its cap, or a link in its place, is a miss: the binary is asked again
    memo.write_text(" " * (MEMO_BYTES + 1))
    ask = CountingInspect()
    remembered_llama_server(binaries[-1], memo, inspect=ask)
    assert ask.calls == 1
    good = tmp_path / "good.json"
    good.write_text(memo.read_text())
    memo.unlink()
    memo.symlink_to(good)
    ask = CountingInspect()
    remembered_llama_server(binaries[-1], memo, inspect=ask)
    assert ask.calls == 1
