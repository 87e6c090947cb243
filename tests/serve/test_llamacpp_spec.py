"""Against the real llama.cpp build (marked `llamacpp`): the tiny qwen35moe model with an MTP block
is served with the flags `quantpick command --spec mtp` chooses, loads its MTP draft context and
answers a completion; and the memory of that configuration is what llama-server allocates.

Run with: QUANTPICK_TEST_LLAMA_BIN=/path/to/llama.cpp/build/bin pytest -m llamacpp
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quantpick.cli import app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.llamacpp
runner = CliRunner()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, data: dict | None = None) -> dict:
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - 127.0.0.1 only
        return json.loads(r.read())


def _serve_and_ask(argv: list[str], log: Path) -> str:
    """Run `argv` (on a free port, -lv 4) until healthy, ask one completion, stop it; the log."""
    port = _free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    with log.open("w") as out:
        proc = subprocess.Popen([*argv, "-lv", "4"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if _get(f"http://127.0.0.1:{port}/health").get("status") == "ok":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server did not become healthy"
            time.sleep(0.3)
        answer = _get(
            f"http://127.0.0.1:{port}/completion",
            {"prompt": "hello", "n_predict": 16, "temperature": 0},
        )
        assert answer["tokens_predicted"] > 0 and isinstance(answer["content"], str)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return log.read_text()


def test_tiny_mtp_model_served_with_the_chosen_flags_answers(
    llamacpp_bin: Path, tmp_path: Path
) -> None:
    model = tmp_path / "tiny-mtp.gguf"
    write_tiny_model(model, mtp=True)
    server = llamacpp_bin / "llama-server"
    args = ["command", "--gguf", str(model), "-c", "4096", "--spec", "mtp", "--no-confirm"]
    result = runner.invoke(app, [*args, "--llama-server", str(server), "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    spec = doc["plan"]["speculative"]
    assert spec["enabled"] and spec["kind"] == "mtp"
    argv = list(doc["command"]["argv"])
    n = spec["draft_n_max"]
    i = argv.index("--spec-type")
    assert argv[i : i + 4] == ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(n)]
    text = _serve_and_ask(argv, tmp_path / "server.log")
    assert "creating MTP draft context" in text
    # the draft context's KV: the NextN layer, 4096 cells (the plan's own -c), f16
    assert (
        "llama_kv_cache: size =    2.00 MiB (  4096 cells,   1 layers"
        in text.split("creating MTP draft context")[1]
    )


@pytest.mark.parametrize("kind", ["mtp", "draft"])
def test_bench_spec_measures_both_ways(llamacpp_bin: Path, tmp_path: Path, kind: str) -> None:
    """`bench --spec mtp` (the model's NextN block) and `bench --spec draft --draft FILE`: the
    plain plan is benched (and would calibrate), the speculation is measured both ways through
    llama-server's timings (draft counts included), never stored."""
    from tiny_model import TINY_DRAFT

    model = tmp_path / "tiny-mtp.gguf"
    write_tiny_model(model, mtp=kind == "mtp")
    extra: list[str] = []
    if kind == "draft":
        draft = tmp_path / "tiny-draft.gguf"
        write_tiny_model(draft, hparams=TINY_DRAFT, seed=1)
        extra = ["--draft", str(draft)]
    args = ["bench", "--gguf", str(model), "-c", "4096", "--spec", kind, *extra, "--reps", "1",
            "--n-prompt", "32", "--n-gen", "16", "--no-save"]  # fmt: skip
    result = runner.invoke(app, [*args, "--llama-bin", str(llamacpp_bin), "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert "--spec-type" not in doc["bench"]["argv"]  # the calibration run is the plain plan
    assert "-md" not in doc["bench"]["argv"]
    spec = doc["speculative"]
    assert spec["measured"] and spec["kind"] == kind and spec["problems"] == []
    assert spec["decode_tps_with"] > 0 and spec["decode_tps_without"] > 0
    assert spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"]
    assert "--spec-type" in spec["argv"] and "not stored in the calibration" in spec["reason"]


@pytest.mark.parametrize(
    ("spec", "kind", "spec_type"),
    [("draft", "draft", "draft-simple"), ("mtp", "mtp", "draft-mtp")],
    ids=["draft-model", "mtp-sidecar"],
)
def test_tiny_model_with_a_draft_file_answers_and_allocates_the_plan(
    llamacpp_bin: Path, tmp_path: Path, spec: str, kind: str, spec_type: str
) -> None:
    """`command --draft FILE --spec draft` (a smaller model of the same vocabulary) and
    `--spec mtp` with an mtp- sidecar (for a model without a NextN block): llama-server loads
    the file where the plan put it, starts that speculation (the vocabularies are compatible),
    answers, and allocates the draft's model and KV buffers the plan counted
    (speculative.draft_model.devices)."""
    from tiny_model import TINY_DRAFT

    model, draft = tmp_path / "tiny.gguf", tmp_path / "mtp-tiny-Q8_0.gguf"
    write_tiny_model(model)
    if kind == "mtp":
        write_tiny_model(draft, sidecar=True, seed=3)
    else:
        draft = tmp_path / "tiny-draft.gguf"
        write_tiny_model(draft, hparams=TINY_DRAFT, seed=1)
    server = llamacpp_bin / "llama-server"
    args = ["command", "--gguf", str(model), "-c", "4096", "-np", "2", "--spec", spec,
            "--draft", str(draft), "--no-confirm", "--llama-server", str(server),
            "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    plan_spec = doc["plan"]["speculative"]
    assert plan_spec["enabled"] and plan_spec["kind"] == kind
    argv = list(doc["command"]["argv"])
    i = argv.index("--spec-type")
    assert argv[i : i + 4] == ["--spec-type", spec_type, "-md", str(draft.resolve())]
    host = {d["device"]: d for d in plan_spec["draft_model"]["devices"]}["CPU"]
    text = _serve_and_ask(argv, tmp_path / "server.log")
    assert f"adding speculative implementation '{spec_type}'" in text
    assert "not compatible" not in text
    drafted = text.split("loading draft model")[1]
    for pattern, key in (("model buffer size =", "weights_bytes"),
                         ("llama_kv_cache: size =", "kv_bytes")):  # fmt: skip
        m = re.search(pattern + r"\s+([0-9.]+) MiB", drafted)
        assert m is not None and float(m.group(1)) == round(host[key] / 2**20, 2), pattern
