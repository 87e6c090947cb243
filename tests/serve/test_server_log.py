"""Reading llama-server's memory lines: public CUDA logs, the pinned CPU build's own logs
(tests/data/server-logs/, re-recorded by scripts/record_server_logs.py), and hostile files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantpick.serve.server_log import (
    HEAD_BYTES,
    MAX_LINE,
    BufferKind,
    device_of,
    parse_lines,
    parse_text,
    read_log,
)

MiB = 1024**2
DATA = Path(__file__).resolve().parents[1] / "data" / "server-logs"


def _mib(text: str) -> int:
    return round(float(text) * MiB)


def test_public_cuda_log_per_device() -> None:
    # llama.cpp PR #22673: Qwen3.6-35B-A3B on one CUDA GPU at -c 131072, f16 KV.
    log = read_log(DATA / "cuda-qwen36-35b-a3b-pr22673.log")
    assert log.problems == ()
    cuda, host = log.measured()
    assert cuda.device == "CUDA0" and host.device == "CPU"
    assert cuda.weights_bytes == _mib("19201.62")
    # KV of qwen35moe: 10 attention layers x 20480 B per token (real-cuda.md), exactly
    assert cuda.kv_bytes == 131072 * 20480 == 2560 * MiB
    assert host.weights_bytes == _mib("21623.30")
    assert host.output_bytes == _mib("0.95")
    assert log.offloaded == (42, 42)
    assert (log.n_ctx, log.n_ctx_seq) == (131072, 131072)
    assert log.param("flash_attn") == "auto" and log.param("n_ubatch") == "512"


def test_public_partial_offload_log() -> None:
    # llama.cpp issue #13729: 30 of 49 layers on the GPU, the rest of the weights in host memory.
    log = read_log(DATA / "cuda-qwen3-30b-a3b-partial-issue13729.log")
    by = {d.device: d for d in log.measured()}
    assert log.offloaded == (30, 49)
    assert by["CUDA0"].weights_bytes == _mib("10750.86")
    assert by["CPU"].weights_bytes == _mib("6940.48")
    assert log.n_ctx_seq == 4096  # an older build's `n_ctx_per_seq`


def test_public_breakdown_table() -> None:
    # llama.cpp issue #23679: two RTX 4090 and an idle RPC worker.
    log = read_log(DATA / "cuda-breakdown-issue23679.log")
    rows = {r.name: r for r in log.breakdown}
    assert list(rows) == ["RPC0", "CUDA0", "CUDA1", "Host"]
    cuda0 = rows["CUDA0"]
    assert (cuda0.total_mib, cuda0.free_mib, cuda0.self_mib) == (24080, 23604, 19875)
    assert (cuda0.model_mib, cuda0.context_mib, cuda0.compute_mib) == (8445, 9932, 1497)
    assert cuda0.unaccounted_mib == -19398 and cuda0.description == "RTX 4090"
    assert rows["RPC0"].description == "mlbox.local:50052"
    host = rows["Host"]
    assert (host.self_mib, host.model_mib, host.context_mib, host.compute_mib) == (
        1505,
        515,
        0,
        990,
    )
    assert host.total_mib is None
    assert "has no model buffer lines" in log.problems[0]


@pytest.mark.parametrize(
    ("buffer", "device"),
    [
        ("CPU", "CPU"), ("CPU_Mapped", "CPU"), ("CPU_REPACK", "CPU"), ("CUDA_Host", "CPU"),
        ("Vulkan_Host", "CPU"), ("CUDA0", "CUDA0"), ("Vulkan1", "Vulkan1"), ("MTL0", "MTL0"),
        ("RPC0[127.0.0.1:50052]", "RPC0[127.0.0.1:50052]"),
    ],
)  # fmt: skip
def test_device_of(buffer: str, device: str) -> None:
    assert device_of(buffer) == device


def test_fit_projection_buffers_are_dropped() -> None:
    # llama-server --fit on first projects with no_alloc: the same lines, then common_params_fit.
    text = """\
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 4090) (0000:01:00.0) - 23604 MiB free
load_tensors:        CUDA0 model buffer size = 99999.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =  9999.00 MiB
common_memory_breakdown_print: |   - CUDA0 (RTX 4090)         | 24080 = 23604 + (19875 =  8445 +    9932 +    1497) +      -19398 |
common_params_fit_impl: projected memory use with initial parameters [MiB]:
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 4090) (0000:01:00.0) - 23604 MiB free
load_tensors:        CUDA0 model buffer size =  1000.00 MiB
llama_kv_cache:      CUDA0 KV buffer size =   100.00 MiB
sched_reserve:      CUDA0 compute buffer size =   300.50 MiB
sched_reserve:  CUDA_Host compute buffer size =    12.01 MiB
"""  # noqa: E501
    log = parse_text(text)
    assert log.dropped_projection
    assert log.breakdown == ()
    cuda, host = log.measured()
    assert (cuda.weights_bytes, cuda.kv_bytes, cuda.compute_bytes) == (
        1000 * MiB, 100 * MiB, _mib("300.50"))  # fmt: skip
    assert host.compute_bytes == _mib("12.01")
    assert [d.name for d in log.devices] == ["CUDA0"] and log.devices[0].free_mib == 23604


def test_prefixes_and_colours_are_ignored() -> None:
    text = (
        "\x1b[34m1.14.610.021\x1b[0m \x1b[32mI \x1b[0mllama_kv_cache:      CUDA0 KV buffer size "
        "=   182.75 MiB\n[53871] 0.09.036.819 I llama_memory_recurrent:      CUDA1 RS buffer "
        "size =   124.69 MiB\n"
    )
    log = parse_text(text)
    assert [(b.kind, b.buffer, b.bytes) for b in log.buffers] == [
        (BufferKind.KV, "CUDA0", _mib("182.75")),
        (BufferKind.RECURRENT, "CUDA1", _mib("124.69")),
    ]


def test_truncated_log_reads_whole_lines_only(tmp_path: Path) -> None:
    log_file = tmp_path / "cut.log"
    log_file.write_bytes(
        b"load_tensors:          CPU model buffer size =    10.00 MiB\n"
        b"llama_kv_cache:        CPU KV buffer size =  1920.5"  # cut mid-number, no newline
    )
    log = read_log(log_file)
    assert [b.kind for b in log.buffers] == [BufferKind.MODEL]


def test_enormous_log_is_read_bounded(tmp_path: Path) -> None:
    log_file = tmp_path / "big.log"
    head = b"load_tensors:          CPU model buffer size =    10.00 MiB\n"
    tail = (
        b"common_memory_breakdown_print: |   - Host                     |"
        b"                   1505 =   515 +       0 +     990                |\n"
    )
    with log_file.open("wb") as f:
        f.write(head)
        f.truncate(64 * HEAD_BYTES)  # 512 MiB of NULs, sparse: a week of request lines
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + tail)  # the request lines before it end in newlines too
    log = read_log(log_file)
    assert [b.bytes for b in log.buffers] == [10 * MiB]
    assert [r.name for r in log.breakdown] == ["Host"]
    assert "read its first 8 MiB" in log.problems[0]


def test_fifo_is_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "server.log"
    os.mkfifo(fifo)
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(read_log(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert result, "read_log blocked on a FIFO"
    assert "not a regular file" in result[0].problems[0]  # type: ignore[attr-defined]


def test_missing_log_is_a_problem_not_an_exception(tmp_path: Path) -> None:
    log = read_log(tmp_path / "nope.log")
    assert log.buffers == () and "cannot read the log" in log.problems[0]


def test_overlong_lines_are_skipped() -> None:
    line = "x" * MAX_LINE + " load_tensors:          CPU model buffer size =    10.00 MiB"
    assert parse_lines([line]).buffers == ()


@settings(deadline=None)  # a shared machine: no timing in tests
@given(st.lists(st.text(max_size=200), max_size=30))
def test_any_text_parses_without_error(lines: list[str]) -> None:
    log = parse_lines(lines)
    assert all(b.bytes >= 0 for b in log.buffers)


def test_pinned_cpu_build_serving_the_tiny_model() -> None:
    # `quantpick serve --gguf tiny -c 4096 --cpu-only` (scripts/record_server_logs.py), -lv 4
    log = read_log(DATA / "cpu-tiny-serve.log")
    assert log.problems == () and not log.dropped_projection
    (host,) = log.measured()
    assert host.device == "CPU"
    assert (host.weights_bytes, host.kv_bytes) == (_mib("16.43"), 4 * MiB)
    assert (host.recurrent_bytes, host.compute_bytes) == (_mib("0.22"), _mib("11.02"))
    assert (log.n_ctx, log.n_ctx_seq, log.offloaded) == (4096, 4096, (0, 9))
    assert log.build == (11312, "0c1e57098")
    # the table llama-server prints when it stops
    assert [(r.name, r.model_mib, r.context_mib) for r in log.breakdown] == [("Host", 16, 4)]


def test_pinned_cpu_build_fit_projection_then_load() -> None:
    # started by hand with -c 1024: --fit on (the default) projects first, then loads
    log = read_log(DATA / "cpu-tiny-c1024.log")
    assert log.dropped_projection
    (host,) = log.measured()
    assert (host.kv_bytes, host.recurrent_bytes) == (1 * MiB, _mib("0.89"))
    assert (log.n_ctx, log.n_ctx_seq, log.param("n_seq_max")) == (1024, 1024, "4")
    # only the table printed at exit is kept, not the projection's
    assert len(log.breakdown) == 1
