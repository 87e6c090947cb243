"""quantpick.fetch.download: planning (dry runs, names, checksums files) and the files it writes
beside the model (SHA256SUMS), on the fake hub; local failures end in one line naming the path."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakehub import FakeHub, gguf_bytes, make_manifest, sha256sums
from typer.testing import CliRunner

import quantpick.cli.download  # noqa: F401 - registers the commands
from quantpick.cli import app
from quantpick.config import load_settings
from quantpick.errors import ExitCode, QuantpickError, VerificationError
from quantpick.fetch.download import fetch_model
from quantpick.fetch.transfer import DiskSpaceError, LocalFileError
from quantpick.hub.http import RetryPolicy
from quantpick.hub.verify import CHECKSUMS_MAX_BYTES
from quantpick.model.manifest import Source

SIZE = 1024 * 1024 + 77
NAME = "m-Q4_K_M.gguf"
DATA = gguf_bytes(SIZE, seed=11)
SHA = hashlib.sha256(DATA).hexdigest()
FAST = RetryPolicy(attempts=2, idle_timeout=2, connect_timeout=2, sleep=lambda s: None)
runner = CliRunner()


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": sha256sums({NAME: DATA})})
    return fake_hub


def manifest(**kw: Any) -> Any:
    return make_manifest("test-model", {NAME: DATA}, (Source("hf", repo="org/model"),), **kw)


def get(dest: Path, **kw: Any) -> Any:
    return fetch_model(
        manifest(), "Q4_K_M", settings=load_settings(), dest_dir=dest, policy=FAST, **kw
    )


def byte_gets(hub: FakeHub) -> list[dict[str, Any]]:
    return [r for r in hub.requests_for(NAME) if r["server"] == "cdn"]


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody can write in: a read-only tmpfs as root (root ignores mode bits),
    mode 0555 otherwise."""
    directory = tmp_path / "ro"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o555)
        yield directory
        directory.chmod(0o755)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1g", "tmpfs", str(directory)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip("running as root without mount(8): cannot make a read-only directory")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=False)


# -- dry runs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("on_disk", "state", "to_fetch"),
    [
        (DATA[:300_000], "partial", SIZE - 300_000),  # truncated at the final name: resumed
        (DATA, "present", 0),
        (DATA + b"extra", "oversized", SIZE),  # moved aside, fetched again whole
    ],
    ids=["truncated", "complete", "oversized"],
)
def test_a_dry_run_counts_what_a_final_file_still_needs(
    hub: FakeHub, tmp_path: Path, on_disk: bytes, state: str, to_fetch: int
) -> None:
    (tmp_path / NAME).write_bytes(on_disk)
    report = get(tmp_path, dry_run=True)
    (planned,) = report.plan.files
    assert (planned.state, planned.bytes_to_fetch, report.plan.bytes_to_fetch) == (
        state,
        to_fetch,
        to_fetch,
    )
    assert byte_gets(hub) == []
    if state == "partial":  # and the real run fetches exactly that
        result = get(tmp_path).results[0]
        assert result.bytes_fetched == to_fetch and (tmp_path / NAME).read_bytes() == DATA


def test_a_dry_run_counts_a_segmented_part_by_its_written_ranges(
    hub: FakeHub, tmp_path: Path
) -> None:
    from quantpick.fetch.partfile import Content, PartLayout, part_paths, write_sidecar
    from quantpick.fetch.segments import RangeSet

    part, sidecar = part_paths(tmp_path / NAME)
    with open(part, "wb") as handle:  # the final size, sparse, 100 kB written
        handle.truncate(SIZE)
        handle.write(DATA[:100_000])
    content = Content("http://elsewhere/x", SIZE, SHA, None)
    write_sidecar(sidecar, content, PartLayout.SEGMENTS, RangeSet([(0, 100_000)]))
    (planned,) = get(tmp_path, dry_run=True).plan.files
    assert (planned.state, planned.local_bytes, planned.bytes_to_fetch) == (
        "partial",
        100_000,
        SIZE - 100_000,
    )


def test_paths_are_absolute_so_quiet_output_never_starts_with_a_dash(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    report = get(Path("-models"))
    assert report.plan.dest_dir == tmp_path / "-models"
    assert report.results[0].path == tmp_path / "-models" / NAME


def test_quiet_prints_an_absolute_path(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(manifests))
    (manifests / "m.toml").write_text(_toml_manifest())
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["download", "m", "--quant", "Q4_K_M", "--dir", "-x", "--quiet"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{tmp_path / '-x' / NAME}\n"


def _toml_manifest() -> str:
    from fakehub import make_manifest as _unused  # noqa: F401 - same shape as make_manifest

    return (
        'schema = 1\nid = "m"\ndisplay_name = "M"\nchecksums_file = "SHA256SUMS"\n'
        '[architecture]\nname = "qwen35moe"\nblock_count = 4\nnextn_predict_layers = 0\n'
        "context_length = 4096\nembedding_length = 64\nhead_count = 4\nhead_count_kv = 2\n"
        "key_length = 16\nvalue_length = 16\nexpert_count = 4\nexpert_used_count = 2\n"
        "expert_feed_forward_length = 32\nexpert_shared_feed_forward_length = 32\n"
        "ssm_conv_kernel = 4\nssm_state_size = 16\nssm_group_count = 2\n"
        "ssm_time_step_rank = 4\nssm_inner_size = 64\nfull_attention_interval = 4\n"
        'vocab_size = 256\n\n[[sources]]\nkind = "hf"\nrepo = "org/model"\n\n'
        f'[[files]]\nname = "{NAME}"\nquant = "Q4_K_M"\nsize_bytes = {SIZE}\n'
        "size_exact = true\nquality_rank = 1\n"
    )


# -- names from the hub and from SHA256SUMS ------------------------------------------------------


def test_refused_listing_names_are_reported_not_silently_dropped(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    long_name = "x" * 300 + ".gguf"
    fake_hub.add_repo(
        "org/model",
        {NAME: DATA, "../evil.gguf": b"GGUF", long_name: b"GGUF", "a.gguf": b"1", "a.gguf/b": b"2"},
    )
    notes: list[str] = []

    class Sink:
        def message(self, text: str) -> None:
            notes.append(text)

        def __getattr__(self, name: str) -> Any:
            return lambda *a, **k: None

    report = get(tmp_path, progress=Sink())
    assert report.results[0].path.read_bytes() == DATA
    (note,) = [n for n in notes if "will not write" in n]
    assert "4 file name(s)" in note and "'../evil.gguf'" in note
    assert report.plan.notes == (note,)
    assert not list(tmp_path.glob("*evil*"))


def test_a_5000_character_name_in_sha256sums_refuses_the_download_in_one_line(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    sums = sha256sums({NAME: DATA}) + f"{SHA}  {'d/' * 2500}x.gguf\n".encode()
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": sums})
    with pytest.raises(VerificationError, match="line 2: refusing file name") as info:
        get(tmp_path)
    assert len(info.value.message) < 400 and "\n" not in info.value.message
    assert byte_gets(fake_hub) == []


def test_a_sha256sums_over_the_cap_is_ignored_with_a_note(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    filler = "".join(
        f"{'0' * 64}  pad/{i:08d}.bin\n" for i in range(CHECKSUMS_MAX_BYTES // 80 + 10)
    )
    sums = sha256sums({NAME: DATA}).decode() + filler
    assert len(sums) > CHECKSUMS_MAX_BYTES
    fake_hub.add_repo("org/model", {NAME: DATA, "SHA256SUMS": sums.encode()})
    report = get(tmp_path)
    assert report.results[0].verified  # the hub listing and the manifest still vouch for it
    assert report.plan.checksums_file is None
    assert any("larger than" in n for n in report.plan.notes)


# -- SHA256SUMS beside the files -----------------------------------------------------------------


def test_enospc_while_writing_sha256sums_leaves_no_tmp_and_one_line(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "SHA256SUMS").write_text(f"{'1' * 64}  other.gguf\n")
    before = (tmp_path / "SHA256SUMS").read_bytes()
    real_write = os.write

    def full_disk(fd: int, data: Any) -> int:
        if "SHA256SUMS" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    with monkeypatch.context() as patch, pytest.raises(DiskSpaceError) as info:
        patch.setattr(os, "write", full_disk)
        get(tmp_path)
    message = info.value.message
    assert message == (
        f"cannot write the checksums file: {tmp_path / 'SHA256SUMS'}: No space left on device"
    )
    assert "complete and verified" in (info.value.hint or "")
    assert info.value.exit_code == ExitCode.ERROR
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    assert (tmp_path / "SHA256SUMS").read_bytes() == before  # untouched
    assert (tmp_path / NAME).read_bytes() == DATA  # the model itself is in place, verified
    again = get(tmp_path)  # space freed: the rerun reuses the file and records it
    assert again.results[0].reused
    assert f"{SHA}  {NAME}" in (tmp_path / "SHA256SUMS").read_text()


def test_two_downloads_merge_their_lines_into_one_sha256sums(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    other = gguf_bytes(50_000, seed=12)
    files = {NAME: DATA, "o-Q8_0.gguf": other}
    fake_hub.add_repo("org/model", {**files, "SHA256SUMS": sha256sums(files)})
    get(tmp_path)
    text = (tmp_path / "SHA256SUMS").read_text()
    assert f"{SHA}  {NAME}" in text and "o-Q8_0.gguf" in text  # the repository's lines kept


def test_a_planted_sha256sums_link_is_neither_copied_nor_written_through(
    hub: FakeHub, tmp_path: Path
) -> None:
    """A shared models folder: another user links SHA256SUMS to a root-only file holding
    checksum-like lines. Following it would copy those lines into a file others may read, and
    rewrite the link's target; instead the link is left alone (the download still completes)."""
    secret = tmp_path / "secret"
    secret.write_text(f"{'ab' * 32}  root-only-name\n")
    secret.chmod(0o600)
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / "SHA256SUMS").symlink_to(secret)
    get(dest)
    assert (dest / NAME).read_bytes() == DATA
    assert secret.read_text() == f"{'ab' * 32}  root-only-name\n"
    assert (dest / "SHA256SUMS").is_symlink()


# -- a directory that cannot be written ----------------------------------------------------------


def test_a_read_only_dir_fails_before_any_network_call_naming_the_path(
    hub: FakeHub, read_only_dir: Path
) -> None:
    target = read_only_dir / "models"
    with pytest.raises(LocalFileError) as info:
        get(target)
    assert info.value.message.startswith(f"cannot create the download directory: {target}: ")
    assert info.value.exit_code == ExitCode.ERROR
    assert hub.requests == []
    with pytest.raises(
        LocalFileError, match=f"cannot write in the download directory: {read_only_dir}"
    ):
        get(read_only_dir)


def test_a_read_only_dir_through_the_cli_is_one_error_line(
    hub: FakeHub, read_only_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "m.toml").write_text(_toml_manifest())
    monkeypatch.setenv("QUANTPICK_MANIFESTS", str(manifests))
    target = read_only_dir / "models"
    result = runner.invoke(app, ["download", "m", "--quant", "Q4_K_M", "--dir", str(target)])
    assert result.exit_code == 2  # a path the user gave that is read-only (README's exit codes)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(target) in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_local_errors_are_quantpick_errors() -> None:
    assert issubclass(LocalFileError, QuantpickError) and issubclass(DiskSpaceError, QuantpickError)


def test_a_dir_too_long_for_the_file_system_is_one_line(hub: FakeHub, tmp_path: Path) -> None:
    from quantpick.errors import UsageError

    # The directory fits PATH_MAX, the file in it would not: refused before anything is written.
    deep = tmp_path.joinpath(*(["d" * 200] * ((4096 - 40 - len(str(tmp_path))) // 201)))
    deep = deep / ("e" * (4096 - 30 - len(str(deep)) - 1))  # 30 bytes short of PATH_MAX
    assert len(str(deep)) == 4096 - 30 and len(str(deep / NAME)) > 4096 - 17
    for dry_run in (True, False):
        with pytest.raises(UsageError, match="the path is longer than the 4096 bytes") as info:
            get(deep, dry_run=dry_run)
        assert info.value.hint == "choose a shorter --dir"
    # A directory that does not fit itself: the OS says so, in one line naming it.
    with pytest.raises(LocalFileError, match="cannot create the download directory: .*too long"):
        get(deep / ("d" * 200))


# -- files already in place, verified before any hub (issue 21) --------------------------------


def test_files_in_place_pinned_by_the_manifest_need_no_sha256sums(tmp_path: Path) -> None:
    from quantpick.fetch.offline import files_in_place
    from quantpick.fetch.progress import NullProgress

    class Notes(NullProgress):
        def __init__(self) -> None:
            self.lines: list[str] = []

        def message(self, text: str) -> None:
            self.lines.append(text)

    dest = tmp_path / "d"
    dest.mkdir()
    (dest / NAME).write_bytes(DATA)
    notes = Notes()
    found = files_in_place(
        manifest(), "Q4_K_M", False, settings=load_settings(), dest_dir=dest, progress=notes
    )
    assert found is not None and found[0]["sha256"] == SHA and found[0]["bytes_fetched"] == 0
    assert "pinned by manifest test-model" in found[0]["source"]
    assert any("sha256 verified; no hub contacted" in line for line in notes.lines)


def test_files_in_place_that_do_not_match_are_left_to_the_download(
    hub: FakeHub, tmp_path: Path
) -> None:
    from quantpick.fetch.offline import files_in_place, verified_local_files

    dest = tmp_path / "d"
    dest.mkdir()
    (dest / NAME).write_bytes(DATA[:-1] + bytes([DATA[-1] ^ 1]))
    settings = load_settings()
    assert files_in_place(manifest(), "Q4_K_M", False, settings=settings, dest_dir=dest) is None
    with pytest.raises(VerificationError, match="does not match"):  # no hub: never used
        verified_local_files(manifest(), "Q4_K_M", False, dest)
    report = get(dest)  # the hub is there: the bad file is replaced
    assert (dest / NAME).read_bytes() == DATA and len(byte_gets(hub)) == 1
    assert report.results[0].verified


def test_files_in_place_unpinned_or_contradicted_are_not_used(tmp_path: Path) -> None:
    from quantpick.fetch.offline import files_in_place, verified_local_files

    dest = tmp_path / "d"
    dest.mkdir()
    (dest / NAME).write_bytes(DATA)
    unpinned = manifest(manifest_sha={NAME: None})
    settings = load_settings()
    assert files_in_place(unpinned, "Q4_K_M", False, settings=settings, dest_dir=dest) is None
    (dest / "SHA256SUMS").write_text(f"{'0' * 64}  {NAME}\n")  # disagrees with the manifest
    assert files_in_place(manifest(), "Q4_K_M", False, settings=settings, dest_dir=dest) is None
    with pytest.raises(VerificationError, match="the manifest"):
        verified_local_files(manifest(), "Q4_K_M", False, dest)
    (dest / "SHA256SUMS").write_text(f"{SHA}  {NAME}\n")  # an earlier download's pins it
    assert files_in_place(unpinned, "Q4_K_M", False, settings=settings, dest_dir=dest)
