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
from dataclasses import dataclass, field
from pathlib import Path

from quantpick.errors import QuantpickError, UsageError
from quantpick.machine.backends import Backend, default_gpu_backend
from quantpick.model.manifest import Manifest
from quantpick.plan.memory import RunConfig
from quantpick.serve.flags import (
    Problem,
    ServerCapabilities,
    check_command,
    raise_for_required,
    spec_types,
)

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


def flag_number(value: float) -> str:
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


def check_env_name(name: str, what: str) -> str:
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
        add("-ts", ",".join(flag_number(v) for v in config.tensor_split))
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
        "draft-mtp"
        if config.spec_draft_n > 0
        else "draft-simple"
        if config.draft is not None
        else "ngram-mod"
        if config.spec_ngram_n
        else None
    )
    known = spec_types(caps) if caps is not None and spec_type else None
    if spec_type and known is not None and spec_type not in known:
        # never a flag the build rejects: the plan runs without speculation
        warnings.append(
            f"this llama-server has no --spec-type {spec_type}: running without speculation"
        )
    elif spec_type is not None and spec_type.startswith("draft-"):
        # MTP (the model's NextN block, or an mtp- sidecar given as the draft file) or a draft
        # model (plan/draft.py): the draft file, where it goes (-devd none -ngld 0: the host;
        # else one GPU, all its layers), the draft count and the draft context's cache types
        add("--spec-type", spec_type)
        d = config.draft
        if d is not None:
            add("-hfd" if d.hub else "-md", d.path)
        add("--spec-draft-n-max", str(config.spec_draft_n or (d.n_max if d else 0)))
        if d is not None:
            add("-ngld", "all" if d.n_gpu_layers is None else str(d.n_gpu_layers))
            if d.devices is not None:
                names = [local.device_name(x) if isinstance(x, int) else x for x in d.devices]
                add("-devd", ",".join(buft(n) for n in names) if names else "none")
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
        add("--temp", flag_number(s.temperature), required=False)
        add("--top-p", flag_number(s.top_p), required=False)
        add("--top-k", str(s.top_k), required=False)
        add("--min-p", flag_number(s.min_p), required=False)
    add("--host", server.host)
    add("--port", str(server.port))
    alias = server.alias if server.alias is not None else (manifest.id if manifest else None)
    if alias:
        add("--alias", alias, required=False)

    if server.api_key_env is not None:
        source = check_env_name(server.api_key_env, "api_key_env")
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
        devices=local_indices(config.devices, local),
        backend=local.key,
        selected_by_env=local.visibility_env is not None and local.visibility_env in env,
        host=server.host,
        port=server.port,
        hf=hf,
    )


# ----------------------------------------------------------------------------------------------
# -hf: which file llama-server's downloader picks for a tag (common/download.cpp, b11312)

# ----------------------------------------------------------------------------------------------
# Renderers. Every argument and value goes through shlex.quote: one argument stays one argument
# whatever it contains (spaces, quotes, $(), backticks, newlines).


def comment_lines(text: str) -> list[str]:
    # A comment ends at a newline: every line of `text` gets its own '#', so a plan description
    # cannot smuggle a command into the script.
    return [f"# {line}".rstrip() for line in (text.splitlines() or [""])]


# ---- systemd -----------------------------------------------------------------------------------
# systemd.service(5) "COMMAND LINES" and systemd.syntax(7) "QUOTING": a word may be wrapped in
# double quotes, inside which C-style escapes apply; "%" starts a specifier everywhere (written
# "%%"); "$" starts a variable in the arguments (written "$$") but not in the executable path,
# which systemd takes as written after specifiers, without undoing "$$" (systemd-analyze verify:
# "Command /opt/a$$b/llama-server is not executable"); a lone unquoted ";" separates commands;
# lines ending in "\" continue. Not the shell's rules, hence this quoting.

# ---- docker compose ------------------------------------------------------------------------------
# The official llama.cpp server images (llama.cpp docs/docker.md): ":server" (CPU) and
# ":server-cuda" (CUDA 12); their entrypoint is /app/llama-server, so `command:` is the argv
# without the program. Written by hand (no YAML library is a dependency): every string is a
# double-quoted YAML scalar, and "$" is doubled because compose interpolates every value.


def local_indices(devices: tuple[int | str, ...] | None, local: Backend) -> tuple[int, ...] | None:
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
