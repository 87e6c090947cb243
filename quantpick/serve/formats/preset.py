"""`--format preset`: the plan as a section of llama.cpp's router presets (an INI file,
`llama-server --models-preset FILE`), merged into the file --preset names, and the router's
start line with a --models-max that fits the machine.

A section of the same name is replaced only while it still is what quantpick wrote (its stamp);
one written by hand, or edited since, is refused without --force. A file the router would not
read is refused, not merged.

Sources: b11312 common/preset.cpp (the INI grammar: a value runs to the end of the line or to
the first ';' or '#', trailing blanks dropped, no quoting or escapes; keys are any spelling of an
option without its dashes, `common_preset_context::load_from_ini`; a section seen twice keeps its
last copy) and tools/server/server-models.cpp (the router sets host, port and alias of each child
and drops API keys from presets; --models-max is the router's own flag; `GET /models?reload=1`
rereads the sources).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantpick.errors import UsageError
from quantpick.outputs import Authorship, authorship, refuse_theirs, stamp
from quantpick.serve.command import ServerCommand, comment_lines
from quantpick.serve.formats.base import (
    EcosystemOptions,
    Emission,
    Emitted,
    OutputFormat,
    Reporter,
    flag_pairs,
)
from quantpick.serve.formats.target import Target
from quantpick.units import human

# llama-server's router flag (tools/server/server.cpp), named in hints: not a quantpick option
MODELS_PRESET_FLAG = "--models-preset"


# Our flag -> its long name, the INI key (common/arg.cpp; --help of b11312). A switch is written
# `key = true`; `no-kv-offload = true` is read as kv-offload false (preset.cpp parse_bool_arg).
INI_KEYS = {
    "-m": "model", "--mmproj": "mmproj", "-hf": "hf-repo", "--hf-file": "hf-file",
    "--no-mmproj": "no-mmproj", "--rpc": "rpc", "-c": "ctx-size", "-np": "parallel",
    "-kvu": "kv-unified", "-ngl": "n-gpu-layers", "--device": "device", "-ts": "tensor-split",
    "-ot": "override-tensor", "--n-cpu-moe": "n-cpu-moe", "--cpu-moe": "cpu-moe",
    "-ctk": "cache-type-k", "-ctv": "cache-type-v", "-fa": "flash-attn", "-ub": "ubatch-size",
    "-b": "batch-size", "-nkvo": "no-kv-offload", "--spec-type": "spec-type",
    "--spec-draft-n-max": "spec-draft-n-max", "--fit": "fit", "--jinja": "jinja",
    "--reasoning-format": "reasoning-format", "--temp": "temp", "--top-p": "top-p",
    "--top-k": "top-k", "--min-p": "min-p",
}  # fmt: skip
# Set by the router for each child (server-models.cpp update_args), so never written.
ROUTER_OWNED = frozenset({"--host", "--port", "--alias"})
MARKER = "; quantpick"  # every comment line quantpick writes in its section starts so
MEMORY_MARKER = "; quantpick-memory:"
_HEADER = re.compile(r"^\[[ \t]*([^\]\r\n]*?)[ \t]*\][ \t]*(?:[;#].*)?$")
_SECTION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./@+-]*$")


def preset_section_name(name: str) -> str:
    """A valid section name for a model name that is not one (`command --gguf "my model.gguf"`):
    each run of other characters becomes one "-", and the name starts with a letter, digit or
    "_" (_SECTION_NAME). The name itself when it is valid."""
    if _SECTION_NAME.match(name):
        return name
    derived = re.sub(r"[^A-Za-z0-9_./@+-]+", "-", name).strip("-./@+")
    return derived if _SECTION_NAME.match(derived) else "model"


def ini_value(value: str, what: str) -> str:
    """A value llama.cpp's INI reader gives back unchanged (it has no quoting)."""
    if any(c in value for c in ";#\r\n") or value != value.strip():
        raise UsageError(
            f"{what} {value!r} cannot be written in a llama.cpp preset: its INI format ends a "
            "value at ';', '#' or the end of the line and has no quoting",
            hint="move or rename the file so that its path has none of them",
        )
    return value


def preset_section(cmd: ServerCommand, target: Target) -> tuple[list[str], list[str]]:
    """(the section's lines, warnings) for `cmd` in router mode."""
    name = target.name
    if not _SECTION_NAME.match(name):
        raise UsageError(
            f"--alias {name!r}: a preset section name is letters, digits and . _ - / @ +",
            hint="give --alias NAME",
        )
    if cmd.selected_by_env:
        raise UsageError(
            "this llama-server has no --device: a router preset cannot choose the GPUs per model",
            hint="upgrade llama.cpp (b6000 or newer has --device)",
        )
    warnings: list[str] = []
    lines = [f"; {line}".rstrip() for line in _comment_lines(target.plan_comment)]
    if target.devices:
        memory = " ".join(f"{d.device}={d.total_bytes}/{d.budget_bytes}" for d in target.devices)
        lines.append(f"{MEMORY_MARKER} machine={target.machine_key} {memory}")
    overrides: list[str] = []
    for flag, value in flag_pairs(cmd):
        if flag in ROUTER_OWNED:
            continue
        if flag == "-ot" and value is not None:
            overrides.append(value)
            continue
        key = INI_KEYS.get(flag, flag.lstrip("-"))
        lines.append(f"{key} = {ini_value(value, flag) if value is not None else 'true'}")
    if overrides:
        if any("," in o for o in overrides):
            raise UsageError("an -ot pattern with a comma cannot be joined into one preset value")
        lines.append(f"override-tensor = {ini_value(','.join(overrides), '-ot')}")
    if cmd.env_from:
        warnings.append(
            "the router drops API keys from presets: start the router itself with the key "
            "(the line below does)"
        )
    body = [f"[{name}]", *lines]
    return [body[0], stamp(";", body), *body[1:]], warnings


def _comment_lines(text: str) -> list[str]:
    return [line[2:] if line.startswith("# ") else line[1:] for line in comment_lines(text)]


@dataclass(frozen=True)
class _Section:
    name: str | None  # None: the lines before the first header
    start: int  # index of the header line (or 0)
    end: int  # one past its last line


def _sections(lines: list[str]) -> list[_Section]:
    out: list[_Section] = []
    name: str | None = None
    start = 0
    for i, line in enumerate(lines):
        match = _HEADER.match(line.rstrip("\r\n"))
        if match:
            out.append(_Section(name, start, i))
            name, start = match[1], i
    out.append(_Section(name, start, len(lines)))
    return out


def _own_end(lines: list[str], section: _Section) -> int:
    """One past the section's last option or quantpick comment: blank lines and other comments
    after it stay (they may introduce the next section)."""
    end = section.start + 1
    for i in range(section.start + 1, section.end):
        stripped = lines[i].strip()
        if stripped and (not stripped.startswith((";", "#")) or stripped.startswith(MARKER)):
            end = i + 1
    return end


_INI_LINE = re.compile(
    r"^(?:\[[ \t]*[^\]]+\][ \t]*(?:[;#].*)?"  # header-line
    r"|[A-Za-z_][A-Za-z0-9_.-]*[ \t]*=[^;#]*(?:[;#].*)?"  # kv-line
    r"|[ \t]*(?:[;#].*)?)$"  # comment-line, blank-line
)


def check_ini(text: str, where: str) -> None:
    """Refuse a preset file llama.cpp's router would not read: each line a header, a
    `key = value` (the key first on its line), a comment or blank (common/preset.cpp:184-224,
    `parse_ini_from_file`: the router fails on the whole file otherwise)."""
    for number, line in enumerate(re.split(r"\r\n|\n|\r", text), 1):
        if not _INI_LINE.match(line):
            raise UsageError(
                f"{where}: line {number} is not INI that llama.cpp's router reads "
                f"({line[:60]!r}); the file is left as it is, nothing merged",
                hint=f"fix that line (llama-server {MODELS_PRESET_FLAG} refuses the file as it is)",
            )


def merge_preset(
    text: str | None, name: str, section: list[str], *, force: bool = False, where: str = ""
) -> tuple[str, bool]:
    """The preset file with `name`'s section replaced by `section` (or appended), every other
    byte unchanged; (new text, whether a section was replaced). A section present twice (the
    router keeps the last) is replaced where it first appears and its later copies removed.
    A file the router cannot read is refused (check_ini), and so is a section of that name that
    quantpick did not write, or that was edited since (its stamp), unless `force`. `where`
    names the file in messages."""
    if text is None:
        header = [
            "; llama.cpp router presets: llama-server --models-preset THIS_FILE",
            "version = 1",
            "",
        ]
        return "\n".join(header + section) + "\n", False
    newline = "\r\n" if "\r\n" in text else "\n"
    check_ini(text, where or "the preset")
    lines = text.splitlines(keepends=True)
    mine = [s for s in _sections(lines) if s.name == name]
    for found in mine:
        owner = authorship(lines[found.start : _own_end(lines, found)])
        if owner is not Authorship.QUANTPICK and not force:
            raise refuse_theirs(
                f"{where}: the section [{name}]", owner, other="another name (--alias)"
            )
    block = [line + newline for line in section]
    if not mine:
        prefix = text
        if prefix and not prefix.endswith(("\n", "\r")):
            prefix += newline
        if prefix and not prefix.endswith(newline * 2):
            prefix += newline
        return prefix + "".join(block), False
    out: list[str] = []
    cursor = 0
    for n, s in enumerate(mine):
        out += lines[cursor : s.start]
        if n == 0:
            out += block
        cursor = _own_end(lines, s)
    out += lines[cursor:]
    return "".join(out), True


@dataclass(frozen=True)
class PlannedSection:
    name: str
    machine: str
    devices: dict[str, tuple[int, int]]  # device -> (total, budget)


def planned_sections(text: str | None) -> tuple[list[PlannedSection], list[str]]:
    """The sections quantpick wrote (with their memory line), and the names of the others."""
    if not text:
        return [], []
    lines = text.splitlines()
    planned, others = [], []
    for s in _sections(lines):
        if s.name is None or s.name == "*":
            continue
        memory = next((ln for ln in lines[s.start : s.end] if ln.startswith(MEMORY_MARKER)), None)
        if memory is None:
            others.append(s.name)
            continue
        fields = memory[len(MEMORY_MARKER) :].split()
        machine = next((f[8:] for f in fields if f.startswith("machine=")), "")
        devices: dict[str, tuple[int, int]] = {}
        for f in fields:
            key, _, value = f.partition("=")
            used, _, budget = value.partition("/")
            if key != "machine" and used.isdigit() and budget.isdigit():
                devices[key] = (int(used), int(budget))
        planned.append(PlannedSection(s.name, machine, devices))
    return planned, others


@dataclass(frozen=True)
class ModelsMax:
    value: int
    counted: int  # sections planned for this machine
    reason: str


def models_max(sections: Sequence[PlannedSection], target: Target) -> ModelsMax:
    """The router's --models-max for the sections planned for this machine: the largest k such
    that, on every device, the k largest of their totals fit in the device's budget. The router
    loads any k of them at once (it evicts the least recently used, counting models, not
    memory: ggml-org/llama.cpp#25326), so the bound takes the worst k. Each model is its own
    process with its own CUDA context, which the plan's totals include; the margin is kept once.
    """
    same = [s for s in sections if s.machine == target.machine_key]
    budgets = {d.device: d.budget_bytes for d in target.devices}
    per_device: dict[str, list[int]] = {}
    for s in same:
        for device, (total, budget) in s.devices.items():
            per_device.setdefault(device, []).append(total)
            budgets.setdefault(device, budget)
    best = 1
    tightest = ""
    for k in range(1, len(same) + 1):
        over = [
            d for d, totals in per_device.items()
            if sum(sorted(totals, reverse=True)[:k]) > budgets[d]
        ]  # fmt: skip
        if over:
            tightest = over[0]
            break
        best = k
    if len(same) <= 1:
        reason = "one model planned for this machine"
    elif best == len(same):
        reason = f"all {len(same)} models planned for this machine fit at once"
    else:
        largest = sorted(per_device[tightest], reverse=True)[: best + 1]
        reason = (
            f"any {best} of the {len(same)} models planned for this machine fit at once; "
            f"{best + 1} could need {human(sum(largest))} on {tightest}, which has "
            f"{human(budgets[tightest])}"
        )
    return ModelsMax(best, len(same), reason)


def router_line(
    program: str, preset: Path, limit: int, cmd: ServerCommand, host: str, port: int
) -> str:
    env = [f"{k}={shlex.quote(v)}" for k, v in cmd.env.items()]
    env += [f'{k}="${src}"' for k, src in cmd.env_from]
    argv = [program, MODELS_PRESET_FLAG, str(preset), "--models-max", str(limit),
            "--host", host, "--port", str(port)]  # fmt: skip
    return " ".join([*env, shlex.join(argv)])


class Preset(OutputFormat):
    name = "preset"
    uses_target = True

    def check(self, options: EcosystemOptions) -> None:
        if options.file is None:
            raise UsageError(
                "--format preset needs --preset FILE (the INI file the router reads)",
                hint="e.g. --preset ~/llama-presets.ini",
            )

    def target_name(self, model_id: str, alias: str | None, say: Reporter) -> str:
        """--alias, else a section name derived from the model's (said when it differs)."""
        if alias is not None:
            return alias
        name = preset_section_name(model_id)
        if name != model_id:
            say.note(
                f"Note: preset section [{name}], derived from the model name {model_id!r} "
                "(a section name is letters, digits and . _ - / @ +; --alias NAME sets another)"
            )
        return name

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        from quantpick.serve.formats.config_file import open_config

        cmd, target, opts = job.cmd, job.target(), job.options
        assert opts.file is not None  # check()
        path = opts.file
        section, warnings = preset_section(cmd, target)
        for w in warnings:
            say.warn(w)
        config = open_config(path, "--preset", force=opts.force)
        text, replaced = merge_preset(config.text, target.name, section, force=opts.force,
                                      where=f"--preset {path}")  # fmt: skip
        planned, others = planned_sections(text)
        limit = models_max(planned, target)
        written = None
        if not opts.dry_run:
            written = config.write(text, force=opts.force)
            say.written(f"[{target.name}] ({'updated' if replaced else 'added'}) in", written)
        preset_path = path.absolute()
        line = router_line(cmd.argv[0], preset_path, limit.value, cmd, opts.host, opts.port)
        say.note(f"--models-max {limit.value}: {limit.reason}")
        if others:
            say.note(
                f"Note: {len(others)} section(s) not written by quantpick "
                f"({', '.join(others[:5])}) are not counted: their memory is unknown"
            )
        say.note(
            f'Start the router with the line on stdout, then ask for the model by name ("model": '
            f'"{target.name}"); after the file changes: GET /models?reload=1, or restart it'
        )
        doc: dict[str, Any] = {
            "file": str(preset_path),
            "section": target.name,
            "replaced": replaced,
            "backup": str(written.backup) if written and written.backup else None,
            "models_max": limit.value,
            "models_max_reason": limit.reason,
            "router": line,
            "text": "\n".join(section) + "\n",
        }
        return Emitted(stdout=line + "\n", rendered={"preset": doc})


FORMAT = Preset()
