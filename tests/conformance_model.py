"""Writes the conformance model: a header-only, sparse GGUF with the exact Qwen3.6-35B-A3B /
Qwen3.8-35B-A3B-Distill architecture (41 blocks incl. MTP) and llama.cpp's Q4_K_M tensor types
(tests/data/q4_k_m-tensor-types.tsv, from `llama-quantize --dry-run`).

The shapes come from the test fixtures (tests/gguf_fixtures.py), written out independently of
quantpick.model.layout, so a mistake there shows up as a conformance failure instead of being copied
into the fixture. The tensor data is a hole: the file
has its full size (21,709,111,616 bytes with the full tokenizer) but uses no disk.
"""

from __future__ import annotations

from pathlib import Path

from gguf_fixtures import FULL, add_hparams, tensor_list

from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.plan.memory import RunConfig

GiB = 1024**3

DATA = Path(__file__).parent / "data"


def load_types(path: Path = DATA / "q4_k_m-tensor-types.tsv") -> dict[str, str]:
    types = {}
    for line in path.read_text().splitlines():
        if line.strip():
            name, qtype = line.split()
            types[name] = qtype.upper()
    return types


def write_conformance_gguf(
    path: Path, types: dict[str, str] | None = None, *, mtp: bool = True, default: str = "BF16"
) -> int:
    """Header + tensor infos with the given types; data left as a sparse hole. Returns the size."""
    import gguf
    import numpy as np

    types = load_types() if types is None else types
    h = FULL
    w = gguf.GGUFWriter(str(path), "qwen35moe")
    w.add_name("conformance-qwen35moe-35B-A3B")
    add_hparams(w, h, mtp=mtp)
    # llama.cpp's vocab shortcut: tokenizer "none" + vocab_size creates dummy tokens (notes §1.4).
    w.add_tokenizer_model("none")
    w.add_vocab_size(h["n_vocab"])
    sizes = []
    for name, ne in tensor_list(h, mtp):
        qtype_name = types.get(name)
        if qtype_name is None:
            qtype_name = (
                "F32"
                if len(ne) == 1
                or name.endswith(("ssm_conv1d.weight", "ffn_gate_inp.weight", "ssm_a"))
                else default
            )
        qtype = gguf.GGMLQuantizationType[qtype_name]
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // block * type_size
        w.add_tensor_info(name, tuple(reversed(ne)), np.float32, nbytes, raw_dtype=qtype)
        sizes.append(nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    f.flush()
    start = f.tell()
    start += (-start) % 32
    total = start + sum(s + (-s) % 32 for s in sizes)
    f.truncate(total)
    w.close()
    return total


def grid_models() -> dict[str, tuple[dict[str, str], bool, str]]:
    """The models of tests/data/llamacpp-fit-extra.json: key -> (types, with MTP, default type)."""
    types = load_types()
    return {
        "q4km": (types, True, "BF16"),
        "bf16": ({}, True, "BF16"),
        "q8_0": ({}, True, "Q8_0"),
        "q4km-nomtp": (
            {k: v for k, v in types.items() if not k.startswith("blk.40.")},
            False,
            "BF16",
        ),
    }


def write_grid_models(directory: Path) -> dict[str, tuple[Path, int]]:
    """Write every grid model into `directory`: key -> (path, file size)."""
    out = {}
    for key, (types, mtp, default) in grid_models().items():
        path = directory / f"{key}.gguf"
        out[key] = (path, write_conformance_gguf(path, types, mtp=mtp, default=default))
    return out


# ---- llama-fit-params cases -> quantpick inputs (test_memory.py, benchmarks/accuracy.py)


def rpc_machine(n: int) -> Machine:
    """Local stand-ins for the RPC workers' CPU devices the fixtures were recorded on: the CPU
    backend's buffer rule, so the plan names them by that backend (CPU0, CPU1)."""
    gpus = tuple(
        Gpu(index=i, name=f"RPC{i}", total_bytes=64 * GiB, free_bytes=64 * GiB, backend="CPU")
        for i in range(n)
    )
    return Machine(
        gpus=gpus, host=Host(ram_total_bytes=128 * GiB, ram_available_bytes=128 * GiB, cpu_cores=2)
    )


def case_config(cfg: dict) -> RunConfig:
    ts = tuple(float(x) for x in cfg["ts"].split(",")) if cfg["ts"] else None
    return RunConfig(
        ctx_size=cfg["ctx"],
        n_parallel=cfg["np"],
        cache_type_k=cfg["kv"],
        cache_type_v=cfg["kv"],
        ubatch=cfg["ub"],
        n_cpu_moe=cfg["ncmoe"],
        tensor_split=ts,
        n_gpu_layers=None if cfg["devices"] and cfg["ngl"] >= 42 else cfg["ngl"],
        flash_attn="on",
        logits_rows="batch",  # llama-fit-params reserves n_ubatch logits rows, not the server's
    )


def config_from_args(args: list[str]) -> tuple[RunConfig, int]:
    """llama-fit-params flags -> (RunConfig, number of GPU devices)."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    overrides: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("--cpu-moe", "-nkvo"):
            flags.add(a)
            i += 1
            continue
        if a == "-ot":
            pattern, _, buft = args[i + 1].rpartition("=")
            overrides.append((pattern, buft))
        else:
            values[a] = args[i + 1]
        i += 2
    n_gpu = 0 if values.get("-dev") == "none" else 2
    ngl = int(values.get("-ngl", "99"))
    config = RunConfig(
        ctx_size=int(values["-c"]),
        n_parallel=int(values.get("-np", "1")),
        n_gpu_layers=None if ngl >= 99 else ngl,
        tensor_split=tuple(float(x) for x in values["-ts"].split(",")) if "-ts" in values else None,
        n_cpu_moe=int(values.get("--n-cpu-moe", "0")),
        cpu_moe="--cpu-moe" in flags,
        override_tensors=tuple(overrides),
        cache_type_k=values.get("-ctk", "f16"),
        cache_type_v=values.get("-ctv", "f16"),
        ubatch=int(values.get("-ub", "512")),
        batch=int(values.get("-b", "2048")),
        kv_offload="-nkvo" not in flags,
        logits_rows="batch",
    )
    return config, n_gpu
