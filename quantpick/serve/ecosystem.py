"""A plan in the tools people already run: llama.cpp's router (an INI preset section), llama-swap
(a `models.<id>` entry), Ollama (a Modelfile) and LM Studio (links in its models folder).

Each takes the llama-server command quantpick built for the plan (serve/command.py, so every
flag is the checked one) and a `Target` (what else the tool needs: file paths, the memory per
device, sampling, the chat template). Rendering is pure; a file is read and written through
`ConfigFile` (quantpick.outputs' policy: regular files only, never through a link, read bounded,
written atomically, the previous version kept under a backup name no later run takes), and
linking goes through fetch.stores.link_into (never a move).

What quantpick writes carries a stamp (`written by quantpick 0.1.0, checksum ...`): a preset
section, a llama-swap entry or a Modelfile of the same name is replaced only while it still is
what quantpick wrote; one written by hand, or edited since, is refused without --force. A
preset or llama-swap file that its own tool would not read (llama.cpp's INI grammar, YAML) is
refused, not merged, and the merged file is read back before it is written: every other
section or entry must come out exactly as it was.

Sources:
- Router presets: b11312 common/preset.cpp (the INI grammar: a value runs to the end of the line
  or to the first ';' or '#', trailing blanks dropped, no quoting or escapes; keys are any
  spelling of an option without its dashes, `common_preset_context::load_from_ini`; a section
  seen twice keeps its last copy) and tools/server/server-models.cpp (the router sets host,
  port and alias of each child and drops API keys from presets; --models-max is the router's
  own flag; `GET /models?reload=1` rereads the sources).
- llama-swap: mostlygeek/llama-swap proxy/config (`cmd` split by POSIX shell rules after lines
  starting with '#' are dropped; `${PORT}` counts up from startPort; every `${...}` in the file
  is a macro, `${env.X}` included; `ttl` seconds, 0 = never unload; `proxy` default
  http://localhost:${PORT}; `checkEndpoint` default /health).
- Ollama: ollama/ollama parser/parser.go (a value ends at the end of its line unless it starts
  with '"' or '\"\"\"'; non-printable characters are dropped) and docs/import (FROM a GGUF copies it
  into the blob store). It has no per-model expert offload, tensor split, device list or KV
  type (ollama/ollama#11772); KV type, flash attention and slots are server-wide settings.
- LM Studio: models folder `<models>/<publisher>/<repo>/<file>` (fetch/stores.py); `lms import`
  moves the file by default, which breaks every other tool's path to it, so quantpick links.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantpick.errors import UsageError
from quantpick.model.manifest import Sampling
from quantpick.outputs import (
    Authorship,
    Existing,
    Written,
    authorship,
    check_output,
    has_stamp,
    refuse_theirs,
    stamp,
    write_output,
)
from quantpick.serve.command import ServerCommand, _comment, yaml_str
from quantpick.units import human

# Flags build_command writes without a value (everything else it writes takes exactly one).
VALUELESS = frozenset({"-kvu", "-nkvo", "--cpu-moe", "--jinja", "--no-mmproj", "--no-jinja"})


@dataclass(frozen=True)
class DeviceUse:
    """One device of the plan: what the model takes there and what the machine allows."""

    device: str  # "CUDA0", "RPC0", "CPU"
    total_bytes: int
    budget_bytes: int


@dataclass(frozen=True)
class Target:
    """What the ecosystem outputs need besides the command."""

    name: str  # the model name clients ask for (the alias)
    quant: str
    plan_comment: str
    ctx_size: int
    n_parallel: int
    n_gpu_layers: int
    model_files: tuple[Path, ...] = ()  # every file of the quant (shards), first one first
    model_bytes: int = 0  # their size (known before they are downloaded)
    mmproj_path: Path | None = None
    devices: tuple[DeviceUse, ...] = ()
    machine_key: str = ""  # the machine the plan was made for (router sizing)
    machine_label: str = ""
    hf_repo: str | None = None  # "org/Repo" of the model's Hugging Face source
    sampling: Sampling | None = None
    chat_template: str | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "on"
    n_cpu_moe: int = 0  # experts of the first N layers in host memory
    override_tensors: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] | None = None
    kv_unified: bool = False
    rpc: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


# llama-server's router flag (tools/server/server.cpp), named in hints: not a quantpick option
MODELS_PRESET_FLAG = "--models-preset"


def machine_key(parts: Sequence[str]) -> str:
    """A short stable name for a machine from what identifies it (GPU UUIDs or names and sizes,
    host RAM, RPC endpoints)."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def options(cmd: ServerCommand) -> list[tuple[str, str | None]]:
    """The command's (flag, value) pairs, in order, without the program."""
    words = list(cmd.argv[1:])
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        flag = words[i]
        if flag in VALUELESS or i + 1 >= len(words):
            out.append((flag, None))
            i += 1
        else:
            out.append((flag, words[i + 1]))
            i += 2
    return out


# ---- files -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigFile:
    """A file the user named (`--preset`, `--swap-config`, `--modelfile`) as it is now."""

    path: Path
    what: str  # the option that named it, for messages
    existing: Existing

    @property
    def text(self) -> str | None:
        """Its text, None when there is none yet (or --force replaces a link there)."""
        if self.existing.data is None:
            return None
        try:
            return self.existing.data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(
                f"{self.what} {self.path}: is not UTF-8 text; it is left as it is",
                hint="give another file",
            ) from None

    def write(self, text: str, *, force: bool = False) -> Written:
        """Replace it by `text` atomically, its mode kept. The previous version is kept as
        FILE.bak (or .bak.1, .bak.2, ...: a backup is never overwritten) when something the user
        wrote may go: with `force`, or the first time quantpick writes into a file it did not
        create. Replacing only quantpick's own unchanged sections keeps no backup (nothing of
        the user's is lost; a preset rewritten by every run would otherwise pile them up)."""
        keep = force or (self.existing.data is not None and not has_stamp(self.text))
        return write_output(self.path, text.encode("utf-8"), self.existing, self.what, backup=keep)


def open_config(path: Path, what: str, *, force: bool = False) -> ConfigFile:
    """The file at `path`, when quantpick may write there (quantpick.outputs.check_output: no
    device, FIFO, socket or directory; a symlink only with --force, and then the link itself is
    replaced); OutputRefused (exit 2) otherwise."""
    return ConfigFile(path, what, check_output(path, what, force=force))


def check_whole_file(config: ConfigFile, *, force: bool = False) -> None:
    """A file quantpick replaces whole (the Modelfile) must be quantpick's, unchanged."""
    if config.existing.data is None or force:
        return
    found = authorship((config.text or "").splitlines())
    if found is not Authorship.QUANTPICK:
        raise refuse_theirs(f"{config.what} {config.path}", found)


# ---- llama.cpp router presets ------------------------------------------------------------------

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
    for flag, value in options(cmd):
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
    return [line[2:] if line.startswith("# ") else line[1:] for line in _comment(text)]


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


# ---- llama-swap ------------------------------------------------------------------------------

SWAP_TTL_S = 900  # default ttl: 15 min of idleness before the model's memory is given back
_YAML_BREAKS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufeff]")


def _swap_word(word: str) -> str:
    if "${" in word:
        raise UsageError(
            f"{word!r} contains '${{', which llama-swap reads as a macro",
            hint="move or rename the file",
        )
    if "\n" in word or "\r" in word or _YAML_BREAKS.search(word):
        raise UsageError(f"{word!r} has a control character llama-swap's config cannot carry")
    return shlex.quote(word)


def swap_entry(cmd: ServerCommand, target: Target, *, ttl: int = SWAP_TTL_S) -> list[str]:
    """The `"<id>":` entry (lines, indented as under `models:`): llama-server on 127.0.0.1 at
    llama-swap's ${PORT}, the plan's flags one per line, the plan's environment; its first
    line is quantpick's stamp."""
    lines = [f"  {line}" for line in _comment(target.plan_comment)]
    lines.append(f"  {yaml_str(target.name, interpolate=True)}:")
    body = [_swap_word(cmd.argv[0])]
    for flag, value in options(cmd):
        if flag in ("--host", "--port"):
            continue
        body.append(_swap_word(flag) + ("" if value is None else " " + _swap_word(value)))
    body += ["--host 127.0.0.1", "--port ${PORT}"]
    lines.append("    cmd: |")
    lines += [f"      {b}" for b in body]
    lines.append(f"    proxy: {yaml_str('http://127.0.0.1:${PORT}', interpolate=True)}")
    lines.append(f"    checkEndpoint: {yaml_str('/health', interpolate=True)}")
    lines.append(f"    ttl: {int(ttl)}")
    if cmd.env:
        lines.append("    env:")
        for k, v in cmd.env.items():
            text = f"{k}={v}"
            if "${" in text:
                raise UsageError(f"env {text!r}: llama-swap reads '${{' as a macro")
            lines.append(f"      - {yaml_str(text, interpolate=True)}")
    return [f"  {stamp('#', lines)}", *lines]


_TOP_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)[ \t]*:(.*)$")
_KEY_LINE = re.compile(
    r"""^[ ]*(?:"((?:[^"\\]|\\.)*)"|'((?:[^']|'')*)'|([^\s"'#][^:#]*?))[ \t]*:(?:[ \t]|$)"""
)


def _entry_key(line: str) -> str | None:
    """The key of a mapping line (`key:`, `"key":`, `'key': ...`), None for anything else."""
    import json

    match = _KEY_LINE.match(line.rstrip("\r\n"))
    if match is None:
        return None
    if match[1] is not None:
        try:
            return str(json.loads(f'"{match[1]}"'))
        except ValueError:
            return match[1]
    if match[2] is not None:
        return match[2].replace("''", "'")
    return match[3]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _yaml(text: str, where: str) -> Any:
    import yaml  # PyYAML: huggingface_hub's own dependency

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise UsageError(
            f"{where}: is not valid YAML ({problem}{at}); the file is left as it is, nothing "
            "merged",
            hint="fix it (llama-swap refuses it as it is), or print the entry without "
            "--swap-config and add it by hand",
        ) from None


def merge_swap_config(
    text: str | None, name: str, entry: list[str], *, force: bool = False, where: str = ""
) -> tuple[str, bool]:
    """The llama-swap config with `models.<name>` replaced by `entry` (or added), every other
    line unchanged; (text, replaced). Only a block-style `models:` mapping is merged. A file
    that is not YAML, or whose top level or `models` is not a mapping, is refused; so is an
    entry of that name that quantpick did not write, or that was edited since, unless `force`.
    The result is parsed back: every other key must be what it was, and the entry ours."""
    where = where or "the llama-swap config"
    if text is None or not text.strip():
        return "models:\n" + "\n".join(entry) + "\n", False
    before = _yaml(text, where)
    if not isinstance(before, dict) or not isinstance(before.get("models") or {}, dict):
        raise UsageError(
            f"{where}: is not a llama-swap config (a mapping with a `models:` mapping); the "
            "file is left as it is, nothing merged",
            hint="print the entry without --swap-config and add it by hand",
        )
    merged, replaced = _merge_swap_lines(text, name, entry, force=force, where=where)
    after = _yaml(merged, where)
    expected = dict(before)
    models = dict(expected.get("models") or {})
    models[name] = _yaml("models:\n" + "\n".join(entry) + "\n", where)["models"][name]
    expected["models"] = models
    if after != expected:
        raise UsageError(
            f"{where}: quantpick cannot merge models.{name} into this file without changing "
            "what else it says; the file is left as it is",
            hint="print the entry without --swap-config and add it by hand",
        )
    return merged, replaced


def _merge_swap_lines(
    text: str, name: str, entry: list[str], *, force: bool, where: str
) -> tuple[str, bool]:
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    start = None
    for i, line in enumerate(lines):
        match = _TOP_KEY.match(line.rstrip("\r\n"))
        if match and match[1] == "models":
            rest = match[2].split("#", 1)[0].strip()
            if rest:
                raise UsageError(
                    "the llama-swap config's `models:` is not a block mapping "
                    f"({rest[:30]!r}): quantpick only merges into `models:` followed by "
                    "indented entries",
                    hint="add the entry by hand (print it without --swap-config)",
                )
            start = i
            break
    if start is None:
        prefix = text if text.endswith(("\n", "\r")) else text + newline
        return prefix + "models:" + newline + newline.join(entry) + newline, False
    # The block: until the next line that starts in column 0 (not blank, not a comment).
    end = len(lines)
    for i in range(start + 1, len(lines)):
        stripped = lines[i].strip()
        if stripped and not stripped.startswith("#") and _indent(lines[i]) == 0:
            end = i
            break
    body = range(start + 1, end)
    content = [i for i in body if lines[i].strip() and not lines[i].strip().startswith("#")]
    unit = _indent(lines[content[0]]) if content else 2
    if unit < 1:
        raise UsageError("the llama-swap config's models are not indented")
    block = [_reindent(ln, unit) + newline for ln in entry]
    keys = [i for i in content if _indent(lines[i]) == unit and _entry_key(lines[i]) is not None]
    for n, i in enumerate(keys):
        if _entry_key(lines[i]) != name:
            continue
        stop = keys[n + 1] if n + 1 < len(keys) else end
        # up to its last line indented deeper than the key (what follows may be a comment
        # or a blank line that belongs to the next entry)
        last = i
        for j in range(i + 1, stop):
            if lines[j].strip() and _indent(lines[j]) > unit:
                last = j
        # our own comment lines just above the key are ours too (the stamp, the plan)
        first = i
        while first - 1 > start and lines[first - 1].strip().startswith(
            ("# quantpick", "# written by quantpick")
        ):
            first -= 1
        owner = authorship(lines[first : last + 1])
        if owner is not Authorship.QUANTPICK and not force:
            raise refuse_theirs(f"{where}: the entry models.{name}", owner,
                                other="another name (--alias)")  # fmt: skip
        return "".join(lines[:first] + block + lines[last + 1 :]), True
    last_content = content[-1] if content else start
    after = lines[: last_content + 1]
    if not after[-1].endswith(("\n", "\r")):
        after[-1] += newline
    return "".join(after + block + lines[last_content + 1 :]), False


def _reindent(line: str, unit: int) -> str:
    """Entry lines are written with 2 spaces per level; use the file's `unit` instead."""
    depth = _indent(line) // 2
    return " " * (depth * unit) + line.lstrip(" ")


# ---- Ollama ----------------------------------------------------------------------------------

# Ollama's own ChatML template (its template/chatml.gotmpl), used for a GGUF whose Jinja
# template speaks ChatML (<|im_start|>role ... <|im_end|>): Qwen's do.
CHATML_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n"
    "{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n"
)
CHATML_STOP = "<|im_end|>"
_OLLAMA_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def ollama_name(target: Target) -> str:
    """`<alias>:<quant>`, lower case, in the characters Ollama allows in a name and a tag."""
    base = _OLLAMA_NAME.sub("-", target.name.lower()).strip("-.") or "model"
    tag = _OLLAMA_NAME.sub("-", target.quant.lower()).strip("-.") or "latest"
    return f"{base}:{tag}"


def _modelfile_path(path: Path) -> str:
    text = str(path)
    if any(ord(c) < 0x20 for c in text) or text != text.strip() or text.startswith('"'):
        raise UsageError(f"{text!r} cannot be written as a Modelfile FROM line")
    return text


def ollama_modelfile(cmd: ServerCommand, target: Target) -> tuple[str, list[str]]:
    """(the Modelfile, what Ollama cannot do of this plan, one line each)."""
    if not target.model_files:
        raise UsageError("--format ollama needs the file on disk (`quantpick get` first)")
    cannot: list[str] = []
    if len(target.model_files) > 1:
        cannot.append(
            f"the quant is split in {len(target.model_files)} files: FROM names the first; "
            "Ollama's support for split GGUFs depends on its version"
        )
    if target.n_cpu_moe or target.override_tensors:
        what = (
            f"--n-cpu-moe {target.n_cpu_moe} (the experts of {target.n_cpu_moe} layers in RAM)"
            if target.n_cpu_moe
            else "-ot " + ",".join(target.override_tensors)
        )
        cannot.append(
            f"the plan needs expert offload, {what}, which Ollama cannot express: it places whole "
            "layers by its own estimate, so the plan's fit and speed do not carry over"
        )
    if target.tensor_split is not None:
        split = ",".join(f"{v:g}" for v in target.tensor_split)
        cannot.append(
            f"the plan splits the layers over the GPUs as -ts {split}; Ollama cannot express a "
            "tensor split and spreads them its own way"
        )
    if target.rpc:
        cannot.append("the plan uses llama.cpp RPC workers, which Ollama does not run")
    if target.kv_unified:
        cannot.append("-kvu (one KV pool for all slots) has no Ollama setting")
    lines = ["# Modelfile written by quantpick. Plan:"]
    lines += _comment(target.plan_comment)
    server_env = [f"OLLAMA_NUM_PARALLEL={target.n_parallel}"]
    if target.cache_type_k != "f16" or target.cache_type_v != "f16":
        server_env.append(f"OLLAMA_KV_CACHE_TYPE={target.cache_type_k}")
        if target.cache_type_k != target.cache_type_v:
            cannot.append(
                f"K and V cache types differ ({target.cache_type_k}/{target.cache_type_v}); "
                "Ollama has one type for both"
            )
    if target.flash_attn == "on":
        server_env.append("OLLAMA_FLASH_ATTENTION=1")
    lines += _comment(
        "Ollama server settings for this plan (they apply to every model it runs): "
        + " ".join(server_env)
    )
    for line in cannot:
        lines += _comment(f"Not expressible in Ollama: {line}")
    lines.append(f"FROM {_modelfile_path(target.model_files[0])}")
    if target.chat_template and "<|im_start|>" in target.chat_template:
        lines += _comment(
            "ChatML, as the GGUF's template; its tool and thinking handling is not carried over"
        )
        lines.append(f'TEMPLATE """{CHATML_TEMPLATE}"""')
        lines.append(f'PARAMETER stop "{CHATML_STOP}"')
    else:
        lines += _comment("no TEMPLATE: Ollama derives one from the GGUF's tokenizer.chat_template")
    # Ollama's num_ctx is one request's window; with N slots it allocates N of them.
    lines.append(f"PARAMETER num_ctx {max(1, target.ctx_size // max(1, target.n_parallel))}")
    lines.append(f"PARAMETER num_gpu {target.n_gpu_layers}")
    if target.sampling is not None:
        from quantpick.serve.command import _num

        s = target.sampling
        lines += [
            f"PARAMETER temperature {_num(s.temperature)}",
            f"PARAMETER top_p {_num(s.top_p)}",
            f"PARAMETER top_k {s.top_k}",
            f"PARAMETER min_p {_num(s.min_p)}",
        ]
    return "\n".join([stamp("#", lines), *lines]) + "\n", cannot


# ---- LM Studio -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Linked:
    source: Path
    dest: Path
    action: str  # "hardlink", "symlink", "present" (already this file)
    why: str


def lmstudio_folder(target: Target) -> tuple[str, str]:
    """(publisher, repo) for LM Studio's layout: the Hugging Face source's, else quantpick/id."""
    if target.hf_repo and target.hf_repo.count("/") == 1:
        publisher, repo = target.hf_repo.split("/")
        return publisher, repo
    return "quantpick", _OLLAMA_NAME.sub("-", target.name).strip("-.") or "model"


def link_into_lmstudio(target: Target, models_dir: Path, *, dry_run: bool = False) -> list[Linked]:
    """Link every file of the quant (and the projector) into
    `<models_dir>/<publisher>/<repo>/`; the files stay where they are. An existing different file
    there is never replaced."""
    from quantpick.errors import QuantpickError
    from quantpick.fetch.stores import LINK_WHY, FileIdentity, link_into

    if not target.model_files:
        raise UsageError("--format lmstudio needs the file on disk (`quantpick get` first)")
    publisher, repo = lmstudio_folder(target)
    folder = models_dir / publisher / repo
    sources = list(target.model_files) + ([target.mmproj_path] if target.mmproj_path else [])
    plan: list[tuple[Path, Path]] = []
    for source in sources:
        if not dry_run and not source.is_file():
            raise UsageError(f"{source} is not there", hint="`quantpick get` it first")
        dest = folder / source.name
        if dest.exists() or dest.is_symlink():
            if dest.exists() and os.path.samefile(dest, source):
                continue
            raise QuantpickError(
                f"LM Studio already has a different file at {dest}",
                hint="remove it in LM Studio first; quantpick never replaces another tool's file",
            )
        plan.append((source, dest))
    out = [Linked(s, folder / s.name, "present", "already linked") for s in sources
           if (s, folder / s.name) not in plan]  # fmt: skip
    for source, dest in plan:
        if dry_run:
            action = "hardlink" if _same_device(source, dest) else "symlink"
            out.append(Linked(source, dest, action, LINK_WHY[action]))
            continue
        # quantpick's own verified file: its identity now is the one linked (and re-checked
        # after the link is made)
        made = link_into(source, dest, FileIdentity.of(os.stat(os.path.realpath(source))))
        action, why = made.action, made.why
        if action == "in-place":
            raise QuantpickError(f"cannot link {source} into {folder}: {why}")
        out.append(Linked(source, dest, action, why))
    return out


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _same_device(source: Path, dest: Path) -> bool:
    """Whether a hard link from `source` to `dest` could be made (a dry run: either may not exist
    yet, so their nearest existing directories are compared)."""
    try:
        real = _existing(Path(os.path.realpath(source)))
        return os.stat(_existing(dest.parent)).st_dev == os.stat(real).st_dev
    except OSError:
        return False
