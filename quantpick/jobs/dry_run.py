"""The dry run: llama.cpp's projection of a plan (or of `estimate`'s one configuration) whose file
is still on the hub, run on a sparse stand-in of its real header bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantpick.jobs.confirm import ConfirmReport, ConfirmRound, confirm_local_plan, overflow_text

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.jobs.confirm import ConfirmOptions
    from quantpick.jobs.plan import PlanResult
    from quantpick.machine.spec import Machine
    from quantpick.model.layout import ModelLayout
    from quantpick.model.manifest import Manifest
    from quantpick.plan.memory import Overheads, RunConfig

DRY_RUN_BASIS = "llama.cpp dry run, before download"


def dry_run(
    result: PlanResult, options: ConfirmOptions, *, settings: Settings
) -> ConfirmReport | None:
    """llama.cpp's own projection of a plan whose file is still on the hub: its real header
    bytes as a sparse stand-in (serve/standin.py), llama-fit-params run on it with the plan's
    flags, re-planned on its figures when a device overflows, as `get` does on the downloaded
    file. None when there is nothing to run it on: a described machine (llama.cpp projects on
    this one's devices), a plan already on a file on disk, or no llama-fit-params; a report
    "skipped" with the reason when the header bytes or a sparse file cannot be had."""
    inputs, p = result.inputs, result.plan
    if inputs.machine.described or inputs.local is not None or _fit_params(options) is None:
        return None
    from quantpick.errors import ModelRejectedError
    from quantpick.serve.fitparams import rejected_before_download

    try:
        with _standin(inputs.manifest, p.quant, inputs.machine, settings, inputs.network) as (
            path,
            runner,
        ):
            try:
                report = confirm_local_plan(
                    p, inputs.manifest, path, inputs.machine, inputs.request, inputs.overheads,
                    options, runner=runner,
                )  # fmt: skip
            except ModelRejectedError as exc:
                name = inputs.manifest.quant_files(p.quant)[0].name
                raise rejected_before_download(exc, path, name) from None
    except _NoDryRun as exc:
        return ConfirmReport("skipped", p, message=f"no {DRY_RUN_BASIS}: {exc}")
    return replace(report, message=f"{report.message} ({DRY_RUN_BASIS}){runner.cached_note}")


@dataclass(frozen=True)
class ConfigCheck:
    """llama.cpp's dry run of one fixed configuration (`estimate`): compared, never re-planned."""

    status: str  # "fits" | "overflows" | "skipped" | "failed"
    message: str
    rounds: tuple[ConfirmRound, ...] = ()
    changes: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.rounds)


def dry_run_config(
    manifest: Manifest,
    layout: ModelLayout,
    machine: Machine,
    config: RunConfig,
    *,
    overheads: Overheads,
    capped: bool,
    projector_bytes: int,
    options: ConfirmOptions,
    settings: Settings,
    network: bool,
) -> ConfigCheck | None:
    """`dry_run` for `estimate`'s one configuration of a remote quant: llama-fit-params on the
    stand-in with exactly these flags, compared device by device. None as for `dry_run`."""
    from quantpick.machine.backends import local_backend
    from quantpick.plan.confirm import compare
    from quantpick.serve.fitparams import FitParamsError, fit_params_argv

    tool = _fit_params(options)
    if machine.described or layout.quant is None or tool is None:
        return None
    try:
        with _standin(manifest, layout.quant, machine, settings, network) as (path, runner):
            argv, env = fit_params_argv(
                tool, config, path, layout.n_slots - 1, extra_args=options.extra_args,
                backend=local_backend(machine.gpus),
            )  # fmt: skip
            run = runner(argv, env, timeout_s=options.timeout_s)
    except _NoDryRun as exc:
        return ConfigCheck("skipped", f"no {DRY_RUN_BASIS}: {exc}")
    except FitParamsError as exc:
        return ConfigCheck("failed", f"no {DRY_RUN_BASIS}: {exc.message}")
    c = compare(
        layout, machine, config, run.projection, capped=capped, overheads=overheads,
        projector_bytes=projector_bytes if config.vision else 0,
    )  # fmt: skip
    rounds = (ConfirmRound(None, c, run.argv, run.seconds),)
    basis = f"({DRY_RUN_BASIS}){runner.cached_note}"
    if c.problem is not None:
        return ConfigCheck("failed", f"could not read llama.cpp's projection: {c.problem}", rounds)
    if c.fits:
        tightest = min(c.checks, key=lambda d: d.headroom_bytes)
        return ConfigCheck(
            "fits",
            f"fits by llama.cpp's own figures: {tightest.headroom_bytes / 2**20:.0f} MiB to "
            f"spare on {tightest.device} {basis}",
            rounds,
        )
    return ConfigCheck(
        "overflows",
        f"llama.cpp projects it will not fit: over budget on {overflow_text(c)} {basis}",
        rounds,
    )


class _NoDryRun(Exception):
    """No stand-in could be had (header bytes, sparse files): the estimate stands alone."""


def _fit_params(options: ConfirmOptions) -> Path | None:
    from quantpick.serve.fitparams import FIT_PARAMS, find_tool

    return find_tool(FIT_PARAMS, llama_bin=options.llama_bin, llama_server=options.llama_server)


@contextmanager
def _standin(
    manifest: Manifest, quant: str, machine: Machine, settings: Settings, network: bool
) -> Iterator[tuple[Path, DryRunCache]]:
    """The quant's sparse stand-in (removed afterwards) and the cached llama-fit-params to run
    on it; _NoDryRun with the reason when there is none."""
    from quantpick.errors import GGUFError
    from quantpick.model.headers import raw_headers
    from quantpick.serve.sealed import install_key
    from quantpick.serve.standin import NoSparseFiles, standins

    try:
        shards = raw_headers(manifest, quant, settings=settings, network=network)
    except GGUFError as exc:
        raise _NoDryRun(exc.message) from exc
    devices = [(g.name, g.total_bytes, g.backend) for g in machine.gpus]
    runner = DryRunCache(
        settings.cache_dir / "dry-runs",
        hashlib.sha256(b"".join(data for _, data, _ in shards)).hexdigest(),
        repr((devices, [w.endpoint for w in machine.rpc_workers])),
        key=install_key((settings.state_dir or settings.config_dir) / "dry-run.key"),
    )
    try:
        with standins(shards, parent=settings.cache_dir / "standins") as path:
            runner.standin = str(path)
            yield path, runner
    except NoSparseFiles as exc:
        raise _NoDryRun(exc.message) from exc


@dataclass
class DryRunCache:
    """run_fit_params, remembered (settings.cache_dir/dry-runs): the same tool build, flags,
    header bytes and devices give the same model/context/compute projection. The free memory it
    also prints is of that moment, so a projection read back has none: the comparison then uses
    this probe's free memory and the device's own overhead, as for a build that prints none.
    Each entry is sealed with this install's key (serve/sealed.py): an edited entry is ignored
    and the dry run runs again; without a key nothing is cached."""

    directory: Path
    file_key: str  # sha256 of the stand-in's header bytes
    devices: str  # the machine's GPUs (name, total, backend) and RPC workers
    standin: str = ""  # the stand-in's path, replaced by file_key in the cache key
    hits: int = 0
    key: bytes | None = None  # serve/sealed.install_key

    @property
    def cached_note(self) -> str:
        return " (its projection read back from the cache)" if self.hits else ""

    def __call__(self, argv: list[str], env: dict[str, str], *, timeout_s: float) -> Any:
        import json

        from quantpick.errors import QuantpickError
        from quantpick.machine.backends import device_env_prefixes
        from quantpick.plan.confirm import Projection
        from quantpick.serve.fitparams import FitParamsRun, parse_output, run_fit_params
        from quantpick.serve.sealed import read_sealed, write_sealed

        try:
            st = Path(argv[0]).stat()
        except OSError:
            return run_fit_params(argv, env, timeout_s=timeout_s)
        if self.key is None:
            return run_fit_params(argv, env, timeout_s=timeout_s)
        tool = f"{Path(argv[0]).resolve()}:{st.st_size}:{st.st_mtime_ns}"
        words = [self.file_key if a == self.standin else a for a in argv[1:]]
        shown = {k: v for k, v in sorted(env.items()) if k.startswith(device_env_prefixes())}
        digest = hashlib.sha256(json.dumps([tool, words, shown, self.devices]).encode())
        path = self.directory / f"{digest.hexdigest()[:40]}.txt"
        try:
            body = read_sealed(path, self.key)
            if body is None:  # none, or edited since it was written: run again
                raise ValueError("no verified entry")
            stdout = body.decode("utf-8")
            projection = parse_output(stdout)
        except (OSError, ValueError, QuantpickError):
            pass
        else:
            self.hits += 1
            devices = tuple(replace(d, free_mib=None, total_mib=None) for d in projection.devices)
            return FitParamsRun(
                tuple(argv), env, 0.0, Projection(devices, projection.other_host_mib), stdout
            )
        got = run_fit_params(argv, env, timeout_s=timeout_s)
        whole = "--log-jsonl" not in argv or '"fit_memory_breakdown"' in got.stdout
        if got.exit_code == 0 and whole:  # never a table whose JSON record the log thread lost
            try:
                write_sealed(path, self.key, got.stdout.encode("utf-8"))
            except OSError:
                pass  # a read-only cache only costs the next dry run its run
        return got
