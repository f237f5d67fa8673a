"""One process drives a run at a time.

The lock is an ``flock`` on ``run.lock``: the kernel releases it when the holder dies, however it
dies, so a lock left by a killed process is recovered by simply taking it again. The file holds
the holder's pid and host, for the message a second process gets, and what else the holder
says of itself (the ``selfplay`` flow: its Prefect flow run, which the next holder of a lock
left by a dead process marks as crashed: :mod:`ub.flows.flow_runs`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from ub.errors import UbError
from ub.run.folder.layout import RunPaths


class RunLocked(UbError):
    """Another live process holds the run."""


class RunLock:
    """``with RunLock(path):`` holds the run for the block (and the process's life)."""

    def __init__(self, path: Path, owner: Mapping[str, str] | None = None, *,
                 pass_on_recovered: bool = False) -> None:
        """:param owner: more of the holder's record (beside its pid, host and start).
        :param pass_on_recovered: leave a dead holder's record for the next holder when this
            one releases (``ub doctor --repair``: the next ``ub train`` marks that holder's
            flow run crashed, which a release that emptied the file left running)."""
        self.path = path
        self.owner = dict(owner or {})
        self.pass_on_recovered = pass_on_recovered
        self._fd: int | None = None
        self.recovered_from: dict | None = None
        """The previous holder's record when it died without releasing (a stale lock)."""

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:  # (no link followed: the holder's record truncates the file it opens)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as exc:
            if self.path.is_symlink():
                raise UbError(f"{self.path} is a symbolic link: ub takes a run's lock only in "
                              "a file of its own, never through a link (it would write the "
                              "file the link names). Remove the link; the next command "
                              "makes the lock anew") from None
            raise UbError(f"cannot take the lock {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            record = _read_holder(fd)
            os.close(fd)
            raise _in_use(self.path, record) from None
        previous = _read_holder(fd)
        if previous and previous.get("pid") != os.getpid():
            self.recovered_from = previous
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **self.owner}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # an empty file = released cleanly
        if self.pass_on_recovered and self.recovered_from:
            os.pwrite(self._fd, json.dumps(self.recovered_from).encode(), 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _in_use(path: Path, record: dict | None) -> RunLocked:
    who = (f"pid {record.get('pid')} on {record.get('host')} since {record.get('since')}"
           if record else "another process")
    return RunLocked(f"run {path.parent} is in use by {who}; wait for it to finish or stop it "
                     "(a dead process releases the lock by itself)")


def check_not_held(path: Path) -> None:
    """Refuse a run whose lock a live process holds, with the message :meth:`RunLock.acquire`
    gives. Takes and writes nothing: a dead holder's record stays for the process that takes
    the lock next (which notes that it recovered it)."""
    record = holder(path)
    if record is not None:
        raise _in_use(path, record)


def _read_holder(fd: int) -> dict | None:
    try:
        data = os.pread(fd, 4096, 0)
        return json.loads(data) if data.strip() else None
    except (OSError, ValueError):
        return None


def holder(path: Path) -> dict | None:
    """The record of the live process holding the lock at ``path`` (``None``: nobody holds it).
    Takes and writes nothing: readers (``ub doctor``, the dashboard) may call it any time."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # (none, or a link, which no ub process holds: acquire refuses it)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(fd) or {}
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def removed_if_refused(paths: RunPaths) -> contextlib.AbstractContextManager[None]:
    """Around a command's checks: a run folder or working copy (a store run's, made by
    :func:`ub.run.folder.store.catch_up`) that did not exist before them is removed if they refuse
    the command, unless another process holds the run by now."""
    from ub.data.atomic import removed_on_failure

    return removed_on_failure(paths.root, keep=lambda: holder(paths.lock) is not None)
