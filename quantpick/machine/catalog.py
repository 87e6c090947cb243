"""Built-in table of common GPUs (NVIDIA, AMD, Apple, Intel; discrete and unified), for describing
a machine with `--gpu NAME`. Pure data: the NVIDIA cards are the table data/nvidia.csv, the others
are written out below.

Figures are stored the way NVML reports them, so a described card and a probed card of the same
model give the same numbers:

* `total_bytes` is the marketing size in GiB (a "24 GB" RTX 3090 is 24 GiB = 25,769,803,776 B,
  which is what `nvmlDeviceGetMemoryInfo(h).total` reports, give or take a few MiB).
* `memory_clock_mhz` is NVML's max memory clock (`nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_MEM)`),
  i.e. half the data rate of GDDR ("19.5 Gbps" GDDR6X -> 9751 MHz) and the HBM clock for HBM.
  `bandwidth_bytes_per_s` is then the same formula the probe uses and matches the data sheets.

A described GPU has free = total: the driver's own reservation (a few hundred MiB, varying with
driver and card) is not guessed here; the planner's per-device overhead accounts for it.

Usage:
    lookup_gpu("3090").bandwidth_bytes_per_s  # 936_096_000_000
    lookup_gpu("tesla-t4").name               # "Tesla T4"
    find_gpu("NVIDIA GeForce RTX 3080", total_bytes=12 * 1024**3).key  # "3080-12g"
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from quantpick.errors import UsageError
from quantpick.machine.backends import Vendor
from quantpick.machine.spec import (
    ASSUMED_GPU_BANDWIDTH_BYTES_PER_S,
    ASSUMED_GPU_FP16_TFLOPS,
    Gpu,
)

_GiB = 1024**3


def theoretical_bandwidth(memory_clock_mhz: int, bus_width_bits: int) -> int:
    """Peak memory bandwidth in bytes/s: 2 transfers per clock x clock x bus width / 8.

    NVML's memory clock is half the effective data rate, hence the factor 2 (RTX 3090: 384 bit x
    9751 MHz -> 936 GB/s; T4: 256 bit x 5001 MHz -> 320 GB/s).
    """
    return 2 * memory_clock_mhz * 1_000_000 * bus_width_bits // 8


@dataclass(frozen=True)
class GpuModel:
    key: str  # the short name shown in help and errors: "3090", "t4", "a100-80g"
    name: str  # as NVML names the card
    aliases: tuple[str, ...]
    total_bytes: int
    bus_width_bits: int
    memory_clock_mhz: int
    compute_capability: str
    pcie_generation: int | None = None
    pcie_width: int | None = None
    # Dense FP16 tensor-core TFLOPS with FP16 accumulate, i.e. half the dense INT8 rate that
    # llama.cpp's quantized matmul kernels (MMQ) run at; for cards without tensor cores (Pascal),
    # half their dp4a INT8 rate. Prefill is compute-bound on this figure.
    fp16_tflops: float | None = None
    vendor: Vendor = Vendor.NVIDIA
    # True: the GPU's memory is the machine's RAM (Apple Silicon, Strix Halo, GB10, Jetson);
    # total_bytes is then the default RAM of the model, and the GPU gets the OS's share of it
    # (unified_share).
    unified: bool = False
    # The data sheet's bandwidth where it is not 2 x clock x bus / 8 (Apple states GB/s).
    sheet_bandwidth: int | None = None

    @property
    def bandwidth_bytes_per_s(self) -> int:
        if self.sheet_bandwidth is not None:
            return self.sheet_bandwidth
        return theoretical_bandwidth(self.memory_clock_mhz, self.bus_width_bits)


def _g(n: int) -> int:
    return n * _GiB


def _card(
    key: str,
    name: str,
    gib: int,
    bus_bits: int,
    clock_mhz: int,
    cc: str,
    pcie: tuple[int, int] | None,
    tflops: float,
    *aliases: str,
) -> GpuModel:
    return GpuModel(
        key, name, aliases, _g(gib), bus_bits, clock_mhz, cc,
        pcie[0] if pcie else None, pcie[1] if pcie else None, tflops,
    )  # fmt: skip


def _nvidia_cards() -> tuple[GpuModel, ...]:
    """The rows of data/nvidia.csv (its header names the columns; `#` lines are comments)."""
    text = (Path(__file__).parent / "data" / "nvidia.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return tuple(
        _card(
            r["key"],
            r["name"],
            int(r["gib"]),
            int(r["bus_bits"]),
            int(r["clock_mhz"]),
            r["compute_capability"],
            (int(r["pcie_generation"]), int(r["pcie_lanes"])),
            float(r["fp16_tflops"]),
            *r["aliases"].split(),
        )  # fmt: skip
        for r in rows
    )


# The NVIDIA cards: machine/data/nvidia.csv (a table, with its sources per column and row).
CATALOG: tuple[GpuModel, ...] = (
    *_nvidia_cards(),
    # DGX Spark's GB10: 128 GB LPDDR5x (256 bit, 8533 MT/s = 273 GB/s) shared with the CPU, no
    # PCIe hop; "1 PFLOP" FP4 sparse / 8.
    dataclasses.replace(
        _card("gb10", "NVIDIA GB10", 128, 256, 4266, "12.1", None, 125.0, "dgx-spark"),
        unified=True,
    ),
    # Jetson AGX Orin 64GB: 64 GB LPDDR5 (256 bit, 6400 MT/s = 204.8 GB/s) shared with the CPU;
    # 275 INT8 TOPS sparse (Jetson AGX Orin data sheet) / 4 = 68.75 dense FP16.
    dataclasses.replace(
        _card("orin", "Orin", 64, 256, 3200, "8.7", None, 68.75, "jetson-agx-orin", "agx-orin"),
        unified=True,
    ),
    *(
        GpuModel(
            key, name, aliases, _g(gib), bus, clock, "", pcie[0], pcie[1], tflops, Vendor.AMD
        )  # fmt: skip
        for key, name, gib, bus, clock, pcie, tflops, aliases in (
            # AMD product pages (amd.com/en/products/graphics/desktops/radeon): memory, bus
            # width, effective memory speed (stored as half, as NVML's clock), PCIe; FP16 is the
            # page's "Peak Half Precision (FP16) Performance" / 2 (the page counts RDNA3's dual
            # issue; WMMA's dense rate is half of it).
            (
                "7900xtx",
                "AMD Radeon RX 7900 XTX",
                24,
                384,
                10000,
                (4, 16),
                61.4,
                ("rx-7900-xtx", "7900-xtx"),
            ),
            (
                "7900xt",
                "AMD Radeon RX 7900 XT",
                20,
                320,
                10000,
                (4, 16),
                51.5,
                ("rx-7900-xt", "7900-xt"),
            ),
            (
                "7800xt",
                "AMD Radeon RX 7800 XT",
                16,
                256,
                9750,
                (4, 16),
                37.3,
                ("rx-7800-xt", "7800-xt"),
            ),
            # RDNA4: the page's FP16 figure is with sparsity; dense is half.
            (
                "9070xt",
                "AMD Radeon RX 9070 XT",
                16,
                256,
                10000,
                (5, 16),
                97.3,
                ("rx-9070-xt", "9070-xt"),
            ),
            (
                "r9700",
                "AMD Radeon AI PRO R9700",
                32,
                256,
                10000,
                (5, 16),
                95.7,
                ("radeon-ai-pro-r9700", "ai-pro-r9700"),
            ),
            ("mi100", "AMD Instinct MI100", 32, 4096, 1200, (4, 16), 184.6, ("instinct-mi100",)),
        )
    ),
    # Strix Halo (Ryzen AI Max+ 395, Radeon 8060S): 256-bit LPDDR5X-8000 = 256 GB/s shared with
    # the CPU (AMD product page); 40 CUs x 512 FP16 ops/clock x 2.9 GHz = 59.4 TFLOPS (WMMA,
    # RDNA 3.5); 32-128 GB. Default: the 128 GB machine.
    GpuModel(
        "strix-halo",
        "AMD Radeon 8060S Graphics",
        ("ryzen-ai-max", "ryzen-ai-max-395", "8060s", "radeon-8060s", "gfx1151"),
        _g(128),
        256,
        4000,
        "",
        None,
        None,
        59.4,
        Vendor.AMD,
        unified=True,
    ),  # fmt: skip
    *(
        GpuModel(
            key, name, aliases, _g(gib), bus, clock, "", pcie[0], pcie[1], tflops, Vendor.INTEL
        )  # fmt: skip
        for key, name, gib, bus, clock, pcie, tflops, aliases in (
            # Intel Arc product pages (intel.com ark): memory, bus, speed, PCIe; FP16 is the
            # page's XMX INT8 TOPS / 2 (B580: 233 TOPS; A770: 276 TOPS; B70: 367 TOPS; B60: 197
            # TOPS, 24 GB GDDR6 at 19 Gbps on 192 bits = 456 GB/s, PCIe 5.0 x8).
            ("arc-b580", "Intel(R) Arc(TM) B580 Graphics", 12, 192, 9500, (4, 8), 116.5, ("b580",)),
            (
                "arc-pro-b60",
                "Intel(R) Arc(TM) Pro B60 Graphics",
                24,
                192,
                9500,
                (5, 8),
                98.5,
                ("b60", "arc-b60"),
            ),
            (
                "arc-a770",
                "Intel(R) Arc(TM) A770 Graphics",
                16,
                256,
                8750,
                (4, 16),
                138.0,
                ("a770",),
            ),
            (
                "arc-pro-b70",
                "Intel(R) Arc(TM) Pro B70 Graphics",
                32,
                256,
                9500,
                (5, 16),
                183.5,
                ("b70", "arc-b70"),
            ),
        )
    ),
    # Lunar Lake's Arc 140V (Core Ultra 200V, Xe2, "Intel(R) Graphics (LNL)" to Vulkan): every
    # 200V part carries on-package LPDDR5X-8533 on 128 bits = 136.5 GB/s shared with the CPU
    # (intel.com ark, Core Ultra 7 258V); FP16 is the GPU's 67 INT8 TOPS / 2 (Intel's Lunar Lake
    # platform brief; the 130V of the Core Ultra 5 parts: 53). 16 or 32 GB; default 32.
    GpuModel(
        "arc-140v",
        "Intel(R) Arc(TM) 140V GPU",
        ("lunar-lake", "lnl", "intel-graphics-lnl", "140v"),
        _g(32),
        128,
        4266,
        "",
        None,
        None,
        33.5,
        Vendor.INTEL,
        unified=True,
    ),  # fmt: skip
    # Panther Lake's Arc B390 (Core Ultra X9 388H / X7 358H, 12 Xe3 cores, "Intel(R) Arc(TM)
    # B390 GPU" to Vulkan): LPDDR5X up to 9600 MT/s on 128 bits = 153.6 GB/s shared with the CPU
    # (intel.com ark, Core Ultra X9 388H; laptops with 8533 MT/s memory have 136.5 GB/s); FP16 is
    # the GPU's 120 INT8 TOPS / 2 (Intel's Panther Lake platform figures: NPU 50, GPU 120). Default
    # 32 GB.
    GpuModel(
        "arc-b390",
        "Intel(R) Arc(TM) B390 GPU",
        ("panther-lake", "ptl", "b390"),
        _g(32),
        128,
        4800,
        "",
        None,
        None,
        60.0,
        Vendor.INTEL,
        unified=True,
    ),  # fmt: skip
    *(
        # Apple Silicon: memory bandwidth and memory sizes from Apple's tech specs pages (GB/s
        # as stated); FP16 = FP32 rate on Apple GPUs: GPU cores x 128 ALUs x 2 x clock (M1 Max
        # 32-core: 10.4 TFLOPS as Apple states). total_bytes: the largest memory offered.
        GpuModel(
            key,
            name,
            aliases,
            _g(gib),
            bus,
            0,
            "",
            None,
            None,
            tflops,
            Vendor.APPLE,
            unified=True,
            sheet_bandwidth=int(gbs * 10**9),
        )  # fmt: skip
        for key, name, gib, bus, gbs, tflops, aliases in (
            ("m1", "Apple M1", 16, 128, 68.25, 2.6, ()),
            ("m1-pro", "Apple M1 Pro", 32, 256, 200, 5.2, ()),
            ("m1-max", "Apple M1 Max", 64, 512, 400, 10.4, ()),
            ("m1-ultra", "Apple M1 Ultra", 128, 1024, 800, 20.8, ()),
            ("m2", "Apple M2", 24, 128, 100, 3.6, ()),
            ("m2-pro", "Apple M2 Pro", 32, 256, 200, 6.8, ()),
            ("m2-max", "Apple M2 Max", 96, 512, 400, 13.6, ()),
            ("m2-ultra", "Apple M2 Ultra", 192, 1024, 800, 27.2, ()),
            ("m3", "Apple M3", 24, 128, 100, 4.1, ()),
            ("m3-pro", "Apple M3 Pro", 36, 192, 150, 7.4, ()),
            ("m3-max", "Apple M3 Max", 128, 512, 400, 16.4, ()),
            ("m3-ultra", "Apple M3 Ultra", 512, 1024, 819, 32.8, ()),
            ("m4", "Apple M4", 32, 128, 120, 4.3, ()),
            ("m4-pro", "Apple M4 Pro", 64, 256, 273, 9.2, ()),
            ("m4-max", "Apple M4 Max", 128, 512, 546, 18.4, ()),
        )
    ),
)


def unified_share(model: GpuModel, ram_bytes: int) -> tuple[int, str]:
    """The part of a unified machine's RAM the GPU may hold by default, and the rule's source.

    Apple: Metal's recommendedMaxWorkingSetSize, which llama.cpp's MTL0 reports as total and free.
    Recorded logs give 2/3 of RAM up to 32 GiB and 3/4 above: 16 GiB -> 11453.25 MB, 32 GiB ->
    22906.50 MB, 36 GiB -> 28991.03 MB, 64 GiB -> 51539.61 MB, 128 GiB -> 103079.22 MB
    (ggml_metal_init lines in public llama.cpp logs; docs/backends.md). `sysctl
    iogpu.wired_limit_mb` raises or lowers it (the probe reads it).
    AMD APUs on Linux: the GTT pool, which TTM caps at half of RAM unless amdgpu.gttsize and
    ttm.pages_limit are raised (drivers/gpu/drm/ttm/ttm_tt.c ttm_tt_mgr_init: totalram / 2).
    NVIDIA GB10/Jetson: CUDA's total is the RAM and its free the host's MemAvailable
    (ggml_backend_cuda_get_available_uma_memory): the whole pool.
    """
    if model.vendor is Vendor.APPLE:
        share = ram_bytes * 2 // 3 if ram_bytes <= 32 * _GiB else ram_bytes * 3 // 4
        return share, "Metal's working set: 2/3 of RAM up to 32 GiB, 3/4 above"
    if model.vendor is Vendor.AMD:
        return ram_bytes // 2, "Linux's GTT limit: half of RAM (TTM default)"
    return ram_bytes, "the NVIDIA driver on unified memory: the whole pool"


# Words that never distinguish two cards: vendor, brand and series names.
_NOISE = re.compile(r"nvidia|geforce|tesla|quadro|rtx|amd|radeon|rx|intel|apple")
# "80GB", "80 GiB", "80g" -> "80g" so that memory suffixes compare equal however they are written.
_MEM_SUFFIX = re.compile(r"(\d+)\s*(?:gib|gb|g)\b")


def normalize_gpu_name(text: str) -> str:
    """'NVIDIA GeForce RTX 3090' / 'rtx-3090' / '3090' -> '3090'; 'A100 80GB' -> 'a10080g'."""
    s = _MEM_SUFFIX.sub(r"\1g", text.strip().lower())
    s = re.sub(r"[^a-z0-9]", "", s)
    return _NOISE.sub("", s)


@functools.cache
def _index() -> dict[str, tuple[GpuModel, ...]]:
    """Normalized name -> the entries it names (an NVML name can cover two memory sizes)."""
    table: dict[str, list[GpuModel]] = {}
    for model in CATALOG:
        for alias in (model.key, model.name, *model.aliases):
            entries = table.setdefault(normalize_gpu_name(alias), [])
            if model not in entries:
                entries.append(model)
    return {k: tuple(v) for k, v in table.items()}


def find_gpu(name: str, total_bytes: int | None = None) -> GpuModel | None:
    """The catalog entry for a forgiving name, or None.

    A name shared by several memory sizes ("NVIDIA GeForce RTX 3080": 10 or 12 GB) gives the
    first listed, or with `total_bytes` (what NVML reports) the size closest to it.
    """
    key = normalize_gpu_name(name)
    if not key:
        return None
    if key in _index():
        entries = _index()[key]
        if total_bytes is None or len(entries) == 1:
            return entries[0]
        return min(entries, key=lambda m: abs(m.total_bytes - total_bytes))
    # "3090-24g": accept a trailing memory size that agrees with the catalog entry. Names are
    # digits too, so try every split point ("309024g" -> "3090" + "24g").
    for cut in range(1, len(key)):
        prefix, suffix = key[:cut], key[cut:]
        if prefix in _index() and re.fullmatch(r"\d+g", suffix):
            for model in _index()[prefix]:
                if model.total_bytes == int(suffix[:-1]) * _GiB:
                    return model
    return None


def known_names() -> tuple[str, ...]:
    return tuple(m.key for m in CATALOG)


def lookup_gpu(name: str) -> GpuModel:
    """Like find_gpu, but an unknown name is a UsageError listing known names."""
    model = find_gpu(name)
    if model is None:
        import difflib

        keys = {normalize_gpu_name(k): k for k in known_names()}
        near = [keys[k] for k in difflib.get_close_matches(normalize_gpu_name(name), keys, n=5)]
        shown = f"near: {', '.join(near)}" if near else f"known: {', '.join(known_names())}"
        raise UsageError(
            f"unknown GPU {name!r}",
            hint=f"{shown}; or describe it as NAME:VRAM[:BANDWIDTH], e.g. mygpu:24G:900GB/s",
        )
    return model


def with_catalog_figures(gpu: Gpu) -> Gpu:
    """`gpu` with what the catalogue knows (by NVML name and memory size) filled in where it has
    nothing: compute throughput (NVML has no such query; old hardware files lack it) and the
    bandwidth when NVML could not report bus width or clock."""
    if gpu.fp16_tflops is not None and gpu.bandwidth_bytes_per_s:
        return gpu
    model = find_gpu(gpu.name, gpu.total_bytes or None)
    if model is None:
        return gpu
    return dataclasses.replace(
        gpu,
        fp16_tflops=gpu.fp16_tflops if gpu.fp16_tflops is not None else model.fp16_tflops,
        bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s or model.bandwidth_bytes_per_s,
    )


def gpu_assumption_notes(gpus: Sequence[Gpu]) -> list[str]:
    """One note per usable GPU whose bandwidth or compute the speed model has to assume, naming
    the value assumed (a card not in the catalogue, described without a bandwidth)."""
    notes = []
    for gpu in gpus:
        if not gpu.usable:
            continue
        assumed = []
        if not gpu.bandwidth_bytes_per_s:
            assumed.append(f"a bandwidth of {ASSUMED_GPU_BANDWIDTH_BYTES_PER_S / 1e9:.0f} GB/s")
        if gpu.fp16_tflops is None:
            assumed.append(f"{ASSUMED_GPU_FP16_TFLOPS:g} FP16 TFLOPS")
        if assumed:
            hint = (
                "; give the bandwidth as --gpu NAME:VRAM:BANDWIDTH"
                if not gpu.bandwidth_bytes_per_s
                else ""
            )
            notes.append(
                f"GPU {gpu.index} ({gpu.name}) is not in the catalogue: the speed estimate "
                f"assumes {' and '.join(assumed)}{hint}"
            )
    return notes
