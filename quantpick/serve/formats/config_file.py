"""A file the user named for a format to write into (`--preset`, `--swap-config`, `--modelfile`),
read and written by quantpick.outputs' policy: regular files only, never through a link, read
bounded, written atomically, the previous version kept under a backup name no later run takes.
What quantpick writes carries a stamp (`written by quantpick 0.1.0, checksum ...`), so that a
section, entry or file of that name is replaced only while it still is what quantpick wrote."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantpick.errors import UsageError
from quantpick.outputs import (
    Authorship,
    Existing,
    Written,
    authorship,
    check_output,
    has_stamp,
    refuse_theirs,
    write_output,
)


@dataclass(frozen=True)
class ConfigFile:
    """A file the user named (`--preset`, `--swap-config`, `--modelfile`) as it is now."""

    path: Path
    what: str  # the option that named it, for messages
    existing: Existing

    @property
    def text(self) -> str | None:
        """Its text, None when there is none yet (or --force replaces a link there)."""
        if self.existing.data is None:
            return None
        try:
            return self.existing.data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(
                f"{self.what} {self.path}: is not UTF-8 text; it is left as it is",
                hint="give another file",
            ) from None

    def write(self, text: str, *, force: bool = False) -> Written:
        """Replace it by `text` atomically, its mode kept. The previous version is kept as
        FILE.bak (or .bak.1, .bak.2, ...: a backup is never overwritten) when something the user
        wrote may go: with `force`, or the first time quantpick writes into a file it did not
        create. Replacing only quantpick's own unchanged sections keeps no backup (nothing of
        the user's is lost; a preset rewritten by every run would otherwise pile them up)."""
        keep = force or (self.existing.data is not None and not has_stamp(self.text))
        return write_output(self.path, text.encode("utf-8"), self.existing, self.what, backup=keep)


def open_config(path: Path, what: str, *, force: bool = False) -> ConfigFile:
    """The file at `path`, when quantpick may write there (quantpick.outputs.check_output: no
    device, FIFO, socket or directory; a symlink only with --force, and then the link itself is
    replaced); OutputRefused (exit 2) otherwise."""
    return ConfigFile(path, what, check_output(path, what, force=force))


def check_whole_file(config: ConfigFile, *, force: bool = False) -> None:
    """A file quantpick replaces whole (the Modelfile) must be quantpick's, unchanged."""
    if config.existing.data is None or force:
        return
    found = authorship((config.text or "").splitlines())
    if found is not Authorship.QUANTPICK:
        raise refuse_theirs(f"{config.what} {config.path}", found)
