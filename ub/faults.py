"""Named crash points for fault-injection tests.

``UB_FAULT_AT=NAME`` (or ``NAME:N``, the N-th time the point is reached, default 1) makes the
process kill itself with SIGKILL at that point: no cleanup, no ``finally`` blocks, like a power
cut or the OOM killer. Unset (always, outside tests) a point costs one dict lookup.

Points: ``rollout.step`` (after an engine step, mid-rollout), ``shard.between-files`` (steps
file written, games file not), ``checkpoint.before-rename`` (checkpoint files written, folder
not renamed into place), ``learn.after-state`` (final-reward state saved, update not done),
``round.before-commit`` (everything of the round done but its manifest).
"""

from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def fault_point(name: str) -> None:
    spec = os.environ.get("UB_FAULT_AT")
    if not spec:
        return
    target, _, count = spec.partition(":")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
