"""The memory model against llama.cpp's own projection (tests/data/llamacpp-fit-q4_k_m.json) and
against llama.cpp's rules for configurations the table does not cover."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conformance_model import (
    DATA,
    case_config,
    config_from_args,
    rpc_machine,
    write_conformance_gguf,
    write_grid_models,
)

from quantpick.errors import UsageError
from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.gguf import layout_from_header, read_gguf_file
from quantpick.model.layout import ModelLayout, synthesize_layout
from quantpick.plan.memory import PROJECTOR_COMPUTE_BYTES, RunConfig, context_cells, estimate

MiB = 1024**2
GiB = 1024**3
CASES = json.loads((DATA / "llamacpp-fit-q4_k_m.json").read_text())["cases"]


@pytest.fixture(scope="module")
def q4km(tmp_path_factory: pytest.TempPathFactory) -> ModelLayout:
    path = tmp_path_factory.mktemp("gguf") / "conformance-q4_k_m.gguf"
    size = write_conformance_gguf(path)
    return layout_from_header(read_gguf_file(path), basis=f"gguf:{path}", file_bytes=size)


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: "-".join(str(v) for v in c["config"].values())
)
def test_conformance_with_llamacpp(q4km: ModelLayout, case: dict) -> None:
    """Weights == llama.cpp `model`, KV + recurrent == llama.cpp `context`, MiB floored, on every
    GPU device (and context on the host for host-only runs)."""
    cfg = case["config"]
    est = estimate(q4km, rpc_machine(cfg["devices"]), case_config(cfg))
    assert len(est.devices) == len(case["mib"])
    for dev, (name, want) in zip(est.devices, case["mib"].items(), strict=False):
        assert dev.kind == ("host" if name == "Host" else "gpu")
        if want["model"] is not None:
            assert dev.weights_bytes // MiB == want["model"], name
        assert (dev.kv_bytes + dev.recurrent_bytes) // MiB == want["context"], name


def test_conformance_file_is_the_published_architecture(q4km: ModelLayout) -> None:
    arch = q4km.architecture
    assert (arch.block_count, arch.nextn_predict_layers, arch.n_layer) == (41, 1, 40)
    assert q4km.view.kv_layers == (3, 7, 11, 15, 19, 23, 27, 31, 35, 39)
    assert len(q4km.view.recurrent_layers) == 30 and q4km.view.attention_period == 4
    assert len(q4km.tensors) == 753
    # 733 trunk tensors + 20 MTP tensors; params 35,505,251,456 like the empero card
    params = 0
    for t in q4km.tensors:
        n = 1
        for d in t.shape:
            n *= d
        params += n
    assert params == 35_505_251_456


def test_kv_and_state_numbers_from_the_notes(q4km: ModelLayout) -> None:
    host_only = replace(rpc_machine(0))
    f16 = estimate(q4km, host_only, RunConfig(ctx_size=262144, n_parallel=4, kv_unified=True))
    assert f16.host.kv_bytes == 5120 * MiB  # 20480 B/token
    assert f16.host.recurrent_bytes == int(251.25 * MiB)  # 4 cells x 62.8125 MiB
    q8 = estimate(
        q4km, host_only, RunConfig(ctx_size=262144, cache_type_k="q8_0", cache_type_v="q8_0")
    )
    assert q8.host.kv_bytes == 2720 * MiB
    assert q8.host.recurrent_bytes == int(62.8125 * MiB)
    mtp = estimate(q4km, host_only, RunConfig(ctx_size=4096, n_parallel=4, spec_draft_n=3))
    assert mtp.host.recurrent_bytes == 1005 * MiB  # x (1 + 3 drafts)


def test_context_padding_and_streams() -> None:
    assert context_cells(1000, 262144, 1, False) == (1024, 1024, 1)
    assert context_cells(0, 262144, 1, False) == (262144, 262144, 1)
    # non-unified: per-slot cells padded to 256, total rounded up
    assert context_cells(10000, 262144, 4, False) == (10240, 2560, 4)
    assert context_cells(10000, 262144, 4, True) == (10240, 10240, 1)


def test_output_layer_offloads_first_and_first_layers_stay_on_host(q4km: ModelLayout) -> None:
    one = rpc_machine(1)
    est = estimate(q4km, one, RunConfig(ctx_size=4096, n_gpu_layers=1))
    assert est.gpus[0].layers == (41,)  # -ngl 1: only the output layer
    assert est.gpus[0].weights_bytes == sum(
        t.n_bytes for t in q4km.tensors if t.name.startswith(("output.", "output_norm."))
    )
    est = estimate(q4km, one, RunConfig(ctx_size=4096, n_gpu_layers=10))
    assert est.gpus[0].layers == (32, 33, 34, 35, 36, 37, 38, 39, 41)  # slot 40 (MTP) is skipped
    assert est.host.layers[:3] == (0, 1, 2)


def test_token_embd_always_on_host_and_mtp_skipped(q4km: ModelLayout) -> None:
    est = estimate(q4km, rpc_machine(1), RunConfig(ctx_size=4096))
    embd = next(t.n_bytes for t in q4km.tensors if t.name == "token_embd.weight")
    mtp = sum(t.n_bytes for t in q4km.tensors if t.name.startswith("blk.40."))
    assert est.host.weights_bytes == embd
    assert est.gpus[0].weights_bytes == q4km.tensor_bytes_total - embd - mtp
    with_mtp = estimate(q4km, rpc_machine(1), RunConfig(ctx_size=4096, spec_draft_n=3))
    assert with_mtp.gpus[0].weights_bytes == q4km.tensor_bytes_total - embd


def test_cpu_moe_and_override_tensor_equivalence(q4km: ModelLayout) -> None:
    m = rpc_machine(2)
    base = RunConfig(ctx_size=32768, tensor_split=(24.0, 16.0))
    n_cpu = estimate(q4km, m, replace(base, n_cpu_moe=10))
    pattern = r"blk\.([0-9])\.ffn_(up|down|gate|gate_up)_(ch|)exps"
    ot = estimate(q4km, m, replace(base, override_tensors=((pattern, "CPU"),)))
    assert [d.weights_bytes for d in n_cpu.devices] == [d.weights_bytes for d in ot.devices]
    all_cpu = estimate(q4km, m, replace(base, cpu_moe=True))
    experts = sum(
        t.n_bytes for t in q4km.tensors if t.is_expert and not t.name.startswith("blk.40.")
    )
    embd = next(t.n_bytes for t in q4km.tensors if t.name == "token_embd.weight")
    assert all_cpu.host.weights_bytes == embd + experts


def test_split_follows_free_memory_without_ts(q4km: ModelLayout) -> None:
    gpus = (Gpu(0, "a", 30 * GiB, 30 * GiB), Gpu(1, "b", 10 * GiB, 10 * GiB))
    m = Machine(gpus=gpus, host=Host(64 * GiB, 64 * GiB, 4))
    est = estimate(q4km, m, RunConfig(ctx_size=4096))
    # fractions 0.75 / 1.0 over 42 slots: slot il on GPU0 while il/42 < 0.75 -> slots 0..31
    assert est.gpus[0].layers[-1] == 31 and est.gpus[1].layers[0] == 32


def test_quantized_v_needs_flash_attention(q4km: ModelLayout) -> None:
    with pytest.raises(UsageError, match="flash attention"):
        estimate(
            q4km, rpc_machine(1), RunConfig(ctx_size=4096, cache_type_v="q8_0", flash_attn="off")
        )
    with pytest.raises(UsageError):
        estimate(q4km, rpc_machine(1), RunConfig(ctx_size=4096, cache_type_k="q3_k"))


@pytest.mark.parametrize(
    "kv", ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
)
def test_kv_bytes_per_token_all_types(q4km: ModelLayout, kv: str) -> None:
    per_token = {
        "f32": 40960,
        "f16": 20480,
        "bf16": 20480,
        "q8_0": 10880,
        "q5_1": 7680,
        "q5_0": 7040,
        "q4_1": 6400,
        "q4_0": 5760,
        "iq4_nl": 5760,
    }[kv]
    est = estimate(q4km, rpc_machine(0), RunConfig(ctx_size=8192, cache_type_k=kv, cache_type_v=kv))
    assert est.host.kv_bytes == 8192 * per_token


def test_synthesized_layout_totals_match_the_file(q4km: ModelLayout) -> None:
    size = 21_713_462_944
    syn = synthesize_layout(q4km.architecture, "Q4_K_M", size)
    assert not syn.exact and "synthesized" in syn.basis
    assert syn.tensor_bytes_total < size  # header estimate kept out
    # the synthesized Q4_K_M mix is the quantizer's: per-slot bytes within 1% of the exact table
    for exact_slot, syn_slot in zip(q4km.slots, syn.slots, strict=False):
        exact_total = exact_slot.dense_bytes + exact_slot.expert_bytes
        syn_total = syn_slot.dense_bytes + syn_slot.expert_bytes
        assert abs(syn_total - exact_total) <= 0.01 * exact_total


# ---- a wider grid recorded with scripts/record_conformance.py -------------------------------

EXTRA = json.loads((DATA / "llamacpp-fit-extra.json").read_text())


@pytest.fixture(scope="module")
def extra_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelLayout]:
    built = write_grid_models(tmp_path_factory.mktemp("extra"))
    return {
        key: layout_from_header(read_gguf_file(path), basis=str(path), file_bytes=size)
        for key, (path, size) in built.items()
    }


@pytest.mark.parametrize(
    "case", EXTRA["cases"], ids=lambda c: c["model"] + " " + " ".join(c["llama_cpp_args"])
)
def test_conformance_wider_grid(extra_models: dict[str, ModelLayout], case: dict) -> None:
    """Other quants, MTP and no-MTP files, partial -ngl, -ts ratios, --n-cpu-moe, --cpu-moe, -ot,
    -nkvo, mixed K/V types, odd context sizes, 2..8 slots: weights and context exact."""
    config, n_gpu = config_from_args(case["llama_cpp_args"])
    est = estimate(extra_models[case["model"]], rpc_machine(n_gpu), config)
    assert len(est.devices) == len(case["mib"])
    for dev, (name, want) in zip(est.devices, case["mib"].items(), strict=True):
        if want["model"] is not None:
            assert dev.weights_bytes // MiB == want["model"], name
        assert (dev.kv_bytes + dev.recurrent_bytes) // MiB == want["context"], name


# ---- RPC workers: llama.cpp's device list -----------------------------------------------------


def _cluster(*, probed: bool = True) -> Machine:
    """A 3090 here, a worker with a T4 and a worker with two devices (other machines)."""
    from quantpick.machine.spec import RpcWorker

    def dev(i: int, name: str, gib: int) -> Gpu:
        return Gpu(i, name, gib * GiB, gib * GiB - GiB)

    return Machine(
        gpus=(Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GiB, 23 * GiB),),
        host=Host(64 * GiB, 64 * GiB, 8),
        rpc_workers=(
            RpcWorker("10.0.0.7", 50052, (dev(0, "Tesla T4", 15),), probed=probed),
            RpcWorker("10.0.0.8", 50052, (dev(0, "a", 12), dev(1, "b", 8)), probed=probed),
        ),
    )


ALL = ("10.0.0.7:50052", "10.0.0.8:50052")


def test_rpc_devices_come_first_named_by_one_counter(q4km: ModelLayout) -> None:
    from quantpick.plan.memory import llama_devices

    m = _cluster()
    devs = llama_devices(m, RunConfig(rpc_servers=ALL))
    assert [(d.name, d.endpoint, d.gpu.index) for d in devs] == [
        ("RPC0", "10.0.0.7:50052", 0),
        ("RPC1", "10.0.0.8:50052", 0),
        ("RPC2", "10.0.0.8:50052", 1),
        ("CUDA0", None, 0),
    ]
    # --rpc order decides the numbering
    flipped = llama_devices(m, RunConfig(rpc_servers=ALL[::-1]))
    assert [(d.name, d.gpu.name) for d in flipped[:3]] == [
        ("RPC0", "a"),
        ("RPC1", "b"),
        ("RPC2", "Tesla T4"),
    ]
    # --device: exactly those, in that order, names case-insensitive, ints = CUDA<i>
    picked = llama_devices(m, RunConfig(rpc_servers=ALL, devices=(0, "rpc2", "RPC0")))
    assert [d.name for d in picked] == ["CUDA0", "RPC2", "RPC0"]
    for bad in ((5,), ("RPC3",), ("RPC0", "RPC0"), ("CPU",)):
        with pytest.raises(UsageError):
            llama_devices(m, RunConfig(rpc_servers=ALL, devices=bad))
    with pytest.raises(UsageError, match="not a worker"):
        llama_devices(m, RunConfig(rpc_servers=("10.0.0.9:1",)))
    # without --rpc the workers are not devices
    assert [d.name for d in llama_devices(m, RunConfig())] == ["CUDA0"]


def test_rpc_budgets_split_and_overheads(q4km: ModelLayout) -> None:
    est = estimate(q4km, _cluster(), RunConfig(ctx_size=4096, rpc_servers=ALL))
    assert [d.device for d in est.devices] == ["RPC0", "RPC1", "RPC2", "CUDA0", "CPU"]
    assert [d.endpoint for d in est.devices] == [*ALL, ALL[1], None, None]
    assert [d.gpu_index for d in est.devices] == [None, None, None, 0, None]
    # budgets from each device's free memory; the default split follows free memory too
    assert [d.free_bytes for d in est.gpus] == [14 * GiB, 11 * GiB, 7 * GiB, 23 * GiB]
    assert [d.budget_bytes for d in est.gpus] == [13 * GiB, 10 * GiB, 6 * GiB, 22 * GiB]
    # free 14:11:7:23 of 55 over 42 slots: cumulative edges 0.2545, 0.4545, 0.5818, 1
    assert [len(d.layers) for d in est.gpus] == [11, 9, 5, 16]  # slot 40 (MTP) is skipped
    # a probed worker's free is after its own context: no CUDA context on top
    assert [d.overhead_bytes for d in est.gpus] == [0, 0, 0, 384 * MiB]
    described = estimate(q4km, _cluster(probed=False), RunConfig(ctx_size=4096, rpc_servers=ALL))
    assert [d.overhead_bytes for d in described.gpus] == [384 * MiB] * 4


def test_rpc_split_with_ts_covers_all_devices(q4km: ModelLayout) -> None:
    base = RunConfig(ctx_size=8192, rpc_servers=ALL, tensor_split=(10.0, 10.0, 2.0, 20.0))
    est = estimate(q4km, _cluster(), base)
    assert [d.layers[0] for d in est.gpus] == [0, 10, 20, 22]
    assert est.gpus[-1].layers[-1] == 41  # the output layer on the last device: the 3090
    # weights, KV and state: the same rules as for local GPUs
    local = Machine(
        gpus=tuple(Gpu(i, f"g{i}", 30 * GiB, 30 * GiB) for i in range(4)),
        host=Host(64 * GiB, 64 * GiB, 8),
    )
    same = estimate(q4km, local, replace(base, rpc_servers=()))
    for a, b in zip(est.devices, same.devices, strict=True):
        assert (a.weights_bytes, a.kv_bytes, a.recurrent_bytes, a.layers) == (
            b.weights_bytes, b.kv_bytes, b.recurrent_bytes, b.layers,
        )  # fmt: skip


def test_host_experts_are_copied_to_the_first_local_gpu_not_an_rpc_device(
    q4km: ModelLayout,
) -> None:
    # --n-cpu-moe 4 vs. an override that matches nothing: both turn pipeline parallelism off, so
    # the only difference in compute is the host expert tensor op offload copies in for prompt
    # processing: one tensor at a time, the largest of them (ggml-backend.cpp:1514-1531).
    no_op = ((r"^$", "CPU"),)
    for devices, taker in (((0, "RPC0"), 0), (("RPC0", 0), 1), (("RPC0", "RPC1"), None)):
        cfg = RunConfig(ctx_size=4096, rpc_servers=ALL, devices=devices, tensor_split=(1.0, 1.0))
        offload = estimate(q4km, _cluster(), replace(cfg, n_cpu_moe=4))
        plain = estimate(q4km, _cluster(), replace(cfg, override_tensors=no_op))
        extra = [
            a.compute_bytes - b.compute_bytes for a, b in zip(offload.gpus, plain.gpus, strict=True)
        ]
        want = [0, 0]
        if taker is not None:
            want[taker] = max(
                t.n_bytes
                for t in q4km.tensors
                if t.is_expert and q4km.slot_of(t.name) < 4 and len(t.shape) > 1
            )
        assert extra == want, devices


def test_ot_to_an_rpc_buffer_type(q4km: ModelLayout) -> None:
    cfg = RunConfig(ctx_size=4096, rpc_servers=ALL, tensor_split=(1.0, 1.0, 1.0, 1.0))
    moved = replace(
        cfg, override_tensors=((r"blk\.(3|4)\.ffn_(up|down|gate)_exps", "RPC1[10.0.0.8:50052]"),)
    )
    a, b = estimate(q4km, _cluster(), cfg), estimate(q4km, _cluster(), moved)
    two_layers = q4km.slots[3].expert_bytes + q4km.slots[4].expert_bytes
    # RPC1[10.0.0.8:50052] is that worker's device 1: llama-server's RPC2
    assert b.gpus[2].weights_bytes - a.gpus[2].weights_bytes == two_layers
    assert a.gpus[0].weights_bytes - b.gpus[0].weights_bytes == two_layers
    with pytest.raises(UsageError, match="not a device") as err:
        estimate(q4km, _cluster(), replace(cfg, override_tensors=(("x", "RPC1"),)))
    assert err.value.hint is not None and "carries its worker" in err.value.hint


def test_projector_goes_to_the_first_local_gpu(q4km: ModelLayout) -> None:
    cfg = RunConfig(ctx_size=4096, rpc_servers=ALL, vision=True)
    est = estimate(q4km, _cluster(), cfg, projector_bytes=100 * MiB)
    assert [d.projector_bytes > 0 for d in est.gpus] == [False, False, False, True]
    first = estimate(q4km, _cluster(), replace(cfg, devices=("RPC1", 0)), projector_bytes=MiB)
    assert [d.projector_bytes > 0 for d in first.gpus] == [True, False]


def test_projector_is_counted_where_llama_server_loads_it(q4km: ModelLayout) -> None:
    """llama-server's clip context takes --mmproj-device, else --device's first device (common/
    arg.cpp: mmproj_device), else the first GPU (tools/mtmd/clip.cpp); `--device none` leaves
    it on the CPU. With --fit on, llama-server adds that device's share to the device's fit
    margin (server-context.cpp: fit_params_target[i] += size); quantpick writes --fit off and
    counts weights + compute on the same device, on top of the model."""
    cpu = estimate(q4km, _cluster(), RunConfig(ctx_size=4096, devices=(), vision=True),
                   projector_bytes=100 * MiB)  # fmt: skip
    assert cpu.host.projector_bytes == 100 * MiB + PROJECTOR_COMPUTE_BYTES
    local = estimate(q4km, _cluster(), RunConfig(ctx_size=4096, vision=True),
                     projector_bytes=100 * MiB)  # fmt: skip
    [gpu] = local.gpus
    assert gpu.projector_bytes == 100 * MiB + PROJECTOR_COMPUTE_BYTES
    assert local.host.projector_bytes == 0
    assert gpu.total_bytes - estimate(q4km, _cluster(), RunConfig(ctx_size=4096)).gpus[
        0
    ].total_bytes == gpu.projector_bytes  # fmt: skip


# ---- conformance with two real workers: llama-fit-params --rpc -------------------------------

# llama-fit-params args (beside -fa on -fitp on -fit off --rpc W0,W1); {w1} is the second
# worker's endpoint. Each case checks one rule against llama.cpp itself: the default split
# (free memory), -ts, partial -ngl, --n-cpu-moe, KV types, --device order, and -ot to an RPC
# buffer type.
RPC_CASES = [
    ["-c", "32768", "-np", "1", "-ngl", "99"],
    ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16"],
    ["-c", "65536", "-np", "2", "-ngl", "99", "-ts", "3,1", "-ctk", "q8_0", "-ctv", "f16"],
    ["-c", "65536", "-np", "4", "-ngl", "20", "-ts", "24,16"],
    ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16", "--n-cpu-moe", "8"],
    ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16", "-dev", "RPC1,RPC0"],
    ["-c", "16384", "-np", "1", "-ngl", "99", "-ts", "24,16", "-ot",
     r"blk\.(3|4)\.ffn_(up|down|gate)_exps=RPC0[{w1}]"],
]  # fmt: skip


@pytest.mark.llamacpp
def test_rpc_conformance_with_llama_fit_params(
    q4km: ModelLayout, llamacpp_bin: Path, tmp_path: Path
) -> None:
    """Two real ggml-rpc-server workers on 127.0.0.1, read by quantpick's probe: per RPC device,
    weights == llama.cpp's `model` and KV + state == its `context` (MiB, floored as printed)."""
    import subprocess

    from rpc_workers import rpc_workers

    from quantpick.machine.describe import resolve_rpc_workers

    model = Path(q4km.basis.removeprefix("gguf:"))
    with rpc_workers(llamacpp_bin, 2, log_dir=tmp_path) as endpoints:
        workers = resolve_rpc_workers(endpoints)
        machine = Machine(gpus=(), host=Host(128 * GiB, 128 * GiB, 2), rpc_workers=workers)
        for case in RPC_CASES:
            args = [a.replace("{w1}", endpoints[1]) for a in case]
            run = subprocess.run(
                [str(llamacpp_bin / "llama-fit-params"), "-m", str(model), "-fa", "on",
                 "-fitp", "on", "-fit", "off", "--rpc", ",".join(endpoints), *args],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            want = _fit_lines(run.stdout)
            assert set(want) >= {"RPC0", "RPC1"}, run.stderr[-2000:]
            config, _ = config_from_args([a for a in args if a not in ("-dev", "RPC1,RPC0")])
            if "-dev" in args:
                config = replace(config, devices=("RPC1", "RPC0"))
            est = estimate(q4km, machine, replace(config, rpc_servers=tuple(endpoints)))
            got = {d.device: d for d in est.devices}
            order = [d.device for d in est.gpus]
            assert order == [n for n in want if n != "Host"], case
            for name in ("RPC0", "RPC1"):
                mib_model, mib_context = want[name]
                assert got[name].weights_bytes // MiB == mib_model, (case, name)
                assert (got[name].kv_bytes + got[name].recurrent_bytes) // MiB == mib_context, (
                    case,
                    name,
                )


def _fit_lines(stdout: str) -> dict[str, tuple[int, int]]:
    """`<DEV> <model MiB> <context MiB> <compute MiB>` lines (common_fit_print), in order."""
    out: dict[str, tuple[int, int]] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.lstrip("-").isdigit() for p in parts[1:]):
            out[parts[0]] = (int(parts[1]), int(parts[2]))
    return out
