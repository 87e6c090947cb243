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
