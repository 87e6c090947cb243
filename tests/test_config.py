"""Settings: the config file, environment variables and flags, with flag > env > file > default."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantpick.config import STORE_NAMES, load_settings, parse_store_list, with_fetch_flags
from quantpick.errors import QuantpickError, UsageError


def env_with(tmp_path: Path, config: str | None = None, **extra: str) -> dict[str, str]:
    env = {"QUANTPICK_HOME": str(tmp_path)}
    if config is not None:
        (tmp_path / "config").mkdir(exist_ok=True)
        (tmp_path / "config" / "config.toml").write_text(config)
    return {**env, **extra}


def test_defaults_reuse_every_store_and_write_quantpick_dir(tmp_path: Path) -> None:
    s = load_settings(env_with(tmp_path))
    assert (s.reuse_stores, s.reuse_origin, s.hf_cache, s.config_file) == (
        STORE_NAMES,
        "default",
        False,
        None,
    )


def test_config_file_then_env_then_flags(tmp_path: Path) -> None:
    config = 'reuse = ["ollama", "hf"]\nhf_cache = true\n[stores]\nlmstudio = "lms"\n'
    s = load_settings(env_with(tmp_path, config))
    assert s.reuse_stores == ("hf", "ollama")  # always in STORE_NAMES order
    assert s.reuse_origin.startswith("config file ") and s.hf_cache
    assert s.store_paths == {"lmstudio": ((tmp_path / "config" / "lms").resolve(),)}
    assert s.config_file == tmp_path / "config" / "config.toml"

    s = load_settings(env_with(tmp_path, config, QUANTPICK_REUSE="llama", QUANTPICK_HF_CACHE="0"))
    assert (s.reuse_stores, s.reuse_origin, s.hf_cache) == (("llama",), "QUANTPICK_REUSE", False)

    flagged = with_fetch_flags(s, reuse_from=["lmstudio,ollama"], hf_cache=True)
    assert (flagged.reuse_stores, flagged.reuse_origin, flagged.hf_cache) == (
        ("lmstudio", "ollama"),
        "--reuse-from",
        True,
    )
    assert with_fetch_flags(s, reuse=False).reuse_stores == ()
    assert with_fetch_flags(s, reuse=True).reuse_stores == STORE_NAMES
    assert with_fetch_flags(s) is s  # no flag given: nothing changes


def test_none_and_false_turn_reuse_off(tmp_path: Path) -> None:
    assert load_settings(env_with(tmp_path, "reuse = false\n")).reuse_stores == ()
    assert load_settings(env_with(tmp_path, "reuse = []\n")).reuse_stores == ()
    assert load_settings(env_with(tmp_path, QUANTPICK_REUSE="none")).reuse_stores == ()


def test_quantpick_config_names_another_file_or_none(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.toml"
    other.write_text('reuse = "ollama"\n')
    s = load_settings(env_with(tmp_path, "reuse = false\n", QUANTPICK_CONFIG=str(other)))
    assert s.reuse_stores == ("ollama",) and s.config_file == other
    s = load_settings(env_with(tmp_path, "reuse = false\n", QUANTPICK_CONFIG=""))
    assert s.reuse_stores == STORE_NAMES and s.config_file is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("reuze = []\n", "unknown setting 'reuze'"),
        ('reuse = ["olama"]\n', "'olama' is not a store"),
        ("hf_cache = 1\n", "hf_cache must be true or false"),
        ('[stores]\nvllm = "/x"\n', "'vllm' is not a store"),
        ("[stores]\nhf = 3\n", "must be a path"),
        ("reuse = [\n", "not valid TOML"),
    ],
)
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(QuantpickError, match=message) as info:
        load_settings(env_with(tmp_path, text))
    assert str(tmp_path / "config" / "config.toml") in info.value.message


def test_bad_env_and_contradicting_flags_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="QUANTPICK_REUSE"):
        load_settings(env_with(tmp_path, QUANTPICK_REUSE="hf,vllm"))
    with pytest.raises(UsageError, match="contradict"):
        with_fetch_flags(load_settings(env_with(tmp_path)), reuse=False, reuse_from=["hf"])


@given(st.lists(st.sampled_from(STORE_NAMES), min_size=1))
def test_store_list_is_a_set_in_canonical_order(names: list[str]) -> None:
    parsed = parse_store_list(" , ".join(names), what="x")
    assert set(parsed) == set(names)
    assert list(parsed) == sorted(parsed, key=STORE_NAMES.index)


def test_a_config_file_that_is_a_fifo_or_huge_is_one_clear_error(tmp_path: Path) -> None:
    """A FIFO would block the open (every command hangs); a link to /dev/zero or a huge file
    would be read until memory runs out."""
    import os
    import threading

    env = env_with(tmp_path, "")
    config = tmp_path / "config" / "config.toml"
    config.unlink()
    os.mkfifo(config)
    box: dict[str, BaseException] = {}

    def load() -> None:
        try:
            load_settings(env)
        except QuantpickError as exc:
            box["error"] = exc

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "load_settings hangs on a FIFO"
    assert "a FIFO, not a regular file" in str(box["error"])
    config.unlink()
    config.write_text("# padding\n" * (1024 * 1024 // 10 + 1))  # valid TOML, over the cap
    with pytest.raises(QuantpickError, match="larger than 1048576 bytes"):
        load_settings(env)


def test_connections_config_then_env_then_flag(tmp_path: Path) -> None:
    assert load_settings(env_with(tmp_path)).connections is None  # the default policy
    s = load_settings(env_with(tmp_path, "connections = 8\n"))
    assert s.connections == 8
    s = load_settings(env_with(tmp_path, "connections = 8\n", QUANTPICK_CONNECTIONS="2"))
    assert s.connections == 2
    assert with_fetch_flags(s, connections=1).connections == 1
    assert with_fetch_flags(s).connections == 2


@pytest.mark.parametrize("bad", ["0", "65", "four", "-1"])
def test_bad_connection_counts_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UsageError, match="QUANTPICK_CONNECTIONS must be a whole number from 1"):
        load_settings(env_with(tmp_path, QUANTPICK_CONNECTIONS=bad))
    number = int(bad) if bad.lstrip("-").isdigit() else 0
    with pytest.raises(UsageError, match="--connections"):
        with_fetch_flags(load_settings(env_with(tmp_path)), connections=number)
    with pytest.raises(QuantpickError, match="connections must be a whole number"):
        load_settings(env_with(tmp_path, "connections = true\n"))


def test_an_unreadable_config_file_says_why_and_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OS's reason, or the error itself when the OS gives none (it read 'None' before)."""
    import errno

    import quantpick.config as config

    path = tmp_path / "config.toml"

    def fail(*args: object, **kwargs: object) -> str:
        raise OSError("the disk went away")

    monkeypatch.setattr(config, "read_bounded_text", fail)
    with pytest.raises(QuantpickError) as caught:
        config.read_config_file(path)
    assert caught.value.message == f"cannot read the config file {path}: the disk went away"

    def denied(*args: object, **kwargs: object) -> str:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(config, "read_bounded_text", denied)
    with pytest.raises(QuantpickError) as caught:
        config.read_config_file(path)
    assert caught.value.message == f"cannot read the config file {path}: Permission denied"
    assert (caught.value.path, caught.value.os_errno) == (str(path), errno.EACCES)
