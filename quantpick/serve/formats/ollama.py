"""`--format ollama`: a Modelfile for the plan (printed, or written where --modelfile says), and
what Ollama cannot express of it.

Sources: ollama/ollama parser/parser.go (a value ends at the end of its line unless it starts
with '"' or '\"\"\"'; non-printable characters are dropped) and docs/import (FROM a GGUF copies it
into the blob store). It has no per-model expert offload, tensor split, device list or KV type
(ollama/ollama#11772); KV type, flash attention and slots are server-wide settings.
"""

from __future__ import annotations

import re
from pathlib import Path

from quantpick.errors import UsageError
from quantpick.outputs import stamp
from quantpick.serve.command import ServerCommand, comment_lines
from quantpick.serve.formats.base import Emission, Emitted, OutputFormat, Reporter
from quantpick.serve.formats.target import Target

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
    lines += comment_lines(target.plan_comment)
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
    lines += comment_lines(
        "Ollama server settings for this plan (they apply to every model it runs): "
        + " ".join(server_env)
    )
    for line in cannot:
        lines += comment_lines(f"Not expressible in Ollama: {line}")
    lines.append(f"FROM {_modelfile_path(target.model_files[0])}")
    if target.chat_template and "<|im_start|>" in target.chat_template:
        lines += comment_lines(
            "ChatML, as the GGUF's template; its tool and thinking handling is not carried over"
        )
        lines.append(f'TEMPLATE """{CHATML_TEMPLATE}"""')
        lines.append(f'PARAMETER stop "{CHATML_STOP}"')
    else:
        lines += comment_lines(
            "no TEMPLATE: Ollama derives one from the GGUF's tokenizer.chat_template"
        )
    # Ollama's num_ctx is one request's window; with N slots it allocates N of them.
    lines.append(f"PARAMETER num_ctx {max(1, target.ctx_size // max(1, target.n_parallel))}")
    lines.append(f"PARAMETER num_gpu {target.n_gpu_layers}")
    if target.sampling is not None:
        from quantpick.serve.command import flag_number

        s = target.sampling
        lines += [
            f"PARAMETER temperature {flag_number(s.temperature)}",
            f"PARAMETER top_p {flag_number(s.top_p)}",
            f"PARAMETER top_k {s.top_k}",
            f"PARAMETER min_p {flag_number(s.min_p)}",
        ]
    return "\n".join([stamp("#", lines), *lines]) + "\n", cannot


class Ollama(OutputFormat):
    name = "ollama"
    uses_target = True
    needs_file = True
    reads_template = True

    def emit(self, job: Emission, say: Reporter) -> Emitted:
        from quantpick.serve.formats.config_file import check_whole_file, open_config
        from quantpick.units import human

        target, opts = job.target(), job.options
        text, cannot = ollama_modelfile(job.cmd, target)
        for line in cannot:
            say.warn(f"Ollama cannot run this plan as planned: {line}")
        name = ollama_name(target)
        where = opts.file
        stdout = text
        if where is not None:
            config = open_config(where, "--modelfile", force=opts.force)
            check_whole_file(config, force=opts.force)  # a Modelfile the user wrote: --force
            if not opts.dry_run:
                say.written("the Modelfile", config.write(text, force=opts.force))
                stdout = ""
        size = target.model_bytes or sum(
            f.stat().st_size for f in target.model_files if f.is_file()
        )
        create = f"ollama create {name} -f {where if where is not None else 'Modelfile'}"
        say.note(
            f"Then: {create}  (Ollama copies the {human(size)} file into its own store, so it "
            "needs that much free space again)"
        )
        doc = {"name": name, "modelfile": text, "file": str(where) if where else None,
               "create": create, "cannot_express": cannot}  # fmt: skip
        return Emitted(stdout=stdout, rendered={"ollama": doc})


FORMAT = Ollama()
