"""GGUF headers -> architecture + tensor table (ModelLayout).

`parse_gguf_header` is a bounded, incremental parser of the GGUF header (metadata + tensor infos).
It pulls bytes through a `fill(offset, min_bytes)` callback, so the same code reads a local file
(`read_gguf_file`, plain file reads) and a remote one (`gguf_remote.read_gguf_url`, HTTP range
requests that grow geometrically until the header is complete). `architecture_from_metadata` and
`layout_from_header` turn the parsed header into the planner's data.

Why not gguf.GGUFReader: it wants the whole file, memory-mapped, and builds a numpy view for every
metadata item; on a real 248k-token vocabulary (tokens + merges: ~500k strings) that takes ~7 s,
and it cannot work from a partial download at all. This parser keeps arrays longer than
`SHORT_ARRAY` elements as an `ArraySummary` (type + length) and skips them without decoding one
string, and it never reads past the tensor infos.

Hostile input: every count and length is checked against what the remaining bytes could hold
(the file size when known, else the header cap) before anything is allocated or looped over, and
against fixed caps (MAX_KV_PAIRS, MAX_TENSORS) far above any real model. Only the metadata someone
reads is decoded and kept (`general.*`, `split.*`, `tokenizer.*` and the architecture's own keys,
within KEPT_METADATA_BUDGET); everything else is walked over without being decoded. Arrays of
arrays are refused, as llama.cpp refuses them. So a header inside the 64 MiB cap costs tens of MB
and about a second at worst (benchmarks/hostile_headers.py), where a naive reader spent up to
634 MB and 30 s. Each problem is one GGUFError naming the offset.
"""

from __future__ import annotations

import errno
import hashlib
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantpick.arch.base import MAX_LAYERS, Architecture, HValue
from quantpick.errors import GGUFError
from quantpick.model.ggml import GGML_TYPES, TYPE_BY_ID, tensor_bytes
from quantpick.model.layout import ModelLayout, TensorInfo

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # v1 (32-bit counts, 2023) is not read by current llama.cpp either
DEFAULT_ALIGNMENT = 32
SHORT_ARRAY = 64  # arrays longer than this become ArraySummary
# ... except the architecture's own numeric arrays: one value per layer (head counts, SWA and
# recurrent-layer flags), up to llama.cpp's LLAMA_MAX_LAYERS.
LAYER_ARRAY = MAX_LAYERS
MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME: llama.cpp's gguf.cpp rejects longer tensor names
MAX_KEY = 65535  # GGUF spec: keys are at most 65535 bytes
_MAX_ELEMENTS = 1 << 62  # sanity bound for the product of dims (ggml uses int64)
# Caps on counts, far above real files and far below what 64 MiB could claim (millions). Real
# headers hold 40-70 metadata pairs and 700-1,200 tensors (Qwen3.6-35B-A3B: 39 pairs kept of 41,
# 753 tensors; DeepSeek-V3 and Llama-3.1-405B: ~1,100); a 128-expert MoE written one tensor per
# expert would reach ~14,000. llama.cpp's gguf.cpp caps neither below SIZE_MAX / sizeof(entry).
MAX_KV_PAIRS = 65536
MAX_TENSORS = 65536
# Metadata kept (decoded) at all: what quantpick reads. layout_from_header and
# architecture_from_metadata read general.architecture/alignment and `<arch>.*`; manifest add and
# the local-GGUF manifest read general.name/license/sampling.*; split files split.*; the
# vocabulary size and chat template live under tokenizer.*. Other keys (quantize.imatrix.*, ...)
# are walked over, never decoded.
KEPT_PREFIXES = ("general.", "split.", "tokenizer.")
MAX_KEPT_KEY = 256  # bytes; longer keys are never read (llama.cpp's longest is ~50)
# Estimated Python memory of the kept metadata (keys + values). A real header keeps ~100 KB
# (its largest value is the chat template, ~10 KB); values past the budget are dropped and counted
# in stats["metadata_dropped"]. 8 MiB of estimate is ~10 MB of real memory.
KEPT_METADATA_BUDGET = 8 * 1024 * 1024

# GGUF value types (gguf.constants.GGUFValueType) -> struct code; STRING=8, ARRAY=9 handled apart.
_SCALAR: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
                           10: "Q", 11: "q", 12: "d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32",
               6: "float32", 7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64",
               12: "float64"}  # fmt: skip


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
    tensor_offsets: tuple[int, ...] = ()  # per tensor, relative to data_offset (file order)
    header_bytes: int = 0  # end of the tensor infos (before the alignment padding)


# A fill callback: (offset, min_bytes) -> bytes starting at offset, at least min_bytes long unless
# the file ends first (b"" at end of file). It may return more than asked (read-ahead).
Fill = Callable[[int, int], bytes]


class _Truncated(GGUFError):
    """The bytes ran out (as opposed to an HTTP or I/O failure inside `fill`)."""


_SKIP_STEP = 4 * 1024 * 1024


class _Cursor:
    """Sequential reads over a growing buffer, with every length checked before it is trusted."""

    def __init__(self, fill: Fill, source: str, max_bytes: int, file_size: int | None) -> None:
        self.fill = fill
        self.source = source
        self.max_bytes = max_bytes
        self.file_size = file_size
        self.buf = bytearray()
        self.base = 0  # absolute offset of buf[0] (consumed bytes are dropped, see _compact)
        self.pos = 0  # absolute offset of the next read

    # -- limits -----------------------------------------------------------------------------
    def fail(self, message: str) -> GGUFError:
        return GGUFError(f"{self.source}: {message}")

    def limit_text(self) -> str:
        if self.file_size is not None and self.file_size <= self.max_bytes:
            return f"the {self.file_size}-byte file"
        return f"the {self.max_bytes}-byte header cap"

    def remaining(self) -> int:
        """Bytes that can still belong to the header: to the end of file, or to the header cap."""
        limit = self.max_bytes if self.file_size is None else min(self.file_size, self.max_bytes)
        return max(limit - self.pos, 0)

    def ensure(self, n: int) -> None:
        end = self.pos + n
        if end > self.max_bytes:
            raise self.fail(
                f"header does not end within {self.max_bytes} bytes (a field at offset {self.pos} "
                f"needs {n} more): not a GGUF header quantpick will read"
            )
        while self.base + len(self.buf) < end:
            have = self.base + len(self.buf)
            chunk = self.fill(have, end - have)
            if not chunk:
                raise _Truncated(
                    f"{self.source}: "
                    f"truncated GGUF header: the file ends at byte {have}, a field at offset "
                    f"{self.pos} needs {n} bytes"
                )
            self.buf += chunk

    def _compact(self) -> None:
        # Keep memory at one window: drop what the parser has already consumed.
        drop = self.pos - self.base
        if drop > 8 * 1024 * 1024:
            del self.buf[:drop]
            self.base = self.pos

    # -- primitives -------------------------------------------------------------------------
    def take(self, n: int) -> bytes:
        self.ensure(n)
        start = self.pos - self.base
        self.pos += n
        return bytes(self.buf[start : start + n])

    def unpack(self, code: str) -> Any:
        size = struct.calcsize("<" + code)
        self.ensure(size)
        value = struct.unpack_from("<" + code, self.buf, self.pos - self.base)[0]
        self.pos += size
        return value

    def skip(self, n: int) -> None:
        # In steps, compacting between them: skipping a 60 MB string never holds 60 MB.
        end = self.pos + n
        if end > self.max_bytes:
            self.ensure(n)  # raises, naming the cap
        while True:
            step = min(end - self.pos, _SKIP_STEP)
            self.ensure(step)
            self.pos += step
            self._compact()
            if self.pos >= end:
                return

    def string_length(self, what: str, cap: int | None = None) -> int:
        at = self.pos
        length = self.unpack("Q")
        if length > self.remaining() or (cap is not None and length > cap):
            if cap is not None and length > cap:
                limit = f"the {cap}-byte limit"
            else:
                limit = f"what is left of {self.limit_text()}"
            raise self.fail(f"{what} at offset {at} claims {length} bytes, more than {limit}")
        return int(length)

    def string(self, what: str, cap: int | None = None) -> str:
        length = self.string_length(what, cap)
        raw = self.take(length)
        return bytes(raw).decode("utf-8", errors="replace")

    def count(self, what: str, min_item_bytes: int) -> int:
        """A uint64 count whose items (each >= min_item_bytes) must fit in the remaining bytes."""
        at = self.pos
        n = int(self.unpack("Q"))
        if n * min_item_bytes > self.remaining():
            raise self.fail(
                f"{what} at offset {at} is {n}, more than the {self.remaining()} bytes left of "
                f"{self.limit_text()} can hold"
            )
        return n


def _min_value_bytes(value_type: int) -> int:
    if value_type in _SCALAR:
        return struct.calcsize("<" + _SCALAR[value_type])
    return 8  # a string: its length


class _Dropped:
    """A kept-namespace value that did not fit the budget (never stored)."""


_DROPPED = _Dropped()
_STR_COST, _NUMBER_COST, _LIST_COST, _ENTRY_COST = 49, 32, 56, 100  # CPython object sizes


class _Budget:
    def __init__(self, limit: int) -> None:
        self.left = limit
        self.dropped = 0

    def spend(self, cost: int) -> bool:
        if cost > self.left:
            return False
        self.left -= cost
        return True


def _skip_value(cur: _Cursor, value_type: int, key: str) -> Any:
    """Walk over a value without decoding it; returns ArraySummary for arrays, else None."""
    if value_type in _SCALAR:
        cur.skip(struct.calcsize("<" + _SCALAR[value_type]))
        return None
    if value_type == _STRING:
        cur.skip(cur.string_length(f"string value of {key}"))
        return None
    element_type, length = _array_head(cur, value_type, key)
    _skip_array(cur, element_type, length, key)
    return ArraySummary(element_type, length)


def _array_head(cur: _Cursor, value_type: int, key: str) -> tuple[int, int]:
    if value_type != _ARRAY:
        raise cur.fail(f"metadata {key}: unknown value type {value_type}")
    element_type = int(cur.unpack("I"))
    if element_type == _ARRAY:
        # gguf.cpp (gguf_init_from_file_impl) refuses arrays of arrays: "invalid GGUF type".
        raise cur.fail(f"metadata {key}: an array of arrays (llama.cpp refuses them too)")
    if element_type not in _SCALAR and element_type != _STRING:
        raise cur.fail(f"metadata {key}: array of unknown value type {element_type}")
    length = cur.count(f"array length of {key}", _min_value_bytes(element_type))
    return element_type, length


def _read_value(
    cur: _Cursor, value_type: int, key: str, budget: _Budget, *, layer_array: bool = False
) -> Any:
    """Decode a kept value, or walk over it (and return _DROPPED) when it does not fit.
    `layer_array`: a numeric array of the architecture's own keys is kept up to LAYER_ARRAY."""
    if value_type in _SCALAR:
        value = cur.unpack(_SCALAR[value_type])
        return value if budget.spend(_NUMBER_COST) else _DROPPED
    if value_type == _STRING:
        length = cur.string_length(f"string value of {key}")
        if not budget.spend(_STR_COST + length):
            cur.skip(length)
            return _DROPPED
        return cur.take(length).decode("utf-8", errors="replace")
    element_type, length = _array_head(cur, value_type, key)
    limit = LAYER_ARRAY if layer_array and element_type in _SCALAR else SHORT_ARRAY
    if length > limit:
        _skip_array(cur, element_type, length, key)
        return ArraySummary(element_type, length)
    if element_type in _SCALAR:
        code = _SCALAR[element_type]
        size = struct.calcsize("<" + code)
        if not budget.spend(_LIST_COST + length * (8 + _NUMBER_COST)):
            cur.skip(size * length)
            return _DROPPED
        raw = cur.take(size * length)
        return list(struct.unpack(f"<{length}{code}", raw))
    if not budget.spend(_LIST_COST + 8 * length):
        _skip_strings(cur, length, key)
        return _DROPPED
    values: list[str] = []
    for i in range(length):
        n = cur.string_length(f"string in {key}")
        if not budget.spend(_STR_COST + n):
            cur.skip(n)
            _skip_strings(cur, length - i - 1, key)
            return _DROPPED
        values.append(cur.take(n).decode("utf-8", errors="replace"))
    return values


def _skip_array(cur: _Cursor, element_type: int, length: int, key: str) -> None:
    if element_type in _SCALAR:
        cur.skip(length * struct.calcsize("<" + _SCALAR[element_type]))
        return
    _skip_strings(cur, length, key)


_U64 = struct.Struct("<Q")


def _skip_strings(cur: _Cursor, length: int, key: str) -> None:
    """Walk `length` strings by their length prefixes only: nothing is decoded or kept.

    The fast inner loop runs over what is already buffered (a string accepted there lies inside
    the buffer, which the header cap bounds); a string that crosses the buffer end goes through
    the checked slow path, which fetches more.
    """
    left = length
    unpack = _U64.unpack_from
    while left:
        buf, p = cur.buf, cur.pos - cur.base
        end = len(buf)
        while left and p + 8 <= end:
            n = unpack(buf, p)[0]
            if p + 8 + n > end:
                break
            p += 8 + n
            left -= 1
        cur.pos = cur.base + p
        if left:
            cur.skip(cur.string_length(f"string in {key}"))
            left -= 1
    cur.skip(0)


def parse_gguf_header(
    fill: Fill,
    *,
    source: str = "<gguf>",
    max_header_bytes: int = MAX_HEADER_BYTES,
    file_size: int | None = None,
) -> GGUFHeader:
    """Parse a GGUF header from bytes pulled through `fill` (see `Fill`). Pure apart from `fill`.

    `file_size`, when known, tightens the plausibility checks (counts and lengths must fit in the
    file). Raises GGUFError for anything that is not a well-formed v2/v3 little-endian GGUF header.
    """
    cur = _Cursor(fill, source, max_header_bytes, file_size)
    try:
        magic = cur.take(4)
    except _Truncated:
        raise cur.fail("not a GGUF file (shorter than the 4-byte magic)") from None
    if magic != GGUF_MAGIC:
        raise cur.fail(f"not a GGUF file (magic {bytes(magic)!r}, expected b'GGUF')")
    version = int(cur.unpack("I"))
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
            raise cur.fail("big-endian GGUF files are not supported")
        raise cur.fail(f"unsupported GGUF version {version} (quantpick reads versions 2 and 3)")
    # Minimum sizes: a tensor info is name(8) + n_dims(4) + one dim(8) + type(4) + offset(8);
    # a metadata pair is key(8+1) + type(4) + one byte of value.
    n_tensors = cur.count("tensor count", 32)
    n_kv = cur.count("metadata count", 8 + 1 + 4 + 1)
    for what, n, cap in (
        ("tensor count", n_tensors, MAX_TENSORS),
        ("metadata count", n_kv, MAX_KV_PAIRS),
    ):
        if n > cap:
            raise cur.fail(
                f"{what} {n} is more than the {cap} quantpick reads (real models: ~1,000)"
            )
    metadata: dict[str, Any] = {}
    seen: set[bytes] = set()  # 16-byte digests of every key: bounded whatever the keys' lengths
    budget = _Budget(KEPT_METADATA_BUDGET)
    kept_prefixes: tuple[bytes, ...] = tuple(p.encode() for p in KEPT_PREFIXES)
    arch_prefix: bytes | None = None
    for _ in range(n_kv):
        at = cur.pos
        raw_key = cur.take(cur.string_length("metadata key", MAX_KEY))
        if not raw_key:
            raise cur.fail(f"empty metadata key before offset {cur.pos}")
        digest = hashlib.blake2b(raw_key, digest_size=16).digest()
        label = raw_key[:80].decode("utf-8", errors="replace")  # for messages only
        if digest in seen:
            raise cur.fail(f"duplicate metadata key {label!r} at offset {at}")
        seen.add(digest)
        value_type = int(cur.unpack("I"))
        if len(raw_key) > MAX_KEPT_KEY or not raw_key.startswith(kept_prefixes):
            _skip_value(cur, value_type, label)
            continue
        key = raw_key.decode("utf-8", errors="replace")
        if not budget.spend(_ENTRY_COST + _STR_COST + len(raw_key)):
            _skip_value(cur, value_type, key)
            budget.dropped += 1
            continue
        layer_array = arch_prefix is not None and raw_key.startswith(arch_prefix)
        value = _read_value(cur, value_type, key, budget, layer_array=layer_array)
        if value is _DROPPED:
            budget.dropped += 1
            continue
        metadata[key] = value
        if key == "general.architecture" and isinstance(value, str):
            arch_prefix = f"{value}.".encode()
            kept_prefixes += (arch_prefix,)

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise cur.fail(f"general.alignment must be a power of two, got {alignment!r}")

    tensors: list[TensorInfo] = []
    offsets: list[int] = []
    names: set[str] = set()
    for _ in range(n_tensors):
        name = cur.string("tensor name", MAX_NAME - 1)
        if name in names:
            raise cur.fail(f"duplicate tensor {name!r}")
        names.add(name)
        n_dims = int(cur.unpack("I"))
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {name}: {n_dims} dimensions (ggml allows 1 to {MAX_DIMS})")
        shape = tuple(int(cur.unpack("Q")) for _ in range(n_dims))
        elements = 1
        for dim in shape:
            elements *= dim
            if elements > _MAX_ELEMENTS:
                raise cur.fail(f"tensor {name}: shape {shape} is absurdly large")
        type_id = int(cur.unpack("I"))
        type_name = TYPE_BY_ID.get(type_id)
        if type_name is None:
            raise cur.fail(f"tensor {name}: unknown ggml type {type_id}")
        block = GGML_TYPES[type_name][1]
        if shape[0] % block:
            raise cur.fail(
                f"tensor {name}: row length {shape[0]} is not a multiple of {type_name}'s "
                f"block size {block}"
            )
        offset = int(cur.unpack("Q"))
        if offset % alignment:
            raise cur.fail(f"tensor {name}: data offset {offset} is not {alignment}-aligned")
        tensors.append(TensorInfo(name, type_name, shape, tensor_bytes(type_name, shape)))
        offsets.append(offset)
    header_end = cur.pos
    data_offset = header_end + (-header_end) % alignment
    if file_size is not None:
        for t, off in zip(tensors, offsets, strict=True):
            if data_offset + off + t.n_bytes > file_size:
                raise cur.fail(
                    f"tensor {t.name}: data ({t.n_bytes} bytes at {data_offset + off}) runs past "
                    f"the end of the {file_size}-byte file"
                )
    stats = {"header_bytes": header_end}
    if budget.dropped:
        stats["metadata_dropped"] = budget.dropped
    return GGUFHeader(
        version=version,
        metadata=metadata,
        tensors=tuple(tensors),
        alignment=int(alignment),
        data_offset=data_offset,
        source=source,
        stats=stats,
        tensor_offsets=tuple(offsets),
        header_bytes=header_end,
    )


# ----------------------------------------------------------------------------------------------
# Local files


def read_gguf_file(
    path: Path, *, max_header_bytes: int = MAX_HEADER_BYTES, check_size: bool = True
) -> GGUFHeader:
    """Header of a local GGUF file, read incrementally (1 MiB reads) with the bounded parser.

    `check_size=False` skips the "tensor data fits in the file" check (a file being downloaded).
    """
    path = Path(path)
    if not path.is_file():
        # path/os_errno: a missing --gguf is a usage error (exit 2) at the CLI boundary
        raise GGUFError(f"{path}: no such file", path=str(path), os_errno=errno.ENOENT)
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            reads = [0, 0]

            def fill(offset: int, min_bytes: int) -> bytes:
                fh.seek(offset)
                data = fh.read(max(min_bytes, 1024 * 1024))
                reads[0] += 1
                reads[1] += len(data)
                return data

            header = parse_gguf_header(
                fill,
                source=str(path),
                max_header_bytes=max_header_bytes,
                file_size=size if check_size else None,
            )
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read: {exc.strerror or exc}") from None
    header.stats.update(reads=reads[0], bytes_read=reads[1], file_bytes=size)
    return header


# ----------------------------------------------------------------------------------------------
# Split GGUFs ("-00001-of-00003.gguf"): llama-gguf-split puts the metadata in the first shard and
# each shard's own tensor infos in that shard, so an exact tensor table needs every shard's header
# (the later ones are small: split keys + tensor infos, ~100 KB).

SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def split_names(name: str) -> list[str]:
    """All shard names of a split GGUF given any one of them; [name] for a single file."""
    match = SPLIT_RE.search(name)
    if not match:
        return [name]
    count = int(match.group(2))
    stem = name[: match.start()]
    return [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def merge_split_headers(headers: list[GGUFHeader]) -> GGUFHeader:
    """One header for a split model: the first shard's metadata, every shard's tensors."""
    first = headers[0]
    if len(headers) == 1:
        return first
    count = first.metadata.get("split.count")
    if isinstance(count, int) and count != len(headers):
        raise GGUFError(f"{first.source}: split.count is {count}, {len(headers)} shards read")
    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for h in headers:
        for t in h.tensors:
            if t.name in seen:
                raise GGUFError(f"{h.source}: tensor {t.name} appears in two shards")
            seen.add(t.name)
            tensors.append(t)
    expected = first.metadata.get("split.tensors.count")
    if isinstance(expected, int) and expected != len(tensors):
        raise GGUFError(
            f"{first.source}: split.tensors.count is {expected}, the shards hold {len(tensors)}"
        )
    stats: dict[str, int] = {}
    for h in headers:
        for k, v in h.stats.items():
            stats[k] = stats.get(k, 0) + v
    stats["shards"] = len(headers)
    return GGUFHeader(
        version=first.version,
        metadata=first.metadata,
        tensors=tuple(tensors),
        alignment=first.alignment,
        data_offset=first.data_offset,
        source=first.source,
        stats=stats,
        tensor_offsets=(),  # offsets are per shard; not meaningful for the merged table
        header_bytes=first.header_bytes,
    )


def read_gguf_split(path: Path) -> GGUFHeader:
    """A local GGUF, or every shard of a split one (stats["file_bytes"] = all shards)."""
    path = Path(path)
    names = split_names(path.name)
    return merge_split_headers([read_gguf_file(path.with_name(n)) for n in names])


# ----------------------------------------------------------------------------------------------
# JSON form (the on-disk header cache)

CACHE_FORMAT = 1


def header_to_json(header: GGUFHeader) -> dict[str, Any]:
    def encode(value: Any) -> Any:
        if isinstance(value, ArraySummary):
            return {"__array__": [value.element_type, value.length]}
        if isinstance(value, list):
            return [encode(v) for v in value]
        return value

    return {
        "format": CACHE_FORMAT,
        "version": header.version,
        "source": header.source,
        "alignment": header.alignment,
        "data_offset": header.data_offset,
        "header_bytes": header.header_bytes,
        "metadata": {k: encode(v) for k, v in header.metadata.items()},
        "tensors": [[t.name, t.ggml_type, list(t.shape)] for t in header.tensors],
        "tensor_offsets": list(header.tensor_offsets),
        "stats": dict(header.stats),
    }


def header_from_json(doc: Any) -> GGUFHeader:
    """Inverse of header_to_json; GGUFError on anything malformed (callers treat it as a miss)."""

    def decode(value: Any) -> Any:
        if isinstance(value, dict):
            element_type, length = value["__array__"]
            return ArraySummary(int(element_type), int(length))
        if isinstance(value, list):
            return [decode(v) for v in value]
        return value

    try:
        if doc.get("format") != CACHE_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        tensors = []
        for name, type_name, shape in doc["tensors"]:
            if type_name not in GGML_TYPES:
                raise ValueError(f"unknown type {type_name}")
            dims = tuple(int(d) for d in shape)
            tensors.append(TensorInfo(str(name), type_name, dims, tensor_bytes(type_name, dims)))
        return GGUFHeader(
            version=int(doc["version"]),
            metadata={str(k): decode(v) for k, v in doc["metadata"].items()},
            tensors=tuple(tensors),
            alignment=int(doc["alignment"]),
            data_offset=int(doc["data_offset"]),
            source=str(doc.get("source", "")),
            stats={str(k): int(v) for k, v in doc.get("stats", {}).items()},
            tensor_offsets=tuple(int(o) for o in doc.get("tensor_offsets", [])),
            header_bytes=int(doc.get("header_bytes", 0)),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise GGUFError(f"malformed cached header: {exc}") from None


# ----------------------------------------------------------------------------------------------
# Header -> planner data


def n_parameters(header: GGUFHeader) -> int:
    """Total weights (elements) of all tensors: the denominator of bits per weight."""
    total = 0
    for t in header.tensors:
        n = 1
        for dim in t.shape:
            n *= dim
        total += n
    return total


def _hparam(value: Any) -> HValue | None:
    """A metadata value as an architecture hyperparameter (numbers, flags, short strings and
    per-layer numeric arrays; long arrays and other lists are not hyperparameters)."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str) and len(value) <= 256:
        return value
    if isinstance(value, list) and all(isinstance(v, (bool, int, float)) for v in value):
        return tuple(value)
    return None


def architecture_from_metadata(
    meta: dict[str, Any], tensor_names: set[str] | None = None
) -> Architecture:
    """The Architecture of a header: `general.architecture` and its `<arch>.*` keys, whatever the
    architecture (arch/registry.py says what quantpick knows of it)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFError("GGUF metadata general.architecture is missing")
    p = arch + "."
    hparams: dict[str, HValue] = {}
    for key, value in meta.items():
        if key.startswith(p):
            hv = _hparam(value)
            if hv is not None:
                hparams[key[len(p) :]] = hv
    for key in ("block_count", "embedding_length", "context_length"):
        value = hparams.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise GGUFError(f"GGUF metadata {p}{key} is missing or not an integer")
    block_count = hparams["block_count"]
    assert isinstance(block_count, int)
    if not 0 < block_count <= MAX_LAYERS:
        raise GGUFError(f"GGUF metadata {p}block_count {block_count} is outside 1..{MAX_LAYERS}")
    vocab = hparams.pop("vocab_size", None)
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        vocab = tokens.length if isinstance(tokens, ArraySummary) else len(tokens or [])
    has_output = True if tensor_names is None else "output.weight" in tensor_names
    return Architecture.of(arch, hparams, int(vocab), has_output_tensor=has_output)


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
