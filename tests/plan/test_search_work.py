"""The search's repeated work is done once (#27 start-up): what an estimate reads of a layout is
read once per layout, the tensor table once per architecture, and the shortcuts give the same
answers as the walks they replace."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model import layout as layout_mod
from quantpick.model.layout import ModelLayout, TensorInfo, synthesize_layout
from quantpick.model.registry import find_manifest
from quantpick.plan.llama_devices import host_weight_tensor
from quantpick.plan.memory import RunConfig, estimate
from quantpick.plan.speed_work import speed_work

GiB = 1024**3
MANIFEST = find_manifest("qwen3.8-35b-a3b-distill")


def _layout(quant: str = "Q4_K_M") -> ModelLayout:
    size = sum(f.size_bytes for f in MANIFEST.quant_files(quant))
    return synthesize_layout(MANIFEST.architecture, quant, size)


LAYOUT = _layout()


class _CountingTensors(tuple[TensorInfo, ...]):
    """A tensor table that counts the walks over it."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def _machine() -> Machine:
    gpus = tuple(
        Gpu(index=i, name=f"GPU{i}", total_bytes=gib * GiB, free_bytes=gib * GiB)
        for i, gib in enumerate((24, 16))
    )
    return Machine(gpus=gpus, host=Host(64 * GiB, 64 * GiB, 8), described=True, source="test")


def test_an_estimate_walks_no_tensor_table_once_the_layout_is_read() -> None:
    """The per-layout facts (slots, padded sizes, the Q projections, the output head, expert
    biases, op offload's largest weight) are read on the first estimate; the search's other
    estimates of that layout (some 16 per quant in a pick) walk none of its tensors."""
    counted = replace(LAYOUT, tensors=_CountingTensors(LAYOUT.tensors))
    machine = _machine()
    first = estimate(counted, machine, RunConfig(ctx_size=32768, tensor_split=(3.0, 2.0)))
    _CountingTensors.walks = 0
    for split, ngl, n_cpu_moe in (
        ((1.0, 1.0), None, 0),
        ((5.0, 1.0), 30, 0),
        ((2.0, 1.0), None, 12),
    ):
        config = RunConfig(
            ctx_size=32768, tensor_split=split, n_gpu_layers=ngl, n_cpu_moe=n_cpu_moe
        )
        again = estimate(counted, machine, config)
        assert again == estimate(LAYOUT, machine, config)  # the same figures
    assert _CountingTensors.walks == 0
    assert first == estimate(LAYOUT, machine, RunConfig(ctx_size=32768, tensor_split=(3.0, 2.0)))


def test_the_speed_model_walks_no_tensor_table_once_the_layout_is_read() -> None:
    counted = replace(LAYOUT, tensors=_CountingTensors(LAYOUT.tensors))
    machine = _machine()
    configs = [RunConfig(ctx_size=32768, tensor_split=(3.0, 2.0), n_cpu_moe=n) for n in (0, 8)]
    work = [speed_work(counted, estimate(counted, machine, c)) for c in configs]
    _CountingTensors.walks = 0
    again = [speed_work(counted, estimate(counted, machine, c)) for c in configs]
    assert _CountingTensors.walks == 0
    assert again == work == [speed_work(LAYOUT, estimate(LAYOUT, machine, c)) for c in configs]


def test_every_quant_of_an_architecture_reads_its_tensor_table_once() -> None:
    layout_mod._skeleton.cache_clear()
    for quant in MANIFEST.quants:
        _layout(quant)
    info = layout_mod._skeleton.cache_info()
    assert (info.misses, info.hits) == (1, len(MANIFEST.quants) - 1)


@settings(max_examples=60, deadline=None)
@given(
    devices=st.lists(st.integers(0, 2), min_size=LAYOUT.n_slots, max_size=LAYOUT.n_slots),
    experts=st.lists(st.booleans(), min_size=LAYOUT.n_slots, max_size=LAYOUT.n_slots),
    skipped=st.frozensets(st.integers(0, LAYOUT.n_slots - 1)),
    experts_only=st.booleans(),
)
def test_largest_host_weight_per_slot_equals_the_walk(
    devices: list[int], experts: list[bool], skipped: frozenset[int], experts_only: bool
) -> None:
    """Without a size limit, the per-slot maxima (ModelLayout.slot_matrix_max) give the weight the
    largest-first walk over every block matrix finds (a limit above every tensor takes the walk)."""
    host_pos = 2
    host_experts = [LAYOUT.slots[s].expert_bytes if on else 0 for s, on in enumerate(experts)]

    def is_skipped(slot: int) -> bool:
        return slot in skipped

    args = (LAYOUT, devices, host_pos, host_experts, is_skipped)
    fast = host_weight_tensor(*args, experts_only=experts_only)
    walk = host_weight_tensor(*args, limit=10**18, experts_only=experts_only)
    assert fast == walk
