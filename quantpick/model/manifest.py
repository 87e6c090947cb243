"""Manifests: one GGUF repository described as data (sources, architecture, files) and validated
from a parsed TOML document. Pure: reading manifest files and finding them is `registry.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NoReturn

from quantpick.arch.base import Architecture, HValue
from quantpick.errors import ManifestError
from quantpick.hub.kinds import KINDS, SOURCE_KINDS
from quantpick.json_view import attrs
from quantpick.safe_names import name_problem, path_conflicts

__all__ = ["Architecture", "Manifest", "ModelFile", "Sampling", "Source", "parse_manifest"]


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    min_p: float


@dataclass(frozen=True)
class Source:
    kind: str  # a hub kind: hub/kinds.py (hf, modelscope, mirror)
    repo: str | None = None  # "owner/name" for hf and modelscope
    revision: str | None = None  # pinned commit (hf) / revision (modelscope)
    url_template: str | None = None  # mirror: "https://host/path/{file}" ({file}, {revision})
    name: str | None = None  # a label for mirrors


@dataclass(frozen=True)
class ModelFile:
    name: str  # file name in the repository (may include folders without ".." / absolute parts)
    quant: str  # "Q4_K_M", "IQ2_M", "BF16", "F16" (mmproj)
    size_bytes: int
    size_exact: bool  # False: from the card's decimal GB, the hub listing is the authority
    sha256: str | None = None
    bits_per_weight: float | None = None
    quality_rank: int | None = None  # higher is better; None for projectors
    role: str = "model"  # "model" | "mmproj"
    shard: int | None = None  # 1-based index of a split file ("-00001-of-00003")
    shard_count: int | None = None


@dataclass(frozen=True)
class Manifest:
    id: str
    display_name: str
    license: str | None
    architecture: Architecture
    sources: tuple[Source, ...]
    files: tuple[ModelFile, ...]
    sampling: Sampling | None = None
    reasoning: bool = False
    checksums_file: str | None = "SHA256SUMS"  # a coreutils sha256sum file in the repo, if any
    path: str | None = None  # where it was loaded from
    description: str | None = None
    extra: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # other names `find_manifest` accepts (besides id and repos)
    origin: str | None = None  # "bundled" | "user" | "QUANTPICK_MANIFESTS"

    def quant_files(self, quant: str) -> tuple[ModelFile, ...]:
        """The file(s) of one quant (several for a split GGUF), shard order."""
        return self._by_quant.get(quant.upper(), ())

    @cached_property
    def _by_quant(self) -> dict[str, tuple[ModelFile, ...]]:
        # Built once: the planner asks for every quant's files once per quant (quadratic in the
        # quants, cubic with a scan: a 200-quant manifest took 7 s of 16 s here before).
        found: dict[str, list[ModelFile]] = {}
        for f in self.files:
            if f.role == "model":
                found.setdefault(f.quant.upper(), []).append(f)
        return {q: tuple(sorted(fs, key=lambda f: f.shard or 0)) for q, fs in found.items()}

    @property
    def quants(self) -> tuple[str, ...]:
        """Model quants, best quality first."""
        seen: dict[str, int] = {}
        for f in self.files:
            if f.role == "model":
                seen[f.quant] = f.quality_rank if f.quality_rank is not None else -1
        return tuple(sorted(seen, key=lambda q: -seen[q]))

    @property
    def projector(self) -> ModelFile | None:
        projectors = [f for f in self.files if f.role == "mmproj"]
        return projectors[0] if projectors else None


# ---------------------------------------------------------------------------------------------
# Loading and validation. The format is documented field by field in manifests/README.md.
# ---------------------------------------------------------------------------------------------

SCHEMA = 1  # the `schema = N` this quantpick reads
ROLES = ("model", "mmproj")
ORIGIN_BUNDLED, ORIGIN_USER, ORIGIN_ENV = "bundled", "user", "QUANTPICK_MANIFESTS"

MANIFEST_HINT = (
    "fix or remove that file (`quantpick manifest check FILE` re-checks it); "
    "the format is described in manifests/README.md"
)
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_QUANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_TEMPLATE_FIELD_RE = re.compile(r"{([^{}]*)}")
_TEMPLATE_FIELDS = ("file", "revision")

_TOP_KEYS = (
    "schema", "id", "display_name", "description", "license", "reasoning", "checksums_file",
    "aliases", "architecture", "sampling", "sources", "files", "extra",
)  # fmt: skip
# [architecture]: `name`, `has_output_tensor`, and GGUF keys without the `<arch>.` prefix
# ("attention.head_count_kv" = 8, or as a nested TOML table); the short names manifests used
# before architectures became data ("head_count_kv", "ssm_state_size") are read as aliases
# (arch.registry.manifest_aliases). These must be present and >= 1:
_ARCH_REQUIRED = ("block_count", "context_length", "embedding_length", "vocab_size")
_ARCH_MAX_ARRAY = 512  # LLAMA_MAX_LAYERS (src/llama-hparams.h:11): one value per layer at most
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")
_FILE_KEYS = (
    "name", "quant", "size_bytes", "size_exact", "sha256", "bits_per_weight", "quality_rank",
    "role", "shard", "shard_count",
)  # fmt: skip


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)  # fmt: skip
    shown = repr(value) if not isinstance(value, (list, dict)) else ""
    if isinstance(value, bool):
        shown = "true" if value else "false"
    return f"{shown} ({kind})" if shown and len(shown) <= 60 else kind


class _Reader:
    """Typed access to one TOML table; every failure names the file and the field path."""

    def __init__(self, file: str, data: Mapping[str, Any], prefix: str = "") -> None:
        self.file = file
        self.data = data
        self.prefix = prefix

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def fail(self, key: str | None, message: str) -> NoReturn:
        where = self.path(key) if key is not None else (self.prefix or "(top level)")
        raise ManifestError(f"{self.file}: {where}: {message}", hint=MANIFEST_HINT)

    def check_keys(self, allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        for key in self.data:
            if key not in allowed:
                import difflib  # only on errors: not on the start-up path

                close = difflib.get_close_matches(key, allowed, n=1)
                extra = f" (did you mean {close[0]!r}?)" if close else ""
                free = " (free-form keys go under [extra])" if not self.prefix else ""
                self.fail(key, f"unknown key{extra}{free or ''}")

    def _get(self, key: str, required: bool) -> Any:
        if key not in self.data:
            if required:
                self.fail(key, "missing (required)")
            return None
        return self.data[key]

    def _typed(self, key: str, required: bool, kinds: tuple[type, ...], expected: str) -> Any:
        """The value at `key`, None when it is absent and not required; one of `kinds` (a TOML
        boolean is no integer or number unless `kinds` names bool), else "expected `expected`"."""
        value = self._get(key, required)
        if value is None:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            self.fail(key, f"expected {expected}, got {_describe(value)}")
        return value

    def str_(self, key: str, *, required: bool = True, allow_empty: bool = False) -> str | None:
        value = self._typed(key, required, (str,), "a string")
        if value is None:
            return None
        if not allow_empty and not value.strip():
            self.fail(key, "must not be empty")
        return value

    def int_(self, key: str, *, required: bool = True, minimum: int | None = None) -> int | None:
        value = self._typed(key, required, (int,), "an integer")
        if value is None:
            return None
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def float_(
        self,
        key: str,
        *,
        required: bool = True,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float | None:
        value = self._typed(key, required, (int, float), "a number")
        if value is None:
            return None
        if value != value or value in (float("inf"), float("-inf")):
            self.fail(key, "must be a finite number")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum:g}, got {value:g}")
        if maximum is not None and value > maximum:
            self.fail(key, f"must be <= {maximum:g}, got {value:g}")
        return float(value)

    def bool_(self, key: str, *, required: bool = True) -> bool | None:
        value: bool | None = self._typed(key, required, (bool,), "true or false")
        return value

    def table(self, key: str, *, required: bool = True) -> _Reader | None:
        value = self._typed(key, required, (dict,), "a table")
        if value is None:
            return None
        return _Reader(self.file, value, self.path(key))

    def tables(self, key: str) -> list[_Reader]:
        """A required, non-empty array of tables (`[[key]]`)."""
        value = self._get(key, True)
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.fail(key, f"expected an array of tables ([[{key}]]), got {_describe(value)}")
        if not value:
            self.fail(key, "must not be empty")
        return [_Reader(self.file, v, f"{self.path(key)}[{i}]") for i, v in enumerate(value)]

    def strings(self, key: str) -> tuple[str, ...]:
        value = self._get(key, False)
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(key, f"expected an array of strings, got {_describe(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                self.fail(f"{key}[{i}]", f"expected a non-empty string, got {_describe(item)}")
        return tuple(value)


def check_file_name(name: str) -> str | None:
    """Why `name` is not a safe relative file name inside a repository (None when it is).

    Plain sub-folders ("BF16/x-00001-of-00002.gguf") are fine; anything that could escape the
    destination directory or mean different things on different systems is not.
    """
    return name_problem(name)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, full + "."))
        else:
            out[full] = value
    return out


def _hvalue(r: _Reader, key: str, gguf_key: str, value: Any) -> HValue:
    from quantpick.arch.keys import INTEGER_KEYS, PER_LAYER_KEYS, POSITIVE_KEYS

    def integer(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(value, list):
        if len(value) > _ARCH_MAX_ARRAY:
            r.fail(key, f"has {len(value)} values; at most {_ARCH_MAX_ARRAY} (one per layer)")
        for i, item in enumerate(value):
            if not isinstance(item, (bool, int, float)):
                r.fail(f"{key}[{i}]", f"expected a number, got {_describe(item)}")
            if gguf_key in INTEGER_KEYS and not integer(item):
                r.fail(f"{key}[{i}]", f"expected an integer, got {_describe(item)}")
            if integer(item) and item < 0:
                r.fail(f"{key}[{i}]", "must not be negative")
        if gguf_key in INTEGER_KEYS and gguf_key not in PER_LAYER_KEYS:
            r.fail(key, f"expected an integer, got {_describe(value)}")
        return tuple(value)
    if gguf_key in INTEGER_KEYS:
        if not integer(value):
            r.fail(key, f"expected an integer, got {_describe(value)}")
        minimum = 1 if gguf_key in POSITIVE_KEYS else 0
        if value < minimum:
            r.fail(key, f"must be >= {minimum}, got {value}")
        return int(value)
    if isinstance(value, (bool, int, float)):
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            r.fail(key, "must be a finite number")
        return value
    if isinstance(value, str):
        return value
    r.fail(key, f"expected a number, a boolean or an array of numbers, got {_describe(value)}")


def _parse_architecture(r: _Reader) -> Architecture:
    from quantpick.arch.keys import ARCH_KEYS
    from quantpick.arch.registry import manifest_aliases

    name = r.str_("name")
    assert name is not None
    has_output = r.bool_("has_output_tensor", required=False)
    aliases = manifest_aliases(name)
    values: dict[str, HValue] = {}
    for key, value in _flatten(r.data).items():
        if key in ("name", "has_output_tensor"):
            continue
        gguf_key = aliases.get(key, key)
        if gguf_key not in ARCH_KEYS:
            import difflib  # only on errors

            close = difflib.get_close_matches(key, [*aliases, *ARCH_KEYS], n=1)
            extra = f" (did you mean {close[0]!r}?)" if close else ""
            r.fail(key, f"unknown key{extra}: not a GGUF key llama.cpp reads")
        if gguf_key in values:
            r.fail(key, f"given twice (also as {gguf_key!r})")
        values[gguf_key] = _hvalue(r, key, gguf_key, value)
    from quantpick.arch.registry import required_keys

    short = {full: alias for alias, full in aliases.items()}
    for key in _ARCH_REQUIRED:
        if key not in values:
            r.fail(key, "missing (required)")
    for key in required_keys(name):
        value = values.get(key)
        shown = short.get(key, key)
        if value is None:
            r.fail(shown, f"missing (required for {name})")
        numbers = value if isinstance(value, tuple) else (value,)
        if any(not isinstance(v, (int, float)) or v < 1 for v in numbers):
            r.fail(shown, f"must be >= 1 for {name}, got {_describe(value)}")
    block_count = values["block_count"]
    nextn = values.get("nextn_predict_layers", 0)
    assert isinstance(block_count, int)
    if isinstance(nextn, int) and nextn >= block_count:
        r.fail("nextn_predict_layers", "must be smaller than block_count")
    used, experts = values.get("expert_used_count", 0), values.get("expert_count", 0)
    if isinstance(used, int) and isinstance(experts, int) and used > experts:
        r.fail("expert_used_count", "must not exceed expert_count")
    from quantpick.arch.keys import PER_LAYER_KEYS

    for key, value in values.items():
        if key in PER_LAYER_KEYS and isinstance(value, tuple) and len(value) != block_count:
            r.fail(key, f"has {len(value)} values; block_count is {block_count} (one per layer)")
    vocab = values.pop("vocab_size")
    assert isinstance(vocab, int)
    return Architecture.of(
        name, values, vocab, has_output_tensor=True if has_output is None else has_output
    )


def _parse_sampling(r: _Reader) -> Sampling:
    r.check_keys(_SAMPLING_KEYS)
    temperature = r.float_("temperature", minimum=0.0)
    top_p = r.float_("top_p", minimum=0.0, maximum=1.0)
    top_k = r.int_("top_k", minimum=0)
    min_p = r.float_("min_p", minimum=0.0, maximum=1.0)
    assert temperature is not None and top_p is not None and top_k is not None
    assert min_p is not None
    return Sampling(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p)


def _parse_source(r: _Reader) -> Source:
    kind = r.str_("kind")
    if kind not in SOURCE_KINDS:
        r.fail("kind", f"must be one of {', '.join(SOURCE_KINDS)}; got {kind!r}")
    r.check_keys(KINDS[kind].manifest_keys)
    revision = r.str_("revision", required=False)
    if revision is not None and revision != revision.strip():
        r.fail("revision", "must not have surrounding whitespace")
    name = r.str_("name", required=False)
    if kind == "mirror":
        template = r.str_("url_template")
        assert template is not None
        if not template.startswith(("https://", "http://")):
            r.fail("url_template", "must start with https:// or http://")
        fields = _TEMPLATE_FIELD_RE.findall(template)
        if "file" not in fields:
            r.fail("url_template", "must contain {file}")
        for f in fields:
            if f not in _TEMPLATE_FIELDS:
                r.fail(
                    "url_template", f"unknown placeholder {{{f}}} (allowed: {{file}}, {{revision}})"
                )
        if "revision" in fields and revision is None:
            r.fail("revision", "missing (required: url_template uses {revision})")
        return Source(kind=kind, url_template=template, revision=revision, name=name)
    repo = r.str_("repo")
    assert repo is not None
    if not _REPO_RE.match(repo):
        r.fail("repo", f"must be 'owner/name', got {repo!r}")
    return Source(kind=kind, repo=repo, revision=revision, name=name)


def _parse_file(r: _Reader) -> ModelFile:
    r.check_keys(_FILE_KEYS)
    name = r.str_("name", allow_empty=True)
    assert name is not None
    problem = check_file_name(name)
    if problem:
        r.fail("name", problem)
    quant = r.str_("quant")
    assert quant is not None
    if not _QUANT_RE.match(quant):
        r.fail("quant", f"must be letters, digits, '_', '-' or '.' (like Q4_K_M), got {quant!r}")
    size_bytes = r.int_("size_bytes", minimum=1)
    size_exact = r.bool_("size_exact")
    sha256 = r.str_("sha256", required=False, allow_empty=True)
    if sha256 is not None and not _SHA256_RE.match(sha256):
        r.fail("sha256", "must be 64 lowercase hex digits")
    bpw = r.float_("bits_per_weight", required=False, minimum=0.0)
    if bpw is not None and not 0.5 <= bpw <= 64:
        r.fail("bits_per_weight", f"must be between 0.5 and 64, got {bpw:g}")
    role = r.str_("role", required=False) or "model"
    if role not in ROLES:
        r.fail("role", f"must be one of {', '.join(ROLES)}; got {role!r}")
    rank = r.int_("quality_rank", required=False)
    if role == "model" and rank is None:
        r.fail("quality_rank", "missing (required for role = 'model'; higher is better)")
    if role != "model" and rank is not None:
        r.fail("quality_rank", f"only model files are ranked (this one has role = {role!r})")
    shard = r.int_("shard", required=False, minimum=1)
    shard_count = r.int_("shard_count", required=False, minimum=1)
    named = _SHARD_RE.search(name)
    if named:
        from_name = (int(named.group(1)), int(named.group(2)))
        if shard is None and shard_count is None:
            shard, shard_count = from_name
        elif (shard, shard_count) != from_name:
            r.fail("shard", f"the name says shard {from_name[0]} of {from_name[1]}")
    if (shard is None) != (shard_count is None):
        r.fail("shard" if shard is None else "shard_count", "give both shard and shard_count")
    if shard is not None and shard_count is not None and shard > shard_count:
        r.fail("shard", f"must be <= shard_count ({shard_count}), got {shard}")
    assert size_bytes is not None and size_exact is not None
    return ModelFile(
        name=name,
        quant=quant,
        size_bytes=size_bytes,
        size_exact=size_exact,
        sha256=sha256,
        bits_per_weight=bpw,
        quality_rank=rank,
        role=role,
        shard=shard,
        shard_count=shard_count,
    )


# Bounds on one manifest. The largest real repositories list ~40 quants (unsloth's, with their UD
# variants) in a few hundred files (a 1 T-parameter BF16 is ~50 shards); planning costs ~25 ms per
# quant here (2-core box, `pick` of a synthetic 200-quant manifest: 5.5 s), so 256 quants stay
# within seconds. A manifest file is at most 4 MiB (4,096 [[files]] of ~250 bytes: 1 MB) and
# nests at most config.MAX_NESTING levels, as config and hardware files.
MAX_MANIFEST_FILES = 4096
MAX_MANIFEST_QUANTS = 256
MAX_MANIFEST_BYTES = 4 * 1024**2


def _check_files(r: _Reader, files: list[ModelFile]) -> None:
    """Cross-file rules: unique names, complete shard sets, one rank per quant, ranks distinct."""
    if len(files) > MAX_MANIFEST_FILES:
        r.fail("files", f"{len(files)} files; a manifest lists at most {MAX_MANIFEST_FILES}")
    quants = {f.quant.upper() for f in files if f.role == "model"}
    if len(quants) > MAX_MANIFEST_QUANTS:
        r.fail("files", f"{len(quants)} quants; a manifest lists at most {MAX_MANIFEST_QUANTS}")
    seen: dict[str, int] = {}
    for i, f in enumerate(files):
        if f.name in seen:
            r.fail(f"files[{i}].name", f"duplicate of files[{seen[f.name]}] ({f.name!r})")
        seen[f.name] = i
    for name, why in path_conflicts(seen).items():
        r.fail(f"files[{seen[name]}].name", why)
    models = [(i, f) for i, f in enumerate(files) if f.role == "model"]
    if not models:
        r.fail("files", "no file has role = 'model'")
    by_quant: dict[str, list[tuple[int, ModelFile]]] = {}
    for i, f in models:
        by_quant.setdefault(f.quant.upper(), []).append((i, f))
    rank_owner: dict[int, str] = {}
    for quant, group in by_quant.items():
        first_i, first = group[0]
        for i, f in group[1:]:
            if f.quality_rank != first.quality_rank:
                r.fail(
                    f"files[{i}].quality_rank",
                    f"differs from files[{first_i}] (same quant {quant})",
                )
        if len(group) > 1 or first.shard is not None:
            counts = {f.shard_count for _, f in group}
            shards = sorted(f.shard or 0 for _, f in group)
            if None in counts or len(counts) != 1:
                r.fail(
                    f"files[{first_i}].quant",
                    f"{quant} has several files that are not one split set",
                )
            (count,) = counts
            if shards != list(range(1, (count or 0) + 1)):
                r.fail(
                    f"files[{first_i}].quant", f"{quant}: shards {shards} of {count} are incomplete"
                )
        assert first.quality_rank is not None
        if first.quality_rank in rank_owner:
            other = rank_owner[first.quality_rank]
            r.fail(f"files[{first_i}].quality_rank", f"{first.quality_rank} is also {other}'s rank")
        rank_owner[first.quality_rank] = quant


def parse_manifest(data: Mapping[str, Any], file: str = "<manifest>") -> Manifest:
    """Validate an already-parsed TOML document (`file` only labels the error messages)."""
    r = _Reader(file, data)
    schema = r.int_("schema")
    if schema != SCHEMA:
        if schema is not None and schema > SCHEMA:
            r.fail(
                "schema", f"is {schema}; this quantpick reads schema {SCHEMA} (upgrade quantpick)"
            )
        r.fail("schema", f"must be {SCHEMA}, got {schema}")
    r.check_keys(_TOP_KEYS)
    manifest_id = r.str_("id")
    assert manifest_id is not None
    if not _ID_RE.match(manifest_id):
        r.fail("id", "must be lowercase letters, digits, '.', '_' or '-' (e.g. qwen3.8-35b-a3b)")
    display_name = r.str_("display_name")
    description = r.str_("description", required=False)
    license_ = r.str_("license", required=False)
    reasoning = r.bool_("reasoning", required=False)
    checksums_file = r.str_("checksums_file", required=False, allow_empty=True)
    if checksums_file:
        problem = check_file_name(checksums_file)
        if problem:
            r.fail("checksums_file", problem)
    aliases = r.strings("aliases")
    arch_r = r.table("architecture")
    assert arch_r is not None
    architecture = _parse_architecture(arch_r)
    sampling_r = r.table("sampling", required=False)
    sampling = _parse_sampling(sampling_r) if sampling_r is not None else None
    sources = tuple(_parse_source(s) for s in r.tables("sources"))
    files = [_parse_file(f) for f in r.tables("files")]
    _check_files(r, files)
    extra: dict[str, str] = {}
    extra_r = r.table("extra", required=False)
    if extra_r is not None:
        for key, value in extra_r.data.items():
            if not isinstance(value, str):
                extra_r.fail(key, f"expected a string, got {_describe(value)}")
            extra[key] = value
    assert display_name is not None
    return Manifest(
        id=manifest_id,
        display_name=display_name,
        license=license_,
        architecture=architecture,
        sources=sources,
        files=tuple(files),
        sampling=sampling,
        reasoning=bool(reasoning),
        checksums_file=checksums_file or None,  # omitted or "" = the repo has no checksums file
        path=file,
        description=description,
        extra=extra,
        aliases=aliases,
    )


def manifest_to_dict(manifest: Manifest) -> dict[str, Any]:
    """A JSON-ready view (snake_case keys, bytes as integers) for `--json` outputs."""
    from dataclasses import asdict

    arch = manifest.architecture
    return {
        **attrs(manifest, "id display_name description license reasoning checksums_file"),
        "aliases": list(manifest.aliases),
        **attrs(manifest, "path origin"),
        "quants": list(manifest.quants),
        "architecture": architecture_to_dict(arch),
        "sampling": asdict(manifest.sampling) if manifest.sampling else None,
        "sources": [asdict(s) for s in manifest.sources],
        "files": [asdict(f) for f in manifest.files],
        "extra": dict(manifest.extra),
    }


def architecture_to_dict(arch: Architecture) -> dict[str, Any]:
    """The [architecture] block as JSON: the GGUF keys, and what the registry makes of them."""
    from quantpick.arch.registry import manifest_aliases, support, view_of

    view = view_of(arch)
    sup = support(arch.name)
    keys = dict(arch.hparams)
    # the short names earlier documents carried, beside the GGUF keys
    legacy = {short: keys[full] for short, full in manifest_aliases(arch.name).items()
              if full in keys}  # fmt: skip
    return {
        **{k: list(v) if isinstance(v, tuple) else v for k, v in legacy.items()},
        "name": arch.name,
        "vocab_size": arch.vocab_size,
        "has_output_tensor": arch.has_output_tensor,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in arch.hparams},
        "family": sup.family,
        "known": sup.known,
        "checked": sup.checked,
        "basis": sup.basis,
        "n_layer": view.n_layer,
        "memory": view.memory.value,
        "attention_layers": list(view.kv_layers),
        "recurrent_layer_count": len(view.recurrent_layers),
        "sliding_window": view.n_swa,
    }
