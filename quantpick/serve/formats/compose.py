"""`--format compose`: a docker compose file that runs the plan in llama.cpp's official server
image (llama.cpp docs/docker.md)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from quantpick.errors import UsageError
from quantpick.machine.backends import backend as backend_named
from quantpick.serve.command import ServerCommand, check_env_name, comment_lines
from quantpick.serve.formats.base import (
    Emission,
    Emitted,
    OutputFormat,
    Reporter,
    text_output,
    yaml_str,
)
from quantpick.serve.formats.systemd import workers_run_elsewhere
from quantpick.serve.script_file import WRITTEN_BY

COMPOSE_IMAGE_CPU = "ghcr.io/ggml-org/llama.cpp:server"


_CONTAINER_HF_HOME = "/hf"


_PATH_FLAGS = ("-m", "--mmproj")


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
    lines += comment_lines(plan_comment)
    lines += comment_lines(
        f"Flags checked against: {cmd.target}; the image runs its own llama.cpp build "
        "(pin a release tag of the image to keep them in step)"
    )
    for warning in cmd.warnings:
        lines += comment_lines(f"Warning: {warning}")
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
        ref = f"${{{check_env_name(src, 'env')}:?set {src} to the API key}}"
        name = check_env_name(key, "env")
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


class Compose(OutputFormat):
    name = "compose"

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        text = render_compose(job.cmd, job.comment, job.machine_gpus)
        say.note("Run: save it as compose.yaml, then: docker compose up -d")
        workers_run_elsewhere(job, say)
        return text_output(text)


FORMAT = Compose()
