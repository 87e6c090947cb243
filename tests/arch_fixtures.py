"""Full-size, header-only GGUFs of any architecture quantpick has a tensor table for.

    write_header_only(path, arch, "Q4_K_M")      # -> file size in bytes (a sparse file)

The header is what the converter writes for the model: `general.architecture`, every
`<arch>.<key>` of `arch.hparams` with the GGUF type convert_hf_to_gguf.py gives it (gguf-py:
integers UINT32, per-layer arrays INT32 or BOOL, floats FLOAT32), and the tensor infos of the
family's table (quantpick/arch, `Family.tensor_shapes`) at llama-quantize-like types. The tensor
data is a sparse hole up to the real data size: llama-fit-params loads with no_alloc and never
reads it, it only checks that every tensor lies inside the file (src/llama-model-loader.h
llama_tensor_weight; notes llamacpp-memory.md §1.4).

The vocabulary is tokenizer.ggml.model "none" plus `<arch>.vocab_size`: llama.cpp then makes
vocab_size dummy tokens (src/llama-vocab.cpp:1949-1968), enough to load and size memory, and the
header is written in milliseconds instead of seconds for a 150k-token list.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantpick.arch.base import Architecture
from quantpick.arch.family import TensorShapes
from quantpick.arch.registry import tensor_shapes
from quantpick.model.ggml import GGML_TYPES, tensor_bytes

ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT (ggml/include/gguf.h)

# llama-quantize leaves these 2-D+ tensors unquantized (src/llama-quant.cpp:297-325): only names
# ending in "weight", never norms, the router, per_layer_model_proj, the conv kernels.
_NOT_QUANTIZED = ("_norm.weight", "ffn_gate_inp.weight", "per_layer_model_proj.weight",
                  "ssm_conv1d.weight", "shortconv.conv.weight")  # fmt: skip
# tensor_type_fallback (src/llama-quant.cpp:390-440): the type a row that does not fill the
# target's block falls back to (then F16 if that does not fit either).
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0"}
QUANTS = ("Q4_K_M", "Q8_0", "BF16", "MXFP4_MOE")


def quantized(name: str, ne: Sequence[int]) -> bool:
    return len(ne) >= 2 and name.endswith("weight") and not name.endswith(_NOT_QUANTIZED)


def _fits(qtype: str, row: int) -> bool:
    return row % GGML_TYPES[qtype][1] == 0


def tensor_type(name: str, ne: Sequence[int], quant: str, *, tied: bool) -> str:
    """A simple llama-quantize rule per tensor class: 1-D and unquantized tensors F32; the
    output head (or the tied token_embd, which llama-quantize treats as the output) Q6_K in
    Q4_K_M; MXFP4_MOE keeps routed experts MXFP4 (gpt-oss ships them so) and the rest Q8_0."""
    if quant not in QUANTS:
        raise ValueError(f"unknown quant {quant!r} (one of {', '.join(QUANTS)})")
    if not quantized(name, ne):
        return "F32"
    if quant == "BF16":
        return "BF16"
    if quant == "Q8_0":
        want = "Q8_0"
    elif quant == "MXFP4_MOE":
        want = "MXFP4" if "_exps." in name else "Q8_0"
    else:
        head = name == "output.weight" or (tied and name == "token_embd.weight")
        want = "Q6_K" if head else "Q4_K"
    if not _fits(want, ne[0]):
        want = _FALLBACK.get(want, want)
    return want if _fits(want, ne[0]) else "F16"


def _add_hparam(w: Any, key: str, value: Any) -> None:
    import gguf

    t = gguf.GGUFValueType
    if isinstance(value, tuple):
        if all(isinstance(v, bool) for v in value):
            w.add_key_value(key, list(value), t.ARRAY, sub_type=t.BOOL)
        elif all(isinstance(v, int) for v in value):
            w.add_key_value(key, list(value), t.ARRAY, sub_type=t.INT32)
        else:
            w.add_key_value(key, [float(v) for v in value], t.ARRAY, sub_type=t.FLOAT32)
    elif isinstance(value, bool):
        w.add_key_value(key, value, t.BOOL)
    elif isinstance(value, int):
        w.add_key_value(key, value, t.UINT32)
    elif isinstance(value, float):
        w.add_key_value(key, value, t.FLOAT32)
    else:
        w.add_key_value(key, str(value), t.STRING)


def typed_tensors(arch: Architecture, quant: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ne, ggml type) for every tensor of `arch`'s table at `quant`."""
    shapes: TensorShapes | None = tensor_shapes(arch)
    if shapes is None:
        raise ValueError(f"no tensor table for {arch.name}")
    tied = not arch.has_output_tensor
    return [(name, ne, tensor_type(name, ne, quant, tied=tied)) for name, ne in shapes]


def write_header_only(
    path: Path,
    arch: Architecture,
    quant: str = "Q4_K_M",
    *,
    name: str | None = None,
    file_type: bool = True,
) -> int:
    """Write `arch` as a full-size sparse GGUF at `path`; returns the file size in bytes.
    `file_type=False`: no general.file_type, as the files tests/data/arch-real was recorded on."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch.name)
    w.add_name(name or f"header-only {arch.name}")
    w.add_tokenizer_model("none")
    from quantpick.model.from_repo import FILE_TYPES

    ftype = {name: value for value, name in FILE_TYPES.items()}.get(quant.upper())
    if ftype is not None and file_type:  # general.file_type, as llama-quantize writes it
        w.add_file_type(ftype)
    w.add_uint32(f"{arch.name}.vocab_size", arch.vocab_size)
    for key, value in arch.hparams:
        if key != "vocab_size":
            _add_hparam(w, f"{arch.name}.{key}", value)
    sizes = []
    for tname, ne, qtype in typed_tensors(arch, quant):
        nbytes = tensor_bytes(qtype, ne)
        raw = gguf.GGMLQuantizationType[qtype]
        w.add_tensor_info(tname, tuple(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=raw)
        sizes.append(nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fh = w.fout[0]
    fh.flush()
    end = fh.seek(0, os.SEEK_END)
    data_start = gguf.GGUFWriter.ggml_pad(end, ALIGNMENT)
    total = data_start + sum(gguf.GGUFWriter.ggml_pad(n, ALIGNMENT) for n in sizes)
    fh.truncate(total)
    w.close()
    return total
