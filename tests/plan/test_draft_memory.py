"""A draft model's memory against llama-server's own buffer lines (-lv 4), recorded over a grid
by scripts/record_draft_oracle.py into tests/data/llama-server-draft-buffers.json: the draft's
second llama_context (weights, KV at the target's n_ctx and -ctkd, recurrent state, output for
np rows, compute) and the target's own buffers beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_model import TINY_DRAFT, write_tiny_model

from quantpick.machine.spec import Host, Machine
from quantpick.model.local import load_draft, local_layout, local_vocabulary
from quantpick.model.speculative import DraftModel, vocab_problem
from quantpick.plan.draft import combine, draft_estimate
from quantpick.plan.memory import DraftRun, RunConfig, estimate

DATA = Path(__file__).resolve().parents[1] / "data" / "llama-server-draft-buffers.json"
DOC = json.loads(DATA.read_text())
MiB = 1024**2
GiB = 1024**3
HOST_ONLY = Machine(gpus=(), host=Host(64 * GiB, 64 * GiB, 8), described=True, source="test")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("draft")
    write_tiny_model(d / "tiny.gguf")
    write_tiny_model(d / "tiny-draft.gguf", hparams=TINY_DRAFT, seed=1)
    return d / "tiny.gguf", d / "tiny-draft.gguf"


def mib(n: int) -> float:
    return round(n / MiB, 2)


def within_compute_bounds(estimated: int, real_mib: float) -> bool:
    """The compute issue's bound: max(5%, 16 MiB) (plan/compute.py)."""
    return abs(estimated / MiB - real_mib) <= max(0.05 * real_mib, 16.0)


@pytest.mark.parametrize(
    "case",
    DOC["cases"],
    ids=lambda c: f"c{c['ctx']}-np{c['np']}-n{c['n_max']}-{c['ctkd']}{'-kvu' if c['kvu'] else ''}",
)
def test_draft_context_matches_llama_server(files: tuple[Path, Path], case: dict) -> None:
    target_path, draft_path = files
    target = local_layout(target_path, None)
    draft = load_draft(draft_path)
    run = DraftRun(str(draft_path), case["n_max"], 0, ())
    config = RunConfig(
        ctx_size=case["ctx"], n_parallel=case["np"], kv_unified=case["kvu"], draft=run,
        spec_cache_type_k=case["ctkd"], spec_cache_type_v=case["ctkd"], devices=(),
    )  # fmt: skip
    tgt = estimate(target, HOST_ONLY, config)
    own = draft_estimate(draft, HOST_ONLY, config, tgt, run).host
    real = case["draft"]
    assert mib(own.weights_bytes) == real["model"]
    assert mib(own.kv_bytes) == real["kv"]
    assert mib(own.recurrent_bytes) == real["recurrent"]
    assert mib(own.overhead_bytes) == real["output"]  # np rows (n_outputs_max = np)
    assert within_compute_bounds(own.compute_bytes, real["compute"])
    # the target beside it: its own buffers, no rollback snapshots for a draft model
    main = case["main"]
    host = tgt.host
    assert mib(host.weights_bytes) == main["model"]
    assert mib(host.kv_bytes) == main["kv"]
    assert mib(host.recurrent_bytes) == main["recurrent"]
    assert within_compute_bounds(host.compute_bytes, main["compute"])
    # the plan's rows are the sum, on the same device
    both = combine(tgt, draft_estimate(draft, HOST_ONLY, config, tgt, run)).host
    assert both.total_bytes == host.total_bytes + own.total_bytes


def test_draft_compute_is_close_on_the_tiny_pair(files: tuple[Path, Path]) -> None:
    """How close the draft context's compute estimate is over the grid (the compute model's
    own accuracy, not a rule of this module): printed by -v, bounded loosely here."""
    target_path, draft_path = files
    draft = load_draft(draft_path)
    target = local_layout(target_path, None)
    ratios = []
    for case in DOC["cases"]:
        run = DraftRun(str(draft_path), case["n_max"], 0, ())
        config = RunConfig(ctx_size=case["ctx"], n_parallel=case["np"], kv_unified=case["kvu"],
                           draft=run, devices=())  # fmt: skip
        tgt = estimate(target, HOST_ONLY, config)
        own = draft_estimate(draft, HOST_ONLY, config, tgt, run).host
        ratios.append(own.compute_bytes / MiB / case["draft"]["compute"])
    assert 0.5 <= min(ratios) and max(ratios) <= 2.0, ratios


@pytest.mark.parametrize("refusal", DOC["refusals"], ids=lambda r: r["draft"])
def test_vocab_check_refuses_what_llama_server_refused(
    files: tuple[Path, Path], refusal: dict, tmp_path: Path
) -> None:
    target_path, _ = files
    kwargs: dict = {
        "vocab-1024-larger": {"hparams": dict(TINY_DRAFT, n_vocab=2048)},
        "token-600-text": {"hparams": TINY_DRAFT, "odd_token": 600},
    }[refusal["draft"]]
    odd = tmp_path / "odd.gguf"
    write_tiny_model(odd, seed=2, **kwargs)
    target = local_vocabulary(target_path, local_layout(target_path, None))
    problem = vocab_problem(target, load_draft(odd).vocab)
    assert refusal["refused"] and problem is not None


def test_the_recorded_draft_is_compatible(files: tuple[Path, Path]) -> None:
    target_path, draft_path = files
    target = local_vocabulary(target_path, local_layout(target_path, None))
    draft: DraftModel = load_draft(draft_path)
    assert all(c["started"] for c in DOC["cases"])
    assert vocab_problem(target, draft.vocab) is None


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sidecar") / "mtp-tiny-Q8_0.gguf"
    write_tiny_model(path, sidecar=True, seed=3)
    return path


@pytest.mark.parametrize(
    "case",
    DOC["sidecar_cases"],
    ids=lambda c: f"c{c['ctx']}-np{c['np']}-n{c['n_max']}-{c['ctkd']}",
)
def test_an_mtp_sidecar_matches_llama_server(
    files: tuple[Path, Path], sidecar: Path, case: dict
) -> None:
    """--spec-type draft-mtp -md mtp-FILE: the sidecar's tensors, the MTP context's NextN KV at
    the target's n_ctx and -ctkd, np output rows, no recurrent state; the target keeps n_max
    rollback snapshots of its recurrent state."""
    from quantpick.plan.draft import is_sidecar

    target = local_layout(files[0], None)
    side = load_draft(sidecar)
    assert is_sidecar(side.layout) and not is_sidecar(target)
    run = DraftRun(str(sidecar), case["n_max"], 0, ())
    config = RunConfig(
        ctx_size=case["ctx"], n_parallel=case["np"], spec_draft_n=case["n_max"], draft=run,
        spec_cache_type_k=case["ctkd"], spec_cache_type_v=case["ctkd"], devices=(),
    )  # fmt: skip
    tgt = estimate(target, HOST_ONLY, config)
    own = draft_estimate(side, HOST_ONLY, config, tgt, run).host
    real, main = case["draft"], case["main"]
    assert mib(own.weights_bytes) == real["model"]
    assert mib(own.kv_bytes) == real["kv"]
    assert own.recurrent_bytes == 0 and "recurrent" not in real
    assert mib(own.overhead_bytes) == real["output"]
    # the MTP context's compute: the same estimate as the NextN block's own MTP context
    # (tests/plan/test_spec_memory.py): never under llama-server's, at most 2.5x on this model
    assert 1.0 <= own.compute_bytes / MiB / real["compute"] <= 2.5
    assert within_compute_bounds(own.compute_bytes, real["compute"])
    assert mib(tgt.host.weights_bytes) == main["model"]  # the target has no NextN block
    assert mib(tgt.host.kv_bytes) == main["kv"]
    assert mib(tgt.host.recurrent_bytes) == main["recurrent"]  # with the rollback snapshots
