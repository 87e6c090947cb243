"""What the options need besides their declaration (cli/option_table.py): shell completion of
their values, parsing, and checking parsed options before they become the core's inputs (machine,
manifest, overheads, plan request)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from quantpick.cli.complete import (
    ESTIMATE_SPEC_CHOICES,
    FLASH_ATTN_CHOICES,
    SOURCE_CHOICES,
    SPEC_CHOICES,
)
from quantpick.model.ggml import KV_CACHE_TYPES  # a plain tuple: no cost at start-up

if TYPE_CHECKING:
    from quantpick.model.manifest import Manifest


# ---- shell completion (each Tab is a new process: keep these light) ---------------------------


def complete_model_id(incomplete: str) -> list[str]:
    """Shell completion for MODEL: the ids of the manifests quantpick knows."""
    try:
        from quantpick.cli.complete import model_items

        return [value for value, _ in model_items(incomplete)]
    except Exception:  # completion must never print a traceback into the shell
        return []


def complete_quant(ctx: typer.Context, incomplete: str) -> list[tuple[str, str | None]]:
    """Shell completion for --quant: the quants of the MODEL already on the command line (best
    first), with their size as the help text zsh and fish show."""
    try:
        from quantpick.cli import completion_args
        from quantpick.cli.complete import quant_items

        # click stops parsing at the option still waiting for its value (`--quant <Tab>`), so
        # MODEL may not be in ctx.params yet: look at the words typed so far too.
        return quant_items([ctx.params.get("model") or "", *completion_args()], incomplete)
    except Exception:  # a broken manifest: nothing to offer, and no traceback in the shell
        return []


def complete_gpu(incomplete: str) -> list[tuple[str, str | None]]:
    """Shell completion for --gpu: the catalogue's names (NAME, before any :VRAM)."""
    try:
        from quantpick.cli.complete import gpu_items

        return gpu_items(incomplete)
    except Exception:
        return []


def choices_completion(values: tuple[str, ...]) -> Any:
    """A completion callback offering fixed values (validated where the option is used)."""

    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


KV_CHOICES = KV_CACHE_TYPES  # common/arg.cpp kv_cache_types: what -ctk/-ctv accept
complete_kv = choices_completion(KV_CHOICES)
complete_source = choices_completion(SOURCE_CHOICES)
complete_spec = choices_completion(SPEC_CHOICES)
complete_estimate_spec = choices_completion(ESTIMATE_SPEC_CHOICES)


# llama-fit-params projects a full-size header in 0.3 s; CUDA initialisation adds 1-3 s.
TOOL_TIMEOUT_S = 10.0


def tool_timeout(value: float | None, default: float | None = None) -> float:
    """--timeout SECONDS as a number of seconds above 0 (default, else TOOL_TIMEOUT_S, when not
    given)."""
    import math

    from quantpick.errors import UsageError

    if value is None:
        return TOOL_TIMEOUT_S if default is None else default
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"--timeout {value:g}: give a number of seconds above 0")
    return value


def context_value(text: Any) -> int:
    """typer parser for a context length: units.parse_context ("128K" = 131072), its problem as
    click's one-line usage error (with the hint the CLI boundary prints)."""
    from quantpick.cli.core import HintedBadParameter
    from quantpick.errors import UsageError
    from quantpick.units import parse_context

    try:
        return parse_context(text)
    except UsageError as exc:
        raise HintedBadParameter(exc.message, exc.hint) from None


# = quantpick.plan.planner.DEFAULT_MIN_TPS, kept here so the CLI does not import the planner to
# show a default (tests/cli/test_cli_plan.py checks they agree).
DEFAULT_MIN_TPS = 5.0


# ---- options -> core inputs ------------------------------------------------------------------

# llama.cpp pads every context to a multiple of 256 cells (src/llama-context.cpp: `cparams.n_ctx =
# GGML_PAD(cparams.n_ctx, 256)`), and before padding it caps the batch at -c (`n_batch =
# min(n_ctx, n_batch)`): a -c below 256 runs with 256 cells but a smaller batch than planned.
# So 256 is the smallest -c quantpick plans. (--fit's floor of 4096, common.h
# `fit_params_min_ctx`, only bounds how far --fit lowers -c by itself.)
MIN_CTX_SIZE = 256


def check_run_options(
    ctx_size: int,
    parallel: int,
    ubatch: int,
    batch: int,
    min_tps: float | None = None,
    flash_attn: str = "on",
    cache_types: tuple[str, ...] = (),
) -> None:
    """Reject values llama.cpp would not run as planned (exit 2, one line each)."""
    from quantpick.errors import UsageError

    if flash_attn not in FLASH_ATTN_CHOICES:
        raise UsageError(f"-fa {flash_attn}: use on, off or auto")
    for t in cache_types:
        if t not in KV_CACHE_TYPES:
            raise UsageError(
                f"KV cache type {t!r} is not one llama.cpp knows",
                hint="use " + ", ".join(KV_CHOICES),
            )

    if ctx_size != 0 and ctx_size < MIN_CTX_SIZE:
        raise UsageError(
            f"-c {ctx_size}: the smallest context is {MIN_CTX_SIZE}",
            hint="llama.cpp pads -c to a multiple of 256; use 0 for the model's own context",
        )
    if parallel < 1:
        raise UsageError(f"-np {parallel}: at least 1 slot")
    if ubatch < 1 or batch < 1:
        raise UsageError(f"-ub {ubatch} / -b {batch}: batch sizes are at least 1")
    if min_tps is not None and not min_tps >= 0:
        raise UsageError(f"--min-tps {min_tps}: a speed floor is 0 (none) or more tok/s")


def check_llama_server(path: Path | None) -> None:
    """--llama-server must name an executable file (checked without running it)."""
    import os

    from quantpick.errors import UsageError

    if path is None:
        return
    if not path.exists():
        raise UsageError(f"--llama-server {path}: no such file")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UsageError(f"--llama-server {path}: not an executable file")


def load_manifest(model: str | None, *, network: bool = True) -> Manifest:
    """MODEL as a manifest: a bundled or added one by id, alias or repository, else any hub
    repository named by owner/name or URL (model/repos.py: listed, every quant's header read and
    cached; `network=False`: from the cache only)."""
    from quantpick.errors import UnknownModelError, UsageError
    from quantpick.model.registry import find_manifest

    if not model:
        from quantpick.cli.core import command_has_option

        # pick and max-context plan a MODEL only; estimate, command, confirm also take --gguf.
        local = " or --gguf PATH" if command_has_option("--gguf") else ""
        raise UsageError(f"give a MODEL (see `quantpick models`){local}")
    from quantpick.cli import output

    try:
        return find_manifest(model, on_note=lambda text: output.note(f"Note: {text}"))
    except UnknownModelError:
        from quantpick.model.repos import is_repo_name, repo_manifest

        if not is_repo_name(model):
            raise
    from quantpick.config import load_settings

    return repo_manifest(
        model, settings=load_settings(), network=network, progress=_header_progress(),
        on_note=lambda text: output.note(f"Note: {text}"),
    )  # fmt: skip


def _header_progress() -> Any:
    """A one-line count of the header reads on a terminal; nothing on a pipe."""
    import sys

    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        sys.stderr.write(f"\rreading GGUF headers {done}/{total}")
        if done >= total:
            sys.stderr.write("\r\033[K")
        sys.stderr.flush()

    return show
