"""The GPU catalog (quantpick/machine/catalog.py): the NVIDIA cards are the table
machine/data/nvidia.csv, read into the same GpuModel rows the other vendors are written as."""

from __future__ import annotations

import csv
from pathlib import Path

import quantpick.machine.catalog as catalog
from quantpick.machine.backends import Vendor

TABLE = Path(catalog.__file__).parent / "data" / "nvidia.csv"


def _table_rows() -> list[dict[str, str]]:
    lines = TABLE.read_text(encoding="utf-8").splitlines()
    return list(csv.DictReader(line for line in lines if not line.startswith("#")))


def test_every_row_of_the_table_is_a_catalog_card_with_its_figures() -> None:
    rows = _table_rows()
    assert len(rows) >= 40
    by_key = {g.key: g for g in catalog.CATALOG}
    for row in rows:
        gpu = by_key[row["key"]]
        assert gpu.vendor is Vendor.NVIDIA
        assert gpu.name == row["name"]
        assert gpu.total_bytes == int(row["gib"]) * 1024**3
        assert (gpu.pcie_generation, gpu.pcie_width) == (
            int(row["pcie_generation"]),
            int(row["pcie_lanes"]),
        )
        assert gpu.aliases == tuple(row["aliases"].split())


def test_keys_and_aliases_name_one_card_each() -> None:
    names = [n for g in catalog.CATALOG for n in (g.key, *g.aliases)]
    assert len(names) == len(set(names))


def test_the_table_reproduces_the_data_sheets_bandwidth() -> None:
    # RTX 3090: 384 bit x 19.5 Gbps = 936 GB/s; T4: 256 bit x 10 Gbps = 320 GB/s (data sheets)
    assert catalog.lookup_gpu("3090").bandwidth_bytes_per_s == 936_096_000_000
    assert catalog.lookup_gpu("t4").bandwidth_bytes_per_s == 320_064_000_000
    assert catalog.lookup_gpu("3090").fp16_tflops == 142.3
