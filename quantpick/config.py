"""Environment variables and directories, parsed once into a frozen Settings.

Precedence everywhere: command-line flag > environment variable > default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

APP_NAME = "quantpick"


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Settings:
    home: (
        Path | None
    )  # QUANTPICK_HOME: one root for config, cache and data (tests, portable installs)
    config_dir: Path  # user manifests live in config_dir / "manifests"
    cache_dir: Path  # parsed GGUF headers, hub listings
    models_dir: Path  # where `download`/`get` put files (QUANTPICK_MODELS_DIR)
    extra_manifest_dirs: tuple[Path, ...]  # QUANTPICK_MANIFESTS (os.pathsep-separated)
    debug: bool  # QUANTPICK_DEBUG: tracebacks for expected errors
    offline: bool = False  # QUANTPICK_OFFLINE or HF_HUB_OFFLINE: no hub is contacted

    @property
    def user_manifest_dir(self) -> Path:
        return self.config_dir / "manifests"


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    home = Path(env["QUANTPICK_HOME"]).expanduser() if env.get("QUANTPICK_HOME") else None
    if home is not None:
        config_dir, cache_dir, data_dir = home / "config", home / "cache", home / "data"
    else:
        import platformdirs

        config_dir = Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
        cache_dir = Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
        data_dir = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    models_dir = (
        Path(env["QUANTPICK_MODELS_DIR"]).expanduser()
        if env.get("QUANTPICK_MODELS_DIR")
        else data_dir / "models"
    )
    extra = tuple(
        Path(p).expanduser() for p in env.get("QUANTPICK_MANIFESTS", "").split(os.pathsep) if p
    )
    return Settings(
        home=home,
        config_dir=config_dir,
        cache_dir=cache_dir,
        models_dir=models_dir,
        extra_manifest_dirs=extra,
        debug=_is_true(env.get("QUANTPICK_DEBUG")),
        offline=_is_true(env.get("QUANTPICK_OFFLINE")) or _is_true(env.get("HF_HUB_OFFLINE")),
    )
