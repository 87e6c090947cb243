"""The memory model against llama.cpp's own projection (tests/data/llamacpp-fit-q4_k_m.json) and
against llama.cpp's rules for configurations the table does not cover."""

from __future__ import annotations

import json
from dataclasses import replace

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
from quantpick.plan.memory import RunConfig, context_cells, estimate

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
    assert arch.attention_layers == (3, 7, 11, 15, 19, 23, 27, 31, 35, 39)
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
