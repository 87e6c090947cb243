"""Speed per backend: published llama.cpp runs on Metal, ROCm, Vulkan and SYCL machines
(benchmarks/data/speed-measurements-backends.json, each row with its source) against the speed
model, which is fitted to CUDA and CPU runs only (speed_accuracy.py's bundled rows).

    python benchmarks/backend_speed.py

For each backend it prints:
- held out: the backend's rows predicted by the CUDA/CPU-fitted model with no backend term (the
  backend never seen);
- fitted, held out by model: a decode (prefill) efficiency for the backend, the bandwidth
  (compute) share its kernels reach relative to CUDA's (decode's at most 1.0: the bus is a
  bound), and, where the backend's decode attention kernel runs each query head on its own
  (Backend.decode_attention_efficiency), that kernel's share of the catalogue's FP16 figure,
  fitted on the backend's other models' rows and applied to each model's rows (rows of one
  model at several depths are not independent, so a model is the unit held out);
- the efficiency fitted on all its rows, beside the value machine/backends/<backend>.py carries.

Goal (issue #31): per backend, decode median error <= 25% and every row within 2x, held out.
The rows are kept apart from speed-measurements.json so that SpeedParams' CUDA fit (and its
recorded accuracy) stays what speed_accuracy.py reports.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
DATA = ROOT / "benchmarks" / "data" / "speed-measurements-backends.json"

from speed_accuracy import Case, load_cases, predict, ratio, summary  # noqa: E402

from quantpick.machine.backends import Backend, BackendKind, parse_device_name  # noqa: E402
from quantpick.machine.backends.base import FixedCost, KernelPath  # noqa: E402
from quantpick.machine.backends.sycl import SYCL_BF16_DMMV_SINCE  # noqa: E402
from quantpick.plan.speed import DEFAULT_SPEED_PARAMS  # noqa: E402

GRID = [round(0.30 + 0.01 * i, 2) for i in range(171)]  # 0.30 .. 2.00
# Decode's bandwidth share stops at 1.0: the bus's data-sheet figure is a bound no kernel reads
# past (expected speed never above decode_speed's bound).
DECODE_GRID = [e for e in GRID if e <= 1.0]
# decode attention efficiency: 0.010 .. 0.500, 4% steps
ATTENTION_GRID = [round(0.01 * 1.04**i, 4) for i in range(100) if 0.01 * 1.04**i <= 0.5]
# a decode path's share of the backend's efficiency (Backend.decode_paths): 0.05 .. 1.00 -- a
# kernel path reads no faster than the backend's plain rows, whose share is bounded by the bus
# (DECODE_GRID): above 1.0 a path would trade against the fixed-cost factor and let a large
# model's predicted decode pass the data sheet's bandwidth
PATH_GRID = [round(0.05 + 0.01 * i, 2) for i in range(96)]
# a vendor's factor on the decode graph's fixed cost (Backend.decode_fixed): 1.0 .. 16.0
FIXED_GRID = [round(1.0 + 0.25 * i, 2) for i in range(61)]
FIT_ROUNDS = 3
# A row informs the decode attention efficiency when its cache holds at least this many cells
# (a server run's few hundred prompt and generated tokens are too few for the term to show).
ATTENTION_MIN_FILL = 1024
# A term is fitted only to rows of at least this many models: one model's rows cannot tell the
# backend's term from that model's own error (its rows at several depths share it); with fewer,
# the term stays 1.0 (none).
MIN_MODELS = 2
GOAL_MEDIAN, GOAL_WORST = 1.25, 2.0


def case_backend(case: Case) -> Backend:
    for name in case.devices:
        parsed = parse_device_name(name)
        if parsed is not None:
            return parsed[0]
    raise ValueError(f"row {case.row_id}: no backend device")


@dataclass(frozen=True)
class Superseded:
    """Weights of `types` whose decode kernel on `kind` changed before the pinned build: a run
    of a build below `since` measured the old kernel, so its decode figure is not compared (its
    prefill still is)."""

    kind: BackendKind
    types: frozenset[str]
    since: int
    why: str


SUPERSEDED = (
    Superseded(
        BackendKind.SYCL,
        frozenset({"BF16"}),
        SYCL_BF16_DMMV_SINCE,
        "BF16 mat-vec through oneDNN's GEMM until PR #21580's DMMV kernel (sycl.py)",
    ),
)


def superseded(case: Case) -> Superseded | None:
    """The superseded kernel whose weights the row's decode reads, or None."""
    kind = case_backend(case).kind
    for s in SUPERSEDED:
        if kind is s.kind and case.build is not None and case.build < s.since:
            read = (t for w in case.work.devices for t, _, n in w.decode_type_bytes if n > 0)
            if any(t in s.types for t in read):
                return s
    return None


def backend_cases(
    path: Path = DATA,
) -> tuple[list[Case], list[tuple[dict, str]], list[tuple[Case, Superseded]]]:  # type: ignore[type-arg]
    """The rows as cases (load_cases), a superseded kernel's decode figures removed (a case left
    with no figure is dropped), the unusable rows, and the rows whose decode was removed."""
    cases, unusable = load_cases(path)
    kept: list[Case] = []
    dropped: list[tuple[Case, Superseded]] = []
    for c in cases:
        s = superseded(c) if c.tg_tps is not None else None
        if s is None:
            kept.append(c)
            continue
        dropped.append((c, s))
        if c.pp_tps is not None:
            kept.append(replace(c, tg_tps=None))
    return kept, unusable, dropped


def with_efficiency(
    case: Case,
    backend: Backend,
    decode: float,
    prefill: float,
    attention: float | None,
    paths: tuple[KernelPath, ...] | None = None,
    fixed: tuple[FixedCost, ...] | None = None,
) -> Case:
    """The case with the backend's GPU figures scaled to efficiencies (decode, prefill, decode
    attention: None for none; decode paths: None for the module's) in place of the module's
    (device_speeds applied those)."""
    devices = {}
    for name, d in case.devices.items():
        if parse_device_name(name) is not None:
            catalogue = d.fp16_tflops / backend.prefill_efficiency
            d = replace(
                d,
                bandwidth_bytes_per_s=int(
                    d.bandwidth_bytes_per_s / backend.decode_efficiency * decode
                ),
                fp16_tflops=catalogue * prefill,
                attention_flops_per_s=catalogue * 1e12 * attention if attention else None,
            )
            if paths is not None or fixed is not None:
                # the candidate terms, taken on the row's GPU as the module's are (terms_for)
                candidate = replace(
                    backend,
                    decode_paths=backend.decode_paths if paths is None else paths,
                    decode_fixed=backend.decode_fixed if fixed is None else fixed,
                )
                d = replace(d, terms=candidate.terms_for(case_gpu(case)))
        devices[name] = d
    return replace(case, devices=devices)


_ROW_GPU: dict[int, str] = {}


def case_gpu(case: Case) -> str:
    """The row's GPU as the data file names it."""
    if not _ROW_GPU:
        import json

        rows = json.loads(DATA.read_text())
        _ROW_GPU.update({int(r["id"]): str(r.get("gpu") or "") for r in rows})
    return _ROW_GPU.get(case.row_id, "")


def case_vendor(case: Case):  # type: ignore[no-untyped-def]
    """The vendor of the row's GPU (its text in the data file)."""
    from quantpick.machine.backends.base import vendor_of_name

    return vendor_of_name(case_gpu(case))


def errors(
    cases: list[Case],
    backend: Backend,
    decode: float,
    prefill: float,
    attention: float | None = None,
    *,
    with_prefill: bool = True,
    paths: tuple[KernelPath, ...] | None = None,
    fixed: tuple[FixedCost, ...] | None = None,
) -> tuple[list[float], list[float]]:
    tg_err: list[float] = []
    pp_err: list[float] = []
    for c in cases:
        case = with_efficiency(c, backend, decode, prefill, attention, paths, fixed)
        if not with_prefill:
            case = replace(case, pp_tps=None)
        tg, pp = predict(case, DEFAULT_SPEED_PARAMS)
        if tg is not None and c.tg_tps is not None:
            tg_err.append(ratio(tg, c.tg_tps))
        if pp is not None and c.pp_tps is not None:
            pp_err.append(ratio(pp, c.pp_tps))
    return tg_err, pp_err


def log_loss(errs: list[float]) -> float:
    return statistics.median(math.log(e) for e in errs) if errs else math.inf


def mean_log(errs: list[float]) -> float:
    return statistics.fmean(math.log(e) for e in errs) if errs else math.inf


def fit_attention(
    cases: list[Case],
    backend: Backend,
    decode: float = 1.0,
    paths: tuple[KernelPath, ...] | None = None,
    fixed: tuple[FixedCost, ...] | None = None,
) -> float | None:
    """The decode attention efficiency (share of the catalogue FP16 figure the backend's
    per-head decode attention kernel reaches) minimising the mean log error of decode over the
    rows with a filled cache (at least ATTENTION_MIN_FILL cells: below it the term is nil; with
    none, the module's value), or None where the backend's module carries none (its decode
    kernel shares a KV head's loads: the bytes model)."""
    if backend.decode_attention_efficiency is None:
        return None
    deep = [c for c in cases if c.fill >= ATTENTION_MIN_FILL and c.tg_tps is not None]
    if not deep:
        return backend.decode_attention_efficiency
    return min(
        ATTENTION_GRID,
        key=lambda a: mean_log(
            errors(deep, backend, decode, 1.0, a, with_prefill=False, paths=paths, fixed=fixed)[0]
        ),
    )


def path_rows(cases: list[Case], path: KernelPath, paths: tuple[KernelPath, ...]) -> list[Case]:
    """The decode rows some of whose weights `path` reads (resolved among the `paths` taken on
    the row GPU's vendor: a path for every vendor reads the rows of all of them)."""
    from quantpick.machine.backends.base import resolve_path

    rows = []
    for c in cases:
        vendor = case_vendor(c)
        if c.tg_tps is None or not path.on(vendor):
            continue
        mine = tuple(p for p in paths if p.on(vendor))
        read = (
            resolve_path(mine, t, e)
            for w in c.work.devices
            for t, e, n in w.decode_type_bytes
            if n > 0
        )
        if any(r is path for r in read):
            rows.append(c)
    return rows


@dataclass(frozen=True)
class Fit:
    """A backend's terms fitted to some rows: decode, prefill and decode-attention efficiency,
    its decode paths' efficiencies and its vendors' fixed-cost factors (a term no row informs:
    1.0, none)."""

    decode: float
    prefill: float
    attention: float | None
    paths: tuple[KernelPath, ...] = ()
    fixed: tuple[FixedCost, ...] = ()


def informs(rows: list[Case]) -> bool:
    """Whether `rows` may fit a term: decode rows of at least MIN_MODELS models."""
    return len({model_key(c) for c in rows if c.tg_tps is not None}) >= MIN_MODELS


def _swap(items: tuple, i: int, item: object) -> tuple:  # type: ignore[type-arg]
    return items[:i] + (item,) + items[i + 1 :]


def fit_all(cases: list[Case], backend: Backend) -> Fit:
    """The backend's terms fitted to `cases`, in turn (FIT_ROUNDS times): the decode attention
    efficiency minimising the mean log error of the depth rows; each vendor's fixed-cost factor
    minimising the mean log error of the rows on that vendor; the decode efficiency minimising
    the median log error of the rows no decode path reads (none: 1.0, the paths carry it); each
    decode path's efficiency minimising the mean log error of the rows it reads (terms from
    1.0, the bandwidth model as it is). Then the prefill efficiency."""
    paths = tuple(replace(p, efficiency=1.0) for p in backend.decode_paths)
    fixed = tuple(replace(f, factor=1.0) for f in backend.decode_fixed)
    best_tg, attention = 1.0, None

    def tg_loss(rows: list[Case], **terms: object) -> float:
        kw: dict = {"paths": paths, "fixed": fixed, **terms}  # type: ignore[type-arg]
        return mean_log(errors(rows, backend, best_tg, 1.0, attention, with_prefill=False, **kw)[0])

    def refit(items: tuple, i: int, rows: list[Case], grid: object, field: str, term: str) -> tuple:  # type: ignore[type-arg]
        """`items` with item i's `field` set to the grid value of least decode loss on `rows`
        (the term passed to the model as `term`: a vendor's fixed cost, a decode path)."""

        def loss(x: float) -> float:
            return tg_loss(rows, **{term: _swap(items, i, replace(items[i], **{field: x}))})

        best = min(grid, key=loss)  # type: ignore[call-overload]
        return _swap(items, i, replace(items[i], **{field: best}))

    for _ in range(FIT_ROUNDS):
        attention = fit_attention(cases, backend, best_tg, paths, fixed)
        # a vendor's fixed cost before the decode efficiency: from the bus's bound (1.0) the
        # fixed cost takes what a small model's rows leave over, not the other way round
        for i, f in enumerate(fixed):
            rows = [c for c in cases if c.tg_tps is not None and case_vendor(c) is f.vendor]
            if informs(rows):
                fixed = refit(fixed, i, rows, FIXED_GRID, "factor", "fixed")
        touched = {id(c) for p in paths for c in path_rows(cases, p, paths)}
        plain = [c for c in cases if id(c) not in touched]
        if informs(plain):
            best_tg = min(
                DECODE_GRID,
                key=lambda e: log_loss(
                    errors(
                        plain,
                        backend,
                        e,
                        1.0,
                        attention,
                        with_prefill=False,
                        paths=paths,
                        fixed=fixed,
                    )[0]
                ),
            )
        for i, path in enumerate(paths):
            rows = path_rows(cases, path, paths)
            if informs(rows):
                paths = refit(paths, i, rows, PATH_GRID, "efficiency", "paths")
        if attention is None and not paths and not fixed:
            break
    best_pp = min(
        GRID, key=lambda e: log_loss(errors(cases, backend, 1.0, e, paths=paths, fixed=fixed)[1])
    )
    return Fit(best_tg, best_pp, attention, paths, fixed)


def fit(cases: list[Case], backend: Backend) -> tuple[float, float, float | None]:
    """(decode, prefill, decode attention) efficiencies fitted to `cases` (fit_all)."""
    f = fit_all(cases, backend)
    return f.decode, f.prefill, f.attention


def held_errors(
    rows: list[Case], backend: Backend, group: Callable[[Case], str]
) -> tuple[list[float], list[float], list[tuple[str, Fit, list[float], list[float]]]]:
    """Decode and prefill errors of `rows`, each group (by `group`) predicted by the terms
    fitted to the other groups' rows, and each group's fit and errors."""
    held_tg: list[float] = []
    held_pp: list[float] = []
    per: list[tuple[str, Fit, list[float], list[float]]] = []
    for key in sorted({group(c) for c in rows}):
        test = [c for c in rows if group(c) == key]
        train = [c for c in rows if group(c) != key]
        f = fit_all(train, backend) if train else Fit(1.0, 1.0, None)
        tg, pp = errors(
            test, backend, f.decode, f.prefill, f.attention, paths=f.paths, fixed=f.fixed
        )
        held_tg += tg
        held_pp += pp
        per.append((key, f, tg, pp))
    return held_tg, held_pp, per


def model_key(case: Case) -> str:
    """One model: its architecture, quant and size (rows of one file at several depths)."""
    size = sum(t.n_bytes for t in case.layout.tensors) / 2**30
    return f"{case.label.split(' d')[0]} {size:.1f}GiB"


def path_label(p: KernelPath) -> str:
    types = "+".join(sorted(p.types)) or "quantized"
    weights = "" if p.weights.value == "any" else f" {p.weights.value}"
    vendor = p.vendor.value if p.vendor is not None else "every vendor's"
    return f"{vendor} {types}{weights}"


def goal_met(errs: list[float]) -> bool:
    return bool(errs) and statistics.median(errs) <= GOAL_MEDIAN and max(errs) <= GOAL_WORST


def backend_report(label: str, rows: list[Case], b: Backend) -> list[str]:
    """One backend's figures: its rows with no backend term, with the module's terms as carried
    (in sample), and held out by model and by source (the goal), and the fit on all rows."""
    out: list[str] = []
    models = sorted({model_key(c) for c in rows})
    sources = sorted({c.source for c in rows})
    unseen_tg, unseen_pp = errors(rows, b, 1.0, 1.0, paths=(), fixed=())
    carried_tg, _ = errors(
        rows, b, b.decode_efficiency, b.prefill_efficiency, b.decode_attention_efficiency
    )
    model_tg, model_pp, per_model = held_errors(rows, b, model_key)
    source_tg, source_pp, per_source = held_errors(rows, b, lambda c: c.source)
    out.append(f"== {label}: {len(rows)} rows, {len(models)} models, {len(sources)} sources")
    for name, errs in (
        ("decode, backend held out (CUDA-fitted, no backend term)", unseen_tg),
        ("prefill, backend held out (CUDA-fitted, no backend term)", unseen_pp),
        ("decode, the module's terms as carried (in sample)", carried_tg),
        ("decode, terms fitted on the other models", model_tg),
        ("prefill, terms fitted on the other models", model_pp),
        ("decode, terms fitted on the other sources [goal]", source_tg),
        ("prefill, terms fitted on the other sources", source_pp),
    ):
        out.append("  " + summary(name, errs, GOAL_WORST))
    for group, per in (("model", per_model), ("source", per_source)):
        out.append(f"  held out by {group}:")
        for key, f, tg, pp in per:
            worst_tg = f"{max(tg):.2f}x" if tg else "-"
            worst_pp = f"{max(pp):.2f}x" if pp else "-"
            at = f" attention {f.attention:.3f}" if f.attention is not None else ""
            ps = "".join(f", {path_label(p)} {p.efficiency:.2f}" for p in f.paths)
            ps += "".join(f", {x.vendor.value} fixed x{x.factor:.2f}" for x in f.fixed)
            out.append(f"    {key:<52} decode eff {f.decode:.2f}{at}{ps} worst {worst_tg}"
                       f"   prefill eff {f.prefill:.2f} worst {worst_pp}")  # fmt: skip
    f = fit_all(rows, b)
    at_fit = f", decode_attention_efficiency {f.attention:.3f}" if f.attention is not None else ""
    carried_at = b.decode_attention_efficiency
    at_now = f", {carried_at:.3f}" if carried_at is not None else ""
    out.append(f"  fitted on all rows: decode_efficiency {f.decode:.2f}, prefill_efficiency "
               f"{f.prefill:.2f}{at_fit}; machine/backends carries {b.decode_efficiency:.2f}, "
               f"{b.prefill_efficiency:.2f}{at_now}")  # fmt: skip
    for fitted, carried in zip(f.paths, b.decode_paths, strict=True):
        n = len(path_rows(rows, fitted, f.paths))
        out.append(f"    decode path {path_label(fitted)}: fitted {fitted.efficiency:.2f} on "
                   f"{n} rows; carried {carried.efficiency:.2f}")  # fmt: skip
    for fitted_f, carried_f in zip(f.fixed, b.decode_fixed, strict=True):
        vendor = fitted_f.vendor.value
        out.append(f"    decode fixed cost on {vendor}: fitted x{fitted_f.factor:.2f}; "
                   f"carried x{carried_f.factor:.2f}")  # fmt: skip
    out.append(f"  goal (decode median <= 25%, every row within 2x, held out by source): "
               f"{'met' if goal_met(source_tg) else 'NOT met'}; held out by model: "
               f"{'met' if goal_met(model_tg) else 'NOT met'}\n")  # fmt: skip
    return out


def report(only: str | None = None) -> list[str]:
    """The per-backend figures, one line each (main prints them; speed_accuracy.py too);
    `only`: one backend's (its label)."""
    out: list[str] = []
    cases, unusable, dropped = backend_cases()
    for row, why in unusable:
        out.append(f"unusable row {row['id']}: {why}")
    for case, s in dropped:
        out.append(f"row {case.row_id} (b{case.build}): decode not compared, {s.why}")
    by_backend: dict[str, list[Case]] = defaultdict(list)
    backends: dict[str, Backend] = {}
    for c in cases:
        b = case_backend(c)
        by_backend[b.label].append(c)
        backends[b.label] = b
    out.append(f"SpeedParams: {DEFAULT_SPEED_PARAMS.basis}")
    out.append(f"{len(cases)} rows from {DATA.name}\n")
    for label, rows in sorted(by_backend.items()):
        if only and label.lower() != only.lower():
            continue
        out += backend_report(label, rows, backends[label])
    return out


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", help="one backend only (Metal, ROCm, Vulkan, SYCL)")
    print("\n".join(report(parser.parse_args().backend)))


if __name__ == "__main__":
    main()
