"""Process-tree helpers for the tests that check nothing outlives a killed command."""

from __future__ import annotations

from pathlib import Path


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
