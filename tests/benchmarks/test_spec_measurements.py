"""benchmarks/data/spec-measurements.json and how benchmarks/spec_accuracy.py reads it."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from spec_accuracy import (  # noqa: E402
    DATA,
    architecture,
    fit_draft_overhead,
    fitted,
    fitted_hit,
    gated,
    predict,
    row_costs,
)

from quantpick.machine.backends import BackendKind  # noqa: E402
from quantpick.model.speculative import SpecKind  # noqa: E402
from quantpick.plan.speculative import DRAFT_TOKEN_OVERHEAD_MS, Task  # noqa: E402

ROWS: list[dict] = json.loads(DATA.read_text())["rows"]
REQUIRED = ("id", "source", "note", "kind", "task", "config", "quant", "file_gb", "backend",
            "n_max", "rate", "tg_without", "tg_with")  # fmt: skip


def test_every_row_has_the_keys_the_benchmark_reads() -> None:
    assert [r["id"] for r in ROWS] == list(range(1, len(ROWS) + 1))
    for r in ROWS:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, (r["id"], missing)
        assert r["source"].startswith("https://"), r["id"]
        assert r["note"].strip(), r["id"]
        SpecKind(r["kind"]), Task(r["task"]), BackendKind(r["backend"])
        assert int(r["n_max"]) >= 1 and r["file_gb"] > 0
        assert r["rate"] is None or 0.0 < r["rate"] <= 1.0, r["id"]
        assert 0.0 <= float(r.get("p_min") or 0.0) < 1.0
        for key in ("tg_without", "tg_with"):
            assert r[key] is None or r[key] > 0, (r["id"], key)
        if "anomalous" in r:
            assert isinstance(r["anomalous"], str) and len(r["anomalous"]) > 20, r["id"]
        architecture(r["config"])  # a config the benchmark knows
        if r.get("gpu") is None:
            assert r["backend"] == "cpu" and r.get("cpu_cores"), r["id"]


def test_draft_rows_name_their_draft_and_ngram_rows_their_hit() -> None:
    for r in ROWS:
        if r["kind"] == "draft":
            assert r["draft_gb"] > 0 and r["draft_quant"], r["id"]
            architecture(r["draft_config"])
        if r["kind"] == "ngram" and r.get("tg_with"):
            assert 0.0 <= r["hit"] <= 1.0, r["id"]


def test_each_kind_has_rows_with_both_speeds_from_more_than_one_source() -> None:
    usable = [r for r in ROWS if r.get("tg_without") and r.get("tg_with")
              and not r.get("anomalous")]  # fmt: skip
    rows = Counter(r["kind"] for r in usable)
    sources = {k: {r["source"] for r in usable if r["kind"] == k} for k in rows}
    assert rows["draft"] >= 6 and len(sources["draft"]) >= 3
    assert rows["ngram"] >= 3 and len(sources["ngram"]) >= 2
    assert rows["mtp"] >= 6


def test_held_out_fits_leave_the_rows_source_out() -> None:
    by_source = Counter(r["source"] for r in ROWS if r["kind"] == "draft" and r.get("rate"))
    only = next(s for s, n in by_source.items() if n == 1)
    alone = next(r for r in ROWS if r["source"] == only and r["kind"] == "draft")
    # its own acceptance does not enter the figure it is predicted with
    mine = [r for r in ROWS if r["kind"] == "draft" and r.get("rate") and r["source"] != only]
    assert fitted(mine, "draft", alone["task"], None) == fitted(ROWS, "draft", alone["task"], only)
    assert fitted_hit(ROWS, "draft", "mixed", None) == 1.0
    assert fitted_hit(ROWS, "ngram", "mixed", "https://nowhere") == 0.0


def test_the_table_overhead_is_the_fit_of_the_rows() -> None:
    assert fit_draft_overhead(ROWS, None) == pytest.approx(DRAFT_TOKEN_OVERHEAD_MS, abs=0.01)


@pytest.mark.parametrize("row_id", [1, 19, 21, 30, 35, 40])
def test_rows_of_every_kind_and_machine_predict(row_id: int) -> None:
    row = next(r for r in ROWS if r["id"] == row_id)
    costs = row_costs(row)
    # scaled to the row's own baseline
    assert 1.0 / costs.decode_s == pytest.approx(row["tg_without"], rel=1e-9)
    a = fitted(ROWS, row["kind"], row["task"], row["source"]) or 0.0
    tps = predict(row, costs, a, float(row.get("hit", 1.0)))
    assert math.isfinite(tps) and tps > 0
    assert gated(row) == (float(row.get("p_min") or 0) > 0)


def test_acceptance_only_and_off_domain_rows() -> None:
    """A suite's category (no speed of its own) enters the acceptance fit; a pair measured off
    its domain (a coder pair on chat) is reported and never fitted."""
    only = [r for r in ROWS if r["tg_without"] is None and r["tg_with"] is None]
    assert only and all(r["rate"] for r in only)
    off = [r for r in ROWS if r.get("off_domain")]
    assert off and all(len(r["off_domain"]) > 40 for r in off)
    chat = fitted(ROWS, "draft", "chat", None)
    assert chat == fitted([r for r in ROWS if not r.get("off_domain")], "draft", "chat", None)
    # the off-domain rows would pull it far down: they are not silently in the median
    with_off = [{k: v for k, v in r.items() if k != "off_domain"} for r in ROWS]
    low = fitted(with_off, "draft", "chat", None)
    assert chat is not None and low is not None and low < chat - 0.1
    # code: row 19's source held out, the suite's code prompts remain
    code_out = fitted(ROWS, "draft", "code", "https://github.com/ggml-org/llama.cpp/pull/10455")
    assert code_out is not None and abs(code_out - 0.86) < 0.02
