"""`quantpick manifest add` against the fake HF / ModelScope hubs, and `manifest check`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fakehub import FakeHub
from gguf_fixtures import TINY, write_gguf, write_split
from typer.testing import CliRunner

import quantpick.cli  # noqa: F401 - registers models/show on the app
import quantpick.cli.manifests  # noqa: F401 - registers `manifest` (not yet in cli/__init__)
from quantpick.cli import app
from quantpick.config import load_settings
from quantpick.model.gguf import read_gguf_file, read_gguf_split
from quantpick.model.headers import layout_for
from quantpick.model.registry import bundled_manifest_dir, load_manifest_file

runner = CliRunner()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def repo_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("repo")
    files: dict[str, Path] = {}
    for big in ("Q8_0", "F16"):
        path = root / f"Tiny-{big}.gguf"
        write_gguf(path, TINY, big=big, mtp=True)
        files[path.name] = path
    split_dir = root / "BF16"
    split_dir.mkdir()
    for p in write_split(split_dir, "Tiny-BF16", 2, TINY, big="BF16", mtp=True):
        files[f"BF16/{p.name}"] = p
    mmproj = root / "mmproj-F16.gguf"
    mmproj.write_bytes(b"GGUF" + b"\0" * 4096)
    files[mmproj.name] = mmproj
    sums = "".join(f"{_sha(p)}  {n}\n" for n, p in files.items())
    (root / "SHA256SUMS").write_text(sums)
    files["SHA256SUMS"] = root / "SHA256SUMS"
    (root / "README.md").write_text("# tiny\n")
    files["README.md"] = root / "README.md"
    return files


def _add(*args: str) -> object:
    return runner.invoke(app, ["manifest", "add", *args])


@pytest.mark.parametrize("kind", ["hf", "modelscope"])
def test_add_writes_a_manifest_show_accepts(
    fake_hub: FakeHub, repo_files: dict[str, Path], kind: str
) -> None:
    repo = fake_hub.add_repo("org/Tiny-GGUF", dict(repo_files))
    result = _add("org/Tiny-GGUF", "--source", kind, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["id"] == "tiny-org"
    path = Path(doc["path"])
    assert path.parent == load_settings().user_manifest_dir
    manifest = load_manifest_file(path)

    # quants by bits per weight: BF16 (split) > F16 > Q8_0
    assert manifest.quants == ("BF16", "F16", "Q8_0")
    assert [q["quant"] for q in doc["quants"]] == ["BF16", "F16", "Q8_0"]
    q8 = manifest.quant_files("Q8_0")[0]
    assert q8.bits_per_weight is not None and 8.0 < q8.bits_per_weight < 9.5
    assert q8.sha256 == _sha(repo_files["Tiny-Q8_0.gguf"])
    assert q8.size_bytes == repo_files["Tiny-Q8_0.gguf"].stat().st_size
    shards = manifest.quant_files("BF16")
    assert [(f.shard, f.shard_count) for f in shards] == [(1, 2), (2, 2)]
    assert manifest.projector is not None and manifest.projector.name == "mmproj-F16.gguf"
    assert manifest.checksums_file == "SHA256SUMS"
    assert manifest.sampling is not None and manifest.sampling.top_k == 20
    source = manifest.sources[0]
    assert (source.kind, source.repo) == (kind, "org/Tiny-GGUF")
    if kind == "hf":
        assert source.revision == repo.commit
    assert {n["name"] for n in doc["skipped"]} == set()

    # the architecture block is the header's, and the exact layout agrees with a local read
    header = read_gguf_file(repo_files["Tiny-Q8_0.gguf"])
    layout = layout_for(
        manifest, "Q8_0", settings=load_settings(), network=False, require_exact=True
    )  # cached by `add`: no network needed
    assert layout.basis.startswith("gguf-cache:")
    assert layout.tensors == header.tensors
    assert manifest.architecture == layout.architecture
    bf16 = layout_for(manifest, "BF16", settings=load_settings(), network=True, require_exact=True)
    assert bf16.tensors == read_gguf_split(repo_files["BF16/Tiny-BF16-00001-of-00002.gguf"]).tensors

    shown = runner.invoke(app, ["show", "tiny-org", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["id"] == "tiny-org"
    checked = runner.invoke(app, ["manifest", "check", str(path)])
    assert checked.exit_code == 0 and checked.stdout.startswith("OK ")


def test_add_reads_one_header_only(fake_hub: FakeHub, repo_files: dict[str, Path]) -> None:
    fake_hub.add_repo("org/Tiny-GGUF", dict(repo_files))
    result = _add("org/Tiny-GGUF", "--json")
    assert result.exit_code == 0, result.output
    byte_requests = [r for r in fake_hub.requests if str(r.get("file", "")).endswith(".gguf")]
    assert {r["file"] for r in byte_requests} == {"Tiny-Q8_0.gguf"}
    header = json.loads(result.stdout)["header"]
    assert header["file"] == "Tiny-Q8_0.gguf" and header["requests"] >= 1


def test_add_refuses_an_existing_id_unless_forced(
    fake_hub: FakeHub, repo_files: dict[str, Path]
) -> None:
    fake_hub.add_repo("org/Tiny-GGUF", dict(repo_files))
    assert _add("org/Tiny-GGUF").exit_code == 0
    again = _add("org/Tiny-GGUF")
    assert again.exit_code == 1
    assert "already exists" in again.stderr
    assert _add("org/Tiny-GGUF", "--force").exit_code == 0
    other = _add("org/Tiny-GGUF", "--id", "my-tiny", "--json")
    assert other.exit_code == 0
    assert Path(json.loads(other.stdout)["path"]).name == "my-tiny.toml"
    # a bundled id is taken too
    bundled = load_manifest_file(next(bundled_manifest_dir().glob("*.toml")))
    clash = _add("org/Tiny-GGUF", "--id", bundled.id)
    assert clash.exit_code == 1 and "already exists" in clash.stderr


def test_add_takes_an_architecture_quantpick_does_not_model(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    # Any GGUF repository: an unknown architecture is described from its header (weights exact,
    # KV by the generic rule) and says so, never refused.
    path = tmp_path / "Newarch-Q8_0.gguf"
    write_gguf(path, TINY, arch="newarch")
    fake_hub.add_repo("org/Newarch-GGUF", {path.name: path})
    result = _add("org/Newarch-GGUF")
    assert result.exit_code == 0, result.stderr
    (written,) = load_settings().user_manifest_dir.glob("*.toml")
    manifest = load_manifest_file(written)
    assert manifest.architecture.name == "newarch"
    assert manifest.architecture.block_count == 8


def test_add_without_gguf_files(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/Empty", {"README.md": b"nothing here"})
    result = _add("org/Empty")
    assert result.exit_code == 1
    assert "no GGUF model files" in result.stderr


def test_add_warns_when_sha256sums_disagrees(fake_hub: FakeHub, tmp_path: Path) -> None:
    path = tmp_path / "Tiny-Q8_0.gguf"
    write_gguf(path, TINY)
    sums = f"{'0' * 64}  {path.name}\n".encode()
    fake_hub.add_repo("org/Tiny-GGUF", {path.name: path, "SHA256SUMS": sums})
    result = _add("org/Tiny-GGUF", "--json")
    assert result.exit_code == 0, result.output
    assert "keeping the listing's" in result.stderr
    manifest = load_manifest_file(Path(json.loads(result.stdout)["path"]))
    assert manifest.files[0].sha256 == _sha(path)


def test_add_bad_source() -> None:
    result = _add("org/x", "--source", "gitlab")
    assert result.exit_code == 2


# ----------------------------------------------------------------------------------------------
# manifest check


@pytest.mark.parametrize(
    "path", sorted(bundled_manifest_dir().glob("*.toml")), ids=lambda p: p.name
)
def test_check_bundled_manifests(path: Path) -> None:
    result = runner.invoke(app, ["manifest", "check", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"] is True


def test_check_reports_one_line_error(tmp_path: Path) -> None:
    bundled = next(bundled_manifest_dir().glob("*.toml")).read_text()
    broken = tmp_path / "broken.toml"
    broken.write_text(bundled.replace("head_count_kv = 2", "head_count_kv = 0"))
    result = runner.invoke(app, ["manifest", "check", str(broken)])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and "head_count_kv" in result.stderr.splitlines()[0]
    as_json = runner.invoke(app, ["manifest", "check", str(broken), "--json"])
    assert as_json.exit_code == 1
    doc = json.loads(as_json.stdout)  # the CLI's error document (README, "--json")
    assert doc["error"]["exit_code"] == 1 and "head_count_kv" in doc["error"]["message"]


def test_check_takes_an_unmodelled_architecture_with_a_note(tmp_path: Path) -> None:
    bundled = next(bundled_manifest_dir().glob("*.toml")).read_text()
    other = tmp_path / "other.toml"
    # GGUF key names: an architecture quantpick has no module for has no short aliases
    text = bundled.replace('name = "qwen35moe"', 'name = "newarch"')
    for short in ("ssm_conv_kernel", "ssm_state_size", "ssm_group_count", "ssm_time_step_rank",
                  "ssm_inner_size"):  # fmt: skip
        text = text.replace(f"{short} =", f'"ssm.{short[4:]}" =')
    other.write_text(text)
    result = runner.invoke(app, ["manifest", "check", str(other)])
    assert result.exit_code == 0, result.stderr
    assert "generic, not checked for this architecture" in result.stderr


# ---- a pasted hub URL (issue 21: HFValidationError, exit 5) ------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("https://huggingface.co/org/Tiny-GGUF", "hf"),
        ("https://huggingface.co/org/Tiny-GGUF/tree/main", "hf"),
        ("https://huggingface.co/org/Tiny-GGUF/blob/main/Tiny-Q8_0.gguf", "hf"),
        ("https://www.modelscope.cn/models/org/Tiny-GGUF/files", "modelscope"),
    ],
)
def test_add_accepts_the_repositorys_url(
    fake_hub: FakeHub, repo_files: dict[str, Path], url: str, kind: str
) -> None:
    fake_hub.add_repo("org/Tiny-GGUF", dict(repo_files))
    result = _add(url, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["repo"], doc["source"]) == ("org/Tiny-GGUF", kind)
    source = load_manifest_file(Path(doc["path"])).sources[0]
    assert (source.kind, source.repo) == (kind, "org/Tiny-GGUF")
    if "/blob/" in url:
        assert "names one file" in result.stderr


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["a b/c"], "cannot read 'a b/c' as a repository"),
        (["https://example.com/org/x"], "not a Hugging Face or ModelScope address"),
        (["https://huggingface.co/datasets/org/x"], "a Hugging Face dataset"),
        (["https://huggingface.co/org/x", "--source", "modelscope"], "--source modelscope but"),
        (["https://huggingface.co/org/x/tree/v2", "--revision", "v1"], "--revision v1 but"),
    ],
)
def test_add_refuses_what_is_not_a_repository_in_one_line(args: list[str], problem: str) -> None:
    result = _add(*args)
    assert result.exit_code == 2, result.output
    (line, *_) = result.stderr.splitlines()
    assert line.startswith("Error: ") and problem in line


def test_planning_commands_accept_the_repositorys_url() -> None:
    repo = "https://huggingface.co/empero-ai/Qwen3.8-35B-A3B-Distill-GGUF"
    for url in (repo, f"{repo}/tree/main", f"{repo}/tree/b1f9d1dcc3de8aa867669b0ab919384aeeb9b8d5"):
        shown = runner.invoke(app, ["show", url, "--json"])
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.stdout)["id"] == "qwen3.8-35b-a3b-distill"
    file_url = f"{repo}/resolve/main/Qwen3.8-35B-A3B-Q4_K_M.gguf"
    picked = runner.invoke(app, ["pick", file_url, "--gpu", "3090"])
    assert picked.exit_code == 2
    assert picked.stderr.splitlines() == [
        f"Error: {file_url} names one file (Qwen3.8-35B-A3B-Q4_K_M.gguf) of "
        "qwen3.8-35b-a3b-distill",
        "Hint: give the model and the quant: qwen3.8-35b-a3b-distill --quant Q4_K_M",
    ]
    # `show` has no --quant: the same error, with a hint it can follow
    shown = runner.invoke(app, ["show", file_url])
    assert shown.exit_code == 2 and shown.stderr.endswith("Hint: see `quantpick show --help`\n")
    other = runner.invoke(app, ["show", f"{repo}/tree/deadbeef"])
    assert other.exit_code == 2 and "names revision deadbeef" in other.stderr


# ---- hostile manifests in QUANTPICK_MANIFESTS (issue 26) ---------------------------------------

PICK = ["pick", "qwen3.8-35b-a3b-distill", "-c", "4096", "--gpu", "3090", "--ram", "64G",
        "--no-network", "--json"]  # fmt: skip


def _many_quants(n: int) -> str:
    text = (bundled_manifest_dir() / "qwen3.8-35b-a3b-distill.toml").read_text()
    head = (
        text[: text.index("[[files]]")]
        .replace('id = "qwen3.8-35b-a3b-distill"', 'id = "many"')
        .replace("aliases = [", 'aliases = ["many-alias", ')
        .replace("empero-ai/Qwen3.8-35B-A3B-Distill-GGUF", "x/many")
    )
    files = "".join(
        f'[[files]]\nname = "M-Q{i}.gguf"\nquant = "Q{i}"\nsize_bytes = {12 * 10**9 + i}\n'
        f"size_exact = false\nquality_rank = {i + 1}\n\n"
        for i in range(n)
    )
    return head.replace('"qwen3.8-35b-a3b", "empero-ai/Qwen3.8-35B-A3B-Distill"', "") + files


def test_a_hostile_manifest_is_skipped_with_a_note_unless_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: one manifest nested 20,000 deep broke every command with a RecursionError."""
    import os

    extra = tmp_path / "manifests"
    extra.mkdir()
    (extra / "deep.toml").write_text('id = "deep"\na = ' + "[" * 20_000 + "]" * 20_000 + "\n")
    (extra / "huge.toml").write_text("# " + "x" * (5 * 1024**2) + "\n")
    (extra / "many.toml").write_text(_many_quants(300))
    os.mkfifo(extra / "fifo.toml")
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(extra))
    result = runner.invoke(app, PICK)
    assert result.exit_code == 0 and result.exception is None, result.output
    notes = [x for x in result.stderr.splitlines() if "skipped a manifest" in x]
    assert len(notes) == 4, result.stderr
    assert any("deep.toml" in x and "nested deeper than 64 levels" in x for x in notes)
    assert any("huge.toml" in x and "larger than" in x for x in notes)
    assert any("many.toml" in x and "300 quants; a manifest lists at most 256" in x for x in notes)
    assert any("fifo.toml" in x and "not a regular file" in x for x in notes)
    for named in ("deep", "many", "huge", "fifo"):
        result = runner.invoke(app, [*PICK[:1], named, *PICK[2:]])
        assert result.exit_code == 1 and result.exception is not None, result.output
        assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
        errors = [x for x in result.stderr.splitlines() if x.startswith("Error:")]
        assert len(errors) == 1 and f"{named}.toml" in errors[0], result.stderr
    models = runner.invoke(app, ["models"])
    assert models.exception is None or isinstance(models.exception, SystemExit)


def test_a_manifest_at_the_quant_bound_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quantpick.model.manifest import MAX_MANIFEST_QUANTS

    extra = tmp_path / "manifests"
    extra.mkdir()
    (extra / "many.toml").write_text(_many_quants(MAX_MANIFEST_QUANTS))
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(extra))
    result = runner.invoke(app, [*PICK[:1], "many", *PICK[2:]])
    assert result.exit_code == 0, result.output
    assert len({c["quant"] for c in json.loads(result.stdout)["candidates"]}) == MAX_MANIFEST_QUANTS
