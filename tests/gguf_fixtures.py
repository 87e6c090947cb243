"""Write qwen35moe-shaped GGUF files with the `gguf` package for the header tests.

Modelled on ../shared/tools/synth_gguf.py: the exact metadata keys and tensor table llama.cpp's
qwen35moe loader reads, with the tensor data either a sparse hole (`data="sparse"`, the full-size
architecture costs no disk) or random bytes (`data="random"`, tiny models only).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FULL: dict[str, int] = dict(n_embd=2048, n_layer=40, n_head=16, n_head_kv=2, head_dim=256,
                            n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512,
                            n_vocab=248320, ssm_state=128, ssm_groups=16, ssm_v_heads=32, conv=4,
                            ctx=262144, interval=4)  # fmt: skip
TINY: dict[str, int] = dict(n_embd=256, n_layer=8, n_head=4, n_head_kv=2, head_dim=64, n_expert=16,
                            n_expert_used=4, n_ff_exp=128, n_ff_shexp=128, n_vocab=1024,
                            ssm_state=32, ssm_groups=4, ssm_v_heads=8, conv=4, ctx=32768,
                            interval=4)  # fmt: skip


def tensor_list(h: dict[str, int], mtp: bool) -> list[tuple[str, tuple[int, ...]]]:
    """(name, ne) in ggml order, as llama.cpp's qwen35moe loader expects them."""
    e, v = h["n_embd"], h["n_vocab"]
    hd, nh, nkv = h["head_dim"], h["n_head"], h["n_head_kv"]
    key_dim = h["ssm_state"] * h["ssm_groups"]
    value_dim = h["ssm_state"] * h["ssm_v_heads"]
    out: list[tuple[str, tuple[int, ...]]] = [
        ("token_embd.weight", (e, v)),
        ("output_norm.weight", (e,)),
        ("output.weight", (e, v)),
    ]

    def block(il: int, attn: bool, nextn: bool) -> list[tuple[str, tuple[int, ...]]]:
        p = f"blk.{il}."
        t: list[tuple[str, tuple[int, ...]]] = [
            (p + "attn_norm.weight", (e,)),
            (p + "post_attention_norm.weight", (e,)),
        ]
        if attn:
            t += [(p + "attn_q.weight", (e, hd * nh * 2)), (p + "attn_k.weight", (e, hd * nkv)),
                  (p + "attn_v.weight", (e, hd * nkv)), (p + "attn_output.weight", (hd * nh, e)),
                  (p + "attn_q_norm.weight", (hd,)), (p + "attn_k_norm.weight", (hd,))]  # fmt: skip
        else:
            conv_dim = key_dim * 2 + value_dim
            t += [(p + "attn_qkv.weight", (e, conv_dim)), (p + "attn_gate.weight", (e, value_dim)),
                  (p + "ssm_conv1d.weight", (h["conv"], conv_dim)),
                  (p + "ssm_dt.bias", (h["ssm_v_heads"],)), (p + "ssm_a", (h["ssm_v_heads"],)),
                  (p + "ssm_beta.weight", (e, h["ssm_v_heads"])),
                  (p + "ssm_alpha.weight", (e, h["ssm_v_heads"])),
                  (p + "ssm_norm.weight", (h["ssm_state"],)),
                  (p + "ssm_out.weight", (value_dim, e))]  # fmt: skip
        x, f, s = h["n_expert"], h["n_ff_exp"], h["n_ff_shexp"]
        t += [(p + "ffn_gate_inp.weight", (e, x)), (p + "ffn_down_exps.weight", (f, e, x)),
              (p + "ffn_gate_exps.weight", (e, f, x)), (p + "ffn_up_exps.weight", (e, f, x)),
              (p + "ffn_gate_inp_shexp.weight", (e,)), (p + "ffn_gate_shexp.weight", (e, s)),
              (p + "ffn_up_shexp.weight", (e, s)),
              (p + "ffn_down_shexp.weight", (s, e))]  # fmt: skip
        if nextn:
            t += [(p + "nextn.eh_proj.weight", (2 * e, e)), (p + "nextn.enorm.weight", (e,)),
                  (p + "nextn.hnorm.weight", (e,)),
                  (p + "nextn.shared_head_norm.weight", (e,))]  # fmt: skip
        return t

    for il in range(h["n_layer"]):
        out += block(il, (il + 1) % h["interval"] == 0, False)
    if mtp:
        out += block(h["n_layer"], True, True)
    return out


def tensor_type(name: str, ne: tuple[int, ...], big: str) -> str:
    if len(ne) == 1 or name.endswith(("ssm_conv1d.weight", "ffn_gate_inp.weight", "ssm_a")):
        return "F32"
    if name == "output.weight" and big not in ("F16", "BF16", "F32", "Q8_0"):
        return "Q6_K"
    return big


def add_hparams(w: Any, h: dict[str, int], *, mtp: bool) -> None:
    """The qwen35moe hyperparameters llama.cpp's loader reads (load_arch_hparams), from `h`."""
    w.add_block_count(h["n_layer"] + (1 if mtp else 0))
    w.add_context_length(h["ctx"])
    w.add_embedding_length(h["n_embd"])
    w.add_feed_forward_length(h["n_ff_exp"])
    w.add_head_count(h["n_head"])
    w.add_head_count_kv(h["n_head_kv"])
    w.add_key_length(h["head_dim"])
    w.add_value_length(h["head_dim"])
    w.add_rope_dimension_count(h["head_dim"] // 4)  # partial rotary 0.25
    w.add_rope_freq_base(1e7)
    # IMROPE sections add up to half the rotary dims: [11, 11, 10, 0] for the real head_dim 256
    w.add_rope_dimension_sections([11, 11, 10, 0] if h["head_dim"] == 256 else [3, 3, 2, 0])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(h["n_expert"])
    w.add_expert_used_count(h["n_expert_used"])
    w.add_expert_feed_forward_length(h["n_ff_exp"])
    w.add_expert_shared_feed_forward_length(h["n_ff_shexp"])
    w.add_ssm_conv_kernel(h["conv"])
    w.add_ssm_state_size(h["ssm_state"])
    w.add_ssm_group_count(h["ssm_groups"])
    w.add_ssm_time_step_rank(h["ssm_v_heads"])
    w.add_ssm_inner_size(h["ssm_state"] * h["ssm_v_heads"])
    w.add_full_attention_interval(h["interval"])
    if mtp:
        w.add_nextn_predict_layers(1)


def write_gguf(
    path: Path,
    h: dict[str, int] = TINY,
    *,
    big: str = "Q8_0",
    mtp: bool = False,
    data: str = "sparse",
    arch: str = "qwen35moe",
    name: str = "Synthetic-Qwen3.6-35B-A3B-shape",
    extra: Callable[[Any], None] | None = None,
    tensors: Sequence[tuple[str, tuple[int, ...]]] | None = None,
    split: tuple[int, int, int] | None = None,  # (split.no 0-based, split.count, tensors total)
    metadata: bool = True,
    sampling: bool = True,
) -> int:
    """Write one GGUF; returns its size in bytes."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    if metadata:
        w.add_name(name)
        w.add_license("apache-2.0")
        add_hparams(w, h, mtp=mtp)
        if sampling:
            w.add_float32("general.sampling.temp", 0.6)
            w.add_float32("general.sampling.top_p", 0.95)
            w.add_int32("general.sampling.top_k", 20)
            w.add_float32("general.sampling.min_p", 0.0)
        v = h["n_vocab"]
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
        # Real BPE tokens average ~7 bytes; the filler is sized alike so header sizes are realistic.
        tokens = [f"tok{i:05d}" for i in range(v - len(specials))] + specials
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen35")
        w.add_token_list(tokens)
        w.add_token_types([1] * (v - len(specials)) + [3] * len(specials))
        w.add_token_merges([f"t{i} o{i}" for i in range(v - 1)])
        w.add_eos_token_id(v - 3)
        w.add_bos_token_id(v - 5)
        w.add_add_bos_token(False)
        w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    if extra is not None:
        extra(w)
    if split is not None:
        no, count, total = split
        w.add_uint16("split.no", no)
        w.add_uint16("split.count", count)
        w.add_int32("split.tensors.count", total)

    rng = np.random.default_rng(0)
    entries = []
    for tname, ne in tensors if tensors is not None else tensor_list(h, mtp):
        qt = gguf.GGMLQuantizationType[tensor_type(tname, ne, big)]
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        n = 1
        for d in ne:
            n *= d
        nbytes = n // bs * ts
        w.add_tensor_info(tname, tuple(reversed(ne)), np.float32, nbytes, raw_dtype=qt)
        entries.append(nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    f.flush()
    align = 32
    f.write(b"\0" * ((-f.tell()) % align))
    for nbytes in entries:
        if data == "random":
            f.write(rng.integers(0, 255, size=nbytes, dtype=np.uint8).tobytes())
        else:
            f.seek(nbytes, os.SEEK_CUR)
        f.seek((-f.tell()) % align, os.SEEK_CUR)
    total = f.tell()
    f.truncate(total)
    w.close()
    return total


def write_split(
    directory: Path, stem: str, n_shards: int, h: dict[str, int] = TINY, **kwargs: Any
) -> list[Path]:
    """A split GGUF like llama-gguf-split writes: metadata in shard 1, tensors spread over all."""
    all_tensors = tensor_list(h, kwargs.pop("mtp", False))
    per = -(-len(all_tensors) // n_shards)
    paths = []
    for i in range(n_shards):
        path = directory / f"{stem}-{i + 1:05d}-of-{n_shards:05d}.gguf"
        write_gguf(
            path,
            h,
            tensors=all_tensors[i * per : (i + 1) * per],
            split=(i, n_shards, len(all_tensors)),
            metadata=i == 0,
            **kwargs,
        )
        paths.append(path)
    return paths


def raw_gguf(
    kvs: Sequence[bytes] = (),
    tensors: Sequence[bytes] = (),
    *,
    version: int = 3,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    magic: bytes = b"GGUF",
) -> bytes:
    """Hand-built header bytes for the hostile-input tests (counts may lie)."""
    import struct

    head = magic + struct.pack("<I", version)
    head += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors,
                        len(kvs) if n_kv is None else n_kv)  # fmt: skip
    return head + b"".join(kvs) + b"".join(tensors)


def gguf_str(s: str | bytes, length: int | None = None) -> bytes:
    import struct

    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def kv(key: str, value_type: int, payload: bytes) -> bytes:
    import struct

    return gguf_str(key) + struct.pack("<I", value_type) + payload


def tensor_info(name: str, shape: Sequence[int], type_id: int, offset: int) -> bytes:
    import struct

    out = gguf_str(name) + struct.pack("<I", len(shape))
    out += b"".join(struct.pack("<Q", d) for d in shape)
    return out + struct.pack("<IQ", type_id, offset)


# ------------------------------------------------------------------------------------------------
# Hostile headers that stay inside the parser's 64 MiB cap (issue 13): cheap to write, costly to
# parse naively. Shared by tests/model/test_gguf.py and benchmarks/hostile_headers.py.

HOSTILE_SHAPES = (
    "tiny-kvs",  # millions of 1-byte metadata values
    "short-arrays",  # 64-element uint8 arrays: under SHORT_ARRAY, so decoded into lists
    "short-string-arrays",  # 64-element arrays of 2-byte strings: one str object each
    "nested-arrays",  # arrays of arrays of arrays, 64 wide at every level
    "wide-nested",  # one array of millions of empty arrays
    "long-keys",  # 60 KiB keys
    "long-string",  # one 60 MiB string value
    "tensors",  # millions of 1-D tensor infos
)


def hostile_header(shape: str, size: int = 60 * 1024 * 1024, max_count: int | None = None) -> bytes:
    """About `size` bytes of a well-formed-looking GGUF header of the given shape; with
    `max_count`, at most that many metadata pairs or tensors (an attacker who knows the parser's
    count caps stays under them)."""
    import struct

    U8, STR, ARR = 0, 8, 9
    limit = max_count if max_count is not None else 1 << 62

    def fill_kvs(prefix: str, suffix: str, value_type: int, body: bytes) -> bytes:
        # Every key is f"{prefix}{i:07d}{suffix}", every value `body`: built by joining (a few
        # hundred ns per pair), and kept inside `size`, so inside the parser's cap.
        head = struct.pack("<Q", len(prefix) + 7 + len(suffix))
        tail = struct.pack("<I", value_type) + body
        item = len(head) + len(prefix) + 7 + len(suffix) + len(tail)
        n = max(1, min(limit, (size - 24) // item))
        return raw_gguf(
            [b"".join(head + f"{prefix}{i:07d}{suffix}".encode() + tail for i in range(n))],
            n_kv=n,
        )

    if shape == "tiny-kvs":
        return fill_kvs("general.k", "", U8, b"\1")
    if shape == "short-arrays":
        return fill_kvs("general.a", "", ARR, struct.pack("<IQ", U8, 64) + bytes(range(64)))
    if shape == "short-string-arrays":
        return fill_kvs("tokenizer.s", "", ARR, struct.pack("<IQ", STR, 64) + gguf_str("ab") * 64)
    if shape == "nested-arrays":
        leaf = struct.pack("<IQ", U8, 64) + bytes(64)
        level2 = struct.pack("<IQ", ARR, 64) + leaf * 64
        level3 = struct.pack("<IQ", ARR, 64) + level2 * 64
        level4 = struct.pack("<IQ", ARR, 64) + level3 * 64
        return fill_kvs("general.n", "", ARR, level4)
    if shape == "wide-nested":
        n = (size - 64) // 12
        return raw_gguf(
            [kv("general.w", ARR, struct.pack("<IQ", ARR, n) + struct.pack("<IQ", U8, 0) * n)]
        )
    if shape == "long-keys":
        return fill_kvs("general.", "k" * 60_000, U8, b"\1")
    if shape == "long-string":
        return raw_gguf([kv("general.description", STR, gguf_str("x" * (size - 64)))])
    if shape == "tensors":
        n = min((size - 24) // 40, limit)
        head, dims = struct.pack("<Q", 8), struct.pack("<IQI", 1, 32, 0)
        infos = b"".join(
            head + f"t{i:07d}".encode() + dims + struct.pack("<Q", 128 * i) for i in range(n)
        )
        return raw_gguf(tensors=[infos], n_tensors=n)
    raise ValueError(shape)


# ------------------------------------------------------------------------------------------------
# A local HTTP server with Range support (and misbehaving modes) for the remote-header tests.


class RangeServer:
    """Serves files on 127.0.0.1 from a {url path: Path | bytes} table.

    mode: "range" (206 + Content-Range), "ignore-range" (200 + the whole body), "stall" (100
    bytes, then silence), "modelscope"
    (200 + Content-Range + exact Content-Length, as ModelScope answers), "endless" (ignores
    Range and streams the path's bytes followed by zeros forever). `redirects` maps a path to a
    URL answered with 302. `require_auth` maps a path to the Authorization value it must carry.
    `fail_next` maps a path to statuses answered first, one per request (e.g. [503, 429]).
    The log records (method, path, Range, Authorization, status, bytes sent) per request.
    """

    def __init__(self) -> None:
        import http.server
        import threading

        self.files: dict[str, Path | bytes] = {}
        self.redirects: dict[str, str] = {}
        self.require_auth: dict[str, str] = {}
        self.fail_next: dict[str, list[int]] = {}
        self.mode = "range"
        self.log: list[dict[str, Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

            def send_response(self, code: int, message: str | None = None) -> None:
                entry = getattr(self, "_log_entry", None)
                if entry is not None:
                    entry["status"] = code
                super().send_response(code, message)

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                entry: dict[str, Any] = {
                    "path": self.path,
                    "range": self.headers.get("Range"),
                    "authorization": self.headers.get("Authorization"),
                    "sent": 0,
                }
                outer.log.append(entry)
                self._log_entry = entry
                try:
                    outer._answer(self, entry)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client closed early: exactly what a header read should do

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _size(self, item: Path | bytes) -> int:
        return len(item) if isinstance(item, bytes) else item.stat().st_size

    def _read(self, item: Path | bytes, start: int, n: int) -> bytes:
        if isinstance(item, bytes):
            return item[start : start + n]
        with item.open("rb") as fh:
            fh.seek(start)
            return fh.read(n)

    def _answer(self, h: Any, entry: dict[str, Any]) -> None:
        path = h.path.split("?")[0]
        if path in self.redirects:
            h.send_response(302)
            h.send_header("Location", self.redirects[path])
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if path in self.require_auth and h.headers.get("Authorization") != self.require_auth[path]:
            h.send_response(401)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if self.fail_next.get(path):
            h.send_response(self.fail_next[path].pop(0))
            h.send_header("Retry-After", "0")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        item = self.files.get(path)
        if item is None:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        size = self._size(item)
        if self.mode == "endless":
            h.send_response(200)
            h.end_headers()  # no length: HTTP/1.1 body until close
            h.close_connection = True
            start = self._read(item, 0, size)
            h.wfile.write(start)
            entry["sent"] += len(start)
            zeros = b"\0" * 65536
            for _ in range(100_000):  # 6.5 GB at most: a bound for the test, not reached
                h.wfile.write(zeros)
                entry["sent"] += len(zeros)
            return
        if self.mode == "stall":  # headers and a few bytes, then silence
            import time

            h.send_response(206)
            h.send_header("Content-Range", f"bytes 0-{size - 1}/{size}")
            h.send_header("Content-Length", str(size))
            h.end_headers()
            h.wfile.write(self._read(item, 0, 100))
            h.wfile.flush()
            time.sleep(2)
            return
        rng = h.headers.get("Range")
        if rng and self.mode in ("range", "modelscope"):
            first_s, _, last_s = rng.removeprefix("bytes=").partition("-")
            first = int(first_s)
            last = min(int(last_s) if last_s else size - 1, size - 1)
            if first >= size:
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{size}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            h.send_response(206 if self.mode == "range" else 200)
            h.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            h.send_header("Content-Length", str(last - first + 1))
            h.end_headers()
            pos = first
            while pos <= last:
                chunk = self._read(item, pos, min(1 << 20, last - pos + 1))
                h.wfile.write(chunk)
                entry["sent"] += len(chunk)
                pos += len(chunk)
            return
        h.send_response(200)
        h.send_header("Content-Length", str(size))
        h.end_headers()
        pos = 0
        while pos < size:
            chunk = self._read(item, pos, min(1 << 20, size - pos))
            h.wfile.write(chunk)
            entry["sent"] += len(chunk)
            pos += len(chunk)
