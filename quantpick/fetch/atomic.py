"""The durable, atomic writes and the one-line OS errors of the fetch stage: they live in
quantpick.outputs (every file quantpick writes follows its policy) and are named here too for
the modules that import them from fetch."""

from __future__ import annotations

from quantpick.outputs import NO_SPACE_ERRNOS as NO_SPACE_ERRNOS
from quantpick.outputs import DiskSpaceError as DiskSpaceError
from quantpick.outputs import LocalFileError as LocalFileError
from quantpick.outputs import fsync_dir as fsync_dir
from quantpick.outputs import os_error as os_error
from quantpick.outputs import write_atomic as write_atomic
