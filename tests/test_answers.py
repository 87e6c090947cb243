"""quantpick/answers.py: a planning command's answer is replayed only while every input it read
is unchanged, and a run that read anything live is never stored.

The CLI runs as a real process (the console script's `main()`), each test in its own
QUANTPICK_HOME (conftest), with PATH holding no llama.cpp tool so that no `--version` runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from quantpick import answers

PICK = ["pick", "qwen3.8-35b-a3b-distill", "-c", "32768", "--gpu", "3090", "--ram", "64G",
        "--offline"]  # fmt: skip
NO_FIT = ["pick", "qwen3.8-35b-a3b-distill", "-c", "32768", "--gpu", "t4", "--ram", "2G",
          "--offline"]  # fmt: skip


def run_cli(
    args: list[str], env: dict[str, str] | None = None, stdout: Any = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ)
    environ.update(QUANTPICK_DEBUG="1", PATH=str(Path(sys.executable).parent) + ":/usr/bin:/bin")
    environ.pop(answers.DISABLE_ENV, None)
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "quantpick", *args],
        env=environ,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


def without_debug(text: str) -> str:
    return "".join(line for line in text.splitlines(True) if not line.startswith("debug: "))


def stored_answers() -> list[Path]:
    return sorted(answers.store_dir(os.environ).glob("*.json"))


def test_a_second_identical_pick_replays_the_first_answer_exactly() -> None:
    first = run_cli(PICK)
    assert first.returncode == 0, first.stderr
    assert "debug: answer stored at" in first.stderr
    second = run_cli(PICK)
    assert "debug: answer replayed" in second.stderr
    assert second.returncode == first.returncode
    assert second.stdout == first.stdout and second.stdout.startswith("qwen3.8-35b-a3b-distill ->")
    assert without_debug(second.stderr) == without_debug(first.stderr)


def test_a_no_fit_answer_replays_with_its_exit_code() -> None:
    first = run_cli(NO_FIT)
    assert first.returncode == 3, first.stderr
    second = run_cli(NO_FIT)
    assert "debug: answer replayed" in second.stderr
    assert second.returncode == 3 and second.stdout == first.stdout


def test_a_config_file_created_after_the_answer_is_a_new_input() -> None:
    run_cli(PICK)
    config = Path(os.environ["QUANTPICK_HOME"]) / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("connections = 4\n")
    again = run_cli(PICK)
    assert "debug: answer replayed" not in again.stderr
    assert "debug: answer stored at" in again.stderr


def test_a_changed_manifest_is_a_new_input(tmp_path: Path) -> None:
    source = Path(__file__).parents[1] / "manifests" / "qwen3.8-35b-a3b-distill.toml"
    extra = tmp_path / "manifests"
    extra.mkdir()
    copy = extra / "mine.toml"
    copy.write_text(source.read_text().replace('id = "qwen3.8-35b-a3b-distill"', 'id = "mine"'))
    args = ["pick", "mine", *PICK[2:]]
    env = {"QUANTPICK_MANIFESTS": str(extra)}
    first = run_cli(args, env)
    assert first.returncode == 0, first.stderr
    assert "debug: answer replayed" in run_cli(args, env).stderr
    copy.write_text(copy.read_text() + "\n# edited\n")
    assert "debug: answer replayed" not in run_cli(args, env).stderr


def test_another_environment_or_argv_is_another_answer() -> None:
    run_cli(PICK)
    assert "debug: answer replayed" not in run_cli(PICK, {"QUANTPICK_REUSE": "hf"}).stderr
    assert "debug: answer replayed" not in run_cli([*PICK, "--json"]).stderr


def test_turned_off_nothing_is_stored_or_replayed() -> None:
    run_cli(PICK, {answers.DISABLE_ENV: "1"})
    assert stored_answers() == []


def test_a_damaged_answer_is_a_miss_and_the_command_runs() -> None:
    first = run_cli(PICK)
    (path,) = stored_answers()
    path.write_text("{not json")
    again = run_cli(PICK)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert "debug: answer replayed" not in again.stderr
    assert json.loads(path.read_text())["exit"] == 0  # stored anew


def test_a_forged_answer_for_other_inputs_is_not_replayed() -> None:
    run_cli(PICK)
    (path,) = stored_answers()
    record = json.loads(path.read_text())
    record["inputs"] = record["inputs"].replace("3090", "4090")
    record["output"] = [[1, "forged\n"]]
    path.write_text(json.dumps(record))
    assert "forged" not in run_cli(PICK).stdout


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")
def test_a_store_others_can_write_to_is_never_replayed() -> None:
    first = run_cli(PICK)
    (path,) = stored_answers()
    path.parent.chmod(0o777)  # a shared folder: anyone could have planted this answer
    again = run_cli(PICK)
    assert "debug: answer replayed" not in again.stderr and again.stdout == first.stdout
    path.parent.chmod(0o700)
    path.chmod(0o666)
    assert "debug: answer replayed" not in run_cli(PICK).stderr


def test_only_planning_commands_are_recorded() -> None:
    assert answers.enabled(["pick", "m", "-c", "1"], {})
    assert answers.enabled(["--offline", "estimate", "m"], {})
    assert not answers.enabled(["get", "m", "-c", "1"], {})
    assert not answers.enabled(["serve", "m"], {})
    assert not answers.enabled(["pick", "--help"], {})
    assert not answers.enabled(["pick", "m"], {answers.DISABLE_ENV: "1"})
    assert not answers.enabled(["pick", "m"], {"_QUANTPICK_COMPLETE": "complete_bash"})


# What makes a recording live: each snippet runs inside a started Recorder in its own process
# (an audit hook cannot be removed from the test process).
LIVE = {
    "a program": "subprocess.run(['true'])",
    "the network": "socket.create_connection(('127.0.0.1', 9), timeout=1)",
    "/proc": "open('/proc/meminfo').read()",
    "free disk space": "shutil.disk_usage('.')",
    "the CPU count": "os.cpu_count()",
    "a written file": "open(os.path.join(tmp, 'out'), 'w').write('x')",
    "a native library": "ctypes.CDLL(None)",
    "an input that changed while it ran": "open(src).read(); open(src, 'a').write('more')",
    "a path relative to a descriptor": "os.stat('x', dir_fd=os.open(tmp, os.O_RDONLY))",
}


@pytest.mark.parametrize("what", sorted(LIVE))
def test_a_run_that_reads_anything_live_is_not_stored(what: str, tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("x")
    script = textwrap.dedent(
        f"""
        import ctypes, os, shutil, socket, subprocess, sys
        from quantpick import answers
        tmp, src = {str(tmp_path)!r}, {str(source)!r}
        recorder = answers.Recorder(["pick", "m"], os.environ)
        recorder.start()
        try:
            {LIVE[what]}
        except OSError:
            pass
        path = recorder.save(0)
        sys.__stdout__.write(repr((path, recorder.why_not)))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))  # fmt: skip
    assert out.returncode == 0, out.stderr
    path, why = eval(out.stdout)  # noqa: S307 - our own repr of (None | str, str)
    assert path is None and why, (what, why)
    assert stored_answers() == []


def test_a_pure_run_stores_what_it_read_and_printed(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("x")
    script = textwrap.dedent(
        f"""
        import os, sys
        from quantpick import answers
        recorder = answers.Recorder(["pick", "m"], os.environ)
        recorder.start()
        print(open({str(source)!r}).read())
        os.path.exists({str(tmp_path / "absent")!r})
        sys.stdout.flush()
        sys.__stdout__.write("|" + str(recorder.save(3)))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))  # fmt: skip
    assert out.returncode == 0, out.stderr
    stored = json.loads(Path(out.stdout.split("|")[1]).read_text())
    files = dict((p, sig) for p, sig in stored["files"])
    assert files[str(source)] == answers.signature(str(source)) is not None
    assert files[str(tmp_path / "absent")] is None  # absence is an input too
    assert stored["output"] == [[1, "x"], [1, "\n"]] and stored["exit"] == 3


def test_a_directory_only_stated_may_gain_entries_but_a_listed_one_may_not(
    tmp_path: Path,
) -> None:
    """An ancestor of the package (realpath stats it) gains files from anything else on the
    machine (/tmp): that is no input of the answer. A directory the run listed is one."""
    stated, listed = tmp_path / "stated", tmp_path / "listed"
    stated.mkdir()
    listed.mkdir()
    script = textwrap.dedent(
        f"""
        import os, sys
        from quantpick import answers
        recorder = answers.Recorder(["pick", "m"], os.environ)
        recorder.start()
        os.stat({str(stated)!r})
        print(sorted(os.listdir({str(listed)!r})))
        sys.stdout.flush()
        sys.__stdout__.write("|" + repr((str(recorder.save(0)), recorder.why_not)))
        """
    )

    def record() -> tuple[str, str | None]:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ))  # fmt: skip
        assert out.returncode == 0, out.stderr
        return eval(out.stdout.split("|")[1])  # noqa: S307 - our own repr

    path, why = record()
    assert why is None
    stored = json.loads(Path(path).read_text())
    files = dict((p, sig) for p, sig in stored["files"])
    assert len(files[str(stated)]) == 2 and len(files[str(listed)]) == 5
    (stated / "made-by-another-process").write_text("x")
    assert all(answers.unchanged(p, sig) for p, sig in stored["files"])
    (listed / "a-new-entry").write_text("x")
    assert not answers.unchanged(str(listed), files[str(listed)])


def test_the_stored_answers_are_bounded(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"{i}.json").write_text("{}")
        os.utime(tmp_path / f"{i}.json", ns=(i * 10**9, i * 10**9))
    answers.prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.json", "4.json"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_replayed_answer_that_cannot_be_written_is_one_error_line() -> None:
    run_cli(PICK)
    assert "debug: answer replayed" in run_cli(PICK).stderr
    with open("/dev/full", "w") as full:
        done = run_cli(PICK, stdout=full)
    assert "debug: answer replayed" not in done.stderr  # it failed before it was replayed
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "Error: cannot write the output: No space left on device: <stdout>"
    )


def test_the_store_is_where_the_settings_put_the_cache(tmp_path: Path) -> None:
    from quantpick.config import load_settings

    for env in ({"QUANTPICK_HOME": str(tmp_path)}, {"HOME": str(tmp_path / "user")}):
        assert answers.store_dir(env).parent == load_settings(env).cache_dir


def test_an_oversized_or_linked_answer_is_a_miss_and_never_read_whole(tmp_path: Path) -> None:
    first = run_cli(PICK)
    (path,) = stored_answers()
    record = json.loads(path.read_text())
    record["padding"] = " " * answers.MAX_ANSWER_BYTES  # a valid answer, over the read's cap
    path.write_text(json.dumps(record))
    again = run_cli(PICK)
    assert "debug: answer replayed" not in again.stderr and again.stdout == first.stdout
    (path,) = stored_answers()
    target = tmp_path / "elsewhere.json"
    target.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(target)  # the stored answer's own place is a link: not followed
    assert "debug: answer replayed" not in run_cli(PICK).stderr
