"""quantpick's weights and KV + recurrent state per device, against llama.cpp's own projection of
its own test model of every architecture (tests/llamacpp_archs.py), to the byte.

The recorded projections (tests/data/llamacpp-archs.json.gz, scripts/record_arch_conformance.py)
are checked on every run; with the pinned llama.cpp built (QUANTPICK_TEST_LLAMA_BIN), the live
test regenerates the models and asks llama.cpp again.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from llamacpp_archs import GRID, Case, case_from_dict, generate_models, machine, project

from quantpick.arch.registry import support
from quantpick.model.gguf import header_from_json, layout_from_header, read_gguf_file
from quantpick.model.layout import ModelLayout
from quantpick.plan.compute import within
from quantpick.plan.memory import estimate

MiB = 1024**2
DATA = Path(__file__).resolve().parents[1] / "data" / "llamacpp-archs.json.gz"

# Architectures whose caches quantpick does not model yet, and why (docs/architectures.md). The
# test expects them to differ: one that starts to match must leave this list.
NOT_EXACT = {
    "dots3note": "the DSA-iSWA cache (an indexer beside a sliding window) is not modelled",
    "qwen4exp": "its PLE convolution rows and hybrid-idx indexer are not modelled",
}


Devices = dict[str, dict[str, int]]


@cache
def recorded() -> dict[str, Any]:
    with gzip.open(DATA, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def quantpick_bytes(layout: ModelLayout, case: Case) -> Devices:
    est = estimate(layout, machine(case.rpc), case.config())
    names = {"Host": est.host, **{f"RPC{i}": d for i, d in enumerate(est.gpus)}}
    return {
        name: {"model": d.weights_bytes, "context": d.kv_bytes + d.recurrent_bytes}
        for name, d in names.items()
    }


def mismatches(layout: ModelLayout, cases: list[tuple[Case, Devices]]) -> list[str]:
    out = []
    for case, devices in cases:
        ours = quantpick_bytes(layout, case)
        for name, theirs in devices.items():
            for part in ("model", "context"):
                if ours[name][part] != theirs[part]:
                    out.append(
                        f"{' '.join(case.flags())}: {name} {part} quantpick {ours[name][part]:,} "
                        f"llama.cpp {theirs[part]:,}"
                    )
    return out


def _models() -> list[str]:
    return sorted(recorded()["models"])


@pytest.mark.parametrize("model", _models())
def test_every_architecture_matches_llamacpp_to_the_byte(model: str) -> None:
    entry = recorded()["models"][model]
    grid = [case_from_dict(c) for c in recorded()["grid"]]
    layout = layout_from_header(header_from_json(entry["header"]), basis=model)
    cases = [(grid[c["case"]], c["devices"]) for c in entry["cases"] if c["error"] is None]
    assert cases, f"llama.cpp refused every case of {model}"
    arch = layout.architecture.name
    problems = mismatches(layout, cases)
    if arch in NOT_EXACT:
        assert problems, f"{arch} now matches llama.cpp: take it off NOT_EXACT"
        pytest.xfail(NOT_EXACT[arch])
    assert problems == []


def test_the_fixture_covers_the_architectures_and_most_are_exact() -> None:
    """The issue's goal: of the decoder-only text architectures test-llama-archs writes, at least
    90% exact; every architecture it writes is known to the registry."""
    archs = {m.rsplit("-", 1)[0] for m in recorded()["models"]}
    assert len(archs) >= 120
    unknown = sorted(a for a in archs if not support(a).known)
    assert unknown == ["dots3note", "nanbeige", "qwen4exp"]
    assert len(archs - set(NOT_EXACT)) / len(archs) >= 0.9


def test_llamacpp_refusals_are_quantpicks_too() -> None:
    """A case llama.cpp refuses (grok forces flash attention off, so no quantized V; laguna's
    80-wide heads take no q8_0) is one quantpick's planner does not offer either."""
    from quantpick.errors import UsageError

    grid = [case_from_dict(c) for c in recorded()["grid"]]
    refused = 0
    for model, entry in recorded()["models"].items():
        layout = layout_from_header(header_from_json(entry["header"]), basis=model)
        for c in entry["cases"]:
            if c["error"] is None or "kimi-linear" in model:  # kimi-linear np 3: llama.cpp's assert
                continue
            refused += 1
            with pytest.raises(UsageError):
                estimate(layout, machine(grid[c["case"]].rpc), grid[c["case"]].config())
    assert refused >= 2


@pytest.mark.llamacpp
def test_live_llamacpp_agrees_on_every_architecture(llamacpp_bin: Path, tmp_path: Path) -> None:
    """A fresh test-llama-archs run, every model and the whole grid, against llama.cpp now."""
    from rpc_workers import rpc_workers

    problems: list[str] = []
    with rpc_workers(llamacpp_bin, 2) as endpoints:
        for name, path in generate_models(llamacpp_bin, tmp_path / "models").items():
            layout = layout_from_header(read_gguf_file(path), basis=name)
            if layout.architecture.name in NOT_EXACT:
                continue
            moe = layout.view.is_moe
            cases = []
            for case in GRID:
                if case.moe_only and not moe:
                    continue
                got = project(llamacpp_bin, path, case, endpoints)
                if got.error is None:
                    cases.append((case, got.devices))
            problems += [f"{name}: {p}" for p in mismatches(layout, cases)]
    assert problems == []


# ---- full-size real configs (tests/data/arch-real, scripts/record_arch_real.py) ----------------


def _real() -> list[Path]:
    from arch_real import DATA as REAL

    return sorted(REAL.glob("*.json"))


@pytest.mark.parametrize("path", _real(), ids=lambda p: p.stem)
def test_real_configs_match_llamacpp_to_the_byte(path: Path) -> None:
    """Llama 3.1, Mistral Small, Qwen2.5/3/3.5/3.6, Qwen3-30B-A3B, Qwen3-Next, Gemma 3/4, gpt-oss,
    DeepSeek-V3, GLM-4.5-Air, Ministral 3, Nemotron-H, LFM2 at their real sizes, header-only."""
    from arch_real import rows

    got = rows(path)
    assert got
    assert [r for r in got if not r.exact] == []


def test_every_family_checked_set_is_what_the_recordings_prove() -> None:
    """A family's `checked` architectures are those a recording proves exact: none claimed
    without evidence, none proven left out."""
    from quantpick.arch.registry import families

    proven = {m.rsplit("-", 1)[0] for m in recorded()["models"]} - set(NOT_EXACT)
    for path in _real():
        proven.add(json.loads(path.read_text())["arch"])
    for fam in families():
        assert fam.checked <= proven, fam.name
        assert set(fam.architectures) & proven <= fam.checked, fam.name


# ---- compute buffers: the graph allocator's peak (plan/compute.py) -----------------------------

# Architectures with a recorded device row off by more than 25% (and 16 MiB), and exactly why
# (benchmarks/arch_*accuracy.py). One that comes within must leave this list.
COMPUTE_BEYOND_25: dict[str, str] = {
    # none: LFM2-1.2B at -c 32768 -ub 4096 -np 1 (1136 vs 1568 MiB) left when the logits followed
    # the allocator's zero-byte free block (plan/compute.py state_rows_fence): 1520 MiB
}


def _compute_rows() -> list[tuple[str, int, int]]:
    """(architecture, quantpick's compute bytes, llama.cpp's) for every recorded device row."""
    from arch_real import grid_rows, rows

    out = []
    grid = [case_from_dict(c) for c in recorded()["grid"]]
    for model, entry in sorted(recorded()["models"].items()):
        layout = layout_from_header(header_from_json(entry["header"]), basis=model)
        for c in entry["cases"]:
            if c["error"] is not None:
                continue
            case = grid[c["case"]]
            est = estimate(layout, machine(case.rpc), case.config())
            ours = {"Host": est.host, **{f"RPC{i}": d for i, d in enumerate(est.gpus)}}
            for name, theirs in c["devices"].items():
                out.append((layout.architecture.name, ours[name].compute_bytes, theirs["compute"]))
    archs = {}
    for path in _real():
        arch = json.loads(path.read_text())["arch"]
        archs[path.stem] = arch
        for r in rows(path):
            scale = MiB if r.unit == "MiB" else 1
            out.append((arch, r.compute[0] * scale, r.compute[1] * scale))
    for r in grid_rows():
        out.append((archs[r.config], r.compute[0], r.compute[1]))
    return out


def test_compute_is_within_the_expected_error_of_llamacpp() -> None:
    """The issue's goal: compute within max(5%, 16 MiB) of llama.cpp b11312 on >= 95% of the
    recorded device rows (every test-llama-archs model, every real config and its compute grid),
    and no row off by more than 25% outside the architectures listed in COMPUTE_BEYOND_25."""
    got = _compute_rows()
    ok = sum(within(ours, theirs) for _, ours, theirs in got)
    assert ok / len(got) >= 0.95, f"{ok}/{len(got)}"
    beyond = {a for a, ours, theirs in got if abs(ours - theirs) > max(0.25 * theirs, 16 * MiB)}
    assert beyond == set(COMPUTE_BEYOND_25)


@pytest.mark.parametrize("path", _real(), ids=lambda p: p.stem)
def test_real_config_compute_is_within_the_expected_error(path: Path) -> None:
    from arch_real import rows

    got = rows(path)
    scale = {"MiB": MiB, "bytes": 1}
    ok = sum(within(r.compute[0] * scale[r.unit], r.compute[1] * scale[r.unit]) for r in got)
    assert ok / len(got) >= 0.9


def test_the_compute_grid_keeps_weights_and_kv_exact() -> None:
    """-ub 128-4096, FA off, -np 4/8 with and without -kvu, -ngl 0 on two devices, -ot exps=CPU and
    --n-cpu-moe (tests/data/arch-real-compute.json.gz): weights and KV+state stay exact."""
    from arch_real import grid_rows

    got = grid_rows()
    assert len(got) >= 300
    assert [r for r in got if not r.exact] == []
