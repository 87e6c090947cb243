"""Settings: environment variables, directories and the config file, parsed once into a frozen
Settings.

Precedence everywhere: command-line flag > environment variable > config file > default. The CLI
applies its flags on top of `load_settings()` with `with_fetch_flags` (the only flags that have a
config-file counterpart are the fetch ones: which stores to reuse from, --hf-cache and
--connections).

The config file is `<config dir>/config.toml` (`QUANTPICK_CONFIG=PATH` names another one, `""`
none). Every key is optional:

    reuse = ["hf", "llama", "lmstudio", "ollama"]  # stores looked in before downloading; [] = none
    hf_cache = false                                 # write downloads into the HF cache layout
    connections = 16                                 # most connections per file; 1 = one stream

    [stores]                 # where a store is, when not where the tool's own settings put it
    lmstudio = "/mnt/big/lmstudio-models"
    ollama = ["/srv/ollama/models"]
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from quantpick.app_dirs import app_dirs
from quantpick.errors import QuantpickError, UsageError

CONFIG_FILE_NAME = "config.toml"

# Other tools' GGUF stores quantpick looks in before downloading (quantpick.fetch.stores says
# where each one is and how its files are named). All of them by default: a look costs a few
# stat() calls, and a candidate is only used after its sha256 matches the pinned one.
STORE_NAMES = ("hf", "llama", "lmstudio", "ollama")
CONFIG_KEYS = ("reuse", "hf_cache", "stores", "connections")
# The config file holds a few keys and a few paths (a few hundred bytes): 1 MiB is a cap that no
# real file reaches and that keeps a hostile one (a link to /dev/zero) from filling memory.
CONFIG_MAX_BYTES = 1024 * 1024
# --connections N: 1 (one stream) to 64 (hf_xet's own upper bound in its normal mode, see
# ../shared/notes/serving-ecosystem.md; beyond it concurrency has collapsed downloads).
MAX_CONNECTIONS = 64


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _is_false(value: str | None) -> bool:
    return (value or "").strip().lower() in {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Settings:
    home: (
        Path | None
    )  # QUANTPICK_HOME: one root for config, cache and data (tests, portable installs)
    config_dir: Path  # user manifests live in config_dir / "manifests"
    cache_dir: Path  # parsed GGUF headers, hub listings, the sha256 cache of reused files
    models_dir: Path  # where `download`/`get` put files (QUANTPICK_MODELS_DIR)
    extra_manifest_dirs: tuple[Path, ...]  # QUANTPICK_MANIFESTS (os.pathsep-separated)
    debug: bool  # QUANTPICK_DEBUG: tracebacks for expected errors
    offline: bool = False  # QUANTPICK_OFFLINE or HF_HUB_OFFLINE: no hub is contacted
    # Stores looked in before any transfer (names from STORE_NAMES, in that order); () = none.
    reuse_stores: tuple[str, ...] = STORE_NAMES
    reuse_origin: str = "default"  # which setting decided reuse_stores (shown in --dry-run)
    # Per-store locations replacing the tool's own (config file [stores]); absent = the tool's.
    store_paths: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)
    hf_cache: bool = False  # write downloads into the Hugging Face cache layout
    # Most connections per file (None: the default SegmentPolicy, adaptive up to 16; 1: one
    # stream). --connections, QUANTPICK_CONNECTIONS, config file `connections`.
    connections: int | None = None
    config_file: Path | None = None  # the config file that was read, if any
    # Run-time state that outlives a command (the pid files and logs of `serve --detach`):
    # platformdirs' user state dir (~/.local/state/quantpick), or QUANTPICK_HOME/state.
    state_dir: Path | None = None

    @property
    def user_manifest_dir(self) -> Path:
        return self.config_dir / "manifests"

    @property
    def servers_dir(self) -> Path:
        """Where `quantpick serve` keeps each server's record (pid file) and log."""
        return (self.state_dir or self.cache_dir) / "servers"


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    home = Path(env["QUANTPICK_HOME"]).expanduser() if env.get("QUANTPICK_HOME") else None
    config_dir, cache_dir, data_dir, state_dir = app_dirs(env)
    models_dir = (
        Path(env["QUANTPICK_MODELS_DIR"]).expanduser()
        if env.get("QUANTPICK_MODELS_DIR")
        else data_dir / "models"
    )
    extra = tuple(
        Path(p).expanduser() for p in env.get("QUANTPICK_MANIFESTS", "").split(os.pathsep) if p
    )
    if "QUANTPICK_CONFIG" in env:
        config_path = (
            Path(env["QUANTPICK_CONFIG"]).expanduser() if env["QUANTPICK_CONFIG"] else None
        )
    else:
        config_path = config_dir / CONFIG_FILE_NAME
    file_settings = read_config_file(config_path) if config_path is not None else {}
    config_file = config_path if file_settings.get("_read") else None

    # reuse: QUANTPICK_REUSE > config file > default (every store)
    reuse: tuple[str, ...] = STORE_NAMES
    origin = "default"
    if "reuse" in file_settings:
        reuse, origin = file_settings["reuse"], f"config file {config_path}"
    if env.get("QUANTPICK_REUSE", "").strip():
        reuse = parse_store_list(env["QUANTPICK_REUSE"], what="QUANTPICK_REUSE")
        origin = "QUANTPICK_REUSE"
    hf_cache = bool(file_settings.get("hf_cache", False))
    if _is_true(env.get("QUANTPICK_HF_CACHE")):
        hf_cache = True
    elif _is_false(env.get("QUANTPICK_HF_CACHE")):
        hf_cache = False
    connections = file_settings.get("connections")
    if env.get("QUANTPICK_CONNECTIONS", "").strip():
        connections = parse_connections(env["QUANTPICK_CONNECTIONS"], what="QUANTPICK_CONNECTIONS")
    return Settings(
        home=home,
        config_dir=config_dir,
        cache_dir=cache_dir,
        models_dir=models_dir,
        extra_manifest_dirs=extra,
        debug=_is_true(env.get("QUANTPICK_DEBUG")),
        offline=_is_true(env.get("QUANTPICK_OFFLINE")) or _is_true(env.get("HF_HUB_OFFLINE")),
        reuse_stores=reuse,
        reuse_origin=origin,
        store_paths=file_settings.get("stores", {}),
        hf_cache=hf_cache,
        connections=connections,
        config_file=config_file,
        state_dir=state_dir,
    )


def parse_connections(value: Any, *, what: str) -> int:
    """A connection count, 1..MAX_CONNECTIONS (a usage error otherwise)."""
    try:
        n = int(str(value).strip()) if not isinstance(value, bool) else 0
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_CONNECTIONS:
        raise UsageError(
            f"{what} must be a whole number from 1 to {MAX_CONNECTIONS}, not {value!r}",
            hint="1 downloads each file over one connection",
        )
    return n


# ---------------------------------------------------------------------------------------------
# The config file


# ---------------------------------------------------------------------------------------------
# Bounded reading of small text files (the config file, hardware files)

# Config and hardware files are a few KB; a bigger one (or /dev/zero) is not one of them.
MAX_CONFIG_FILE_BYTES = 1024**2
# tomllib and json recurse once per nesting level: 5000 nested arrays end in RecursionError (a
# traceback) deep inside the parser. No file quantpick reads nests deeper than a few levels.
MAX_NESTING = 64


def read_bounded_text(path: Path, limit: int, *, pipe_timeout_s: float | None = None) -> str:
    """The UTF-8 text of `path`: a regular file only, refused (an OSError) past `limit` bytes
    without reading on: a FIFO or /dev/zero given as a file ends here, not in a hang or a
    MemoryError (local_files.read_small). With `pipe_timeout_s`, a pipe (`<(...)`) is read too,
    bounded by `limit` and by that many seconds."""
    from quantpick.local_files import read_small

    return read_small(path, limit, pipe_timeout_s=pipe_timeout_s).decode("utf-8")


def _nesting_depth(text: str) -> int:
    """The deepest bracket nesting of `text`, outside strings (an upper bound is enough: brackets
    inside TOML strings count too, which only makes the check stricter)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def _check_nesting(text: str, what: str) -> None:
    # Cheap when shallow: count only if the text has enough brackets to be deep at all.
    if text.count("[") + text.count("{") > MAX_NESTING and _nesting_depth(text) > MAX_NESTING:
        raise ValueError(f"not valid {what}: nested deeper than {MAX_NESTING} levels")


def load_toml_text(text: str) -> dict[str, Any]:
    """tomllib.loads, bounded: ValueError("not valid TOML (...)") for any malformed text,
    including nesting that would exhaust the parser's recursion."""
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib
    _check_nesting(text, "TOML")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not valid TOML ({exc})") from None
    except RecursionError:
        raise ValueError("not valid TOML: nested too deep") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"not valid JSON: {name} is not a JSON number")


def load_json_text(text: str) -> Any:
    """json.loads, bounded and strict: ValueError("not valid JSON (...)") for malformed text,
    NaN/Infinity (which JSON does not have) and nesting deeper than MAX_NESTING."""
    import json

    _check_nesting(text, "JSON")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise ValueError("not valid JSON: nested too deep") from None


def read_config_file(path: Path) -> dict[str, Any]:
    """The validated settings of one config file ({} when it does not exist).

    Unknown keys and bad values are errors naming the file (a typo must not silently turn a
    setting off). "_read" is set when the file existed.
    """
    hint = "the format is in docs/download.md (Reusing files other tools downloaded)"
    try:
        # a FIFO or /dev/zero here must not hang a run, a huge file not fill memory
        text = read_bounded_text(path, MAX_CONFIG_FILE_BYTES)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise QuantpickError.unreadable("the config file", path, exc) from None
    except UnicodeDecodeError as exc:
        raise QuantpickError(f"{path} is not valid TOML: {exc}", hint=hint) from None
    try:
        data = load_toml_text(text)
    except ValueError as exc:
        raise QuantpickError(f"{path}: {exc}", hint=hint) from None
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise QuantpickError(
            f"{path}: unknown setting {unknown[0]!r}",
            hint=f"known settings: {', '.join(CONFIG_KEYS)}; {hint}",
        )
    out: dict[str, Any] = {"_read": True}
    where = str(path)
    if "reuse" in data:
        out["reuse"] = _store_list_value(data["reuse"], f"{where}: reuse")
    if "hf_cache" in data:
        if not isinstance(data["hf_cache"], bool):
            raise QuantpickError(f"{where}: hf_cache must be true or false", hint=hint)
        out["hf_cache"] = data["hf_cache"]
    if "stores" in data:
        out["stores"] = _store_paths_value(data["stores"], path)
    if "connections" in data:
        if type(data["connections"]) is not int:
            raise QuantpickError(f"{where}: connections must be a whole number", hint=hint)
        try:
            out["connections"] = parse_connections(
                data["connections"], what=f"{where}: connections"
            )
        except UsageError as exc:
            raise QuantpickError(exc.message, hint=hint) from None
    return out


def _store_list_value(value: Any, what: str) -> tuple[str, ...]:
    if value is False:
        return ()
    if value is True:
        return STORE_NAMES
    if isinstance(value, str):
        return parse_store_list(value, what=what)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return parse_store_list(",".join(value), what=what, allow_empty=True)
    raise QuantpickError(
        f"{what} must be a list of store names ({', '.join(STORE_NAMES)}), true or false"
    )


def _store_paths_value(value: Any, path: Path) -> dict[str, tuple[Path, ...]]:
    if not isinstance(value, dict):
        raise QuantpickError(f"{path}: [stores] must be a table of store = path(s)")
    out: dict[str, tuple[Path, ...]] = {}
    for store, paths in value.items():
        if store not in STORE_NAMES:
            raise QuantpickError(
                f"{path}: [stores] {store!r} is not a store",
                hint=f"one of {', '.join(STORE_NAMES)}",
            )
        items = [paths] if isinstance(paths, str) else paths
        if not isinstance(items, list) or not all(isinstance(p, str) and p for p in items):
            raise QuantpickError(f"{path}: [stores] {store} must be a path or a list of paths")
        if any("\0" in p for p in items):
            # TOML can spell a NUL ("\u0000"); no file system path holds one.
            raise QuantpickError(f"{path}: [stores] {store}: a path cannot contain a NUL byte")
        # Relative paths are relative to the config file, so a config can travel with its data.
        out[store] = tuple((path.parent / Path(p).expanduser()).resolve() for p in items)
    return out


def parse_store_list(text: str, *, what: str, allow_empty: bool = False) -> tuple[str, ...]:
    """ "hf,ollama" -> ("hf", "ollama") in STORE_NAMES order; "none" -> (); "all" -> every store."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["none"] or (allow_empty and not names):
        return ()
    if names == ["all"]:
        return STORE_NAMES
    bad = [n for n in names if n not in STORE_NAMES]
    if bad or not names:
        raise UsageError(
            f"{what}: {bad[0] if bad else text!r} is not a store",
            hint=f"use a comma-separated list of {', '.join(STORE_NAMES)}, or all, or none",
        )
    return tuple(n for n in STORE_NAMES if n in names)


# ---------------------------------------------------------------------------------------------
# Flags on top


def with_fetch_flags(
    settings: Settings,
    *,
    reuse: bool | None = None,
    reuse_from: Sequence[str] | None = None,
    hf_cache: bool | None = None,
    connections: int | None = None,
) -> Settings:
    """Apply `--reuse/--no-reuse`, `--reuse-from STORE[,STORE]`, `--hf-cache/--no-hf-cache` and
    `--connections N` (None: not given) over the environment and config file.

    `--no-reuse` wins over everything; `--reuse-from` limits reuse to the stores it names;
    `--reuse` alone turns every store back on (over QUANTPICK_REUSE=none or the config file).
    """
    changes: dict[str, Any] = {}
    if reuse is False:
        if reuse_from:
            raise UsageError("--no-reuse and --reuse-from contradict each other")
        changes.update(reuse_stores=(), reuse_origin="--no-reuse")
    elif reuse_from:
        stores = parse_store_list(",".join(reuse_from), what="--reuse-from")
        changes.update(reuse_stores=stores, reuse_origin="--reuse-from")
    elif reuse is True:
        changes.update(reuse_stores=STORE_NAMES, reuse_origin="--reuse")
    if hf_cache is not None:
        changes["hf_cache"] = hf_cache
    if connections is not None:
        changes["connections"] = parse_connections(connections, what="--connections")
    return replace(settings, **changes) if changes else settings
