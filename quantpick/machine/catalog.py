"""Built-in table of common NVIDIA cards, for describing a machine with `--gpu NAME`. Pure data.

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quantpick.errors import UsageError

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

    @property
    def bandwidth_bytes_per_s(self) -> int:
        return theoretical_bandwidth(self.memory_clock_mhz, self.bus_width_bits)


def _g(n: int) -> int:
    return n * _GiB


# Sources: NVIDIA data sheets (memory size, bus width, data rate, bandwidth); clocks converted to
# NVML's convention (data rate / 2) so that theoretical_bandwidth() reproduces the sheet figure.
CATALOG: tuple[GpuModel, ...] = (
    # Consumer, Ampere / Ada / Blackwell.
    GpuModel(
        "3060",
        "NVIDIA GeForce RTX 3060",
        ("3060-12g", "3060 12gb"),
        _g(12),
        192,
        7501,
        "8.6",
        4,
        16,
    ),
    GpuModel("3090", "NVIDIA GeForce RTX 3090", ("3090-24g",), _g(24), 384, 9751, "8.6", 4, 16),
    GpuModel(
        "3090ti", "NVIDIA GeForce RTX 3090 Ti", ("3090-ti",), _g(24), 384, 10501, "8.6", 4, 16
    ),
    GpuModel(
        "4060ti-16g", "NVIDIA GeForce RTX 4060 Ti", ("4060ti16",), _g(16), 128, 9001, "8.9", 4, 8
    ),
    GpuModel(
        "4070tis",
        "NVIDIA GeForce RTX 4070 Ti SUPER",
        ("4070tisuper", "4070ti-super"),
        _g(16),
        256,
        10501,
        "8.9",
        4,
        16,
    ),
    GpuModel("4080", "NVIDIA GeForce RTX 4080", (), _g(16), 256, 11201, "8.9", 4, 16),
    GpuModel("4090", "NVIDIA GeForce RTX 4090", (), _g(24), 384, 10501, "8.9", 4, 16),
    GpuModel("5080", "NVIDIA GeForce RTX 5080", (), _g(16), 256, 15001, "12.0", 5, 16),
    GpuModel("5090", "NVIDIA GeForce RTX 5090", (), _g(32), 512, 14001, "12.0", 5, 16),
    # Workstation.
    GpuModel("a4000", "NVIDIA RTX A4000", (), _g(16), 256, 7001, "8.6", 4, 16),
    GpuModel("a6000", "NVIDIA RTX A6000", (), _g(48), 384, 8001, "8.6", 4, 16),
    # Data centre.
    GpuModel(
        "a100-40g",
        "NVIDIA A100-PCIE-40GB",
        ("a100", "a100-pcie-40g", "a100-sxm4-40g"),
        _g(40),
        5120,
        1215,
        "8.0",
        4,
        16,
    ),
    GpuModel(
        "a100-80g",
        "NVIDIA A100-SXM4-80GB",
        ("a100-sxm4-80g", "a100-80g-sxm", "a100-sxm-80g"),
        _g(80),
        5120,
        1593,
        "8.0",
        4,
        16,
    ),
    GpuModel(
        "a100-80g-pcie",
        "NVIDIA A100 80GB PCIe",
        ("a100-pcie-80g",),
        _g(80),
        5120,
        1512,
        "8.0",
        4,
        16,
    ),
    GpuModel(
        "h100",
        "NVIDIA H100 80GB HBM3",
        ("h100-sxm", "h100-80g", "h100-sxm5-80g", "h100-80g-hbm3"),
        _g(80),
        5120,
        2619,
        "9.0",
        5,
        16,
    ),
    GpuModel(
        "h100-pcie",
        "NVIDIA H100 PCIe",
        ("h100-80g-pcie", "h100-pcie-80g"),
        _g(80),
        5120,
        1593,
        "9.0",
        5,
        16,
    ),
    GpuModel("l4", "NVIDIA L4", (), _g(24), 192, 6251, "8.9", 4, 16),
    # A "16 GB" T4 reports 15360 MiB total with ECC on (nvidia-smi / NVML), as datacenter T4s ship.
    GpuModel("t4", "Tesla T4", ("t4-16g",), _g(15), 256, 5001, "7.5", 3, 16),
    GpuModel(
        "v100-16g",
        "Tesla V100-SXM2-16GB",
        ("v100", "v100-pcie-16g", "v100-sxm2-16g"),
        _g(16),
        4096,
        877,
        "7.0",
        3,
        16,
    ),
    GpuModel(
        "v100-32g",
        "Tesla V100-SXM2-32GB",
        ("v100-pcie-32g", "v100-sxm2-32g", "v100s"),
        _g(32),
        4096,
        877,
        "7.0",
        3,
        16,
    ),
    GpuModel("p40", "Tesla P40", (), _g(24), 384, 3615, "6.1", 3, 16),
)

# Words that never distinguish two cards: vendor, brand and series names.
_NOISE = re.compile(r"nvidia|geforce|tesla|quadro|rtx")
# "80GB", "80 GiB", "80g" -> "80g" so that memory suffixes compare equal however they are written.
_MEM_SUFFIX = re.compile(r"(\d+)\s*(?:gib|gb|g)\b")


def normalize_gpu_name(text: str) -> str:
    """'NVIDIA GeForce RTX 3090' / 'rtx-3090' / '3090' -> '3090'; 'A100 80GB' -> 'a10080g'."""
    s = _MEM_SUFFIX.sub(r"\1g", text.strip().lower())
    s = re.sub(r"[^a-z0-9]", "", s)
    return _NOISE.sub("", s)


def _index() -> dict[str, GpuModel]:
    table: dict[str, GpuModel] = {}
    for model in CATALOG:
        for alias in (model.key, model.name, *model.aliases):
            table.setdefault(normalize_gpu_name(alias), model)
    return table


_BY_NAME = _index()


def find_gpu(name: str) -> GpuModel | None:
    """The catalog entry for a forgiving name, or None."""
    key = normalize_gpu_name(name)
    if not key:
        return None
    if key in _BY_NAME:
        return _BY_NAME[key]
    # "3090-24g": accept a trailing memory size that agrees with the catalog entry. Names are
    # digits too, so try every split point ("309024g" -> "3090" + "24g").
    for cut in range(1, len(key)):
        prefix, suffix = key[:cut], key[cut:]
        if prefix in _BY_NAME and re.fullmatch(r"\d+g", suffix):
            model = _BY_NAME[prefix]
            if model.total_bytes == int(suffix[:-1]) * _GiB:
                return model
    return None


def known_names() -> tuple[str, ...]:
    return tuple(m.key for m in CATALOG)


def lookup_gpu(name: str) -> GpuModel:
    """Like find_gpu, but an unknown name is a UsageError listing known names."""
    model = find_gpu(name)
    if model is None:
        raise UsageError(
            f"unknown GPU {name!r}",
            hint=f"known: {', '.join(known_names())}; "
            "or describe it as NAME:VRAM[:BANDWIDTH], e.g. mygpu:24G:900GB/s",
        )
    return model
