"""Process-tree helpers for the tests that check nothing outlives a killed command, and a
command run in a real terminal."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def in_a_terminal(argv: list[str], env: dict[str, str], timeout: float, *,
                  cwd: Path | None = None, preexec_fn: Callable[[], None] | None = None
                  ) -> tuple[int, str]:
    """Run ``argv`` with a pty as its stdin, stdout and stderr (what a user's terminal is:
    Rich draws bars, Prefect prints what it prints on a TTY) until it exits or ``timeout``
    seconds pass (then it is killed); its exit code and everything it wrote."""
    import pty
    import select

    leader, follower = pty.openpty()
    child = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env,
                             cwd=cwd, close_fds=True, preexec_fn=preexec_fn)
    os.close(follower)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 1)[0]:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the child closed the pty
                    break
                if not chunk:
                    break
                out += chunk
            elif child.poll() is not None:
                break
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(30)
        os.close(leader)
    return child.returncode, out.decode("utf-8", "replace")


def as_from_a_terminal() -> None:
    """``preexec_fn`` for a command that a test stops with SIGINT or SIGTERM. A child inherits
    its parent's ignored signals and its spawning thread's blocked ones: a shell starts a
    background job (``make test &``) with SIGINT ignored, and libraries loaded by earlier tests
    in the same pytest process may block signals. Either way the command would never see the
    signal the test sends; give it what a terminal gives it."""
    stops = {signal.SIGINT, signal.SIGTERM}
    for number in stops:
        signal.signal(number, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), parents before their children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # (after the command's name)
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
