"""The layouts a plan is handed (LayoutSource.layouts): every quant the manifest can give is
listed, but a synthesized table is built only when the planner reads it (#27 start-up: a pick
weighs four of the bundled manifest's ten quants)."""

from __future__ import annotations

import pytest

from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model import headers
from quantpick.model.headers import LayoutSource
from quantpick.model.registry import find_manifest
from quantpick.plan.plan_types import Placement, PlanRequest
from quantpick.plan.planner import plan

GiB = 1024**3


def _box() -> Machine:
    gpus = tuple(
        Gpu(index=i, name=f"GPU{i}", total_bytes=gib * GiB, free_bytes=gib * GiB)
        for i, gib in enumerate((24, 16))
    )
    return Machine(gpus=gpus, host=Host(64 * GiB, 64 * GiB, 8), described=True, source="test")


def test_a_pick_synthesizes_only_the_quants_it_weighs(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    real = headers.synthesize_layout

    def counting(arch, quant, file_bytes):  # type: ignore[no-untyped-def]
        built.append(quant)
        return real(arch, quant, file_bytes)

    monkeypatch.setattr(headers, "synthesize_layout", counting)
    manifest = find_manifest("qwen3.8-35b-a3b-distill")
    source = LayoutSource(manifest, exact=False, network=False)
    layouts = source.layouts()
    assert list(layouts) == list(manifest.quants) and len(layouts) == len(manifest.quants)
    assert built == [] and source.problems == []
    p = plan(manifest, _box(), layouts, PlanRequest(ctx_size=32768))
    weighed = {c.quant for c in p.candidates if c.placement is not Placement.NOT_SEARCHED}
    assert sorted(built) == sorted(weighed)
    assert 0 < len(built) < len(manifest.quants)
    # read again: the same layout, not a second synthesis
    assert layouts[p.quant] is source(p.quant) and sorted(built) == sorted(weighed)
    assert "no-such-quant" not in layouts
    with pytest.raises(KeyError):
        layouts["no-such-quant"]
