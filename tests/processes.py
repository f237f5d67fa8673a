"""Process-tree helpers for the tests that check nothing outlives a killed command."""

from __future__ import annotations

import signal
from pathlib import Path


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
