"""Manifest loading and validation: the bundled manifests, every validation rule, precedence."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from quantpick.config import load_settings
from quantpick.errors import ManifestError
from quantpick.model.manifest import (
    ORIGIN_BUNDLED,
    ORIGIN_ENV,
    ORIGIN_USER,
    Manifest,
    check_file_name,
    manifest_to_dict,
    parse_manifest,
)
from quantpick.model.registry import (
    bundled_manifest_dir,
    find_manifest,
    list_manifests,
    load_manifest_file,
)

REPO = Path(__file__).resolve().parents[2]
DISTILL = REPO / "manifests" / "qwen3.8-35b-a3b-distill.toml"
UNSLOTH = REPO / "manifests" / "qwen3.6-35b-a3b-unsloth.toml"


# --- a tiny TOML writer for test documents (strings, numbers, booleans, arrays, tables) --------


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def dump_toml(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for key, value in doc.items():
        is_table = isinstance(value, dict)
        is_aot = isinstance(value, list) and value and all(isinstance(x, dict) for x in value)
        if is_table or is_aot:
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_value(value)}")
    for key, value in tables:
        for table in value if isinstance(value, list) else [value]:
            lines.append(f"\n[[{key}]]" if isinstance(value, list) else f"\n[{key}]")
            lines += [f"{json.dumps(k)} = {_value(x)}" for k, x in table.items()]
    return "\n".join(lines) + "\n"


ARCH: dict[str, Any] = {
    "name": "qwen35moe",
    "block_count": 4,
    "nextn_predict_layers": 0,
    "context_length": 4096,
    "embedding_length": 64,
    "head_count": 4,
    "head_count_kv": 2,
    "key_length": 16,
    "value_length": 16,
    "expert_count": 8,
    "expert_used_count": 2,
    "expert_feed_forward_length": 32,
    "expert_shared_feed_forward_length": 32,
    "ssm_conv_kernel": 4,
    "ssm_state_size": 16,
    "ssm_group_count": 2,
    "ssm_time_step_rank": 4,
    "ssm_inner_size": 128,
    "full_attention_interval": 4,
    "vocab_size": 1000,
}


def base_doc(model_id: str = "tiny-test") -> dict[str, Any]:
    return {
        "schema": 1,
        "id": model_id,
        "display_name": "Tiny test model",
        "license": "MIT",
        "checksums_file": "SHA256SUMS",
        "architecture": copy.deepcopy(ARCH),
        "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0},
        "sources": [
            {"kind": "hf", "repo": "someone/Tiny-GGUF", "revision": "a" * 40},
            {"kind": "mirror", "name": "m", "url_template": "https://example.org/x/{file}"},
        ],
        "files": [
            {"name": "tiny-Q4_K_M.gguf", "quant": "Q4_K_M", "size_bytes": 1000,
             "size_exact": True, "sha256": "ab" * 32, "quality_rank": 2},
            {"name": "tiny-Q2_K.gguf", "quant": "Q2_K", "size_bytes": 600, "size_exact": False,
             "quality_rank": 1},
            {"name": "Q8_0/tiny-Q8_0-00001-of-00002.gguf", "quant": "Q8_0", "size_bytes": 900,
             "size_exact": True, "quality_rank": 3},
            {"name": "Q8_0/tiny-Q8_0-00002-of-00002.gguf", "quant": "Q8_0", "size_bytes": 800,
             "size_exact": True, "quality_rank": 3},
            {"name": "mmproj-tiny-F16.gguf", "quant": "F16", "role": "mmproj",
             "size_bytes": 100, "size_exact": True},
        ],
    }  # fmt: skip


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_toml(doc), encoding="utf-8")
    return path


def load_error(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = write(tmp_path / "bad.toml", doc)
    with pytest.raises(ManifestError) as info:
        load_manifest_file(path)
    message = info.value.message
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message
    return message


# --- the bundled manifests ---------------------------------------------------------------------


def test_bundled_dir_is_the_repo_manifests_in_a_checkout() -> None:
    assert bundled_manifest_dir() == REPO / "manifests"
    assert {p.name for p in bundled_manifest_dir().glob("*.toml")} >= {DISTILL.name, UNSLOTH.name}


def test_distill_manifest() -> None:
    m = load_manifest_file(DISTILL)
    assert m.id == "qwen3.8-35b-a3b-distill"
    assert len(m.files) == 11
    assert m.quants == (
        "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "IQ3_M", "Q2_K", "IQ2_M",
    )  # fmt: skip
    (q4,) = m.quant_files("q4_k_m")
    assert q4.name == "Qwen3.8-35B-A3B-Q4_K_M.gguf"
    assert q4.size_bytes == 21_713_462_944 and q4.size_exact
    assert q4.sha256 == "196103269085bc54c9b8f49ed21e9f53e1b56b465e8b796c6d8e31e06f63cfa5"
    assert q4.bits_per_weight == pytest.approx(4.89)
    exact = {f.quant: (f.size_bytes, f.sha256[:8]) for f in m.files if f.size_exact and f.sha256}
    assert exact == {
        "IQ3_M": (16_339_529_600, "0ad7b253"),
        "IQ4_XS": (19_627_788_160, "b645af45"),
        "Q4_K_M": (21_713_462_944, "19610326"),
        "F16": (899_283_520, "4381cb51"),
    }
    # Card sizes: decimal GB x 1e9, flagged inexact; the 11 files add up to the card's 266.1 GB.
    assert m.quant_files("BF16")[0].size_bytes == 71_067_000_000
    assert not m.quant_files("BF16")[0].size_exact
    assert sum(f.size_bytes for f in m.files) == 266_067_064_224
    assert m.projector is not None and m.projector.name == "mmproj-Qwen3.8-35B-A3B-F16.gguf"
    assert m.projector.quality_rank is None
    a = m.architecture
    assert (a.name, a.block_count, a.nextn_predict_layers, a.n_layer) == ("qwen35moe", 41, 1, 40)
    from quantpick.arch.registry import view_of

    assert view_of(a).kv_layers == tuple(range(3, 40, 4))
    assert len(view_of(a).recurrent_layers) == 30
    assert (a.expert_count, a.expert_used_count, a.vocab_size) == (256, 8, 248_320)
    assert m.sampling is not None and (m.sampling.top_k, m.sampling.min_p) == (20, 0.0)
    assert m.reasoning and m.license == "Apache-2.0" and m.checksums_file == "SHA256SUMS"
    kinds = {s.kind: s for s in m.sources}
    assert set(kinds) == {"hf", "mirror"}  # no ModelScope copy of this repo is known
    assert kinds["hf"].revision == "b1f9d1dcc3de8aa867669b0ab919384aeeb9b8d5"
    assert kinds["mirror"].url_template is not None and "{file}" in kinds["mirror"].url_template


def test_distill_sizes_and_ranks_agree() -> None:
    m = load_manifest_file(DISTILL)
    models = [f for f in m.files if f.role == "model"]
    by_size = sorted(models, key=lambda f: f.size_bytes)
    ranks = [f.quality_rank for f in by_size]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert [f.quant for f in by_size] == [
        "IQ2_M", "Q2_K", "IQ3_M", "Q3_K_M", "IQ4_XS", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "BF16",
    ]  # fmt: skip
    for f in models:  # bits per weight = bytes * 8 / 35,505,251,456 params
        assert f.bits_per_weight == pytest.approx(f.size_bytes * 8 / 35_505_251_456, abs=0.006)


def test_unsloth_manifest() -> None:
    m = load_manifest_file(UNSLOTH)
    assert m.id == "qwen3.6-35b-a3b-unsloth"
    assert m.checksums_file is None  # unsloth repos have no SHA256SUMS
    assert len(m.quants) == 23
    assert [f.name for f in m.files if f.role == "mmproj"] == [
        "mmproj-F16.gguf",
        "mmproj-BF16.gguf",
    ]
    assert all(f.size_exact for f in m.files)
    (q4,) = m.quant_files("UD-Q4_K_M")
    assert q4.name == "Qwen3.6-35B-A3B-UD-Q4_K_M.gguf"
    assert q4.size_bytes == 22_134_528_992
    assert q4.sha256 == "ac0e2c1189e055faa36eff361580e79c5bd6f8e76bffb4ce547f167d53e31a61"
    assert m.quant_files("UD-Q2_K_XL")[0].size_bytes == 12_290_628_576
    assert m.quant_files("UD-IQ4_NL")[0].size_bytes == 18_040_888_288
    assert m.quant_files("Q8_0")[0].size_bytes == 36_903_140_320
    assert m.quant_files("UD-Q2_K_XL")[0].sha256 == (
        "96b9c0af5c77a4ecaabe3983175112b5ece763261c1ece12b2494b692a70dad7"
    )
    a = m.architecture
    assert (a.block_count, a.nextn_predict_layers, a.n_layer) == (40, 0, 40)
    from quantpick.arch.registry import view_of

    assert len(view_of(a).kv_layers) == 10
    sources = {s.kind: s for s in m.sources}
    assert sources["hf"].revision == "a483e9e6cbd595906af30beda3187c2663a1118c"
    assert sources["modelscope"].repo == "unsloth/Qwen3.6-35B-A3B-GGUF"
    assert sources["modelscope"].revision == "a2a9fd3585d658243e64acd133f247980392f82b"
    # Ranks follow size within the family, so the best quant is the biggest.
    models = sorted((f for f in m.files if f.role == "model"), key=lambda f: f.size_bytes)
    assert [f.quant for f in models] == list(reversed(m.quants))
    assert m.quants[0] == "UD-Q8_K_XL" and m.quants[-1] == "UD-IQ1_M"


def test_list_manifests_default_settings_has_both() -> None:
    ids = [m.id for m in list_manifests()]
    assert ids == ["qwen3.6-35b-a3b-unsloth", "qwen3.8-35b-a3b-distill"]
    assert all(m.origin == ORIGIN_BUNDLED for m in list_manifests())


# --- a valid test manifest, quant_files / quants ------------------------------------------------


def test_base_doc_is_valid_and_shards_are_read(tmp_path: Path) -> None:
    m = load_manifest_file(write(tmp_path / "tiny.toml", base_doc()))
    assert m.path == str(tmp_path / "tiny.toml")
    assert m.quants == ("Q8_0", "Q4_K_M", "Q2_K")  # best first
    shards = m.quant_files("q8_0")
    assert [(f.shard, f.shard_count) for f in shards] == [(1, 2), (2, 2)]
    assert m.quant_files("Q4_K_M")[0].shard is None
    assert m.quant_files("MISSING") == ()
    assert m.sampling is not None and m.sampling.min_p == 0.0
    assert isinstance(m.sampling.min_p, float)  # an integer 0 in TOML becomes a float
    assert m.architecture.has_output_tensor is True  # default


def test_quant_files_returns_shards_in_order_whatever_the_file_order(tmp_path: Path) -> None:
    doc = base_doc()
    doc["files"][2], doc["files"][3] = doc["files"][3], doc["files"][2]
    m = load_manifest_file(write(tmp_path / "tiny.toml", doc))
    assert [f.shard for f in m.quant_files("Q8_0")] == [1, 2]


def test_optional_fields_default(tmp_path: Path) -> None:
    doc = base_doc()
    for key in ("license", "checksums_file", "sampling"):
        del doc[key]
    m = load_manifest_file(write(tmp_path / "tiny.toml", doc))
    assert (m.license, m.checksums_file, m.sampling, m.reasoning) == (None, None, None, False)


def test_extra_table_allows_free_keys(tmp_path: Path) -> None:
    doc = base_doc()
    doc["extra"] = {"anything_goes": "yes", "Another-Key": "1"}
    m = load_manifest_file(write(tmp_path / "tiny.toml", doc))
    assert m.extra == {"anything_goes": "yes", "Another-Key": "1"}


def test_manifest_to_dict_is_json_ready() -> None:
    d = manifest_to_dict(load_manifest_file(DISTILL))
    text = json.dumps(d)
    assert json.loads(text)["files"][5]["size_bytes"] == 21_713_462_944
    assert d["architecture"]["n_layer"] == 40


# --- every validation rule: one error naming file and field ------------------------------------


def _mutated(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = base_doc()
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        # missing required fields
        (("id",), _DELETE, "id: missing (required)"),
        (("display_name",), _DELETE, "display_name: missing (required)"),
        (("architecture",), _DELETE, "architecture: missing (required)"),
        (("architecture", "block_count"), _DELETE, "architecture.block_count: missing"),
        (("files", 1, "size_bytes"), _DELETE, "files[1].size_bytes: missing"),
        (("files", 1, "size_exact"), _DELETE, "files[1].size_exact: missing"),
        (("files", 0, "quality_rank"), _DELETE, "files[0].quality_rank: missing"),
        (("sources",), _DELETE, "sources: missing"),
        (("sources", 0, "repo"), _DELETE, "sources[0].repo: missing"),
        (("sources", 1, "url_template"), _DELETE, "sources[1].url_template: missing"),
        # wrong types
        (("architecture", "block_count"), True, "architecture.block_count: expected an integer"),
        (("architecture", "block_count"), "41", "architecture.block_count: expected an integer"),
        (("architecture", "head_count"), 16.0, "architecture.head_count: expected an integer"),
        (("files", 0, "size_bytes"), 1.5, "files[0].size_bytes: expected an integer"),
        (("files", 0, "size_exact"), "yes", "files[0].size_exact: expected true or false"),
        (("files", 0, "quality_rank"), False, "files[0].quality_rank: expected an integer"),
        (("sampling", "top_p"), "0.9", "sampling.top_p: expected a number"),
        (("sampling", "top_p"), True, "sampling.top_p: expected a number"),
        (("display_name",), 3, "display_name: expected a string"),
        (("display_name",), " ", "display_name: must not be empty"),
        (("files",), [], "files: must not be empty"),
        (("files",), "x.gguf", "files: expected an array of tables"),
        (("architecture",), "qwen", "architecture: expected a table"),
        (("reasoning",), "yes", "reasoning: expected true or false"),
        (("aliases",), ["ok", 3], "aliases[1]: expected a non-empty string"),
        # ranges
        (("files", 0, "size_bytes"), 0, "files[0].size_bytes: must be >= 1"),
        (("architecture", "full_attention_interval"), 0, "full_attention_interval: must be >= 1"),
        (("architecture", "nextn_predict_layers"), 4, "nextn_predict_layers: must be smaller"),
        (("architecture", "expert_used_count"), 9, "expert_used_count: must not exceed"),
        (("sampling", "top_p"), 1.5, "sampling.top_p: must be <= 1"),
        (("files", 0, "bits_per_weight"), 100.0, "files[0].bits_per_weight: must be between"),
        # schema and id
        (("schema",), _DELETE, "schema: missing (required)"),
        (("schema",), 2, "schema: is 2; this quantpick reads schema 1"),
        (("schema",), 0, "schema: must be 1"),
        (("id",), "Has Spaces", "id: must be lowercase"),
        # file names
        (("files", 3, "name"), "/abs/x.gguf", "files[3].name: must be relative (no leading '/')"),
        (("files", 3, "name"), "../x.gguf", "files[3].name: must not contain '..'"),
        (("files", 3, "name"), "a/../../x.gguf", "files[3].name: must not contain '..'"),
        (("files", 3, "name"), "a\x00.gguf", "files[3].name: must not contain NUL"),
        (("files", 3, "name"), "Q8_0\\x.gguf", "files[3].name: must not contain backslashes"),
        (("files", 3, "name"), "", "files[3].name: must not be empty"),
        (("files", 3, "name"), "C:x.gguf", "files[3].name: must be relative (no drive letter)"),
        (("files", 3, "name"), "a//b.gguf", "files[3].name: must not contain empty or '.'"),
        (("files", 3, "name"), "./b.gguf", "files[3].name: must not contain empty or '.'"),
        (("files", 3, "name"), "a\nb.gguf", "files[3].name: must not contain control characters"),
        (("checksums_file",), "../SUMS", "checksums_file: must not contain '..'"),
        # hashes, quants, roles
        (("files", 0, "sha256"), "AB" * 32, "files[0].sha256: must be 64 lowercase hex digits"),
        (("files", 0, "sha256"), "ab" * 31, "files[0].sha256: must be 64 lowercase hex digits"),
        (("files", 0, "sha256"), "zz" * 32, "files[0].sha256: must be 64 lowercase hex digits"),
        (("files", 0, "quant"), "Q4 K M", "files[0].quant: must be letters"),
        (("files", 0, "quant"), "", "files[0].quant: must not be empty"),
        (("files", 0, "role"), "vision", "files[0].role: must be one of model, mmproj"),
        (("files", 4, "quality_rank"), 9, "files[4].quality_rank: only model files are ranked"),
        # sources
        (("sources", 0, "kind"), "ftp", "sources[0].kind: must be one of hf, modelscope, mirror"),
        (("sources", 0, "repo"), "no-slash", "sources[0].repo: must be 'owner/name'"),
        (("sources", 1, "url_template"), "https://e.org/x", "url_template: must contain {file}"),
        (("sources", 1, "url_template"), "ftp://e.org/{file}", "url_template: must start with"),
        (("sources", 1, "url_template"), "https://e/{fle}/{file}", "unknown placeholder {fle}"),
        (("sources", 1, "url_template"), "https://e/{revision}/{file}", "[1].revision: missing"),
        (("sources", 1, "repo"), "a/b", "sources[1].repo: unknown key"),
        # unknown keys (typos), with a suggestion
        (("sizes_bytes",), 1, "sizes_bytes: unknown key"),
        (("files", 0, "size_byte"), 1, "size_byte: unknown key (did you mean 'size_bytes'?)"),
        (("architecture", "block_cout"), 1, "architecture.block_cout: unknown key (did you mean"),
        (("sampling", "temp"), 1, "sampling.temp: unknown key"),
        (("extra",), {"n": 1}, "extra.n: expected a string"),
    ],
)  # fmt: skip
def test_each_validation_error(
    tmp_path: Path, path: tuple[Any, ...], value: Any, expected: str
) -> None:
    message = load_error(tmp_path, _mutated(path, value))
    assert expected in message, message


def test_unknown_top_level_key_points_to_extra(tmp_path: Path) -> None:
    message = load_error(tmp_path, _mutated(("homepage",), "https://x"))
    assert message.endswith("homepage: unknown key (free-form keys go under [extra])")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["files"].append(dict(d["files"][0])), "files[5].name: duplicate of files[0]"),
        (lambda d: d["files"].__delitem__(3), "Q8_0: shards [1] of 2 are incomplete"),
        (lambda d: d["files"][3].update(quality_rank=4), "files[3].quality_rank: differs from"),
        (lambda d: d["files"][1].update(quality_rank=2), "quality_rank: 2 is also Q4_K_M's rank"),
        (lambda d: d["files"][3].update(shard=1), "files[3].shard: the name says shard 2 of 2"),
        (lambda d: d["files"][0].update(shard=1), "files[0].shard_count: give both"),
        (lambda d: d["files"][0].update(shard=3, shard_count=2), "files[0].shard: must be <="),
        (lambda d: d.__setitem__("files", [d["files"][4]]), "files: no file has role = 'model'"),
        (
            lambda d: d["files"].append(dict(d["files"][1], name="other-Q2_K.gguf")),
            "Q2_K has several files that are not one split set",
        ),
        (
            lambda d: d["files"][4].update(name="tiny-Q4_K_M.gguf/mmproj-F16.gguf"),
            "'tiny-Q4_K_M.gguf' is listed both as a file and as a folder",
        ),
        (
            lambda d: d["files"][4].update(name="m" * 300 + ".gguf"),
            "has a 305-byte component",
        ),
    ],
)
def test_cross_file_rules(tmp_path: Path, mutate: Any, expected: str) -> None:
    doc = base_doc()
    mutate(doc)
    message = load_error(tmp_path, doc)
    assert expected in message, message


def test_invalid_toml_and_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.toml"
    bad.write_text("schema = 1\nid = \n", encoding="utf-8")
    with pytest.raises(ManifestError, match=r"broken\.toml: invalid TOML"):
        load_manifest_file(bad)
    with pytest.raises(ManifestError, match=r"missing\.toml: cannot read"):
        load_manifest_file(tmp_path / "missing.toml")


def test_parse_manifest_labels_errors_with_the_given_name() -> None:
    doc = base_doc()
    doc["files"][2]["name"] = "../x-00001-of-00002.gguf"
    with pytest.raises(ManifestError) as info:
        parse_manifest(doc, "manifests/foo.toml")
    assert info.value.message == "manifests/foo.toml: files[2].name: must not contain '..'"
    assert info.value.hint and "manifest check" in info.value.hint


@pytest.mark.parametrize(
    "name", ["x.gguf", "Q4_K_M/x.gguf", "BF16/Qwen-BF16-00001-of-00002.gguf", "a.b/c..d.gguf"]
)
def test_safe_file_names(name: str) -> None:
    assert check_file_name(name) is None


# --- directories and precedence ----------------------------------------------------------------


def test_user_dir_and_quantpick_manifests_override_by_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings()
    user_dir = settings.user_manifest_dir
    assert str(user_dir).startswith(str(tmp_path / "home"))  # conftest isolates QUANTPICK_HOME
    # The user overrides the bundled distill and adds a model of their own.
    override = base_doc("qwen3.8-35b-a3b-distill")
    override["display_name"] = "user copy"
    write(user_dir / "distill.toml", override)
    write(user_dir / "mine.toml", base_doc("mine"))
    # QUANTPICK_MANIFESTS (two dirs) overrides the user dir, the later entry wins.
    env1, env2 = tmp_path / "env1", tmp_path / "env2"
    write(env1 / "a.toml", dict(base_doc("mine"), display_name="env1 mine"))
    write(env2 / "b.toml", dict(base_doc("mine"), display_name="env2 mine"))
    monkeypatch.setenv("QUANTPICK_MANIFESTS", os.pathsep.join([str(env1), str(env2)]))

    by_id = {m.id: m for m in list_manifests()}
    assert set(by_id) == {"qwen3.6-35b-a3b-unsloth", "qwen3.8-35b-a3b-distill", "mine"}
    assert by_id["qwen3.8-35b-a3b-distill"].display_name == "user copy"
    assert by_id["qwen3.8-35b-a3b-distill"].origin == ORIGIN_USER
    assert by_id["mine"].display_name == "env2 mine"
    assert by_id["mine"].origin == ORIGIN_ENV
    assert by_id["mine"].path == str(env2 / "b.toml")
    assert by_id["qwen3.6-35b-a3b-unsloth"].origin == ORIGIN_BUNDLED
    assert find_manifest("mine").display_name == "env2 mine"


def test_explicit_settings_are_used(tmp_path: Path) -> None:
    write(tmp_path / "h" / "config" / "manifests" / "x.toml", base_doc("from-settings"))
    settings = load_settings({"QUANTPICK_HOME": str(tmp_path / "h")})
    assert "from-settings" in [m.id for m in list_manifests(settings)]
    assert "from-settings" not in [m.id for m in list_manifests()]
    assert find_manifest("FROM-SETTINGS", settings).id == "from-settings"


def test_quantpick_manifests_may_name_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "single.toml", base_doc("single"))
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(path))
    assert find_manifest("single").path == str(path)


def test_missing_quantpick_manifests_dir_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(tmp_path / "nope"))
    with pytest.raises(ManifestError, match="QUANTPICK_MANIFESTS: .*nope: no such directory"):
        list_manifests()
    errors: list[ManifestError] = []
    assert len(list_manifests(errors=errors)) == 2
    assert len(errors) == 1 and "no such directory" in errors[0].message


def test_missing_user_dir_is_fine() -> None:
    assert not load_settings().user_manifest_dir.exists()
    assert len(list_manifests()) == 2


def test_broken_manifest_raises_naming_it_unless_errors_are_collected(tmp_path: Path) -> None:
    user_dir = load_settings().user_manifest_dir
    doc = base_doc("broken")
    doc["files"][0]["sha256"] = "nothex"
    broken = write(user_dir / "broken.toml", doc)
    with pytest.raises(ManifestError) as info:
        list_manifests()
    assert info.value.message == f"{broken}: files[0].sha256: must be 64 lowercase hex digits"
    # another model is found, the broken file skipped with a note; the one naming it is an error
    notes: list[str] = []
    assert find_manifest("qwen3.8-35b-a3b-distill", on_note=notes.append).id.startswith("qwen3.8")
    assert notes == [f"skipped a manifest that does not load: {info.value.message}"]
    with pytest.raises(ManifestError, match="broken.toml"):
        find_manifest("broken")
    errors: list[ManifestError] = []
    ids = [m.id for m in list_manifests(errors=errors)]
    assert ids == ["qwen3.6-35b-a3b-unsloth", "qwen3.8-35b-a3b-distill"]
    assert [e.message for e in errors] == [info.value.message]


def test_duplicate_id_in_one_directory_is_an_error(tmp_path: Path) -> None:
    user_dir = load_settings().user_manifest_dir
    write(user_dir / "a.toml", base_doc("twice"))
    write(user_dir / "b.toml", base_doc("twice"))
    with pytest.raises(ManifestError, match=r"b\.toml: id: 'twice' is also the id of .*a\.toml"):
        list_manifests()


# --- find_manifest -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("qwen3.8-35b-a3b-distill", "qwen3.8-35b-a3b-distill"),
        ("Qwen3.8-35B-A3B-Distill", "qwen3.8-35b-a3b-distill"),
        ("empero-ai/Qwen3.8-35B-A3B-Distill-GGUF", "qwen3.8-35b-a3b-distill"),
        ("empero-ai/qwen3.8-35b-a3b-distill-gguf", "qwen3.8-35b-a3b-distill"),
        (
            "https://huggingface.co/empero-ai/Qwen3.8-35B-A3B-Distill-GGUF",
            "qwen3.8-35b-a3b-distill",
        ),
        ("hf.co/empero-ai/Qwen3.8-35B-A3B-Distill-GGUF/", "qwen3.8-35b-a3b-distill"),
        ("qwen3.8-35b-a3b", "qwen3.8-35b-a3b-distill"),  # alias
        ("unsloth/Qwen3.6-35B-A3B-GGUF", "qwen3.6-35b-a3b-unsloth"),
        ("https://modelscope.cn/models/unsloth/Qwen3.6-35B-A3B-GGUF", "qwen3.6-35b-a3b-unsloth"),
    ],
)
def test_find_manifest(name: str, expected: str) -> None:
    m = find_manifest(name)
    assert isinstance(m, Manifest) and m.id == expected


def test_find_unknown_lists_known_ids() -> None:
    with pytest.raises(ManifestError) as info:
        find_manifest("qwen3.8-35b-a3b-distil")
    assert info.value.message == "unknown model 'qwen3.8-35b-a3b-distil'"
    assert info.value.hint is not None
    assert "did you mean qwen3.8-35b-a3b-distill?" in info.value.hint
    assert "qwen3.6-35b-a3b-unsloth" in info.value.hint


def test_find_ambiguous_repo_alias(tmp_path: Path) -> None:
    user_dir = load_settings().user_manifest_dir
    doc = base_doc("copy-of-distill")
    doc["sources"][0]["repo"] = "empero-ai/Qwen3.8-35B-A3B-Distill-GGUF"
    write(user_dir / "copy.toml", doc)
    with pytest.raises(ManifestError, match="names several manifests"):
        find_manifest("empero-ai/Qwen3.8-35B-A3B-Distill-GGUF")
    assert find_manifest("copy-of-distill").id == "copy-of-distill"  # ids stay unambiguous
