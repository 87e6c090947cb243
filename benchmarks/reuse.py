"""Reusing a copy from another tool's store vs downloading it, on loopback (tests/fakehub.py).

    python benchmarks/reuse.py [--rounds 3] [--size-mib 1024]

One round, each in a fresh `fetch_model` call with its own QUANTPICK_HOME (own sha256 cache):
  * download      - no store holds the file: hub 302 -> CDN, sha256 while downloading.
  * reuse (cold)  - an Ollama blob (`blobs/sha256-<hex>`) holds it: hashed once, hardlinked.
  * reuse (warm)  - the same again with the sha256 cache of the previous run: no rehash.
  * hashlib alone - one sha256 pass over the file: the floor for a cold reuse.
Timed around fetch_model only (hub metadata included in every case). The file is page-cached,
so "cold" is the hashing cost (hashlib with SHA-NI), not a disk read. Reference: the download's
own cost on this loopback, where quantpick runs at curl's speed (benchmarks/download.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakehub import FakeHub, make_manifest  # noqa: E402

NAME = "model-Q4_K_M.gguf"


def make_file(path: Path, size: int) -> bytes:
    data = b"GGUF" + os.urandom(size - 4)
    path.write_bytes(data)
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size-mib", type=int, default=1024)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="quantpick-reuse-bench-"))
    os.environ.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1", NO_PROXY="127.0.0.1")
    os.environ["HF_HOME"] = str(work / "hf-home")
    os.environ["OLLAMA_MODELS"] = str(work / "ollama")
    os.environ["HOME"] = str(work / "home")
    hub = FakeHub(work / "hub").start()
    os.environ["HF_ENDPOINT"] = hub.hf_endpoint
    try:
        from quantpick.config import load_settings
        from quantpick.fetch.download import fetch_model
        from quantpick.model.manifest import Source

        src = work / NAME
        data = make_file(src, args.size_mib * 1024 * 1024)
        sha = hashlib.sha256(data).hexdigest()
        del data
        hub.add_repo("org/model", {NAME: src})
        manifest = make_manifest(
            "bench",
            {NAME: b""},
            (Source("hf", repo="org/model"),),
            checksums_file=None,
            manifest_sha={NAME: sha},
        )
        manifest = dataclasses.replace(
            manifest,
            files=tuple(
                dataclasses.replace(f, size_bytes=src.stat().st_size) for f in manifest.files
            ),
        )
        blob = work / "ollama" / "blobs" / f"sha256-{sha}"
        times: dict[str, list[float]] = {
            "download": [],
            "reuse (cold)": [],
            "reuse (warm)": [],
            "hashlib alone": [],
        }
        for r in range(args.rounds):
            for label in times:
                if label == "hashlib alone":  # the floor for a cold reuse: one sha256 pass
                    t = time.perf_counter()
                    digest = hashlib.sha256()
                    buffer = bytearray(1024 * 1024)
                    with open(src, "rb", buffering=0) as handle:
                        while n := handle.readinto(buffer):
                            digest.update(memoryview(buffer)[:n])
                    times[label].append(time.perf_counter() - t)
                    assert digest.hexdigest() == sha
                    continue
                home = work / f"qp-{r}-{'warm' if label == 'reuse (warm)' else label[:5]}"
                if label == "reuse (cold)":
                    shutil.rmtree(home, ignore_errors=True)
                os.environ["QUANTPICK_HOME"] = str(home)
                dest = work / f"out-{r}-{label[:5]}-{label[-5:-1]}"
                shutil.rmtree(dest, ignore_errors=True)
                if label == "download":
                    blob.unlink(missing_ok=True)
                else:
                    blob.parent.mkdir(parents=True, exist_ok=True)
                    if not blob.exists():
                        os.link(src, blob)
                settings = load_settings()
                t = time.perf_counter()
                report = fetch_model(manifest, "Q4_K_M", settings=settings, dest_dir=dest)
                times[label].append(time.perf_counter() - t)
                assert report.results[0].sha256 == sha
                assert (NAME in report.reused) == (label != "download"), label
                if label == "reuse (cold)":  # the warm run shares this run's sha256 cache
                    warm_home = work / f"qp-{r}-warm"
                    shutil.rmtree(warm_home, ignore_errors=True)
                    shutil.copytree(home, warm_home)
        mib = args.size_mib
        print(f"{mib} MiB file, {args.rounds} rounds, medians:")
        base = statistics.median(times["download"])
        for label, values in times.items():
            med = statistics.median(values)
            print(
                f"  {label:<14} {med:7.3f} s  {mib / med:8.0f} MiB/s  {med / base:5.2f}x download"
            )
    finally:
        hub.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
