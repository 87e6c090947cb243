"""`quantpick models` and `quantpick show MODEL`: the manifests quantpick knows.

Usage:
    quantpick models
    quantpick models --json | jq -r '.models[].id'
    quantpick show qwen3.8-35b-a3b-distill
    quantpick show empero-ai/Qwen3.8-35B-A3B-Distill-GGUF --json | jq '.files[].size_bytes'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantpick.cli.core import app
from quantpick.cli.option_blocks import takes
from quantpick.cli.option_table import ShowModelArg

if TYPE_CHECKING:
    from quantpick.errors import ManifestError
    from quantpick.model.manifest import Manifest
    from quantpick.plan.quality import Quality


MODELS_EXAMPLES = ["quantpick models", "quantpick models --json | jq -r '.models[].id'"]
SHOW_EXAMPLES = [
    "quantpick show qwen3.8-35b-a3b-distill",
    "quantpick show unsloth/Qwen3.6-35B-A3B-GGUF --json | jq '.files[].size_bytes'",
]


def _epilog(examples: list[str]) -> str:
    return "Examples:\n\n" + "\n\n".join(f"  $ {e}" for e in examples)


def _size_range(manifest: Manifest) -> tuple[int, int]:
    sizes = [sum(f.size_bytes for f in manifest.quant_files(q)) for q in manifest.quants] or [0]
    return min(sizes), max(sizes)


def _summary(manifest: Manifest) -> dict[str, Any]:
    from dataclasses import asdict

    smallest, largest = _size_range(manifest)
    return {
        "id": manifest.id,
        "display_name": manifest.display_name,
        "quants": list(manifest.quants),
        "quant_count": len(manifest.quants),
        "min_size_bytes": smallest,
        "max_size_bytes": largest,
        "has_projector": manifest.projector is not None,
        "sources": [asdict(s) for s in manifest.sources],
        "origin": manifest.origin,
        "path": manifest.path,
    }


def _error_dict(exc: ManifestError) -> dict[str, Any]:
    return {"message": exc.message, "hint": exc.hint}


@app.command("models", epilog=_epilog(MODELS_EXAMPLES))
@takes("json_")
def models_command(**given: Any) -> None:
    """List the models quantpick knows (bundled, user and QUANTPICK_MANIFESTS manifests)."""
    from quantpick.cli import output
    from quantpick.model.registry import list_manifests
    from quantpick.units import GB

    # A broken manifest must not hide the others here: list what loads, report the rest on stderr
    # (and under "errors" in JSON). Commands that need one model (show, plan, ...) stay strict.
    errors: list[ManifestError] = []
    from quantpick.config import load_settings
    from quantpick.model.repos import cached_repos

    manifests = list_manifests(errors=errors)
    known = {m.id for m in manifests}
    # repositories described by `pick OWNER/REPO` (no manifest written: the cache keeps them)
    manifests += [m for m in cached_repos(load_settings()) if m.id not in known]
    for exc in errors:
        output.warn(f"skipped {exc.message}")
    if given["json_"]:
        output.print_json(
            {
                "models": [_summary(m) for m in manifests],
                "errors": [_error_dict(e) for e in errors],
            }
        )
        return

    from rich.table import Table

    table = Table(title=None, show_edge=False, pad_edge=False)
    table.add_column("ID", no_wrap=True)
    table.add_column("Name", overflow="fold")
    table.add_column("Quants", justify="right", no_wrap=True)
    table.add_column("Sizes", no_wrap=True)
    table.add_column("Sources", overflow="fold")
    table.add_column("From", no_wrap=True)
    for m in manifests:
        smallest, largest = _size_range(m)
        table.add_row(
            m.id,
            m.display_name,
            str(len(m.quants)),
            f"{smallest / GB:.1f}-{largest / GB:.1f} GB",
            ", ".join(s.kind if s.kind != "mirror" else s.name or "mirror" for s in m.sources),
            m.origin or "-",
        )
    console = output.stdout()
    if not manifests:
        console.print("No manifests found.")
        return
    console.print(table)


@app.command("show", epilog=_epilog(SHOW_EXAMPLES))
@takes("model json_")
def show_command(model: ShowModelArg, **given: Any) -> None:
    """Show one model: its files (sizes, quants, hashes), architecture, sources and sampling."""
    from quantpick.cli import output
    from quantpick.cli.options import load_manifest
    from quantpick.cli.render import quality_dict
    from quantpick.model.manifest import manifest_to_dict
    from quantpick.plan.planner import quality_for

    manifest = load_manifest(model)
    quality = {q: quality_for(manifest, q) for q in manifest.quants}
    if given["json_"]:
        doc = manifest_to_dict(manifest)
        for f in doc["files"]:
            f["quality"] = quality_dict(quality[f["quant"]]) if f["role"] == "model" else None
        output.print_json(doc)
        return

    _render_model(manifest, quality)


def _render_model(manifest: Manifest, quality: dict[str, Quality]) -> None:
    """`show`'s human rendering: the header, the files table with their KLD, the architecture,
    the sources and the sampling defaults."""
    from rich.table import Table

    from quantpick.cli import output
    from quantpick.plan.quality import TIER_BOUNDS, TIER_WORDS
    from quantpick.units import GB, GiB

    console = output.stdout()

    def line(text: str = "") -> None:
        # soft_wrap: long URLs and hashes stay on one line (copy-paste), the terminal wraps them.
        console.print(text, soft_wrap=True)

    line(f"{manifest.display_name}  ({manifest.id})")
    if manifest.description:
        line(manifest.description)
    line(
        f"License: {manifest.license or 'unknown'}    "
        f"Reasoning: {'yes' if manifest.reasoning else 'no'}    "
        f"Checksums file: {manifest.checksums_file or 'none'}"
    )
    line(f"Manifest: {manifest.path} ({manifest.origin or 'given'})")
    line()

    # Quant first and the file name last: at 80 columns only the name column folds.
    files = Table(show_edge=False, pad_edge=False)
    files.add_column("Quant", no_wrap=True)
    files.add_column("GB", justify="right", no_wrap=True)
    files.add_column("GiB", justify="right", no_wrap=True)
    files.add_column("BPW", justify="right", no_wrap=True)
    files.add_column("KLD", justify="right", no_wrap=True)
    files.add_column("basis", no_wrap=True)
    files.add_column("sha256", no_wrap=True)
    files.add_column("File", overflow="fold")
    for f in manifest.files:
        approx = "" if f.size_exact else "~"
        files.add_row(
            f.quant,
            f"{approx}{f.size_bytes / GB:.3f}",
            f"{approx}{f.size_bytes / GiB:.2f}",
            f"{f.bits_per_weight:.2f}" if f.bits_per_weight is not None else "-",
            f"{quality[f.quant].mean_kld:.4f}" if f.role == "model" else "-",
            quality[f.quant].basis if f.role == "model" else f.role,
            f.sha256[:10] if f.sha256 else "-",
            f.name,
        )
    console.print(files)
    line("~ = size from the model card (decimal GB); the hub listing is the authority")
    scopes = dict.fromkeys(q.scope for q in quality.values() if q.basis != "reference")
    line(
        "KLD = mean KL divergence vs BF16 on one scale (mudler/apex-quant, Qwen3.5-35B-A3B); "
        f"source: {'; '.join(scopes) or '-'}; each figure measured, interpolated by bits per "
        "weight, or estimated. "
        + "; ".join(
            f"<= {b:g}: {w.split(':')[0]}" for b, w in zip(TIER_BOUNDS, TIER_WORDS, strict=False)
        )
        + f"; above: {TIER_WORDS[-1].split(':')[0]}"
    )
    line()

    a = manifest.architecture
    from quantpick.arch.registry import support, view_of

    view, sup = view_of(a), support(a.name)
    nextn = f" + {a.nextn_predict_layers} NextN/MTP" if a.nextn_predict_layers else ""
    swa = sum(1 for lv in view.layers if lv.kv and lv.attention.value == "sliding")
    kinds = [f"{len(view.kv_layers)} with KV"]
    if swa:
        kinds.append(f"{swa} of them sliding-window ({view.n_swa} tokens)")
    if view.recurrent_layers:
        kinds.append(f"{len(view.recurrent_layers)} recurrent")
    experts = f"experts {a.expert_count}/{a.expert_used_count} used, " if a.expert_count else ""
    line(
        f"Architecture: {a.name} ({sup.basis}), {a.n_layer} layers{nextn} "
        f"({', '.join(kinds)}), context {a.context_length:,}, embedding {a.embedding_length}, "
        f"heads {view.n_head}/{view.layers[0].n_head_kv} kv, {experts}vocab {a.vocab_size:,}"
    )
    line("Sources:")
    for s in manifest.sources:
        if s.kind == "mirror":
            line(f"  mirror {s.name or ''}: {s.url_template}")
        else:
            line(f"  {s.kind}: {s.repo} @ {s.revision or '(default branch)'}")
    if manifest.sampling:
        sp = manifest.sampling
        line(
            f"Sampling: --temp {sp.temperature:g} --top-p {sp.top_p:g} "
            f"--top-k {sp.top_k} --min-p {sp.min_p:g}"
        )
