"""The library's commands of the ``ub`` command line, one module per command.

Each command module has ``add_parser(sub)``, which adds the command's subparser to the
subparsers ``sub`` and sets its ``func``. The ``ub`` command itself (:mod:`ub.flows.cli`) composes
these with the commands that run Prefect flows (``ub train``), which live with the flows: the
library imports nothing of the orchestration (docs/architecture.md).

Every expected failure is a :class:`ub.errors.UbError`: printed as one ``ub: error: ...`` line on
stderr with exit code 2, no traceback (:func:`ub.cli.parser.run`). Heavy imports (vLLM, torch)
happen inside the commands that need them, so ``ub --help`` and argument errors are instant.
"""
