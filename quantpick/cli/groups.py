"""Option groups as values: each group of a command's parsed options becomes one core input, once,
by one function, for every command that takes the group.

typer cannot group options in a signature (typer#264), so a command's signature stays long; its
body does not. It hands its parsed parameters to the groups it takes, by name:

    given = locals()  # first line of the command: the parameters typer parsed
    machine = MachineOptions.of(given).machine()
    inputs = PlanOptions.of(given).inputs(manifest, machine)

- `MachineOptions` (--hardware, --gpu, --ram, --cpu-only, --rpc*, --cores, ...) -> `Machine`;
- `PlanOptions` (-c, -np, --prefer, -q, --kv, -ub/-b/-fa, --gpu-overhead, --margin, the reserves,
  --exact, --offline, --no-calibration) -> `PlanRequest`, `Overheads`, `PlanInputs`;
- `LlamaCppOptions` (--llama-bin, --llama-server, --no-confirm, --timeout) -> `ConfirmOptions`;
- `FetchOptions` (--source, --dir, --reuse, --reuse-from, --hf-cache, --connections) -> `Settings`;
- `LaunchOptions` (--format, --script, --host, --port, --alias, the ecosystem files)
  -> `ServerOptions`, `EcosystemOptions`;
- `OutputOptions` (--json, --quiet) -> whether stderr shows progress.

A group's fields are its options' parameter names; an option a command does not take keeps the
group's default (llama-server's own for -ub/-b/-fa: the planner's `PlanRequest` defaults).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from quantpick.cli.options import DEFAULT_MIN_TPS, check_llama_server, check_run_options

if TYPE_CHECKING:
    from quantpick.config import Settings
    from quantpick.jobs.confirm import ConfirmOptions
    from quantpick.jobs.plan import PlanInputs
    from quantpick.machine.spec import Machine
    from quantpick.model.layout import ModelLayout
    from quantpick.model.manifest import Manifest
    from quantpick.model.speculative import DraftModel
    from quantpick.plan.memory import Overheads
    from quantpick.plan.plan_types import PlanRequest
    from quantpick.serve.command import ServerOptions
    from quantpick.serve.formats.base import EcosystemOptions

G = TypeVar("G", bound="Group")


class Group:
    """A group of options, taken by name from a command's parsed parameters."""

    @classmethod
    def of(cls: type[G], given: Mapping[str, Any], **fixed: Any) -> G:
        """The group's fields that the command takes, from `given` (its `locals()`); `fixed`:
        values the command sets itself (an option it does not offer, or means otherwise)."""
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        values = {k: v for k, v in given.items() if k in names}
        return cls(**{**values, **fixed})


def notes(lines: tuple[str, ...] | list[str]) -> None:
    """The notes a job returns, one `Note:` line each on stderr."""
    from quantpick.cli import output

    for line in lines:
        output.note(f"Note: {line}")


@dataclass(frozen=True)
class MachineOptions(Group):
    """The machine: probed here, or described (--hardware FILE / --gpu / --ram / --cpu-only),
    with RPC workers read (--rpc) or described (--rpc-device)."""

    hardware: Path | None = None
    gpu: list[str] | None = None
    ram: str | None = None
    cpu_only: bool = False
    llama_server: Path | None = None
    ram_bandwidth: str | None = None
    rpc: list[str] | None = None
    rpc_device: list[str] | None = None
    rpc_bandwidth: str | None = None
    rpc_latency: str | None = None
    cores: int | None = None
    threads: int | None = None
    backend: str | None = None  # --backend: llama.cpp's backend for the GPUs

    def machine(
        self, *, disk: Path | None = None, show_disk: bool = False, inspect_server: bool = False
    ) -> Machine:
        """The machine, its notes on stderr. llama-server is not run unless `inspect_server`
        (`probe` shows it): planning does not need it, and `get`/`command` inspect the binary
        they target when they build the command (serve.flags.capabilities_for). `disk`: the
        directory whose free space `show_disk` measures (`probe`; no plan reads it)."""
        from quantpick.machine.describe import resolve_machine

        check_llama_server(self.llama_server)
        machine = resolve_machine(
            hardware_file=self.hardware, gpus=self.gpu, ram=self.ram, cpu_only=self.cpu_only,
            llama_server=self.llama_server, disk_path=disk, inspect_server=inspect_server,
            measure_disk=show_disk, rpc=self.rpc, rpc_devices=self.rpc_device,
            rpc_bandwidth=self.rpc_bandwidth, rpc_latency=self.rpc_latency, cores=self.cores,
            threads=self.threads, ram_bandwidth=self.ram_bandwidth, backend_name=self.backend,
        )  # fmt: skip
        notes(machine.notes)
        return machine


@dataclass(frozen=True)
class PlanOptions(Group):
    """What to plan and on which basis: the request, the overheads, the headers and tuning."""

    model: str | None = None
    ctx_size: int = 0
    parallel: int = 1
    kv_unified: bool = False
    prefer: str = "balanced"
    quant: str | None = None
    vision: bool = False
    min_tps: float = DEFAULT_MIN_TPS
    allow_q4_kv: bool = False
    kv: list[str] | None = None
    no_offload: bool = False
    spec: str = "off"  # --spec: speculative decoding (off, auto, mtp, draft, ngram)
    draft: str | None = None  # --draft PATH: a draft model for --spec auto/draft
    ubatch: int | None = None  # None: llama-server's default (PlanRequest's)
    batch: int | None = None
    flash_attn: str | None = None
    gpu_overhead: str | None = None
    margin: str | None = None
    ram_reserve: str | None = None
    gpu_reserve: str | None = None
    exact: bool = False
    no_network: bool = False
    no_calibration: bool = False
    llama_server: Path | None = None  # the build whose compute rule and calibration apply

    def manifest(self) -> Manifest:
        """MODEL's manifest (from the cache only with --offline)."""
        from quantpick.cli.options import load_manifest

        return load_manifest(self.model, network=not self.no_network)

    def request(self) -> PlanRequest:
        from quantpick.errors import UsageError
        from quantpick.model.ggml import KV_CACHE_TYPES
        from quantpick.plan.plan_types import DEFAULT_KV_TYPES, PlanRequest
        from quantpick.plan.speculative import SpecMode, SpecRequest

        modes = [m.value for m in SpecMode]
        if self.spec not in modes:
            raise UsageError(
                f"--spec {self.spec}: not a speculation mode", hint="use " + ", ".join(modes)
            )

        batches: dict[str, Any] = {
            "ubatch": self.ubatch, "batch": self.batch, "flash_attn": self.flash_attn
        }  # fmt: skip
        kv_types = (
            tuple(self.kv)
            if self.kv
            else DEFAULT_KV_TYPES + (("q4_0",) if self.allow_q4_kv else ())
        )
        request = PlanRequest(
            ctx_size=self.ctx_size, n_parallel=self.parallel, kv_unified=self.kv_unified,
            kv_types=kv_types, prefer=self.prefer, quant=self.quant, vision=self.vision,
            min_tps=self.min_tps, allow_offload=not self.no_offload,
            spec=SpecRequest(mode=SpecMode(self.spec), draft=self._draft()),
            **{k: v for k, v in batches.items() if v is not None},
        )  # fmt: skip
        check_run_options(
            self.ctx_size, self.parallel, request.ubatch, request.batch, self.min_tps,
            request.flash_attn,
        )  # fmt: skip
        for t in kv_types:
            if t not in KV_CACHE_TYPES:
                raise UsageError(
                    f"--kv {t}: not a KV cache type", hint="use " + ", ".join(KV_CACHE_TYPES)
                )
        return request

    def _draft(self) -> DraftModel | None:
        """--draft PATH: the draft model's layout and vocabulary, read from its file."""
        if self.draft is None or self.spec == "off":
            return None
        from quantpick.errors import UsageError
        from quantpick.model.local import load_draft
        from quantpick.model.repos import hub_draft, is_repo_name

        path = Path(self.draft).expanduser()
        if path.exists():
            return load_draft(path)
        if is_repo_name(self.draft.rsplit(":", 1)[0]) or is_repo_name(self.draft):
            from quantpick.config import load_settings

            return hub_draft(self.draft, settings=load_settings(), network=not self.no_network)
        raise UsageError(
            f"--draft {self.draft}: no such file, nor a repository (OWNER/REPO[:QUANT])"
        )

    def overheads(self) -> Overheads:
        from quantpick.cli import output
        from quantpick.machine.device_specs import size_notes
        from quantpick.plan.memory import Overheads
        from quantpick.units import parse_size

        given: dict[str, tuple[str, Any]] = {
            "--gpu-overhead": ("gpu_context_bytes", self.gpu_overhead),
            "--margin": ("gpu_margin_bytes", self.margin),
            "--ram-reserve": ("host_reserve_bytes", self.ram_reserve),
            "--gpu-reserve": ("gpu_desktop_bytes", self.gpu_reserve),
        }
        for flag, (_, value) in given.items():
            for line in size_notes(f"{flag} {value}", value) if value else []:
                output.note(f"Note: {line}")
        sizes: dict[str, Any] = {field: parse_size(v) for field, v in given.values() if v}
        return Overheads(**sizes)

    def inputs(
        self,
        manifest: Manifest,
        machine: Machine,
        *,
        local: ModelLayout | None = None,
        local_dir: Path | None = None,
    ) -> PlanInputs:
        """Everything one plan needs (jobs.plan.plan_for); `local`: a file on disk, planned
        on its own header; `local_dir`: where the files would be (a header read there)."""
        from quantpick.jobs.plan import PlanInputs

        return PlanInputs(
            manifest, machine, self.request(), self.overheads(),
            llama_server=self.llama_server, gpu_overhead_given=self.gpu_overhead is not None,
            exact=self.exact, network=not self.no_network, local=local, local_dir=local_dir,
            calibration=not self.no_calibration,
        )  # fmt: skip


@dataclass(frozen=True)
class LlamaCppOptions(Group):
    """Which llama.cpp tools check the plan (llama-fit-params), and for how long."""

    llama_bin: Path | None = None
    llama_server: Path | None = None
    no_confirm: bool = False
    timeout: float | None = None

    @property
    def timeout_s(self) -> float:
        from quantpick.cli.options import tool_timeout

        return tool_timeout(self.timeout)

    def tools(self) -> ConfirmOptions:
        """The tools, whether or not confirming is on (`confirm` always runs them)."""
        from quantpick.jobs.confirm import ConfirmOptions

        self.check_llama_bin()
        return ConfirmOptions(
            llama_bin=self.llama_bin, llama_server=self.llama_server, timeout_s=self.timeout_s
        )

    def check_llama_bin(self) -> None:
        from quantpick.errors import UsageError

        if self.llama_bin is not None and not self.llama_bin.is_dir():
            raise UsageError(f"--llama-bin {self.llama_bin}: not a directory")

    def confirm(self, machine: Machine) -> ConfirmOptions | None:
        """None when confirming is off or the machine is not this one (--llama-bin is checked
        either way; the confirmation's own modules are not loaded for nothing)."""
        # llama.cpp projects on the devices it sees: a described machine is not this one.
        if self.no_confirm or machine.described:
            self.check_llama_bin()
            return None
        return self.tools()


@dataclass(frozen=True)
class FetchOptions(Group):
    """Where and how files are fetched: the source, the model directory and the reuse stores."""

    source: str = "auto"
    allow_unverified: bool = False
    dir_: Path | None = None
    reuse: bool | None = None
    reuse_from: list[str] | None = None
    hf_cache: bool | None = None
    connections: int | None = None

    def settings(self) -> Settings:
        """The environment and config file, with these flags over them."""
        from quantpick.config import load_settings, with_fetch_flags

        return with_fetch_flags(
            load_settings(), reuse=self.reuse, reuse_from=self.reuse_from,
            hf_cache=self.hf_cache, connections=self.connections,
        )  # fmt: skip


@dataclass(frozen=True)
class OutputOptions(Group):
    """What goes where: one JSON document on stdout, and whether stderr shows progress."""

    json_: bool = False
    quiet: bool = False

    @property
    def silent(self) -> bool:
        """No progress or plan line on stderr (--quiet, or --json: a script reads stdout)."""
        return self.quiet or self.json_


@dataclass(frozen=True)
class LaunchOptions(Group):
    """How the llama-server command is written: its format, file, listening address and the
    ecosystem files (router preset, llama-swap, Ollama, LM Studio)."""

    fmt: str = "line"
    model_source: str = "local"
    script: Path | None = None
    force: bool = False
    host: str = "127.0.0.1"
    port: int = 8080
    alias: str | None = None
    api_key_env: str | None = None
    rpc_bind: str | None = None
    rpc_cache: bool = True
    preset: Path | None = None
    swap_config: Path | None = None
    modelfile: Path | None = None
    ttl: int = 900  # serve.formats.llama_swap.SWAP_TTL_S

    def server(self, *, any_port: bool = False) -> ServerOptions:
        """`any_port`: --port 0 lets the system choose a free port (`serve` starts the server;
        a written command needs a real one)."""
        from quantpick.errors import UsageError
        from quantpick.serve.command import ServerOptions

        if any_port and not 0 <= self.port <= 65535:
            raise UsageError(f"--port {self.port}: use 1-65535, or 0 for any free port")
        if not any_port and not 1 <= self.port <= 65535:
            raise UsageError(f"--port {self.port}: use 1-65535")
        return ServerOptions(
            host=self.host, port=self.port, alias=self.alias, api_key_env=self.api_key_env
        )

    def ecosystem(self, *, dry_run: bool = False) -> EcosystemOptions:
        """The ecosystem formats' options, checked before any planning or transfer."""
        from quantpick.cli.ecosystem import check_ecosystem_options
        from quantpick.serve.formats import entry
        from quantpick.serve.formats.base import EcosystemOptions

        files = {"--preset": self.preset, "--swap-config": self.swap_config,
                 "--modelfile": self.modelfile}  # fmt: skip
        own = entry(self.fmt).file_option
        eco = EcosystemOptions(
            files.get(own) if own else None, self.ttl, dry_run, self.host, self.port, self.force
        )
        check_ecosystem_options(self.fmt, files, eco)
        return eco
