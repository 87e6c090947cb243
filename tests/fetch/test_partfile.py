"""quantpick.fetch.partfile: the sidecar never lets unwritten bytes count as done."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from quantpick.fetch.partfile import (
    Content,
    PartLayout,
    _checksum,
    part_bytes,
    part_paths,
    read_sidecar,
    sidecar_bytes,
    write_sidecar,
    written_ranges,
)
from quantpick.fetch.segments import RangeSet

CONTENT = Content("http://hub/x.gguf", 10 * 4096, "ab" * 32, "c0ffee")


def test_sidecar_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf.part.json"
    done = RangeSet([(0, 4096), (8192, 12288)])
    write_sidecar(path, CONTENT, PartLayout.SEGMENTS, done)
    found = read_sidecar(path)
    assert found is not None
    assert (found.content, found.layout, found.done) == (CONTENT, PartLayout.SEGMENTS, done)
    write_sidecar(path, CONTENT, PartLayout.STREAM)
    found = read_sidecar(path)
    assert found is not None and found.layout is PartLayout.STREAM


def test_torn_or_edited_sidecars_are_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf.part.json"
    good = sidecar_bytes(CONTENT, PartLayout.SEGMENTS, RangeSet([(0, 4096)]))
    path.write_bytes(good[: len(good) // 2])  # torn mid-write
    assert read_sidecar(path) is None
    edited = json.loads(good)
    edited["done"] = [[0, 10 * 4096]]  # claims more than was written, checksum kept
    path.write_text(json.dumps(edited))
    assert read_sidecar(path) is None
    for bad in ([[4096, 0]], [[0, "9"]], [[0]], "0-4096"):
        doc = {k: v for k, v in json.loads(good).items() if k != "checksum"}
        doc["done"] = bad
        doc["checksum"] = _checksum(doc)  # well signed, badly formed
        path.write_text(json.dumps(doc))
        assert read_sidecar(path) is None, bad


def test_version_1_sidecars_are_streams(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf.part.json"
    path.write_text(json.dumps({"version": 1, **CONTENT.as_dict()}))
    found = read_sidecar(path)
    assert found is not None and found.layout is PartLayout.STREAM
    assert found.content.same_as(CONTENT)


def test_same_content_by_hash_or_by_url_size_commit() -> None:
    other_url = Content("http://mirror/x.gguf", CONTENT.size, CONTENT.sha256, None)
    assert CONTENT.same_as(other_url)  # the same bytes, from another source
    assert not CONTENT.same_as(Content(CONTENT.url, CONTENT.size, "cd" * 32, CONTENT.commit))
    unhashed = Content(CONTENT.url, CONTENT.size, None, "c0ffee")
    assert unhashed.same_as(unhashed)
    assert not unhashed.same_as(Content(CONTENT.url, CONTENT.size, None, "other"))


@pytest.mark.skipif(not hasattr(os, "SEEK_HOLE"), reason="needs SEEK_HOLE")
def test_listed_ranges_are_checked_against_the_file(tmp_path: Path) -> None:
    part = tmp_path / "x.gguf.part"
    block = 64 * 1024  # larger than any file system's allocation unit here
    with open(part, "wb") as handle:
        handle.truncate(8 * block)  # sparse, the final size
        handle.seek(block)
        handle.write(b"x" * block)  # only [block, 2 block) was ever written
    fd = os.open(part, os.O_RDONLY)
    try:
        if os.lseek(fd, 0, os.SEEK_HOLE) != 0:
            pytest.skip("this file system does not report holes")
    finally:
        os.close(fd)
    # Trusted from each listed start up to the first hole: [block, 3 block) holds data only in
    # its first half; [0, 2 block) starts with a hole, so none of it counts; past 8 blocks is
    # past the file.
    listed = RangeSet([(0, 2 * block - 1), (2 * block + 1, 3 * block), (7 * block, 12 * block)])
    assert list(written_ranges(part, 8 * block, listed)) == []
    listed = RangeSet([(block, 3 * block)])
    assert list(written_ranges(part, 8 * block, listed)) == [(block, 2 * block)]


def test_ranges_past_the_end_of_the_file_do_not_count(tmp_path: Path) -> None:
    part = tmp_path / "x.gguf.part"
    part.write_bytes(b"y" * 1000)  # killed before the .part was given its final size
    assert list(written_ranges(part, 5000, RangeSet([(0, 800), (900, 4000)]))) == [
        (0, 800),
        (900, 1000),
    ]
    assert list(written_ranges(tmp_path / "missing", 5000, RangeSet([(0, 10)]))) == []


def test_part_bytes_reads_the_layout(tmp_path: Path) -> None:
    dest = tmp_path / "x.gguf"
    part, sidecar = part_paths(dest)
    assert part_bytes(dest) == 0
    with open(part, "wb") as handle:
        handle.truncate(10 * 4096)
    write_sidecar(sidecar, CONTENT, PartLayout.SEGMENTS, RangeSet([(0, 4096), (8192, 9000)]))
    assert part_bytes(dest) == 4096 + 808  # not the .part's size
    write_sidecar(sidecar, CONTENT, PartLayout.STREAM)
    assert part_bytes(dest) == 10 * 4096
