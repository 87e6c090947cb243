"""llama-server's own -hf REPO:QUANT: which file its downloader picks for a tag
(common/download.cpp, b11312), emulated so the command names what llama-server will fetch."""

from __future__ import annotations

import re
from collections.abc import Sequence

from quantpick.errors import UsageError
from quantpick.model.manifest import Manifest
from quantpick.serve.command import HfModel

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
