"""The llama-server command for a plan: argv + env, rendered as a line, a script, JSON, env, a
systemd user unit or a docker compose file. The model is a file on disk (`-m`) or, with `HfModel`,
what llama-server's own `-hf` downloader fetches into its Hugging Face cache.

Pure except `write_script`. Flags use llama.cpp's spellings (notes `llamacpp-memory.md` section 4,
tree 0c1e570). With `capabilities` (from `serve.flags.capabilities_for`) the command is adapted to
and checked against that build; without, it targets current llama.cpp and says so.

Secrets: the API key is never part of the command. `ServerOptions.api_key_env` names an environment
variable that holds it; the command maps it to `LLAMA_API_KEY`, which llama-server reads itself
(`--api-key` env). It is passed by reference (`LLAMA_API_KEY="$NAME"`) in the line, script and env
formats, so the key appears neither in the rendered text nor in the process's argv (`ps`), only in
its environment, which other users cannot read.

RPC workers: a plan over other machines' devices (`config.rpc_servers`) puts `--rpc h1:p1,...`
first on the head's line, so that `--device RPC0,...` and `-ot ...=RPC0[h1:p1]` after it can name
the remote devices (llama.cpp resolves device names while it parses, and registers the RPC devices
when it reads --rpc: common/arg.cpp). `build_worker_commands` writes one `ggml-rpc-server` line
per worker, to be started before the head.

Usage:
    cmd = build_command(config, model_path=path, mmproj_path=None, manifest=m, block_count=40,
                        server=ServerOptions(), capabilities=None)
    print(render_line(cmd))
    workers = build_worker_commands(machine.rpc_workers, cache=True)
    print(render_worker_lines(workers))
"""

from __future__ import annotations

import re
import shlex
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantpick.errors import QuantpickError, UsageError
from quantpick.machine.backends import Backend, backend_of, default_gpu_backend
from quantpick.machine.backends import backend as backend_named
from quantpick.machine.spec import RpcWorker
from quantpick.model.manifest import Manifest
from quantpick.outputs import Existing
from quantpick.plan.memory import RunConfig
from quantpick.serve.flags import (
    Problem,
    ServerCapabilities,
    check_command,
    raise_for_required,
    spec_types,
)
from quantpick.units import human

PROGRAM = "llama-server"
# llama-server defaults (common/common.h): -ub 512, -b 2048. Emitted only when they differ.
DEFAULT_UBATCH = 512
DEFAULT_BATCH = 2048
# What the command targets when no binary was checked.
CURRENT_TARGET = (
    "current llama.cpp (flags of tree 0c1e570, 2026-10-01; not checked against a binary)"
)
UNCHECKED_WARNING = "no llama-server was checked"
# Architectures whose support landed late, with the first build that loads them.

# common/common.h LLM_FFN_EXPS_REGEX: the routed-expert tensors --cpu-moe / --n-cpu-moe move.
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"

# Env var per flag in current llama.cpp (common/arg.cpp set_env; notes section 4). With a checked
# build its own `(env: ...)` from --help wins.
ENV_VARS: dict[str, str] = {
    "-m": "LLAMA_ARG_MODEL",
    "--mmproj": "LLAMA_ARG_MMPROJ",
    "-c": "LLAMA_ARG_CTX_SIZE",
    "-np": "LLAMA_ARG_N_PARALLEL",
    "-kvu": "LLAMA_ARG_KV_UNIFIED",
    "-ngl": "LLAMA_ARG_N_GPU_LAYERS",
    "--device": "LLAMA_ARG_DEVICE",
    "-ts": "LLAMA_ARG_TENSOR_SPLIT",
    "-ot": "LLAMA_ARG_OVERRIDE_TENSOR",
    "--n-cpu-moe": "LLAMA_ARG_N_CPU_MOE",
    "--cpu-moe": "LLAMA_ARG_CPU_MOE",
    "-ctk": "LLAMA_ARG_CACHE_TYPE_K",
    "-ctv": "LLAMA_ARG_CACHE_TYPE_V",
    "-fa": "LLAMA_ARG_FLASH_ATTN",
    "-ub": "LLAMA_ARG_UBATCH",
    "-b": "LLAMA_ARG_BATCH",
    "-nkvo": "LLAMA_ARG_KV_OFFLOAD",
    "--spec-type": "LLAMA_ARG_SPEC_TYPE",
    "--spec-draft-n-max": "LLAMA_ARG_SPEC_DRAFT_N_MAX",
    "--fit": "LLAMA_ARG_FIT",
    "--jinja": "LLAMA_ARG_JINJA",
    "--reasoning-format": "LLAMA_ARG_THINK",
    "--temp": "LLAMA_ARG_TEMPERATURE",
    "--top-p": "LLAMA_ARG_TOP_P",
    "--top-k": "LLAMA_ARG_TOP_K",
    "--min-p": "LLAMA_ARG_MIN_P",
    "--host": "LLAMA_ARG_HOST",
    "--port": "LLAMA_ARG_PORT",
    "--alias": "LLAMA_ARG_ALIAS",
    "--rpc": "LLAMA_ARG_RPC",
}
# Value-less flags that turn something off: through the positive env var they are "0"
# (-nkvo -> LLAMA_ARG_KV_OFFLOAD=0); old builds had LLAMA_ARG_NO_KV_OFFLOAD=1 instead.
NEGATIVE_FLAGS = frozenset({"-nkvo", "--no-kv-offload"})

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    alias: str | None = None  # None: the manifest id
    api_key_env: str | None = None  # NAME of an env var holding the key; never the key itself
    extra_args: tuple[str, ...] = ()  # appended verbatim (checked against the build like the rest)
    program: str | None = None  # None: the checked binary's path, else "llama-server"


@dataclass(frozen=True)
class HfModel:
    """The model as llama-server's `-hf repo:tag` fetches it (into the HF cache, notes section 5).

    `file` is the exact path for `--hf-file` when the tag alone could pick another file (the
    first listing entry matching `<tag>[.-]` wins); `revision` is the commit quantpick planned on,
    which `-hf` cannot pin (it follows the repository's main branch).
    """

    repo: str
    tag: str
    file: str | None = None
    revision: str | None = None


@dataclass(frozen=True)
class ServerCommand:
    argv: tuple[str, ...]
    env: dict[str, str]  # literal variables for the process (CUDA_DEVICE_ORDER, ...)
    warnings: tuple[str, ...]
    target: str  # which llama-server the command was built for
    # Variables set from another variable at run time: (LLAMA_API_KEY, "MY_KEY") renders as
    # LLAMA_API_KEY="$MY_KEY". Keeps secrets out of every rendering.
    env_from: tuple[tuple[str, str], ...] = ()
    # flag -> env var valid for the target build (render_env); empty: ENV_VARS.
    env_names: dict[str, str] = field(default_factory=dict)
    # NVML indices (PCI bus order) of the GPUs the plan uses: None = all, () = none. The compose
    # rendering reserves exactly these.
    devices: tuple[int, ...] | None = None  # the CUDA indices of --device (RPC ones left out)
    host: str = "127.0.0.1"
    port: int = 8080
    hf: HfModel | None = None  # the model comes from -hf, not a file on disk
    backend: str = field(
        default_factory=lambda: default_gpu_backend().key
    )  # machine/backends key of the local devices the command names
    selected_by_env: bool = False  # True: the backend's variable selects the GPUs (no --device)


@dataclass
class _Opt:
    flag: str
    value: str | None
    required: bool


def _float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _num(value: float) -> str:
    """The shortest decimal llama.cpp reads back as the same number: 0.6 -> '0.6', 20.0 -> '20'.

    llama.cpp parses these flags with std::stof (float32), and GGUF headers store
    general.sampling.* as float32, whose exact value 0.6000000238418579 is what Python sees. The
    shortest text that rounds to the same float32 is what the header meant (0.6), and llama.cpp
    turns it into exactly the same float.
    """
    value = float(value)
    try:
        f32 = _float32(value)
    except OverflowError:  # beyond float32: llama.cpp could not read it either; show it as is
        return repr(value)
    if f32.is_integer():
        return str(int(f32))
    for digits in range(1, 10):  # 9 significant digits always round-trip a float32
        text = f"{value:.{digits}g}"
        if _float32(float(text)) == f32:
            return text
    return repr(value)


def _absolute(path: Path) -> str:
    # Absolute paths never start with '-', so llama-server cannot read one as a flag, and the
    # command keeps working when run from another directory.
    return str(path if path.is_absolute() else Path.cwd() / path)


def _check_env_name(name: str, what: str) -> str:
    if not _ENV_NAME.match(name):
        raise UsageError(f"{what} {name!r} is not a valid environment variable name")
    return name


def _version_warnings(caps: ServerCapabilities, arch: str | None) -> list[str]:
    from quantpick.arch.registry import min_build

    need = min_build(arch or "")  # the architecture's family knows its first build
    if need is None:
        return []
    if caps.version:
        # Semver tags started ~b10621 (Aug 2026), long after qwen35moe landed.
        return []
    if caps.build == 1:
        return [
            f"{caps.describe()} reports build 1, which is what a shallow clone (such as a vendored "
            f"submodule) reports: its age is unknown, so it is treated as new enough for {arch}; "
            f"if it fails with 'unknown model architecture', upgrade to b{need} or newer"
        ]
    if caps.build is None:
        why = f" ({caps.version_error})" if caps.version_error else ""
        return [f"could not read the llama-server build{why}; {arch} needs b{need} or newer"]
    if caps.build < need:
        return [
            f"{caps.describe()} is older than {arch} support (first release ~b{need}): "
            f"it will fail to load this model with 'unknown model architecture: {arch}'. "
            f"Upgrade llama.cpp to b{need} or newer"
        ]
    return []


def build_too_old(caps: ServerCapabilities, arch: str | None) -> str | None:
    """Why this llama-server cannot load `arch` at all (its build predates the architecture),
    or None: unknown and shallow-clone builds are let through (build_command warns about them).
    The first build of each architecture is its family's (arch.registry.min_build)."""
    from quantpick.arch.registry import min_build

    need = min_build(arch or "")
    if need is None or caps.version or caps.build is None or caps.build == 1:
        return None
    if caps.build < need:
        return (
            f"{caps.describe()} is too old for {arch}: that architecture needs llama.cpp "
            f"b{need} or newer (it would stop with 'unknown model architecture: {arch}')"
        )
    return None


def build_command(
    config: RunConfig,
    *,
    model_path: Path | None,
    mmproj_path: Path | None,
    manifest: Manifest | None,
    block_count: int,
    server: ServerOptions,
    capabilities: ServerCapabilities | None,
    hf: HfModel | None = None,
    backend: Backend | None = None,
) -> ServerCommand:
    """The llama-server argv + env that runs `config` exactly as planned.

    `backend` (machine/backends; default CUDA) names the local devices (CUDA0, ROCm0, MTL0, ...)
    and gives the variables that select and order them.

    block_count is the GGUF's (MTP block included): full offload is written as -ngl block_count+1,
    which every build accepts (`all` is recent). With `capabilities`, optional flags the build lacks
    are dropped with a warning and a missing required one raises QuantpickError.
    """
    caps = capabilities
    local = backend or default_gpu_backend()
    warnings: list[str] = []
    env: dict[str, str] = {}
    env_from: list[tuple[str, str]] = []
    opts: list[_Opt] = []

    def has(flag: str) -> bool:
        # Without a build, assume current llama.cpp has it.
        return caps is None or caps.has(flag)

    def add(flag: str, value: str | None = None, *, required: bool = True) -> None:
        opts.append(_Opt(flag, value, required))

    if hf is not None:
        add("-hf", f"{hf.repo}:{hf.tag}")
        if hf.file is not None:
            add("--hf-file", hf.file)
        if config.vision:
            # -hf fetches a projector by itself (find_best_mmproj: the one whose bits are
            # closest to the model's), which may not be the one the plan counted.
            warnings.append(
                "-hf picks the projector itself (closest in bits to the model); the plan counted "
                f"{mmproj_path.name if mmproj_path else 'the manifest projector'}"
            )
        else:
            add("--no-mmproj")  # -hf would otherwise fetch and load one the plan did not count
        if hf.revision:
            warnings.append(
                f"-hf follows {hf.repo}'s main branch and checks no sha256; quantpick planned on "
                f"revision {hf.revision[:12]} (`quantpick get` downloads and verifies it)"
            )
    else:
        if model_path is None:
            raise UsageError("no model: give a file (-m) or a Hugging Face repo (-hf)")
        add("-m", _absolute(model_path))
        if config.vision:
            if mmproj_path is None:
                raise UsageError("the plan uses vision but no projector (mmproj) file was given")
            add("--mmproj", _absolute(mmproj_path))
    if config.rpc_servers:
        # Before --device / -ot, which may name the devices --rpc creates (parsed in order).
        add("--rpc", ",".join(config.rpc_servers))
    add("-c", str(config.ctx_size))
    add("-np", str(config.n_parallel))
    if config.kv_unified:
        if has("-kvu"):
            add("-kvu")
        else:
            # Builds before PR #14363 (mid 2025) had no per-slot streams: one KV pool shared by
            # all slots, which is what -kvu asks for, so the memory layout is the same.
            warnings.append("this build has no -kvu; its KV cache is always one shared pool")

    cpu_only = config.devices == ()
    if cpu_only:
        ngl = 0
    elif config.n_gpu_layers is None:
        ngl = block_count + 1  # every layer slot plus the output layer (notes section 2a)
    else:
        ngl = config.n_gpu_layers
    add("-ngl", str(ngl))

    # Device names: the backend's (CUDA0, ROCm0, MTL0, Vulkan0, SYCL0) with the plan's indices.
    # CUDA numbers GPUs fastest-first by default while the plan numbers them as NVML does (PCI
    # bus order): the backend's order variables pin that whenever GPUs are named.
    def local_index(name: str) -> int | None:
        return local.device_index(name) if name[-1:].isdigit() else None

    gpu_names_matter = False
    renumber: dict[int, int] = {}
    if config.devices is not None:
        names = [local.device_name(d) if isinstance(d, int) else d for d in config.devices]
        if has("--device"):
            add("--device", ",".join(names) if names else "none")
        elif any(isinstance(d, str) and local_index(d) is None for d in config.devices):
            raise QuantpickError(
                f"{caps.describe() if caps else 'this llama-server'} has no --device, which "
                "choosing RPC devices needs",
                hint="upgrade llama.cpp",
            )
        elif local.visibility_env is None:
            raise QuantpickError(
                f"{caps.describe() if caps else 'this llama-server'} has no --device, and "
                f"{local.label} has no variable that selects devices",
                hint="upgrade llama.cpp",
            )
        else:
            # The visibility variable both selects and orders the GPUs (and "" hides them all);
            # the survivors are renumbered from 0 in that order.
            indices = [i for i in (local_index(n) for n in names) if i is not None]
            env.update(local.visibility(tuple(indices)))
            renumber = {phys: pos for pos, phys in enumerate(indices)}
            warnings.append(
                f"this build has no --device; the GPUs are selected with {local.visibility_env}"
            )
        gpu_names_matter = any(local_index(n) is not None for n in names)
    if config.tensor_split is not None and not cpu_only:
        add("-ts", ",".join(_num(v) for v in config.tensor_split))
        # -ts covers the local GPUs too (after the RPC devices): their order matters.
        gpu_names_matter = True

    def buft(name: str) -> str:
        index = local_index(name)
        if index is not None and renumber:
            return local.device_name(renumber.get(index, index))
        return name

    for pattern, target in config.override_tensors:
        if "," in pattern or "=" in pattern:
            # -ot splits its value on ',' and '=' (parse_tensor_buffer_overrides).
            raise UsageError(
                f"-ot pattern {pattern!r} contains ',' or '=', which llama.cpp splits on"
            )
        add("-ot", f"{pattern}={buft(target)}")
        gpu_names_matter = gpu_names_matter or local_index(target) is not None
    # After the explicit -ot (first match wins, in command-line order), as memory.py assumes.
    if config.cpu_moe:
        if has("--cpu-moe") or not has("-ot"):
            add("--cpu-moe")
        else:
            add("-ot", f"{FFN_EXPS_REGEX}=CPU")
            warnings.append("this build has no --cpu-moe; the same override is given as -ot")
    elif config.n_cpu_moe > 0:
        if has("--n-cpu-moe") or not has("-ot"):
            add("--n-cpu-moe", str(config.n_cpu_moe))
        else:
            blocks = "|".join(str(i) for i in range(config.n_cpu_moe))
            add("-ot", rf"blk\.({blocks}){FFN_EXPS_REGEX}=CPU")
            warnings.append("this build has no --n-cpu-moe; the same override is given as -ot")
    if gpu_names_matter:
        env.update(dict(local.order_env))

    add("-ctk", config.cache_type_k)
    add("-ctv", config.cache_type_v)
    fa_info = caps.info("-fa") if caps is not None else None
    if fa_info is not None and not fa_info.takes_value:
        # Before Sept 2025 -fa was a switch (default off): no 'auto', no 'off' needed.
        quantized_v = config.cache_type_v not in ("f16", "f32", "bf16")
        if config.flash_attn == "on" or (config.flash_attn == "auto" and quantized_v):
            add("-fa")
        elif config.flash_attn == "auto":
            warnings.append("this build has no '-fa auto'; it runs with flash attention off")
    else:
        add("-fa", config.flash_attn)
    if config.ubatch != DEFAULT_UBATCH:
        add("-ub", str(config.ubatch))
    if config.batch != DEFAULT_BATCH:
        add("-b", str(config.batch))
    if not config.kv_offload:
        add("-nkvo")
    spec_type = (
        "draft-mtp" if config.spec_draft_n > 0 else "ngram-mod" if config.spec_ngram_n else None
    )
    known = spec_types(caps) if caps is not None and spec_type else None
    if spec_type and known is not None and spec_type not in known:
        # never a flag the build rejects: the plan runs without speculation
        warnings.append(
            f"this llama-server has no --spec-type {spec_type}: running without speculation"
        )
    elif config.spec_draft_n > 0:
        add("--spec-type", "draft-mtp")
        add("--spec-draft-n-max", str(config.spec_draft_n))
        if config.spec_cache_type_k != "f16":
            add("-ctkd", config.spec_cache_type_k)
        if config.spec_cache_type_v != "f16":
            add("-ctvd", config.spec_cache_type_v)
    elif config.spec_ngram_n > 0:
        add("--spec-type", "ngram-mod")
        add("--spec-ngram-mod-n-min", str(config.spec_ngram_n))
        add("--spec-ngram-mod-n-max", str(config.spec_ngram_n))

    # The placement is explicit, so --fit must not move it. Builds without --fit never adjust.
    if has("--fit"):
        add("--fit", "off", required=False)
    add("--jinja", required=False)
    if manifest is not None and manifest.reasoning:
        # Thoughts go to message.reasoning_content. --reasoning is left at its default 'auto'
        # (from the template: Qwen thinks by default), which keeps the per-request switch
        # (chat_template_kwargs enable_thinking) working; 'on' would add nothing for this model.
        add("--reasoning-format", "deepseek", required=False)
    if manifest is not None and manifest.sampling is not None:
        s = manifest.sampling
        add("--temp", _num(s.temperature), required=False)
        add("--top-p", _num(s.top_p), required=False)
        add("--top-k", str(s.top_k), required=False)
        add("--min-p", _num(s.min_p), required=False)
    add("--host", server.host)
    add("--port", str(server.port))
    alias = server.alias if server.alias is not None else (manifest.id if manifest else None)
    if alias:
        add("--alias", alias, required=False)

    if server.api_key_env is not None:
        source = _check_env_name(server.api_key_env, "api_key_env")
        if caps is not None and caps.env_var("--api-key") != "LLAMA_API_KEY":
            raise QuantpickError(
                f"{caps.describe()} does not read the API key from LLAMA_API_KEY",
                hint="upgrade llama.cpp; quantpick does not put API keys on the command line",
            )
        env_from.append(("LLAMA_API_KEY", source))
    elif server.host not in _LOOPBACK:
        warnings.append(
            f"listening on {server.host} without an API key: anyone who can reach the port can "
            "use the server (set an API key variable)"
        )

    if caps is not None:
        kept: list[_Opt] = []
        fatal: list[Problem] = []
        for opt in opts:
            # One option at a time, so a problem maps back to the option to drop or fail on.
            words = (PROGRAM, opt.flag) if opt.value is None else (PROGRAM, opt.flag, opt.value)
            problems = check_command(words, caps)
            if not problems:
                kept.append(opt)
            elif opt.required:
                fatal.extend(problems)
            else:
                warnings.append(f"dropped {opt.flag}: {problems[0].message}")
        raise_for_required(fatal, caps)
        opts = kept
        arch = manifest.architecture.name if manifest is not None else None
        warnings.extend(_version_warnings(caps, arch))
        target = caps.describe()
    else:
        target = CURRENT_TARGET
        warnings.append(
            f"{UNCHECKED_WARNING}: the command targets current llama.cpp; "
            "give quantpick a llama-server to check it against that build"
        )

    program = server.program or (caps.path if caps is not None and caps.path else PROGRAM)
    argv: list[str] = [program]
    for opt in opts:
        argv.append(opt.flag)
        if opt.value is not None:
            argv.append(opt.value)
    argv.extend(server.extra_args)

    if caps is not None:
        # Extra args are the user's: check them too, and fail rather than drop them.
        problems = check_command((PROGRAM, *server.extra_args), caps)
        raise_for_required([Problem(p.flag, True, p.message, p.value) for p in problems], caps)
        env_names = {o.flag: name for o in opts if (name := caps.env_var(o.flag)) is not None}
    else:
        env_names = {o.flag: ENV_VARS[o.flag] for o in opts if o.flag in ENV_VARS}

    return ServerCommand(
        argv=tuple(argv),
        env=env,
        warnings=tuple(warnings),
        target=target,
        env_from=tuple(env_from),
        env_names=env_names,
        devices=_local_indices(config.devices, local),
        backend=local.key,
        selected_by_env=local.visibility_env is not None and local.visibility_env in env,
        host=server.host,
        port=server.port,
        hf=hf,
    )


# ----------------------------------------------------------------------------------------------
# -hf: which file llama-server's downloader picks for a tag (common/download.cpp, b11312)

# gguf_filename_is_model: files whose name contains one of these are never the model.
_NOT_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def hf_candidates(paths: Sequence[str], tag: str) -> list[str]:
    """The repository paths llama-server's `find_best_model` accepts for `-hf repo:tag`, in
    listing order: model GGUFs (not mmproj, imatrix, ...; of a split file only the first part)
    whose path matches the regex `<tag>[.-]`, case-insensitively. The first one wins."""
    pattern = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
    out = []
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if not path.endswith(".gguf") or any(word in name for word in _NOT_MODEL):
            continue
        split = _SPLIT.search(path)
        if split and int(split.group(2)) > 1 and int(split.group(1)) != 1:
            continue
        if pattern.search(path):
            out.append(path)
    return out


def hf_model(manifest: Manifest, quant: str) -> HfModel:
    """`-hf repo:QUANT` for one quant of a manifest, with `--hf-file` whenever the tag could
    resolve to another file: another listed file matches it too (the hub's listing order, not
    the manifest's, would decide), or the quant's own file does not match it."""
    source = next((s for s in manifest.sources if s.kind == "hf" and s.repo), None)
    if source is None or source.repo is None:
        raise UsageError(
            f"{manifest.id} has no Hugging Face source for -hf",
            hint="download it (`quantpick get`) and run it from the file",
        )
    files = manifest.quant_files(quant)
    if not files:
        raise UsageError(f"{manifest.id} has no quant {quant}")
    first = files[0].name
    candidates = hf_candidates([f.name for f in manifest.files], quant)
    exact = None if candidates == [first] else first
    return HfModel(repo=source.repo, tag=quant, file=exact, revision=source.revision)


# ----------------------------------------------------------------------------------------------
# Renderers. Every argument and value goes through shlex.quote: one argument stays one argument
# whatever it contains (spaces, quotes, $(), backticks, newlines).


def _assignments(cmd: ServerCommand) -> list[str]:
    parts = [f"{_check_env_name(k, 'env')}={shlex.quote(v)}" for k, v in cmd.env.items()]
    # "$NAME" expands at run time; NAME is validated, so nothing else can be injected.
    parts += [
        f'{_check_env_name(k, "env")}="${_check_env_name(src, "env")}"' for k, src in cmd.env_from
    ]
    return parts


def render_line(cmd: ServerCommand) -> str:
    """One POSIX shell line: `VAR=value ... llama-server ...`."""
    return " ".join([*_assignments(cmd), shlex.join(cmd.argv)])


def _comment(text: str) -> list[str]:
    # A comment ends at a newline: every line of `text` gets its own '#', so a plan description
    # cannot smuggle a command into the script.
    return [f"# {line}".rstrip() for line in (text.splitlines() or [""])]


def _groups(argv: tuple[str, ...]) -> list[list[str]]:
    """Flag + value pairs, for one flag per line (cosmetic only: the words are unchanged)."""
    groups: list[list[str]] = []
    for tok in argv[1:]:
        if (
            groups
            and len(groups[-1]) == 1
            and groups[-1][0].startswith("-")
            and not tok.startswith("-")
        ):
            groups[-1].append(tok)
        else:
            groups.append([tok])
    return groups


def render_script(
    cmd: ServerCommand, plan_comment: str, workers: tuple[WorkerCommand, ...] = ()
) -> str:
    """A bash script that execs the server; the plan, warnings and the RPC workers' own lines
    (to run on those machines first) are comments."""
    lines = ["#!/usr/bin/env bash", f"{WRITTEN_BY} Plan:"]
    lines += _comment(plan_comment)
    lines += _comment(f"Target: {cmd.target}")
    for warning in cmd.warnings:
        lines += _comment(f"Warning: {warning}")
    if workers:
        lines += _comment("Start these RPC workers first, each on its own machine:")
        for w in workers:
            lines += _comment(f"  on {w.endpoint}: {shlex.join(w.argv)}")
            for warning in w.warnings:
                lines += _comment(f"    Warning: {warning}")
            for rule in w.firewall:
                lines += _comment(f"    firewall: {rule}")
    lines.append("set -euo pipefail")
    program = cmd.argv[0]
    if "/" not in program:
        # No binary was found when this was written: say so plainly instead of bash's
        # "exec: llama-server: not found".
        lines.append(
            f"command -v {shlex.quote(program)} >/dev/null 2>&1 || {{ printf '%s\\n' "
            + shlex.quote(
                f"{program} is not on PATH: install llama.cpp (or run quantpick's "
                "scripts/build-llamacpp.sh) and put it on PATH, or write this script again "
                "with quantpick get --llama-server PATH"
            )
            + " >&2; exit 127; }"
        )
    for _, src in cmd.env_from:
        # Fail with a clear message instead of starting a server without its key.
        lines.append(f': "${{{src}:?set {src} to the API key before running this script}}"')
    for part in _assignments(cmd):
        lines.append(f"export {part}")
    body = [shlex.quote(cmd.argv[0])] + [
        " ".join(shlex.quote(t) for t in g) for g in _groups(cmd.argv)
    ]
    lines.append("exec " + " \\\n  ".join(body))
    return "\n".join(lines) + "\n"


def render_json(cmd: ServerCommand) -> dict[str, Any]:
    """argv and env as data; `env_from` maps a variable to the one it must be copied from."""
    return {
        "argv": list(cmd.argv),
        "env": dict(cmd.env),
        "env_from": dict(cmd.env_from),
        "shell": render_line(cmd),
        "target": cmd.target,
        "warnings": list(cmd.warnings),
    }


def _env_value(flag: str, value: str | None, name: str) -> str:
    if value is not None:
        return value
    # A switch through its env var: "1" turns it on; a negative switch through the positive
    # variable is "0" (common_arg::get_env, is_truthy / is_falsey).
    if flag in NEGATIVE_FLAGS and "_NO_" not in name:
        return "0"
    return "1"


def render_env(cmd: ServerCommand) -> str:
    """`export` lines: LLAMA_ARG_* for every flag that has one, then the rest as a run comment.

    Flags without an env var (and repeated -ot whose patterns cannot be comma-joined) stay
    arguments, listed in the final comment line. llama-server reads the env first and lets the
    command line override it.
    """
    names: Mapping[str, str] = cmd.env_names or ENV_VARS
    exports = list(_assignments(cmd))
    rest: list[str] = []
    groups = _groups(cmd.argv)
    ot_values = [g[1] for g in groups if g[0] == "-ot" and len(g) == 2]
    ot_joinable = "-ot" in names and all("," not in v for v in ot_values)
    if ot_values and ot_joinable:
        exports.append(f"{names['-ot']}={shlex.quote(','.join(ot_values))}")
    for g in groups:
        flag, value = g[0], (g[1] if len(g) == 2 else None)
        if flag == "-ot" and ot_joinable:
            continue
        name = names.get(flag)
        if name is None or not flag.startswith("-"):
            rest.extend(g)
            continue
        exports.append(f"{name}={shlex.quote(_env_value(flag, value, name))}")
    lines = _comment(f"llama-server environment written by quantpick; target: {cmd.target}")
    lines += [f"export {e}" for e in exports]
    run = shlex.join([cmd.argv[0], *rest])
    # shlex.quote keeps newlines inside quotes; a comment cannot hold them, so show them escaped.
    lines.append("# then run: " + run.replace("\r", "\\r").replace("\n", "\\n"))
    return "\n".join(lines) + "\n"


# ---- systemd -----------------------------------------------------------------------------------
# systemd.service(5) "COMMAND LINES" and systemd.syntax(7) "QUOTING": a word may be wrapped in
# double quotes, inside which C-style escapes apply; "%" starts a specifier everywhere (written
# "%%"); "$" starts a variable in the arguments (written "$$") but not in the executable path,
# which systemd takes as written after specifiers, without undoing "$$" (systemd-analyze verify:
# "Command /opt/a$$b/llama-server is not executable"); a lone unquoted ";" separates commands;
# lines ending in "\" continue. Not the shell's rules, hence this quoting.

_SYSTEMD_SAFE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")
_SYSTEMD_ESCAPES = {
    "\\": "\\\\", '"': '\\"', "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
    "\t": "\\t", "\v": "\\v",
}  # fmt: skip
SYSTEMD_UNIT_DIR = "~/.config/systemd/user"


def systemd_quote(word: str, *, exec_line: bool = True) -> str:
    """One word for a unit file, read back by systemd as exactly `word`.

    `exec_line`: in ExecStart='s arguments a "$" expands variables, so it is doubled; in
    Environment= and in the executable path it is plain text. "%" is doubled everywhere
    (specifiers).
    """
    text = word.replace("%", "%%")
    if exec_line:
        text = text.replace("$", "$$")
    if text and _SYSTEMD_SAFE.match(text):
        return text
    out = []
    for ch in text:
        if ch in _SYSTEMD_ESCAPES:
            out.append(_SYSTEMD_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        elif 0x80 <= ord(ch) <= 0x9F or ch in "\u2028\u2029":
            out.append(f"\\u{ord(ch):04x}")  # C1 controls and Unicode line breaks, visibly
        else:
            out.append(ch)  # UTF-8 is accepted as is (systemd.syntax(7))
    return '"' + "".join(out) + '"'


def _systemd_executable(program: str) -> str:
    """The executable of ExecStart=: its path is not variable-expanded, argv[0] (the same word)
    is. With a "$" in the path, the "@" prefix gives both: the path as written, then argv[0] as
    an argument word (systemd.service(5): "@" passes the second word as argv[0])."""
    if "$" not in program:
        return systemd_quote(program, exec_line=False)
    # the prefix inside the quotes: systemd unquotes the word, then reads its prefixes
    return f"{systemd_quote('@' + program, exec_line=False)} {systemd_quote(program)}"


def systemd_unit_name(name: str) -> str:
    """A unit name from a model name: systemd allows ASCII letters, digits and ":-_.\\"."""
    cleaned = re.sub(r"[^A-Za-z0-9:_.-]+", "-", name).strip("-.") or "model"
    return f"llama-server-{cleaned}"


def render_systemd(cmd: ServerCommand, plan_comment: str, name: str) -> str:
    """A systemd user unit that runs the server and restarts it on failure, with the install
    steps as comments. The API key stays out of the unit: EnvironmentFile= names a file the user
    creates (mode 0600) holding LLAMA_API_KEY=..."""
    program = cmd.argv[0]
    if program[:1] in ("-", "@", ":", "+", "!") or any(c in program for c in "\\\"'"):
        raise UsageError(
            f"systemd cannot start {program!r}",
            hint="give the absolute path of llama-server (--llama-server PATH)",
        )
    unit = systemd_unit_name(name)
    env_file = f"%h/.config/quantpick/{unit}.env"
    lines = [f"{WRITTEN_BY} Plan:"]
    lines += _comment(plan_comment)
    lines += _comment(f"Target: {cmd.target}")
    for warning in cmd.warnings:
        lines += _comment(f"Warning: {warning}")
    lines += [
        "#",
        "# Install as a user service:",
        f"#   mkdir -p {SYSTEMD_UNIT_DIR}",
        f"#   (save this file as {SYSTEMD_UNIT_DIR}/{unit}.service)",
    ]
    for _, src in cmd.env_from:
        lines += [
            f"#   The API key: ~/.config/quantpick/{unit}.env, readable only by you, holds",
            "#   LLAMA_API_KEY=<key> (systemd does not see your shell's variables):",
            "#     mkdir -p ~/.config/quantpick && (umask 077 && printf 'LLAMA_API_KEY=%s\\n' "
            f'"${src}" > ~/.config/quantpick/{unit}.env)',
        ]
    lines += [
        f"#   systemctl --user daemon-reload && systemctl --user enable --now {unit}.service",
        f"#   journalctl --user -u {unit} -f          # its log",
        "#   loginctl enable-linger $USER            # optional: run it without a login session",
    ]
    if not program.startswith("/"):
        lines.append(
            f"# {program} is looked up in systemd's fixed PATH (/usr/local/bin, /usr/bin, ...)"
        )
    lines += [
        "",
        "[Unit]",
        # Description= is plain text with specifiers: only "%" needs escaping.
        "Description=llama-server {} (quantpick)".format(" ".join(name.split()).replace("%", "%%")),
        "After=network-online.target",
        "Wants=network-online.target",
        # Give up after 10 failed starts within 30 minutes instead of looping for ever.
        "StartLimitIntervalSec=30min",
        "StartLimitBurst=10",
        "",
        "[Service]",
        "Type=exec",
    ]
    for key, value in cmd.env.items():
        lines.append("Environment=" + systemd_quote(f"{key}={value}", exec_line=False))
    if cmd.env_from:
        # Without "-": a missing key file stops the start, rather than serving without a key.
        lines.append(f"EnvironmentFile={env_file}")
    body = [_systemd_executable(program)] + [
        " ".join(systemd_quote(t) for t in g) for g in _groups(cmd.argv)
    ]
    lines.append("ExecStart=" + " \\\n  ".join(body))
    lines += [
        "Restart=on-failure",
        # Back-off: 5 s, growing to 2 min over 5 restarts (RestartSteps= and
        # RestartMaxDelaySec= need systemd 254; older versions ignore them and keep 5 s).
        "RestartSec=5s",
        "RestartSteps=5",
        "RestartMaxDelaySec=2min",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


# ---- docker compose ------------------------------------------------------------------------------
# The official llama.cpp server images (llama.cpp docs/docker.md): ":server" (CPU) and
# ":server-cuda" (CUDA 12); their entrypoint is /app/llama-server, so `command:` is the argv
# without the program. Written by hand (no YAML library is a dependency): every string is a
# double-quoted YAML scalar, and "$" is doubled because compose interpolates every value.

COMPOSE_IMAGE_CPU = "ghcr.io/ggml-org/llama.cpp:server"
_CONTAINER_HF_HOME = "/hf"
_PATH_FLAGS = ("-m", "--mmproj")


def yaml_str(text: str, *, interpolate: bool = False) -> str:
    """A double-quoted YAML scalar (JSON's escapes are YAML's), with the characters YAML 1.1
    treats as line breaks (NEL, LS, PS) and the C1 controls escaped too. Without `interpolate`,
    "$" is doubled so compose reads it literally."""
    import json

    if not interpolate:
        text = text.replace("$", "$$")
    quoted = json.dumps(text, ensure_ascii=False)
    return "".join(
        f"\\u{ord(ch):04x}" if 0x7F <= ord(ch) <= 0x9F or ch in "\u2028\u2029" else ch
        for ch in quoted
    )


def _published(host: str, port: int) -> str:
    """The `ports:` entry: the server listens on all interfaces inside the container, and the
    host side keeps the address --host asked for (loopback by default)."""
    if host.endswith(".sock"):
        raise UsageError("--format compose publishes a TCP port; --host cannot be a socket")
    if host in ("0.0.0.0", "::", "[::]", ""):
        return f"{port}:{port}"
    if host in ("localhost",):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}:{port}"


def _container_index(cmd: ServerCommand) -> dict[int, int]:
    """Device index in the argv -> inside the container, where only the reserved GPUs exist and,
    in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID), are numbered from 0."""
    if not cmd.devices:
        return {}
    order = sorted(cmd.devices)
    variable = backend_named(cmd.backend).visibility_env
    if cmd.selected_by_env and variable:  # the argv numbers GPUs by their place in that list
        listed = [int(i) for i in re.findall(r"\d+", cmd.env[variable])]
        return {pos: order.index(phys) for pos, phys in enumerate(listed)}
    return {phys: order.index(phys) for phys in cmd.devices}


def _local_indices(devices: tuple[int | str, ...] | None, local: Backend) -> tuple[int, ...] | None:
    """--device's local devices as indices ("ROCm1" -> 1); RPC devices are not this host's."""
    if devices is None:
        return None
    out = []
    for d in devices:
        if isinstance(d, int):
            out.append(d)
        elif d[-1:].isdigit() and (index := local.device_index(d)) is not None:
            out.append(index)
    return tuple(out)


def render_compose(
    cmd: ServerCommand, plan_comment: str, machine_gpus: Sequence[int] | None = None
) -> str:
    """A docker compose file running the plan in the official llama.cpp server image: the model
    directory mounted read-only (paths rewritten), the plan's GPUs reserved, the port published
    on the --host address, the API key and HF token by reference.

    `machine_gpus`: the NVML indices of the machine's GPUs, reserved when the plan uses them all
    (`cmd.devices` is None); without them the reservation is `count: all`.
    """
    local = backend_named(cmd.backend)
    gpus = cmd.devices is None or bool(cmd.devices)
    reserved = cmd.devices if cmd.devices is not None else (tuple(machine_gpus or ()) or None)
    # The image built for the backend (llama.cpp docs/docker.md: server-cuda, server-rocm,
    # server-vulkan, server-intel); Metal has none (macOS runs no GPU in containers).
    if gpus and not local.image_suffix:
        raise UsageError(
            f"--format compose: llama.cpp publishes no {local.label} image "
            "(containers on macOS get no GPU)",
            hint="use --format script or systemd",
        )
    image = f"{COMPOSE_IMAGE_CPU}-{local.image_suffix}" if gpus else COMPOSE_IMAGE_CPU
    renumber = _container_index(cmd)
    prefix = re.escape(local.device_prefix)

    def renamed(text: str) -> str:
        return re.sub(
            rf"{prefix}(\d+)",
            lambda m: local.device_name(renumber.get(int(m[1]), int(m[1]))),
            text,
        )

    mounts: dict[str, str] = {}  # host directory -> container directory
    args: list[str] = []
    argv = list(cmd.argv[1:])
    i = 0
    while i < len(argv):
        word = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if word in _PATH_FLAGS and value is not None:
            host_path = Path(value)
            target = mounts.setdefault(
                str(host_path.parent), "/models" + (f"-{len(mounts) + 1}" if mounts else "")
            )
            args += [word, f"{target}/{host_path.name}"]
            i += 2
            continue
        if word == "--host" and value is not None:
            args += [word, "0.0.0.0"]  # inside the container; `ports:` decides who can reach it
            i += 2
            continue
        if renumber and word in ("--device", "-dev", "-ot", "--override-tensor") and value:
            args += [word, renamed(value)]
            i += 2
            continue
        args.append(word)
        i += 1

    env = {k: v for k, v in cmd.env.items() if k != local.visibility_env}
    lines = [f"{WRITTEN_BY} Plan:"]
    lines += _comment(plan_comment)
    lines += _comment(
        f"Flags checked against: {cmd.target}; the image runs its own llama.cpp build "
        "(pin a release tag of the image to keep them in step)"
    )
    for warning in cmd.warnings:
        lines += _comment(f"Warning: {warning}")
    lines.append("# Run: docker compose -f THIS_FILE up -d")
    if gpus and local.container_gpu_driver:
        lines.append(f"# GPUs need {local.container_runtime} on the host.")
    elif gpus:
        lines.append(f"# {local.label} reaches the GPUs through the host's device files.")
    for _, src in cmd.env_from:
        lines.append(f"# The API key comes from ${src} (in the shell or an .env file beside this).")
    lines += ["services:", "  llama-server:", f"    image: {yaml_str(image)}", "    command:"]
    lines += [f"      - {yaml_str(a)}" for a in args]
    environment = [f"      {k}: {yaml_str(v)}" for k, v in env.items()]
    for key, src in cmd.env_from:
        ref = f"${{{_check_env_name(src, 'env')}:?set {src} to the API key}}"
        name = _check_env_name(key, "env")
        environment.append(f"      {name}: {yaml_str(ref, interpolate=True)}")
    if cmd.hf is not None:
        environment.append(f"      HF_HOME: {yaml_str(_CONTAINER_HF_HOME)}")
        environment.append(f"      HF_TOKEN: {yaml_str('${HF_TOKEN:-}', interpolate=True)}")
    if environment:
        lines += ["    environment:", *environment]
    volumes = []
    for source, target in mounts.items():
        volumes += [
            "      - type: bind",
            f"        source: {yaml_str(source)}",
            f"        target: {yaml_str(target)}",
            "        read_only: true",
        ]
    if cmd.hf is not None:
        volumes += [
            "      - type: volume",
            '        source: "hf-cache"',
            f"        target: {yaml_str(_CONTAINER_HF_HOME)}",
        ]
    if volumes:
        lines += ["    volumes:", *volumes]
    health = f"http://localhost:{cmd.port}/health"
    lines += [
        "    ports:",
        f"      - {yaml_str(_published(cmd.host, cmd.port))}",
        "    healthcheck:",
        f'      test: ["CMD", "curl", "-f", {yaml_str(health)}]',
        "      interval: 30s",
        "      start_period: 15m  # loading tens of GB takes a while",
        "    restart: unless-stopped",
    ]
    if gpus and not local.container_gpu_driver:
        # the backend's device files (machine/backends: ROCm /dev/kfd and /dev/dri, ...)
        lines += ["    devices:", *(f"      - {yaml_str(n)}" for n in local.container_devices)]
    elif gpus:
        lines += [
            "    deploy:",
            "      resources:",
            "        reservations:",
            "          devices:",
            f"            - driver: {yaml_str(local.container_gpu_driver or '')}",
        ]
        if reserved is None:
            lines.append('              count: "all"')
        else:
            ids = ", ".join(yaml_str(str(d)) for d in sorted(reserved))
            lines.append(f"              device_ids: [{ids}]")
        lines.append('              capabilities: ["gpu"]')
    if cmd.hf is not None:
        lines += ["volumes:", "  hf-cache: {}"]
    return "\n".join(lines) + "\n"


# The marker line of every file quantpick renders (script, systemd unit, compose file): a file
# holding it in its first bytes is one quantpick wrote, and may replace.
WRITTEN_BY = "# Written by quantpick."
_MARKER_SCAN_BYTES = 4096


def check_script_target(path: Path, *, force: bool = False) -> Existing:
    """What is at `path`, when quantpick may write the script there (quantpick.outputs' policy):
    absent, a regular file quantpick wrote (its marker line), or, with `force`, any regular file
    or a symbolic link (the link is replaced, never its target). A device, FIFO, socket or
    directory is never written over, even with `force` (as root, writing over /dev/null would
    turn it into a regular file). UsageError (exit 2) otherwise."""
    from quantpick.outputs import check_output

    existing = check_output(path, "--script", force=force)
    data = existing.data
    if data is not None and not force and WRITTEN_BY.encode() not in data[:_MARKER_SCAN_BYTES]:
        raise UsageError(
            f"--script {path}: exists and was not written by quantpick (no {WRITTEN_BY!r} line "
            "at its start); it is left as it is",
            hint="pass --force to replace it (the old file is kept as a backup), or choose "
            "another path",
        )
    return existing


def write_script(path: Path, text: str, *, force: bool = False) -> None:
    """Write `text` to `path` atomically with mode 0755, only where `check_script_target`
    allows (checked again here, just before the write). A file quantpick did not write, replaced
    with `force`, is kept as a backup first (FILE.bak, .bak.1, ...)."""
    from quantpick.outputs import write_output

    existing = check_script_target(path, force=force)
    theirs = existing.data is not None and WRITTEN_BY.encode() not in existing.data
    try:
        # surrogateescape: a path that is not UTF-8 (a model directory named in Latin-1) reaches
        # the script as the bytes it is on disk, which bash then opens as they are.
        data = text.encode("utf-8", "surrogateescape")
        write_output(path, data, existing, "the launch script", backup=theirs, mode=0o755)
    except QuantpickError as exc:
        if exc.hint is None or "choose a file" in exc.hint:
            exc.hint = "choose a --script path in a directory you can write to"
        raise


# Flags that say where the model comes from or how the server listens, not how memory is placed.
_NOT_PLACEMENT = {
    "-m",
    "--mmproj",
    "--host",
    "--port",
    "--alias",
    "--fit",
    "--jinja",
    "--reasoning-format",
    "--temp",
    "--top-p",
    "--top-k",
    "--min-p",
}


def placement_flags(config: RunConfig, block_count: int) -> list[str]:
    """The llama-server flags a plan implies for memory and placement (for `pick` output):
    `-c 262144 -np 1 -ngl 42 -ts 27,15 -ctk f16 -ctv f16 -fa on`, as shell words."""
    cmd = build_command(
        config,
        model_path=Path("/model.gguf"),
        mmproj_path=Path("/mmproj.gguf") if config.vision else None,
        manifest=None,
        block_count=block_count,
        server=ServerOptions(),
        capabilities=None,
    )
    words: list[str] = [f"{k}={v}" for k, v in sorted(cmd.env.items())]
    argv = list(cmd.argv[1:])
    i = 0
    while i < len(argv):
        flag = argv[i]
        takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("-") or flag == "-ot"
        value = argv[i + 1] if takes_value and i + 1 < len(argv) else None
        if flag not in _NOT_PLACEMENT:
            words.append(flag)
            if value is not None:
                words.append(shlex.quote(value))
        i += 2 if value is not None else 1
    return words


# ----------------------------------------------------------------------------------------------
# RPC workers: one `ggml-rpc-server` per machine that lends its devices to the head.

RPC_SERVER_PROGRAM = "ggml-rpc-server"
# The worker's tensor cache (-c): weight tensors above HASH_THRESHOLD (10 MiB, ggml-rpc.cpp:87,717)
# are offered by hash first (RPC_CMD_SET_TENSOR_HASH); the worker saves those it receives in full
# (rpc_server::set_tensor) under $LLAMA_CACHE/rpc or ~/.cache/llama.cpp/rpc
# (tools/rpc/rpc-server.cpp fs_get_cache_directory).
RPC_CACHE_DIR = "$LLAMA_CACHE/rpc (default ~/.cache/llama.cpp/rpc)"


@dataclass(frozen=True)
class WorkerCommand:
    endpoint: str  # what the head's --rpc names
    argv: tuple[str, ...]
    bind: str  # -H: the IPv4 address the worker listens on
    devices: tuple[str, ...]  # the head's names for the worker's devices: "RPC0", ...
    cache: bool  # -c: the worker keeps the weights it receives on its disk
    cache_bytes: int | None  # about what the cache holds: the weights planned on the worker
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    firewall: tuple[str, ...]  # commands to run on the worker so that only the head gets in


def _ipv4(text: str) -> bool:
    import ipaddress  # only when there are workers

    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def _loopback(text: str) -> bool:
    return text.startswith("127.") and _ipv4(text)


def build_worker_commands(
    workers: tuple[RpcWorker, ...],
    *,
    bind: str | None = None,
    cache: bool = True,
    program: str = RPC_SERVER_PROGRAM,
    weights_bytes: Mapping[str, int] | None = None,
) -> tuple[WorkerCommand, ...]:
    """The `ggml-rpc-server` line of each worker (flags of tools/rpc/rpc-server.cpp at b11312:
    -H host, -p port, -d dev1,dev2 (comma or '/'), -c cache switch, -t CPU threads).

    `bind` (--rpc-bind) is the address every worker listens on; by default each binds the
    address the head reaches it at. ggml-rpc-server binds IPv4 literals only (transport.cpp
    create_server: inet_addr), so a worker named by host name needs its address resolved first
    (RpcWorker.address). quantpick never picks 0.0.0.0 on its own. `weights_bytes` (endpoint ->
    bytes planned on it) sizes the tensor cache.
    """
    if bind is not None and not _ipv4(bind):
        raise UsageError(
            f"--rpc-bind {bind}: ggml-rpc-server binds an IPv4 address (e.g. 192.168.1.20)"
        )
    out: list[WorkerCommand] = []
    n_devices = 0
    for worker in workers:
        names = tuple(f"RPC{n_devices + i}" for i in range(len(worker.devices)))
        n_devices += len(worker.devices)
        reach = worker.address if worker.address and _ipv4(worker.address) else None
        if reach is None and _ipv4(worker.host):
            reach = worker.host
        address = bind if bind is not None else reach
        if address is None:
            raise UsageError(
                f"RPC worker {worker.endpoint}: cannot tell which IPv4 address it should bind "
                f"({worker.host!r} does not resolve here)",
                hint="name it by its IPv4 address, or give --rpc-bind ADDR",
            )
        argv = [program, "-H", address, "-p", str(worker.port)]
        warnings: list[str] = []
        notes: list[str] = []
        firewall: list[str] = []
        if worker.probed:
            notes.append(
                f"the RPC protocol does not name a worker's devices: if {worker.endpoint} was "
                "started with -d, keep that -d (the plan uses the devices it serves now)"
            )
        else:
            device_names = [backend_of(g.backend).device_name(g.index) for g in worker.devices]
            argv += ["-d", ",".join(device_names)]
            notes.append(
                f"-d assumes the described device(s) are the worker's {device_names[0]}.. in "
                f"that order; `{program} -d x` lists its devices"
            )
        if cache:
            argv.append("-c")
            size = (weights_bytes or {}).get(worker.endpoint)
            held = f" (about {human(size)} of its disk)" if size else ""
            notes.append(
                f"-c: {worker.endpoint} keeps the weights it receives{held} in {RPC_CACHE_DIR}; "
                "the next load sends a hash per large tensor instead of the tensor"
            )
        head = worker.head_address or "<head-ip>"
        if address == "0.0.0.0":
            warnings.append(
                f"{worker.endpoint}: ggml-rpc-server binds every interface (0.0.0.0), so anyone "
                "on any network that machine is on can use it: the RPC protocol has no "
                "authentication (rpc-server warns: never expose it to an open network). Bind its "
                "LAN address instead and let only the head in"
            )
        elif _loopback(address) and reach is not None and not _loopback(reach):
            warnings.append(
                f"{worker.endpoint}: bound to {address}, it cannot be reached from the head"
            )
        elif reach is not None and address != reach and not _loopback(address):
            warnings.append(
                f"{worker.endpoint}: bound to {address}, but the head reaches it at {reach}"
            )
        if not _loopback(address):
            if address != "0.0.0.0":
                warnings.append(
                    f"{worker.endpoint}: ggml-rpc-server on {address} accepts whoever reaches "
                    f"that address (no authentication): let only the head ({head}) in"
                )
            firewall.append(
                f"sudo ufw allow from {head} to any port {worker.port} proto tcp"
                "  # with ufw enabled (default: deny incoming)"
            )
        out.append(
            WorkerCommand(
                endpoint=worker.endpoint,
                argv=tuple(argv),
                bind=address,
                devices=names,
                cache=cache,
                cache_bytes=(weights_bytes or {}).get(worker.endpoint) if cache else None,
                warnings=tuple(warnings),
                notes=tuple(notes),
                firewall=tuple(firewall),
            )
        )
    return tuple(out)


def render_worker_json(worker: WorkerCommand) -> dict[str, Any]:
    return {
        "endpoint": worker.endpoint,
        "argv": list(worker.argv),
        "shell": shlex.join(worker.argv),
        "bind": worker.bind,
        "devices": list(worker.devices),
        "cache": worker.cache,
        "cache_bytes": worker.cache_bytes,
        "warnings": list(worker.warnings),
        "notes": list(worker.notes),
        "firewall": list(worker.firewall),
    }


def render_worker_lines(workers: tuple[WorkerCommand, ...]) -> str:
    """The workers' lines as a shell snippet: a comment saying where, then the command."""
    lines: list[str] = []
    for w in workers:
        lines += _comment(f"on the RPC worker {w.endpoint} ({', '.join(w.devices)}), first:")
        lines.append(shlex.join(w.argv))
        for rule in w.firewall:
            lines += _comment(f"  and: {rule}")
    return "\n".join(lines) + ("\n" if lines else "")
