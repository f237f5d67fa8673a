"""Atomic file writes: a temporary name in the same folder, fsync, rename, fsync the folder.

A reader sees the whole file or nothing; a writer killed midway leaves only a hidden
``.NAME.tmp-PID-XXXXXXXX`` file, which ``ub.run.folder.layout.remove_orphans`` clears (and
``ub doctor`` reports).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
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


def _umask() -> int:
    """The process's umask, read without setting it where Linux says it (setting it, even back
    at once, would give a file another thread creates meanwhile the wrong mode)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    umask = os.umask(0)
    os.umask(umask)
    return umask


def publishable(path: Path) -> None:
    """Give folder ``path`` and its files the permissions of a normal mkdir and open under the
    umask: mkdtemp makes a folder 0700, and safetensors writes its files 0600, so a checkpoint's
    weights were private while the rest of its run was not."""
    umask = _umask()
    path.chmod(0o777 & ~umask)
    for child in path.iterdir():
        child.chmod(0o666 & ~umask)


@contextlib.contextmanager
def removed_on_failure(path: Path, keep: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """If the block fails and ``path`` did not exist before it, remove ``path`` and the parent
    folders the block created for it, unless ``keep()`` says otherwise: a command refused after
    it made a folder (a lock, a working copy) leaves the disk as it found it. A parent goes only
    while empty (another process may be writing beside it)."""
    path = Path(path).absolute()
    new = []  # path and its missing parents, innermost first
    folder = path
    while not os.path.lexists(folder) and folder != folder.parent:
        new.append(folder)
        folder = folder.parent
    try:
        yield
    except BaseException:
        if new and os.path.lexists(path) and not keep():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):  # (the command's own error is the news)
                    path.unlink()
        if new and not os.path.lexists(path):
            for parent in new[1:]:
                try:
                    parent.rmdir()
                except OSError:
                    break
        raise


def check_can_create(folder: Path) -> None:
    """Fail before any work if ``folder`` could not be created and written, creating nothing
    (the folder appears only when its first file is written)."""
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        reason = "not a folder" if not existing.is_dir() else "permission denied"
        raise UbError(f"output folder {folder} is not writable ({existing}: {reason})")
