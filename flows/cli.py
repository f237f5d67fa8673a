"""The ``ub`` command (``[project.scripts]``; ``python -m ub.flows.cli`` runs the same).

The application composes the library's commands (:mod:`ub.cli`, one module per command) with
the commands that run Prefect flows (``ub train``, :mod:`ub.flows.train_command`). It lives with the
flows because it is the one place that may import both: the library ``ub`` imports nothing of
``flows`` or ``tasks`` (docs/architecture.md). Nothing here imports Prefect, vLLM or torch:
``ub --help`` and argument errors are instant.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
from collections.abc import Sequence

from ub.cli import (
    batch,
    compare,
    config,
    dashboard,
    doctor,
    envs,
    evaluate,
    learn,
    model,
    play,
    report,
    serve,
    sft,
    sql,
)
from ub.cli.parser import build_parser, run
from ub.flows import sweep_command, train_command

# In the order `ub --help` lists them.
COMMANDS = (model, play, sql, batch, learn, train_command, sweep_command, sft, evaluate, compare,
            serve, dashboard, report, doctor, envs, config)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ub`` command."""
    return run(build_parser(COMMANDS), argv)


def entry() -> None:
    """The console script: :func:`main`, then exit without the interpreter's teardown.

    After a run, torch, transformers, vLLM and Prefect hold millions of objects that Python's
    finalization frees one by one (~3 s of CPU on 2 cores, after the work is done) while the OS
    reclaims the memory at once. Everything else a normal exit does still happens first:
    non-daemon threads are joined and every other exit handler runs (logging flushes, vLLM and
    Ray shut down, Prefect drains its logs), as this one is registered first and so runs last.
    An exception escaping :func:`main` exits the normal way.
    """
    # `kill -USR1 PID` prints where every thread of a running `ub` is, to its stderr (a run
    # that seems stuck, or a stop that takes long), and it goes on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    code: list[int] = []

    def skip_teardown() -> None:
        if code:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code[0])

    atexit.register(skip_teardown)
    code.append(main())
    sys.exit(code[0])


if __name__ == "__main__":
    entry()
