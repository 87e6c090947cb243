"""The fitted compute-graph rules (quantpick/plan/graph_rules.py): a generated table, one record a
line, that `scripts/fit_compute.py --emit` rewrites."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from script_module import load_script

from quantpick.plan.graph_rules import GENERIC, GRAPH_RULES, GraphRule


def _fit_script() -> ModuleType:
    return load_script("fit_compute")


def _emit_lfm2_into_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, generic: set[str]
) -> dict[str, Any]:
    """Emit a refitted lfm2 record into a copy of graph_rules.py; the copy's GRAPH_RULES."""
    fit = _fit_script()
    copy = tmp_path / "graph_rules.py"
    shutil.copy(fit.RULES_PY, copy)
    monkeypatch.setattr(fit, "RULES_PY", copy)
    monkeypatch.setattr(fit, "ROOT", tmp_path)
    record = (
        '    "lfm2": GraphRule(layer=1.0, source="9/9 rows within, median 1.0%, 0 beyond 25%"),'
    )
    fit.emit({"lfm2": record}, generic=generic)
    namespace: dict[str, object] = {}
    exec(compile(copy.read_text(encoding="utf-8"), str(copy), "exec"), namespace)  # noqa: S102
    rules = namespace["GRAPH_RULES"]
    assert isinstance(rules, dict)
    return rules


def test_every_rule_names_its_fit_and_differs_from_the_generic_rule_somewhere() -> None:
    for arch, rule in GRAPH_RULES.items():
        assert "rows within" in rule.source, arch
        assert any(
            getattr(rule, f) != getattr(GENERIC, f) for f in GraphRule.__dataclass_fields__
        ), arch


def test_the_fit_script_reads_every_record_of_the_table() -> None:
    fit = _fit_script()
    text = fit.RULES_PY.read_text(encoding="utf-8")
    block = fit.BLOCK.search(text)
    assert block is not None
    arches = [m["arch"] for m in map(fit.RECORD.match, block[2].splitlines()) if m]
    assert arches == sorted(GRAPH_RULES)


def test_emit_rewrites_only_the_fitted_records_and_keeps_their_notes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = _emit_lfm2_into_a_copy(tmp_path, monkeypatch, generic=set())
    assert sorted(rules) == sorted(GRAPH_RULES)
    assert rules["lfm2"].layer == 1.0
    # the record's note after "beyond 25%" stays with it
    assert rules["lfm2"].source.endswith("0 beyond 25% (with state_rows_fence)")
    # the others as they were (the copy defines its own GraphRule class: compare their reprs)
    assert {a: repr(r) for a, r in rules.items() if a != "lfm2"} == {
        a: repr(r) for a, r in GRAPH_RULES.items() if a != "lfm2"
    }


def test_a_refit_drops_a_record_only_where_the_generic_rule_holds_and_nothing_else_backs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refit where the generic rule holds on an architecture's rows drops its record, unless the
    record's note says it rests on other data the script does not read (minimax-m3's
    tests/data/arch-traits.json, beside its GraphTrait): a full `--emit` lost it before."""
    # lfm2 refitted; the generic rule holds on gemma3's and minimax-m3's rows
    rules = _emit_lfm2_into_a_copy(tmp_path, monkeypatch, generic={"gemma3", "minimax-m3"})
    assert "minimax-m3" in rules
    assert sorted(rules) == sorted(set(GRAPH_RULES) - {"gemma3"})
