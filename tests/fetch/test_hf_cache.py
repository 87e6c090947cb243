"""quantpick.fetch.hf_cache: reading huggingface_hub's refs (another program's files)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from quantpick.fetch.hf_cache import REF_MAX_BYTES, read_ref

COMMIT = "c" * 40


def test_a_ref_is_read_as_huggingface_hub_writes_it(tmp_path: Path) -> None:
    ref = tmp_path / "main"
    ref.write_text(COMMIT)  # no newline, as _cache_commit_hash_for_specific_revision writes
    assert read_ref(ref) == COMMIT
    assert read_ref(tmp_path / "missing") is None


def test_a_ref_that_is_a_fifo_a_device_or_huge_is_no_ref(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    box: dict[str, str | None] = {}
    worker = threading.Thread(target=lambda: box.setdefault("ref", read_ref(fifo)), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and box["ref"] is None
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    assert read_ref(zero) is None
    huge = tmp_path / "huge"
    huge.write_text(COMMIT + " " * REF_MAX_BYTES)
    assert read_ref(huge) is None


def test_a_planted_cachedir_tag_link_is_not_written_through(tmp_path: Path) -> None:
    """A shared Hugging Face cache (HF_HOME on a shared volume): another user's dangling link at
    CACHEDIR.TAG would make quantpick create the file it points to (as root: anywhere)."""
    import hashlib

    from quantpick.fetch.hf_cache import hf_cache_target, link_snapshot

    cache = tmp_path / "hub"
    cache.mkdir()
    outside = tmp_path / "outside" / "planted"
    outside.parent.mkdir()
    (cache / "CACHEDIR.TAG").symlink_to(outside)
    data = b"GGUF bytes"
    sha = hashlib.sha256(data).hexdigest()
    target = hf_cache_target(cache, "org/model", COMMIT, "main")
    blob = target.blob_path(sha)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    pointer = link_snapshot(target, "m.gguf", sha)
    assert pointer.read_bytes() == data
    assert not outside.exists()
    assert (cache / "CACHEDIR.TAG").is_symlink()  # left as it is: a cache tag is a courtesy
