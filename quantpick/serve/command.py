"""The llama-server command for a plan: argv + env, rendered as a line, a script, JSON or env.

Pure except `write_script`. Flags use llama.cpp's spellings (notes `llamacpp-memory.md` section 4,
tree 0c1e570). With `capabilities` (from `serve.flags.capabilities_for`) the command is adapted to
and checked against that build; without, it targets current llama.cpp and says so.

Secrets: the API key is never part of the command. `ServerOptions.api_key_env` names an environment
variable that holds it; the command maps it to `LLAMA_API_KEY`, which llama-server reads itself
(`--api-key` env). It is passed by reference (`LLAMA_API_KEY="$NAME"`) in the line, script and env
formats, so the key appears neither in the rendered text nor in the process's argv (`ps`), only in
its environment, which other users cannot read.

Usage:
    cmd = build_command(config, model_path=path, mmproj_path=None, manifest=m, block_count=40,
                        server=ServerOptions(), capabilities=None)
    print(render_line(cmd))
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantpick.errors import QuantpickError, UsageError
from quantpick.machine.llamacpp import QWEN35MOE_MIN_BUILD
from quantpick.model.manifest import Manifest
from quantpick.plan.memory import RunConfig
from quantpick.serve.flags import (
    Problem,
    ServerCapabilities,
    check_command,
    raise_for_required,
)

PROGRAM = "llama-server"
# llama-server defaults (common/common.h): -ub 512, -b 2048. Emitted only when they differ.
DEFAULT_UBATCH = 512
DEFAULT_BATCH = 2048
# What the command targets when no binary was checked.
CURRENT_TARGET = (
    "current llama.cpp (flags of tree 0c1e570, 2026-10-01; not checked against a binary)"
)
# Architectures whose support landed late, with the first build that loads them.
MIN_BUILD_FOR_ARCH = {"qwen35moe": QWEN35MOE_MIN_BUILD}

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


@dataclass
class _Opt:
    flag: str
    value: str | None
    required: bool


def _num(value: float) -> str:
    """0.6 -> '0.6', 20.0 -> '20', 0.0 -> '0' (llama.cpp parses all with std::stof/stoi)."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _absolute(path: Path) -> str:
    # Absolute paths never start with '-', so llama-server cannot read one as a flag, and the
    # command keeps working when run from another directory.
    return str(path if path.is_absolute() else Path.cwd() / path)


def _check_env_name(name: str, what: str) -> str:
    if not _ENV_NAME.match(name):
        raise UsageError(f"{what} {name!r} is not a valid environment variable name")
    return name


def _version_warnings(caps: ServerCapabilities, arch: str | None) -> list[str]:
    need = MIN_BUILD_FOR_ARCH.get(arch or "")
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
            f"{caps.describe()} is older than {arch} support (PR #19468, first release ~b{need}): "
            f"it will fail to load this model with 'unknown model architecture: {arch}'. "
            f"Upgrade llama.cpp to b{need} or newer"
        ]
    return []


def build_command(
    config: RunConfig,
    *,
    model_path: Path,
    mmproj_path: Path | None,
    manifest: Manifest | None,
    block_count: int,
    server: ServerOptions,
    capabilities: ServerCapabilities | None,
) -> ServerCommand:
    """The llama-server argv + env that runs `config` exactly as planned.

    block_count is the GGUF's (MTP block included): full offload is written as -ngl block_count+1,
    which every build accepts (`all` is recent). With `capabilities`, optional flags the build lacks
    are dropped with a warning and a missing required one raises QuantpickError.
    """
    caps = capabilities
    warnings: list[str] = []
    env: dict[str, str] = {}
    env_from: list[tuple[str, str]] = []
    opts: list[_Opt] = []

    def has(flag: str) -> bool:
        # Without a build, assume current llama.cpp has it.
        return caps is None or caps.has(flag)

    def add(flag: str, value: str | None = None, *, required: bool = True) -> None:
        opts.append(_Opt(flag, value, required))

    add("-m", _absolute(model_path))
    if config.vision:
        if mmproj_path is None:
            raise UsageError("the plan uses vision but no projector (mmproj) file was given")
        add("--mmproj", _absolute(mmproj_path))
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

    # Device names: llama.cpp calls GPUs CUDA<runtime index>; the plan's indices are NVML's (PCI
    # bus order). CUDA's default order is fastest-first, so pin PCI order whenever GPUs are named.
    gpu_names_matter = False
    cuda_renumber: dict[int, int] = {}
    if config.devices is not None:
        if has("--device"):
            value = ",".join(f"CUDA{i}" for i in config.devices) if config.devices else "none"
            add("--device", value)
        else:
            # CUDA_VISIBLE_DEVICES both selects and orders the GPUs (and "" hides them all);
            # the survivors are renumbered CUDA0.. in that order.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in config.devices)
            cuda_renumber = {phys: pos for pos, phys in enumerate(config.devices)}
            warnings.append(
                "this build has no --device; the GPUs are selected with CUDA_VISIBLE_DEVICES"
            )
        gpu_names_matter = bool(config.devices)
    if config.tensor_split is not None and not cpu_only:
        add("-ts", ",".join(_num(v) for v in config.tensor_split))
        gpu_names_matter = True

    def buft(name: str) -> str:
        m = re.fullmatch(r"CUDA(\d+)", name)
        if m and cuda_renumber:
            return f"CUDA{cuda_renumber.get(int(m.group(1)), int(m.group(1)))}"
        return name

    for pattern, target in config.override_tensors:
        if "," in pattern or "=" in pattern:
            # -ot splits its value on ',' and '=' (parse_tensor_buffer_overrides).
            raise UsageError(
                f"-ot pattern {pattern!r} contains ',' or '=', which llama.cpp splits on"
            )
        add("-ot", f"{pattern}={buft(target)}")
        gpu_names_matter = gpu_names_matter or target.upper().startswith("CUDA")
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
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"

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
    if config.spec_draft_n > 0:
        add("--spec-type", "draft-mtp")
        add("--spec-draft-n-max", str(config.spec_draft_n))

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
            "no llama-server was checked: the command targets current llama.cpp; "
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
    )


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


def render_script(cmd: ServerCommand, plan_comment: str) -> str:
    """A bash script that execs the server; the plan and warnings are comments."""
    lines = ["#!/usr/bin/env bash", "# Written by quantpick. Plan:"]
    lines += _comment(plan_comment)
    lines += _comment(f"Target: {cmd.target}")
    for warning in cmd.warnings:
        lines += _comment(f"Warning: {warning}")
    lines.append("set -euo pipefail")
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


def write_script(path: Path, text: str) -> None:
    """Write `text` to `path` atomically with mode 0755 (temp file in the same dir + os.replace)."""
    import tempfile  # only when writing: `pick` imports this module for its flags

    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # a read-only or missing directory: one line naming the path
        raise QuantpickError(
            f"cannot write the launch script: {path}: {exc.strerror or exc}",
            hint="choose a --script path in a directory you can write to",
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            # Explicit mode: mkstemp creates 0600 and the umask must not decide executability.
            os.fchmod(f.fileno(), 0o755)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise QuantpickError(
                f"cannot write the launch script: {path}: {exc.strerror or exc}"
            ) from None
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
