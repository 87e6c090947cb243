"""`--format llama-swap`: the plan as a `models.<id>` entry of a llama-swap config, printed or
merged into the file --swap-config names.

An entry of the same name is replaced only while it still is what quantpick wrote (its stamp);
a file that is not YAML, or not a llama-swap config, is refused, not merged, and the merged file
is read back before it is written: every other entry must come out exactly as it was.

Source: mostlygeek/llama-swap proxy/config (`cmd` split by POSIX shell rules after lines starting
with '#' are dropped; `${PORT}` counts up from startPort; every `${...}` in the file is a macro,
`${env.X}` included; `ttl` seconds, 0 = never unload; `proxy` default http://localhost:${PORT};
`checkEndpoint` default /health).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from quantpick.errors import UsageError
from quantpick.outputs import Authorship, authorship, refuse_theirs, stamp
from quantpick.serve.command import ServerCommand, comment_lines
from quantpick.serve.formats.base import (
    Emission,
    Emitted,
    OutputFormat,
    Reporter,
    flag_pairs,
    yaml_str,
)
from quantpick.serve.formats.target import Target

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
    lines = [f"  {line}" for line in comment_lines(target.plan_comment)]
    lines.append(f"  {yaml_str(target.name, interpolate=True)}:")
    body = [_swap_word(cmd.argv[0])]
    for flag, value in flag_pairs(cmd):
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


class LlamaSwap(OutputFormat):
    name = "llama-swap"
    uses_target = True

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        from quantpick.serve.formats.config_file import open_config

        cmd, target, opts = job.cmd, job.target(), job.options
        entry = swap_entry(cmd, target, ttl=opts.ttl)
        if cmd.env_from:
            say.warn(
                "llama-swap's own apiKeys protect its proxy; the model's llama-server listens on "
                "127.0.0.1 only, so the entry sets no key"
            )
        stdout = "models:\n" + "\n".join(entry) + "\n"
        doc: dict[str, Any] = {"entry": "\n".join(entry) + "\n", "file": None, "replaced": None}
        if opts.file is not None:
            config = open_config(opts.file, "--swap-config", force=opts.force)
            text, replaced = merge_swap_config(config.text, target.name, entry, force=opts.force,
                                               where=f"--swap-config {opts.file}")  # fmt: skip
            doc.update(replaced=replaced, file=str(opts.file.absolute()))
            if not opts.dry_run:
                written = config.write(text, force=opts.force)
                say.written(f"models.{target.name} ({'updated' if replaced else 'added'}) in",
                            written)  # fmt: skip
                doc["backup"] = str(written.backup) if written.backup else None
                stdout = ""
            say.note(f"Run: llama-swap --config {opts.file}")
        else:
            say.note("Add this under `models:` in llama-swap's config (or give --swap-config FILE)")
        return Emitted(stdout=stdout, rendered={"llama_swap": doc})


FORMAT = LlamaSwap()
