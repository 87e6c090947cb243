#!/usr/bin/env python3
"""Record llama.cpp's own per-device memory projection for a grid of configurations.

Writes tests/data/llamacpp-fit-extra.json, which tests/plan/test_memory.py checks the memory model
against (weights and KV+recurrent state exact, in MiB floored as llama.cpp prints them). With
--fit-params-fixtures it writes instead the raw llama-fit-params outputs the confirm tests feed
through a fake binary (tests/data/llama-fit-params-*.txt), asked with exactly the flags quantpick
sends (quantpick.serve.fitparams.fit_params_argv).

Needs a llama.cpp build with llama-fit-params and ggml-rpc-server (two RPC workers on 127.0.0.1
stand in for two GPUs, as in tests/data/llamacpp-fit-q4_k_m.json):

    scripts/record_conformance.py --bin /path/to/llama.cpp/build/bin [--out FILE]
    scripts/record_conformance.py --bin /path/to/llama.cpp/build/bin --fit-params-fixtures

The models are header-only sparse GGUFs written by tests/conformance_model.py (no disk used).
The output is parsed by the product's own parser (quantpick.serve.fitparams.parse_output).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "tests"))

from conformance_model import write_grid_models  # noqa: E402

from quantpick.serve.fitparams import parse_output, run_fit_params  # noqa: E402

# (model key, args) -- model keys: q4km (llama.cpp's Q4_K_M mix, with MTP), bf16, q8_0 (uniform
# types, with MTP), q4km-nomtp (40 blocks).
GRID: list[tuple[str, list[str]]] = [
    ("q4km", ["-c", "10000", "-np", "3", "-ngl", "99", "-ts", "24,16"]),
    (
        "q4km",
        ["-c", "65536", "-np", "2", "-ngl", "99", "-ts", "3,1", "-ctk", "q8_0", "-ctv", "f16"],
    ),
    (
        "q4km",
        ["-c", "131072", "-np", "1", "-ngl", "99", "-ts", "1,1", "-ctk", "q4_0", "-ctv", "q4_0"],
    ),
    ("q4km", ["-c", "65536", "-np", "4", "-ngl", "20", "-ts", "24,16"]),
    ("q4km", ["-c", "32768", "-np", "1", "-ngl", "1", "-ts", "24,16"]),
    ("q4km", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16", "--n-cpu-moe", "25"]),
    ("q4km", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16", "--cpu-moe"]),
    (
        "q4km",
        [
            "-c",
            "32768",
            "-np",
            "1",
            "-ngl",
            "99",
            "-ts",
            "24,16",
            "-ot",
            r"blk\.(1[0-9]|2[0-9])\.ffn_(up|down|gate)_exps=CPU",
        ],
    ),
    ("q4km", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16", "-nkvo"]),
    (
        "q4km",
        ["-c", "49152", "-np", "2", "-ngl", "99", "-ts", "30,12", "-ctk", "q5_1", "-ctv", "q5_0"],
    ),
    (
        "q4km",
        ["-c", "262144", "-np", "8", "-ngl", "99", "-ts", "24,16", "-ctk", "f32", "-ctv", "f32"],
    ),
    (
        "q4km",
        ["-c", "16384", "-np", "1", "-ngl", "99", "-ts", "24,16", "-ub", "2048", "-b", "2048"],
    ),
    (
        "q4km",
        ["-c", "8192", "-np", "1", "-ngl", "99", "-ts", "24,16", "-ctk", "iq4_nl", "-ctv", "q4_1"],
    ),
    ("q4km", ["-c", "100000", "-np", "4", "-dev", "none"]),
    ("bf16", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "1,1", "--n-cpu-moe", "30"]),
    ("bf16", ["-c", "65536", "-np", "2", "-dev", "none"]),
    (
        "q8_0",
        [
            "-c",
            "131072",
            "-np",
            "1",
            "-ngl",
            "99",
            "-ts",
            "24,16",
            "--n-cpu-moe",
            "12",
            "-ctk",
            "q8_0",
            "-ctv",
            "q8_0",
        ],
    ),
    ("q8_0", ["-c", "4096", "-np", "1", "-ngl", "30", "-ts", "2,1"]),
    ("q4km-nomtp", ["-c", "32768", "-np", "1", "-ngl", "99", "-ts", "24,16"]),
    (
        "q4km-nomtp",
        ["-c", "262144", "-np", "4", "-ngl", "41", "-ts", "24,16", "-ctk", "q8_0", "-ctv", "q8_0"],
    ),
    ("q4km-nomtp", ["-c", "65536", "-np", "1", "-ngl", "99", "-ts", "24,16", "--n-cpu-moe", "8"]),
]


def write_models(tmp: Path) -> dict[str, Path]:
    return {key: path for key, (path, _) in write_grid_models(tmp).items()}


def mib_table(text: str) -> dict[str, dict[str, int | None]]:
    """llama-fit-params' output as {device: {model, context, compute}} (MiB as printed). The host's
    model is left out (None): llama-fit-params loads without mmap, llama-server maps the file."""
    projection = parse_output(text)
    return {
        d.name: {
            "model": None if d.is_host else d.model_mib,
            "context": d.context_mib,
            "compute": d.compute_mib,
        }
        for d in projection.devices
    }


RPC_PORTS = (50062, 50063)


@contextmanager
def rpc_workers(bin_dir: Path, ports: tuple[int, ...] = RPC_PORTS) -> Iterator[None]:
    """Two ggml-rpc-server workers on 127.0.0.1: the "GPUs" of the two-device cases. Their address
    space is capped (3 GB): llama-fit-params allocates nothing on them, and a run that would load
    weights for real (llama-server) fails instead of filling the host's RAM."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 1024**3, 3 * 1024**3))

    workers = [
        subprocess.Popen(
            [str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=cap,
        )
        for port in ports
    ]
    deadline = time.monotonic() + 10
    for port in ports:
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
    try:
        yield
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait()


def fit_params(
    bin_dir: Path, model: Path, args: list[str], ports: tuple[int, ...] = RPC_PORTS
) -> tuple[dict[str, dict[str, int | None]], str]:
    """llama.cpp's projection for `args` (-fa on, printed, not fitted): (MiB per device, error)."""
    from quantpick.serve.fitparams import FitParamsError

    cmd = [str(bin_dir / "llama-fit-params"), "-m", str(model), "-fa", "on", "-fitp", "on",
           "-fit", "off", "--log-jsonl", *args]  # fmt: skip
    if "-dev" not in args:
        cmd += ["--rpc", ",".join(f"127.0.0.1:{p}" for p in ports)]
    try:
        run = run_fit_params(cmd, {}, timeout_s=120)
    except FitParamsError as exc:
        return {}, exc.message
    return mib_table(run.stdout), ""


# ---- raw outputs for the confirm tests (tests/data/llama-fit-params-*.txt) --------------------

# name -> (model key, RunConfig keyword arguments, with the RPC "GPUs"?, with --log-jsonl?)
FIXTURES: dict[str, tuple[str, dict, bool, bool]] = {
    "tiny-host": ("tiny", {"ctx_size": 4096, "devices": ()}, False, True),
    "tiny-host-table": ("tiny", {"ctx_size": 4096, "devices": ()}, False, False),
    # RPC0 holds 41 of 42 slots at 262144: over its budget by llama.cpp's own free memory
    "q4km-rpc-41-1": ("q4km", {"ctx_size": 262144, "tensor_split": (41.0, 1.0)}, True, True),
    "q4km-rpc-30-12": ("q4km", {"ctx_size": 262144, "tensor_split": (30.0, 12.0)}, True, True),
    # host only: llama-fit-params lists the repacked weights (CPU_REPACK) outside "Host"
    "q4km-host": ("q4km", {"ctx_size": 8192, "devices": ()}, False, True),
    # four slots sharing one pool: llama-fit-params has no -kvu (an adjustment)
    "q4km-rpc-np4-kvu": (
        "q4km",
        {"ctx_size": 65536, "n_parallel": 4, "kv_unified": True, "tensor_split": (24.0, 18.0)},
        True,
        True,
    ),
}


def record_fixtures(bin_dir: Path, tmp: Path, version: str) -> None:
    from datetime import date

    from tiny_model import write_tiny_model

    from quantpick.plan.memory import RunConfig
    from quantpick.serve.fitparams import fit_params_argv

    models = write_models(tmp)
    tiny = tmp / "tiny.gguf"
    write_tiny_model(tiny)
    paths = {"tiny": (tiny, 8), "q4km": (models["q4km"], 41)}  # (file, block_count)
    rpc = ("--rpc", ",".join(f"127.0.0.1:{p}" for p in RPC_PORTS))
    with rpc_workers(bin_dir):
        for name, (key, kwargs, with_rpc, jsonl) in FIXTURES.items():
            model, block_count = paths[key]
            argv, env = fit_params_argv(
                bin_dir / "llama-fit-params",
                RunConfig(**kwargs),
                model,
                block_count,
                extra_args=rpc if with_rpc else (),
            )
            if not jsonl:
                argv.remove("--log-jsonl")
            run = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=None)
            if run.returncode != 0:
                print(f"FAILED {name}: {run.stderr[-2000:]}", file=sys.stderr)
                continue
            flags = " ".join(a for a in argv[1:] if not a.startswith(str(tmp)))
            header = (
                f"# Recorded: stdout of llama-fit-params, {version} (CPU + RPC build of "
                f"scripts/build-llamacpp.sh), {date.today().isoformat()}.\n"
                f"# Model: {key} ({model.name}); flags: {flags}\n"
            )
            out = DATA / f"llama-fit-params-{name}.txt"
            out.write_text(header + run.stdout)
            print("wrote", out.relative_to(ROOT))
        # Its flags (the tests check every flag quantpick passes is one it accepts).
        run = subprocess.run([str(bin_dir / "llama-fit-params"), "--help"], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        out = DATA / "llama-fit-params-help.txt"
        out.write_text(
            f"# Recorded: llama-fit-params --help (stdout+stderr), {version}, "
            f"{date.today().isoformat()}.\n" + run.stdout + run.stderr
        )
        print("wrote", out.relative_to(ROOT))
        # llama-bench -o json on the tiny model, with the flags quantpick's bench passes.
        from quantpick.serve.bench import BenchSettings, bench_argv

        settings = BenchSettings(n_prompt=32, n_gen=8, depth=64, reps=1)
        argv, env = bench_argv(
            bin_dir / "llama-bench", RunConfig(ctx_size=4096, devices=()), tiny, 8, settings
        )
        run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        out = DATA / "llama-bench-tiny.txt"
        flags = " ".join(a for a in argv[1:] if not a.startswith(str(tmp)))
        out.write_text(
            f"# Recorded: stdout of llama-bench, {version}, {date.today().isoformat()}, on a "
            "shared 2-core machine (speeds are not a reference).\n"
            f"# Model: tiny ({tiny.name}); flags: {flags}\n" + run.stdout
        )
        print("wrote", out.relative_to(ROOT))
        # A failing run: a file that is not there.
        argv, _ = fit_params_argv(
            bin_dir / "llama-fit-params", RunConfig(ctx_size=4096, devices=()), tmp / "gone.gguf", 8
        )
        run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        out = DATA / "llama-fit-params-missing-model.txt"
        out.write_text(
            f"# Recorded: stderr of llama-fit-params for a missing model file, {version}, "
            f"{date.today().isoformat()}; exit code {run.returncode}.\n" + run.stderr
        )
        print("wrote", out.relative_to(ROOT))


# ---- what llama-server's n_outputs_max cap saves (plan/confirm.py LOGITS_LIVE_BYTES_PER_ROW) ---

SAVING_GRID: list[list[str]] = [
    ["-c", "8192", "-np", "4", "-ngl", "99", "-ts", "24,16", "-ub", "512", "-fa", "on"],
    ["-c", "8192", "-np", "4", "-ngl", "99", "-ts", "24,16", "-ub", "2048", "-fa", "on"],
    ["-c", "65536", "-np", "1", "-ngl", "99", "-ts", "24,16", "-ub", "1024", "-b", "2048",
     "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"],
    ["-c", "32768", "-np", "2", "-ngl", "99", "-ts", "24,16", "-ub", "512", "-fa", "on",
     "--n-cpu-moe", "10"],
    ["-c", "16384", "-np", "1", "-ngl", "99", "-ts", "1,1", "-ub", "256", "-b", "256", "-fa", "on"],
]  # fmt: skip


def server_projection(bin_dir: Path, model: Path, args: list[str]) -> dict[str, int]:
    """llama-server's own fit projection (`--fit on --log-jsonl`: the fit_memory_breakdown record
    of its first measurement, made with its n_outputs_max cap). The server is stopped as soon as
    the record is out; the capped RPC workers make a real load fail anyway."""
    rpc = ",".join(f"127.0.0.1:{p}" for p in RPC_PORTS)
    proc = subprocess.Popen(
        [str(bin_dir / "llama-server"), "-m", str(model), *args, "--rpc", rpc, "--fit", "on",
         "--log-jsonl", "--no-warmup", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"fit_memory_breakdown"' in line:
                return {d.name: d.compute_mib for d in parse_output(line).devices}
        return {}
    finally:
        proc.kill()
        proc.wait()


def record_saving(bin_dir: Path, tmp: Path, version: str) -> None:
    from datetime import date

    models = write_models(tmp)
    cases = []
    with rpc_workers(bin_dir):
        for args in SAVING_GRID:
            fit, err = fit_params(bin_dir, models["q4km"], args)
            server = server_projection(bin_dir, models["q4km"], args)
            if not fit or not server:
                print(f"FAILED {' '.join(args)} {err}", file=sys.stderr)
                continue
            compute = {k: {"llama_fit_params": v["compute"], "llama_server": server.get(k)}
                       for k, v in fit.items()}  # fmt: skip
            cases.append({"llama_cpp_args": args, "compute_mib": compute})
            print(" ".join(args), json.dumps(compute))
    out = DATA / "llama-server-logits-saving.json"
    out.write_text(
        json.dumps(
            {
                "source": "compute MiB per device: llama-fit-params --fit-print on vs "
                f"llama-server --fit on --log-jsonl (its fit_memory_breakdown record), {version}, "
                f"{date.today().isoformat()}",
                "model": "q4km: llama.cpp Q4_K_M tensor types, 41 blocks (vocab 248320)",
                "devices_note": "RPC0/RPC1: two RPC workers on 127.0.0.1; RPC1 holds the output "
                "layer. MiB floored.",
                "cases": cases,
            },
            indent=1,
        )
        + "\n"
    )
    print("wrote", out.relative_to(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp build/bin")
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/llamacpp-fit-extra.json")
    ap.add_argument("--tmp", type=Path, default=Path("/tmp/quantpick-conformance"))
    ap.add_argument(
        "--fit-params-fixtures",
        action="store_true",
        help="write tests/data/llama-fit-params-*.txt (the confirm tests' recordings)",
    )
    ap.add_argument(
        "--server-saving",
        action="store_true",
        help="write tests/data/llama-server-logits-saving.json (llama-server vs llama-fit-params)",
    )
    args = ap.parse_args()
    args.tmp.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(
        [str(args.bin / "llama-server"), "--version"], capture_output=True, text=True
    ).stderr.splitlines()[0]
    if args.fit_params_fixtures:
        record_fixtures(args.bin, args.tmp, version)
        return
    if args.server_saving:
        record_saving(args.bin, args.tmp, version)
        return
    models = write_models(args.tmp)
    cases = []
    with rpc_workers(args.bin):
        for key, extra in GRID:
            mib, stderr = fit_params(args.bin, models[key], extra)
            if not mib:
                print(f"FAILED {key} {' '.join(extra)}\n{stderr[-2000:]}", file=sys.stderr)
                continue
            cases.append({"model": key, "llama_cpp_args": extra, "mib": mib})
            print(key, " ".join(extra), json.dumps(mib))
    args.out.write_text(
        json.dumps(
            {
                "source": f"llama-fit-params --fit-print on -fit off -fa on ({version})",
                "models": {
                    "q4km": "llama.cpp Q4_K_M tensor types (q4_k_m-tensor-types.tsv), 41 blocks",
                    "bf16": "every matrix BF16, 41 blocks",
                    "q8_0": "every matrix Q8_0, 41 blocks",
                    "q4km-nomtp": "Q4_K_M types without the MTP block (40 blocks)",
                },
                "devices_note": "RPC0/RPC1: two llama.cpp RPC workers on 127.0.0.1 stand in for "
                "two GPUs (free memory = host RAM). MiB floored. Compute: the CPU backend's.",
                "cases": cases,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
