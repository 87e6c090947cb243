"""`quantpick pick OWNER/REPO` with no manifest: the repository listed, its quants named, every
header read (and cached), the plan made on them; offline from the cache only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from arch_fixtures import write_header_only
from fakehub import FakeHub
from gguf_fixtures import TINY, write_gguf, write_split
from typer.testing import CliRunner

from quantpick.arch.registry import architecture
from quantpick.cli import app

runner = CliRunner()
BOX = ["--gpu", "3090", "--ram", "64G", "--cores", "8"]

# A small dense Llama (2,048 wide, 8 layers): llama.cpp's own loader shapes, a few MB per quant.
SMALL_LLAMA = architecture(
    "llama", block_count=8, context_length=32768, embedding_length=2048,
    feed_forward_length=5632, head_count=16, head_count_kv=4, vocab_size=32000,
    rope__dimension_count=128, attention__layer_norm_rms_epsilon=1e-5,
)  # fmt: skip


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    root = tmp_path_factory.mktemp("repos")
    dense = {}
    for quant in ("Q4_K_M", "Q8_0"):
        path = root / f"Small-Llama-{quant}.gguf"
        write_header_only(path, SMALL_LLAMA, quant)
        dense[path.name] = path
    untagged = root / "small-llama.gguf"  # no tag in the name: named by its general.file_type
    write_header_only(untagged, SMALL_LLAMA, "BF16")
    dense[untagged.name] = untagged
    split_dir = root / "split"
    split_dir.mkdir()
    split = {f"Q8_0/{p.name}": p for p in write_split(split_dir, "Tiny-Q8_0", 3, TINY)}
    moe = root / "Tiny-Q4_K_M.gguf"
    write_gguf(moe, TINY, big="Q8_0")
    split[moe.name] = moe
    broken = root / "Tiny-Q2_K.gguf"  # a header the planner refuses: left out, not fatal
    write_gguf(broken, TINY, big="Q4_K")
    split[broken.name] = broken
    mmproj = root / "mmproj-Tiny-F16.gguf"
    mmproj.write_bytes(b"GGUF" + bytes(1000))
    split[mmproj.name] = mmproj
    unknown = root / "Newarch-Q8_0.gguf"
    write_gguf(unknown, TINY, arch="newarch")
    return {"org/Small-Llama-GGUF": dense, "org/Tiny-GGUF": split,
            "org/Newarch-GGUF": {unknown.name: unknown}}  # fmt: skip


@pytest.fixture
def hub(fake_hub: FakeHub, repos: dict[str, dict[str, Path]]) -> FakeHub:
    for repo, files in repos.items():
        fake_hub.add_repo(repo, dict(files))
    return fake_hub


def pick(*args: str) -> tuple[int, dict, str]:
    result = runner.invoke(app, ["pick", *args, "--json"])
    doc = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.exit_code, doc, result.stderr


def test_a_dense_repository_is_planned_without_a_manifest(hub: FakeHub) -> None:
    code, doc, err = pick("org/Small-Llama-GGUF", "-c", "8192", *BOX)
    assert code == 0, err
    assert doc["quant"] in ("Q4_K_M", "Q8_0", "BF16")
    assert doc["layout_basis"].startswith(("gguf-cache:", "gguf-remote:"))  # its own header
    quants = {c["quant"] for c in doc["candidates"]}
    assert quants == {"Q4_K_M", "Q8_0", "BF16"}  # the untagged file, named by its file type


def test_a_moe_and_a_split_repository(hub: FakeHub) -> None:
    code, doc, err = pick("org/Tiny-GGUF", "-c", "8192", *BOX)
    assert code == 0, err
    assert {c["quant"] for c in doc["candidates"]} == {"Q8_0", "Q4_K_M"}
    code, doc, err = pick("org/Tiny-GGUF", "-c", "8192", "--quant", "Q8_0", *BOX)
    assert code == 0, err
    assert [f["name"] for f in doc["files"]] == [
        f"Q8_0/Tiny-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]
    with_vision = pick("org/Tiny-GGUF", "-c", "8192", "--vision", *BOX)
    assert with_vision[0] == 0 and with_vision[1]["projector"]["name"] == "mmproj-Tiny-F16.gguf"


def test_an_architecture_quantpick_does_not_model_is_planned_and_says_so(hub: FakeHub) -> None:
    code, doc, err = pick("org/Newarch-GGUF", "-c", "8192", *BOX)
    assert code == 0, err
    assert any("generic, not checked for this architecture" in n for n in doc["notes"])


def test_offline_uses_the_cache_and_says_what_is_missing(hub: FakeHub) -> None:
    code, _, err = pick("org/Small-Llama-GGUF", "-c", "8192", *BOX, "--offline")
    assert code != 0
    (error,) = [line for line in err.splitlines() if line.startswith("Error:")]
    assert "not described here and planning is offline" in error
    assert pick("org/Small-Llama-GGUF", "-c", "8192", *BOX)[0] == 0
    n_requests = len(hub.requests)
    code, doc, err = pick("org/Small-Llama-GGUF", "-c", "8192", *BOX, "--offline")
    assert code == 0, err
    assert len(hub.requests) == n_requests  # the cache: no hub
    assert doc["layout_basis"].startswith("gguf-cache:")


def test_the_plan_pins_the_commit_and_models_lists_the_repository(hub: FakeHub) -> None:
    code, doc, err = pick("org/Small-Llama-GGUF", "-c", "8192", *BOX)
    assert code == 0, err
    commit = hub.repos["org/Small-Llama-GGUF"].commit
    shown = runner.invoke(app, ["show", "org/Small-Llama-GGUF", "--json"])
    assert shown.exit_code == 0, shown.stderr
    assert json.loads(shown.stdout)["sources"][0]["revision"] == commit
    listed = runner.invoke(app, ["models", "--json"])
    assert "small-llama-org" in listed.stdout


def test_many_quants_are_read_in_bounded_time_and_each_once(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    files = {}
    for i, quant in enumerate(("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")):
        path = tmp_path / f"M-{quant}.gguf"
        write_gguf(path, dict(TINY, ctx=4096 + 256 * i), big="Q8_0")
        files[path.name] = path
    fake_hub.add_repo("org/Many-GGUF", files)
    assert pick("org/Many-GGUF", "-c", "4096", *BOX)[0] == 0
    reads = [r for r in fake_hub.requests if str(r.get("path", "")).endswith(".gguf")]
    assert 0 < len({r["path"] for r in reads}) <= len(files) * 2  # hub + CDN path per file
    before = len(fake_hub.requests)
    assert pick("org/Many-GGUF", "-c", "4096", *BOX)[0] == 0
    # a branch is listed again, but no header is read twice
    again = [r for r in fake_hub.requests[before:] if str(r.get("path", "")).endswith(".gguf")]
    assert again == []


@pytest.mark.llamacpp
def test_pick_shows_llamacpp_s_own_projection_before_download(
    hub: FakeHub, repos: dict[str, dict[str, Path]], llamacpp_bin: Path, tmp_path: Path
) -> None:
    """On this machine (not a described one) with llama.cpp installed, pick runs llama-fit-params
    on a sparse stand-in made of the chosen file's real header bytes: the same projection, to the
    MiB, as llama-fit-params on the file itself, and no weight byte read."""
    from quantpick.config import load_settings
    from quantpick.serve.fitparams import run_fit_params

    args = ["org/Small-Llama-GGUF", "-c", "8192", "--quant", "Q8_0", "--llama-bin",
            str(llamacpp_bin)]  # fmt: skip
    code, doc, err = pick(*args)
    assert code == 0, err
    dry = doc["dry_run"]
    assert dry["status"] == "confirmed", dry["message"]
    assert "before download" in dry["message"]
    (rnd,) = dry["rounds"]
    (host,) = rnd["devices"]
    assert host["agrees"]["model"] and host["agrees"]["context"]
    # llama-fit-params on the real file, same flags: the same figures
    real = repos["org/Small-Llama-GGUF"]["Small-Llama-Q8_0.gguf"]
    argv = list(rnd["argv"])
    argv[argv.index("-m") + 1] = str(real)
    direct = run_fit_params(argv, {})
    (theirs,) = direct.projection.devices
    assert (theirs.model_mib, theirs.context_mib, theirs.compute_mib) == (
        host["llamacpp_mib"]["model"], host["llamacpp_mib"]["context"],
        host["llamacpp_mib"]["compute"],
    )  # fmt: skip
    # header bytes only: every read of the file was a range inside its header
    reads = hub.requests_for("Small-Llama-Q8_0.gguf")
    assert reads and all(r.get("range") for r in reads)
    standins = load_settings().cache_dir / "standins"
    assert not standins.exists() or not any(standins.iterdir())  # removed when it ended
    # a described machine is not this one: no dry run, the estimate alone
    code, doc, err = pick(*args, *BOX)
    assert code == 0 and doc["dry_run"] is None, err
    # --no-confirm turns it off
    code, doc, err = pick(*args, "--no-confirm")
    assert code == 0 and doc["dry_run"] is None, err


@pytest.mark.llamacpp
def test_estimate_and_a_second_pick_use_the_dry_run_too(hub: FakeHub, llamacpp_bin: Path) -> None:
    tool = ["--llama-bin", str(llamacpp_bin)]
    result = runner.invoke(
        app, ["estimate", "org/Small-Llama-GGUF", "--quant", "Q4_K_M", "-c", "4096", *tool,
              "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dry = json.loads(result.stdout)["dry_run"]
    assert dry["status"] == "fits" and "before download" in dry["message"], dry["message"]
    (host,) = dry["rounds"][0]["devices"]
    assert host["agrees"]["model"] and host["agrees"]["context"]
    # the same plan again: llama.cpp's projection is read back, not run again
    args = ["org/Small-Llama-GGUF", "-c", "8192", "--quant", "Q8_0", *tool]
    first = pick(*args)[1]["dry_run"]
    again = pick(*args)[1]["dry_run"]
    assert "read back from the cache" in again["message"]
    assert again["rounds"][0]["seconds"] == 0
    ours = [d["llamacpp_mib"] for d in first["rounds"][0]["devices"]]
    assert [d["llamacpp_mib"] for d in again["rounds"][0]["devices"]] == ours
    # a text run shows the projection beside the estimate
    text = runner.invoke(app, ["pick", *args])
    assert text.exit_code == 0, text.stderr
    assert "llama.cpp's projection" in text.stderr and "before download" in text.stderr


@pytest.mark.llamacpp
def test_the_dry_run_adds_the_projector_llama_fit_params_leaves_out(
    hub: FakeHub, llamacpp_bin: Path
) -> None:
    args = ["org/Tiny-GGUF", "-c", "8192", "--quant", "Q4_K_M", "--llama-bin", str(llamacpp_bin)]
    code, plain, err = pick(*args)
    assert code == 0, err
    code, vision, err = pick(*args, "--vision")
    assert code == 0, err
    (rnd,) = vision["dry_run"]["rounds"]
    assert vision["dry_run"]["status"] == "confirmed"
    assert any("vision projector" in a["why"] for a in rnd["adjustments"])
    with_p = sum(d["projected_bytes"] for d in rnd["devices"])
    without = sum(d["projected_bytes"] for d in plain["dry_run"]["rounds"][0]["devices"])
    assert with_p - without >= vision["projector"]["size_bytes"]


@pytest.mark.llamacpp
def test_without_sparse_files_the_estimate_stands_alone_with_a_note(
    hub: FakeHub, llamacpp_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from quantpick.serve import standin

    monkeypatch.setattr(standin, "stored_bytes", lambda fd: os.fstat(fd).st_size)
    args = ["org/Small-Llama-GGUF", "-c", "8192", "--llama-bin", str(llamacpp_bin)]
    code, doc, err = pick(*args)
    assert code == 0, err
    assert doc["dry_run"]["status"] == "skipped"
    assert "without sparse files" in doc["dry_run"]["message"]
    text = runner.invoke(app, ["pick", *args])
    assert text.exit_code == 0 and "Note: no llama.cpp dry run, before download" in text.stderr


def test_a_file_named_for_another_quant_is_planned_as_its_header_says(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    """A Q4_K_M file named `-Q8_0` (the issue's was Q4_0): before, labelled Q8_0 without a note."""
    files = {}
    for name, quant in (("Small-Llama-BF16.gguf", "BF16"), ("Small-Llama-Q8_0.gguf", "Q4_K_M")):
        files[name] = tmp_path / name
        write_header_only(files[name], SMALL_LLAMA, quant)
    fake_hub.add_repo("org/Mislabelled-GGUF", files)
    code, doc, err = pick("org/Mislabelled-GGUF", "-c", "8192", *BOX)
    assert code == 0, err
    assert {c["quant"] for c in doc["candidates"]} == {"BF16", "Q4_K_M"}
    assert (
        "Small-Llama-Q8_0.gguf: named Q8_0, but its header's general.file_type is Q4_K_M: "
        "planned as Q4_K_M" in err
    )
    # the header's quant is already another file of the repository: that one is left out
    other = tmp_path / "other"
    other.mkdir()
    twice = ("Small-Llama-Q4_K_M.gguf", "Small-Llama-Q8_0.gguf")
    for name in twice:
        write_header_only(other / name, SMALL_LLAMA, "Q4_K_M")
    fake_hub.add_repo("org/Twice-GGUF", {n: other / n for n in twice})
    code, doc, err = pick("org/Twice-GGUF", "-c", "8192", *BOX)
    assert code == 0, err
    assert {c["quant"] for c in doc["candidates"]} == {"Q4_K_M"}
    assert "is Q4_K_M, already a quant of this repository: not planned" in err


def test_untagged_headers_are_capped_named_and_given_up_on_quickly(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every untagged .gguf header was read (3,000 files: 115 s, 11.7 GiB), and a file
    the hub cuts short was tried six times. benchmarks/hostile_repo.py prints the costs."""
    import quantpick.hub.http as http
    from quantpick.model.from_repo import MAX_UNTAGGED_HEADERS

    monkeypatch.setattr(http, "DEFAULT_POLICY", http.RetryPolicy(sleep=lambda s: None))
    real = tmp_path / "Tiny-Q4_K_M.gguf"
    write_gguf(real, TINY, big="Q8_0")
    bait = tmp_path / "bait.gguf"  # a header that names its type: Q8_0 (llama_ftype 7)
    write_gguf(bait, TINY, big="Q8_0", extra=lambda w: w.add_file_type(7))
    untagged = [f"part-{i:03d}.gguf" for i in range(MAX_UNTAGGED_HEADERS + 24)]
    fake_hub.add_repo("org/Hostile-GGUF", {real.name: real} | dict.fromkeys(untagged, bait))
    for name in untagged:
        fake_hub.faults.add(name, "short", after=2048, times=None)  # every answer cut short
    code, doc, err = pick("org/Hostile-GGUF", "-c", "8192", *BOX)
    assert code == 0, err
    assert {c["quant"] for c in doc["candidates"]} == {"Q4_K_M"}
    read = [n for n in untagged if fake_hub.requests_for(n)]
    assert len(read) == MAX_UNTAGGED_HEADERS
    # two attempts (the hub's redirect, then two ranged reads), not a download's six (7 requests)
    assert all(len(fake_hub.requests_for(n)) <= 3 for n in read)
    assert (
        f"24 GGUF files without a quant tag in their names were not read (at most "
        f"{MAX_UNTAGGED_HEADERS} per repository): part-016.gguf," in err
    )
    assert "give its URL: quantpick pick https://huggingface.co/org/Hostile-GGUF/blob/" in err
    # naming one by its URL reads it first
    fake_hub.faults.clear()
    wanted = untagged[-1]
    url = f"https://huggingface.co/org/Hostile-GGUF/blob/main/{wanted}"
    code, doc, err = pick(url, "-c", "8192", *BOX)
    assert code == 0, err
    assert fake_hub.requests_for(wanted)
    assert {c["quant"] for c in doc["candidates"]} == {"Q4_K_M", "Q8_0"}
