"""The llama-server binary: where it is and which build it is (`--version` parsing is pure).

Where: `--llama-server PATH`, else `--llama-bin DIR`, else beside the other llama.cpp tools a plan
used (llama-fit-params), else PATH, else quantpick's own build cache: `scripts/build-llamacpp.sh`
builds into `$QUANTPICK_LLAMACPP_CACHE` (default `${XDG_CACHE_HOME:-~/.cache}/quantpick/llama.cpp`),
one directory per build key `<sdist version>-b<build>-<hash>`, binaries in its `bin/`, which holds
`.complete` once the build finished (the script's `cached_ok`).

`llama-server --version` prints, on stderr (llama.cpp `common/build-info.cpp.in`):
    version: 0.5.0-dev (build 1, commit 0c1e570)      # semver-era builds
    version: 7988 (7f5f5119b)                          # older builds: b-number and hash
followed by a "built with ..." line.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from quantpick.machine.spec import LlamaServer

VERSION_TIMEOUT_S = 5.0
# remembered_llama_server's memo: the builds of this many binaries at most (one entry is ~150
# bytes), read with this cap
MEMO_BINARIES = 64
MEMO_BYTES = 256 * 1024
# `--version` prints two lines (~150 bytes) and, on GPU builds, one line per device found.
VERSION_CAP = 64 * 1024

_NEW_FORM = re.compile(
    r"version:\s*(?P<version>[^\s(]+)\s*\(\s*build\s+(?P<build>\d+)\s*,\s*commit\s+(?P<commit>[0-9a-fA-F]+)\s*\)"
)
_OLD_FORM = re.compile(r"version:\s*(?P<build>\d+)\s*\(\s*(?P<commit>[0-9a-fA-F]+)\s*\)")
# The compact build_info form ("b7988-7f5f5119b") seen in User-Agent and /props.
_COMPACT_FORM = re.compile(r"\bb(?P<build>\d+)-(?P<commit>[0-9a-fA-F]{6,})\b")


def parse_version_output(text: str) -> tuple[str | None, int | None, str | None]:
    """(version, build, commit) from `llama-server --version` output; Nones when absent.

    version is the semver string of new builds ("0.5.0-dev"); old builds have none.
    """
    match = _NEW_FORM.search(text)
    if match:
        return match["version"], int(match["build"]), match["commit"].lower()
    for pattern in (_OLD_FORM, _COMPACT_FORM):
        match = pattern.search(text)
        if match:
            return None, int(match["build"]), match["commit"].lower()
    return None, None, None


SERVER = "llama-server"
# scripts/build-llamacpp.sh: cache_root is ${QUANTPICK_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/
# .cache}/quantpick/llama.cpp}, bin="$dir/bin", and `touch "$bin.new/.complete"` before the rename.
BUILD_CACHE_ENV = "QUANTPICK_LLAMACPP_CACHE"
BUILD_COMPLETE_MARKER = ".complete"
BUILD_CACHE_ORIGIN = "quantpick's build cache, scripts/build-llamacpp.sh"
_BUILD_KEY = re.compile(r"-b(\d+)-")  # "0.3.36-b11312-7fa9b96e2626"


def build_cache_root(env: Mapping[str, str] | None = None) -> Path:
    """Where scripts/build-llamacpp.sh keeps its builds (the same rule as the script)."""
    env = os.environ if env is None else env
    if env.get(BUILD_CACHE_ENV):
        return Path(env[BUILD_CACHE_ENV]).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path(env.get("HOME") or Path.home()) / ".cache"
    return base / "quantpick" / "llama.cpp"


def cached_builds(env: Mapping[str, str] | None = None) -> list[Path]:
    """The finished builds' bin directories, the highest build number first (then the newest)."""
    root = build_cache_root(env)
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    found: list[tuple[int, float, Path]] = []
    for entry in entries:
        bin_dir = entry / "bin"
        server = bin_dir / SERVER
        try:
            complete = (bin_dir / BUILD_COMPLETE_MARKER).is_file()
            mtime = (bin_dir / BUILD_COMPLETE_MARKER).stat().st_mtime if complete else 0.0
        except OSError:
            continue
        if complete and server.is_file() and os.access(server, os.X_OK):
            match = _BUILD_KEY.search(entry.name)
            found.append((int(match[1]) if match else 0, mtime, bin_dir))
    return [bin_dir for _, _, bin_dir in sorted(found, reverse=True)]


@dataclass(frozen=True)
class FoundServer:
    path: Path
    origin: str  # "--llama-server", "--llama-bin", "beside llama-fit-params", "PATH", the cache


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def locate_llama_server(
    explicit: Path | None = None,
    *,
    llama_bin: Path | None = None,
    beside: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
) -> FoundServer | None:
    """The llama-server to run, and where it was found (module doc for the order). An explicit
    path that is not there is not replaced by another: None."""
    if explicit is not None:
        found = find_llama_server(explicit)
        return FoundServer(found, "--llama-server") if found is not None else None
    if llama_bin is not None:
        candidate = llama_bin / SERVER
        return FoundServer(candidate, "--llama-bin") if _executable(candidate) else None
    for tool in beside:
        candidate = tool.parent / SERVER
        if _executable(candidate):
            cached = tool.parent in cached_builds(env)
            return FoundServer(candidate, BUILD_CACHE_ORIGIN if cached else f"beside {tool.name}")
    on_path = shutil.which(SERVER)
    if on_path:
        return FoundServer(Path(on_path), "PATH")
    for bin_dir in cached_builds(env):
        return FoundServer(bin_dir / SERVER, BUILD_CACHE_ORIGIN)
    return None


def not_found_message(explicit: Path | None = None, llama_bin: Path | None = None) -> str:
    """One line saying plainly where no llama-server was found."""
    if explicit is not None:
        return f"--llama-server {explicit}: no such executable"
    if llama_bin is not None:
        return f"no {SERVER} in --llama-bin {llama_bin}"
    return (
        f"no {SERVER} found (not given with --llama-server or --llama-bin, not on PATH, not in "
        f"quantpick's build cache {build_cache_root()}, which scripts/build-llamacpp.sh fills)"
    )


def find_llama_server(path: Path | None = None) -> Path | None:
    """The given path if it exists (or names a program on PATH), else `llama-server` on PATH,
    else the newest build in quantpick's own build cache."""
    if path is not None:
        if path.exists():
            return path
        found = shutil.which(str(path))
        return Path(found) if found else None
    found = shutil.which(SERVER)
    if found:
        return Path(found)
    builds = cached_builds()
    return builds[0] / SERVER if builds else None


def remembered_llama_server(
    path: Path,
    memo: Path,
    *,
    inspect: Callable[[Path], LlamaServer] | None = None,
) -> LlamaServer:
    """`inspect_llama_server(path)`, remembered in the JSON file `memo` per binary: a build's
    `--version` answer cannot change while the file itself does not, which its stat signature
    (local_files.stat_signature) tells without running it. Every plan asks which build will run
    it; a CUDA build takes a good part of a second to answer (it loads its backends first).
    Only answers that name a build are kept, for the MEMO_BINARIES binaries asked last; an
    unreadable, oversized or damaged memo is a miss, and one that cannot be written is left."""
    import json

    from quantpick.local_files import read_small_text, stat_signature

    inspect = inspect or inspect_llama_server
    try:
        real = path.resolve()
    except OSError:
        return inspect(path)
    key = str(real)
    signature = stat_signature(real)
    if signature is None:
        return inspect(path)
    try:
        known = json.loads(read_small_text(memo, MEMO_BYTES, follow=False))
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    entry = known.get(key)
    if isinstance(entry, dict) and entry.get("signature") == signature:
        build = entry.get("build")
        if isinstance(build, int):
            version, commit = entry.get("version"), entry.get("commit")
            return LlamaServer(
                path=str(path),
                version=version if isinstance(version, str) else None,
                build=build,
                commit=commit if isinstance(commit, str) else None,
            )
    server = inspect(path)
    if server.error is None and server.build is not None:
        known.pop(key, None)  # the newest last: the oldest go first beyond MEMO_BINARIES
        known[key] = {"signature": signature, "version": server.version,
                      "build": server.build, "commit": server.commit}  # fmt: skip
        for old in list(known)[:-MEMO_BINARIES]:
            del known[old]
        from quantpick.outputs import write_atomic

        text = json.dumps(known, indent=1, sort_keys=True) + "\n"
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(memo, text.encode(), durable=False)
        except OSError:
            pass
    return server


def inspect_llama_server(path: Path, *, timeout_s: float = VERSION_TIMEOUT_S) -> LlamaServer:
    """Run `path --version` and read its build; any failure is reported in `error`, not raised.
    Bounded (quantpick.process): its own process group, capped output, killed at the deadline."""
    from quantpick.process import printable, run_tool

    try:
        proc = run_tool([str(path), "--version"], timeout_s=timeout_s, stdout_cap=VERSION_CAP)
    except FileNotFoundError:
        return LlamaServer(path=str(path), error="not found")
    except PermissionError:
        return LlamaServer(path=str(path), error="not executable")
    except OSError as exc:
        return LlamaServer(path=str(path), error=f"cannot run: {exc.strerror or exc}")
    if proc.timed_out:
        return LlamaServer(path=str(path), error=f"--version did not finish in {timeout_s:g} s")
    # New builds print to stderr, the combined `llama` app to stdout: read both.
    text = f"{proc.stdout}\n{proc.stderr}"
    version, build, commit = parse_version_output(text)
    if build is None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        what = f"exit {proc.returncode}" if proc.returncode else "no version line"
        if proc.overflowed:
            what = "more than 64 KiB of output"
        return LlamaServer(
            path=str(path), error=f"cannot read --version ({what}): {printable(first)[:120]!r}"
        )
    return LlamaServer(path=str(path), version=version, build=build, commit=commit)
