"""Named crash points for fault-injection tests.

``UB_FAULT_AT=NAME`` (or ``NAME:N``, the N-th time the point is reached, default 1) makes the
process kill itself with SIGKILL at that point: no cleanup, no ``finally`` blocks, like a power
cut or the OOM killer. Unset (always, outside tests) a point costs one dict lookup.

``UB_FAULT_AT=NAME:N:raise`` raises :class:`InjectedFault` there instead (an error inside the
process, e.g. a game env failing on some turn). ``UB_FAULT_AT=NAME:N:kill-engine`` SIGKILLs the
process's vLLM engine processes instead (vLLM's separate ``EngineCore``, with
``VLLM_ENABLE_V1_MULTIPROCESSING=1``; a CUDA fault or the OOM killer on a GPU) and goes on.
With ``UB_FAULT_ONCE=FILE`` the fault fires in
one process only, the first to create FILE (e.g. a Ray worker that is restarted after it).
``UB_FAULT_LOG=FILE`` appends the name of every point reached to FILE: a census of where a
run can be cut, for randomized fault tests.

Points: ``rollout.step`` (after an engine step, mid-rollout), ``env.step`` (before a game env's
step), ``atomic.before-rename`` (any atomic file write, temp file complete, not renamed: shards,
manifests, rating snapshots, reward state), ``shard.between-files`` (steps file written, games
file not), ``learn.mid-update`` (after a micro-batch's backward pass), ``learn.after-state``
(final-reward state saved, update not done), ``checkpoint.before-rename`` (checkpoint files
written, folder not renamed into place), ``rate.before-snapshot`` (ratings computed, snapshot
not written), ``round.before-commit`` (everything of the round done but its manifest),
``store.put`` (before a file is published to a run's store, :mod:`ub.run.folder.store`).
"""

from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """Raised at a fault point by ``UB_FAULT_AT=NAME:N:raise``."""


def fault_point(name: str) -> None:
    census = os.environ.get("UB_FAULT_LOG")
    if census:
        with open(census, "a") as log:
            log.write(name + "\n")
    spec = os.environ.get("UB_FAULT_AT")
    if not spec:
        return
    target, _, rest = spec.partition(":")
    if target != name:
        return
    count, _, action = rest.partition(":")
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(count or 1):
        once = os.environ.get("UB_FAULT_ONCE")
        if once:
            try:
                os.close(os.open(once, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return  # another process took this fault already
        if action == "raise":
            raise InjectedFault(f"injected fault at {name} (hit {_hits[name]})")
        if action == "kill-engine":
            _kill_engine_processes()
            return
        os.kill(os.getpid(), signal.SIGKILL)


def _kill_engine_processes() -> None:
    """SIGKILL this process's vLLM engine processes (vLLM titles them ``VLLM::EngineCore``)."""
    import psutil

    cores = [child for child in psutil.Process().children(recursive=True)
             if "EngineCore" in child.name()]
    if not cores:
        raise InjectedFault("kill-engine: no vLLM engine process to kill (it runs in-process "
                            "unless VLLM_ENABLE_V1_MULTIPROCESSING=1)")
    for core in cores:
        core.kill()  # (not waited for: reaping it here would hide its exit code from vLLM)
