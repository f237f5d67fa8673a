"""The ``ub`` command (``[project.scripts]``; ``python -m flows.cli`` runs the same).

The application composes the library's commands (:mod:`ub.cli`, one module per command) with
the commands that run Prefect flows (``ub train``, :mod:`flows.train_command`). It lives with the
flows because it is the one place that may import both: the library ``ub`` imports nothing of
``flows`` or ``tasks`` (docs/architecture.md). Nothing here imports Prefect, vLLM or torch:
``ub --help`` and argument errors are instant.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from flows import train_command
from ub.cli import (
    batch,
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

# In the order `ub --help` lists them.
COMMANDS = (model, play, sql, batch, learn, train_command, sft, evaluate, serve, dashboard,
            report, doctor, envs, config)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ub`` command."""
    return run(build_parser(COMMANDS), argv)


if __name__ == "__main__":
    sys.exit(main())
