"""GGUF headers -> architecture + tensor table (ModelLayout).

`read_gguf_file` reads a local file's header; `architecture_from_metadata` and `layout_from_header`
turn the parsed header into the planner's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantpick.errors import GGUFError
from quantpick.ggml import GGML_TYPES, TYPE_BY_ID, tensor_bytes
from quantpick.layout import SUPPORTED_ARCHITECTURES, ModelLayout, TensorInfo
from quantpick.manifest import Architecture


@dataclass(frozen=True)
class ArraySummary:
    """A long metadata array (e.g. the 248k tokenizer tokens) kept as its type and length only."""

    element_type: int
    length: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]  # scalars, short arrays as lists, long arrays as ArraySummary
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int  # first byte of tensor data == bytes of header incl. padding
    source: str = ""  # path or URL
    stats: dict[str, int] = field(default_factory=dict)  # e.g. bytes_fetched, requests


def read_gguf_file(path: Path) -> GGUFHeader:
    """Header of a local GGUF file, read with llama.cpp's gguf package."""
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - gguf is a dependency
        raise GGUFError("the gguf package is not installed") from exc
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError/struct errors on bad input
        raise GGUFError(f"{path}: not a readable GGUF file ({exc})") from None
    metadata: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if fld.types and fld.types[0] == gguf.GGUFValueType.ARRAY:
            if len(fld.data) > 64:
                metadata[key] = ArraySummary(int(fld.types[-1]), len(fld.data))
            else:
                metadata[key] = [fld.contents(i) for i in range(len(fld.data))]
        else:
            metadata[key] = fld.contents()
    tensors = []
    for t in reader.tensors:
        type_name = TYPE_BY_ID.get(int(t.tensor_type))
        if type_name is None:
            raise GGUFError(f"{path}: tensor {t.name} has unknown ggml type {int(t.tensor_type)}")
        shape = tuple(int(d) for d in t.shape)
        tensors.append(TensorInfo(t.name, type_name, shape, tensor_bytes(type_name, shape)))
    version = int(reader.fields["GGUF.version"].contents())
    alignment = int(metadata.get("general.alignment", 32))
    return GGUFHeader(
        version=version,
        metadata=metadata,
        tensors=tuple(tensors),
        alignment=alignment,
        data_offset=int(reader.data_offset),
        source=str(path),
    )


def _meta_int(meta: dict[str, Any], key: str, default: int | None = None) -> int:
    value = meta.get(key, default)
    if isinstance(value, list):  # per-layer arrays: llama.cpp takes layer 0 for these shapes
        value = value[0] if value else default
    if value is None or isinstance(value, (bool, ArraySummary)):
        raise GGUFError(f"GGUF metadata {key} is missing")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise GGUFError(f"GGUF metadata {key} is not an integer: {value!r}") from None


def architecture_from_metadata(meta: dict[str, Any], tensor_names: set[str] | None = None) -> Architecture:
    """The Architecture block from GGUF keys (src/models/qwen35moe.cpp: load_arch_hparams)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError("GGUF metadata general.architecture is missing")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"architecture {arch!r} is not modelled by quantpick's memory model",
            hint="supported: " + ", ".join(SUPPORTED_ARCHITECTURES),
        )
    p = arch + "."
    n_embd = _meta_int(meta, p + "embedding_length")
    n_head = _meta_int(meta, p + "attention.head_count")
    vocab = meta.get(p + "vocab_size")
    tokens = meta.get("tokenizer.ggml.tokens")
    if vocab is None:
        vocab = tokens.length if isinstance(tokens, ArraySummary) else len(tokens or [])
    has_output = True if tensor_names is None else "output.weight" in tensor_names
    return Architecture(
        name=arch,
        block_count=_meta_int(meta, p + "block_count"),
        nextn_predict_layers=_meta_int(meta, p + "nextn_predict_layers", 0),
        context_length=_meta_int(meta, p + "context_length"),
        embedding_length=n_embd,
        head_count=n_head,
        head_count_kv=_meta_int(meta, p + "attention.head_count_kv", n_head),
        key_length=_meta_int(meta, p + "attention.key_length", n_embd // max(n_head, 1)),
        value_length=_meta_int(meta, p + "attention.value_length", n_embd // max(n_head, 1)),
        expert_count=_meta_int(meta, p + "expert_count", 0),
        expert_used_count=_meta_int(meta, p + "expert_used_count", 0),
        expert_feed_forward_length=_meta_int(meta, p + "expert_feed_forward_length", 0),
        expert_shared_feed_forward_length=_meta_int(meta, p + "expert_shared_feed_forward_length", 0),
        ssm_conv_kernel=_meta_int(meta, p + "ssm.conv_kernel"),
        ssm_state_size=_meta_int(meta, p + "ssm.state_size"),
        ssm_group_count=_meta_int(meta, p + "ssm.group_count"),
        ssm_time_step_rank=_meta_int(meta, p + "ssm.time_step_rank"),
        ssm_inner_size=_meta_int(meta, p + "ssm.inner_size"),
        full_attention_interval=_meta_int(meta, p + "full_attention_interval", 4),
        vocab_size=int(vocab),
        has_output_tensor=has_output,
    )


def layout_from_header(
    header: GGUFHeader, *, basis: str, file_bytes: int | None = None, quant: str | None = None
) -> ModelLayout:
    names = {t.name for t in header.tensors}
    arch = architecture_from_metadata(header.metadata, names)
    for t in header.tensors:
        if t.ggml_type not in GGML_TYPES:  # pragma: no cover - guarded by the parser
            raise GGUFError(f"tensor {t.name}: unknown type {t.ggml_type}")
    return ModelLayout(
        architecture=arch,
        tensors=header.tensors,
        basis=basis,
        exact=True,
        file_bytes=file_bytes,
        quant=quant,
        metadata={k: v for k, v in header.metadata.items() if not isinstance(v, ArraySummary)},
    )
