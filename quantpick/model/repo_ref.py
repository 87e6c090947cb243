"""A repository named the way people paste it: `owner/name`, or a hub URL copied from a browser.

    parse_repo_ref("https://huggingface.co/unsloth/Qwen3.6-35B-A3B-GGUF/tree/main")
    # RepoRef(repo="unsloth/Qwen3.6-35B-A3B-GGUF", kind="hf", revision="main", path=None)
    parse_repo_ref("https://huggingface.co/o/r/resolve/main/r-Q4_K_M.gguf?download=true")
    # ... revision="main", path="r-Q4_K_M.gguf"
    parse_repo_ref("https://www.modelscope.cn/models/o/r/file/view/master/r-Q4_K_M.gguf")
    # ... kind="modelscope", revision="master", path="r-Q4_K_M.gguf"

URL shapes, as the hubs' web pages and download links write them:
- Hugging Face (huggingface.co, hf.co): /OWNER/NAME, then /tree/REV[/DIR], /blob/REV/FILE,
  /resolve/REV/FILE, /raw/REV/FILE or /commit/REV; /datasets/... and /spaces/... are not models.
- ModelScope (modelscope.cn, modelscope.ai): /models/OWNER/NAME, then /files, /summary,
  /file/view/REV/FILE or /resolve/REV/FILE; the API's /api/v1/models/OWNER/NAME/repo?Revision=
  REV&FilePath=FILE too.
Anything else that looks like a URL is a one-line usage error, never a repo id handed to a hub
client (huggingface_hub's HFValidationError surfaced as a download failure, exit 5). Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from quantpick.errors import UsageError

HF_HOSTS = frozenset({"huggingface.co", "www.huggingface.co", "hf.co"})
MODELSCOPE_HOSTS = frozenset(
    {"modelscope.cn", "www.modelscope.cn", "modelscope.ai", "www.modelscope.ai"}
)
# An owner or repository name on both hubs: letters, digits, '-', '_', '.'; not starting with a
# separator (huggingface_hub's validate_repo_id; ModelScope's names are a subset).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_HINT = "give owner/name, or the repository's URL (https://huggingface.co/owner/name)"


@dataclass(frozen=True)
class RepoRef:
    repo: str  # owner/name
    kind: str | None = None  # "hf" | "modelscope" from a URL's host; None for a bare owner/name
    revision: str | None = None  # a branch, tag or commit the URL names
    path: str | None = None  # a file inside the repository the URL names
    url: str | None = None  # the URL it was read from, if any


def looks_like_url(text: str) -> bool:
    t = text.strip().lower()
    return "://" in t or t.split("/", 1)[0] in HF_HOSTS | MODELSCOPE_HOSTS


def parse_repo_ref(text: str) -> RepoRef:
    """`owner/name` or a hub URL -> RepoRef; UsageError (exit 2) for anything else."""
    value = text.strip()
    if not looks_like_url(value):
        return RepoRef(repo=_repo_id(value.split("/"), text))
    parts = urlsplit(value if "://" in value else f"https://{value}")
    host = (parts.hostname or "").lower()
    segments = [unquote(s) for s in parts.path.split("/") if s]
    if parts.scheme not in ("http", "https") or not (host in HF_HOSTS or host in MODELSCOPE_HOSTS):
        raise UsageError(
            f"{text!r} is not a Hugging Face or ModelScope address",
            hint="give owner/name (with --source for ModelScope), or a huggingface.co or "
            "modelscope.cn URL",
        )
    if host in HF_HOSTS:
        return _hf(segments, text)
    return _modelscope(segments, parse_qs(parts.query), text)


def _repo_id(segments: list[str], text: str) -> str:
    if len(segments) != 2 or not all(_NAME.fullmatch(s) for s in segments):
        raise UsageError(f"cannot read {text!r} as a repository (owner/name)", hint=_HINT)
    return "/".join(segments)


def _file(rest: list[str], text: str) -> str:
    if not rest or any(s in (".", "..") for s in rest):
        raise UsageError(f"{text!r} names no file", hint=_HINT)
    return "/".join(rest)


def _hf(segments: list[str], text: str) -> RepoRef:
    if segments[:1] in (["datasets"], ["spaces"]):
        raise UsageError(
            f"{text!r} is a Hugging Face {segments[0][:-1]}, not a model repository", hint=_HINT
        )
    repo = _repo_id(segments[:2], text)
    rest = segments[2:]
    ref = RepoRef(repo=repo, kind="hf", url=text.strip())
    if not rest:
        return ref
    if rest[0] in ("tree", "commit") and len(rest) >= 2:
        return RepoRef(repo, "hf", revision=rest[1], url=ref.url)  # a folder: the repository
    if rest[0] in ("blob", "resolve", "raw") and len(rest) >= 3:
        return RepoRef(repo, "hf", revision=rest[1], path=_file(rest[2:], text), url=ref.url)
    raise UsageError(f"cannot read {text!r} as a Hugging Face repository or file", hint=_HINT)


def _modelscope(segments: list[str], query: dict[str, list[str]], text: str) -> RepoRef:
    url = text.strip()
    if segments[:3] == ["api", "v1", "models"] and segments[5:] == ["repo"]:
        repo = _repo_id(segments[3:5], text)
        revision = next(iter(query.get("Revision", [])), None)
        path = next(iter(query.get("FilePath", [])), None)
        return RepoRef(repo, "modelscope", revision=revision, path=path, url=url)
    if segments[:1] != ["models"]:
        raise UsageError(f"{text!r} is not a ModelScope model page", hint=_HINT)
    repo = _repo_id(segments[1:3], text)
    rest = segments[3:]
    if not rest or rest in (["files"], ["summary"]):
        return RepoRef(repo, "modelscope", url=url)
    if rest[:2] == ["file", "view"] and len(rest) >= 4:
        return RepoRef(repo, "modelscope", revision=rest[2], path=_file(rest[3:], text), url=url)
    if rest[0] == "resolve" and len(rest) >= 3:
        return RepoRef(repo, "modelscope", revision=rest[1], path=_file(rest[2:], text), url=url)
    raise UsageError(f"cannot read {text!r} as a ModelScope repository or file", hint=_HINT)
