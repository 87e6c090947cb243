"""Where quantpick keeps its files: one rule for config.load_settings and for answers.py, which
needs its cache directory before anything heavier than the standard library is imported."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

APP_NAME = "quantpick"


class AppDirs(NamedTuple):
    config: Path
    cache: Path  # parsed GGUF headers, hub listings, sha256s, recorded answers
    data: Path
    state: Path  # `serve`'s records and logs


def app_dirs(env: Mapping[str, str]) -> AppDirs:
    """`$QUANTPICK_HOME/{config,cache,data,state}`, else the platform's directories
    (platformdirs: ~/.config/quantpick, ~/.cache/quantpick, ... on Linux)."""
    if env.get("QUANTPICK_HOME"):
        home = Path(env["QUANTPICK_HOME"]).expanduser()
        return AppDirs(home / "config", home / "cache", home / "data", home / "state")
    import platformdirs

    return AppDirs(
        Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
        Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        Path(platformdirs.user_state_dir(APP_NAME, appauthor=False)),
    )
