"""Atomic file writes: a temporary name in the same folder, fsync, rename, fsync the folder.

A reader sees the whole file or nothing; a writer killed midway leaves only a hidden
``.NAME.tmp-PID-XXXXXXXX`` file, which ``ub.run.layout.remove_orphans`` clears (and
``ub doctor`` reports).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ub.errors import UbError
from ub.faults import fault_point


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse directory fsync
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(handle)`` on a temporary sibling of ``path``, then move it into place.

    :raises UbError: the folder cannot be created or the file cannot be written (disk full,
        permissions), naming the file; nothing is left at ``path``.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UbError(f"cannot create output folder {path.parent}: {exc.strerror}") from None
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        fault_point("atomic.before-rename")
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UbError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
