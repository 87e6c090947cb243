"""Option aliases shared by several commands (llama-server spellings where they mean the same)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]

# The machine: probed here, or described (--hardware FILE / --gpu / --ram / --cpu-only).
HardwareOpt = Annotated[
    Optional[Path],  # noqa: UP045 - typer needs Optional on 3.10
    typer.Option(
        "--hardware",
        help="Plan for a described machine: a `quantpick probe --json` file (JSON) or TOML.",
        dir_okay=False,
    ),
]
GpuOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--gpu",
        help="Describe a GPU: NAME[:VRAM[:BANDWIDTH]] "
        "(e.g. 3090, t4, 'a100-80g', 4090:24G:1008GB/s). "
        "Repeatable; order = device order.",
    ),
]
RamOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--ram", help="Describe the host RAM (e.g. 64G); overrides the probe."),
]
CpuOnlyOpt = Annotated[
    bool, typer.Option("--cpu-only", help="Plan without GPUs (ignores any probed GPU).")
]
LlamaServerOpt = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option("--llama-server", help="The llama-server binary to inspect (default: PATH)."),
]


def complete_model_id(incomplete: str) -> list[str]:
    """Shell completion for MODEL: the ids of the manifests quantpick knows."""
    try:
        from quantpick.manifest import list_manifests

        ids = [m.id for m in list_manifests(errors=[])]
    except Exception:  # completion must never print a traceback into the shell
        return []
    return [i for i in ids if i.startswith(incomplete)]
