"""Per-component log files under ``RUN/logs/``, so a failure can be debugged after the fact.

Each component logs to a standard logger (``ub.flow``, ``ub.rollout``, ``ub.learner``,
``ub.eval``, ``ub.pool``; vLLM's own ``vllm``) and, while a run is being driven, each of those
also goes to its own file (appended: a resumed run continues the files). ub sets
``PREFECT_LOGGING_EXTRA_LOGGERS=ub`` so the same records also reach Prefect's run logs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

COMPONENTS = {
    "ub.flow": "flow.log",
    "ub.rollout": "rollout.log",
    "ub.learner": "learner.log",
    "ub.eval": "eval.log",
    "ub.pool": "pool.log",
    "vllm": "engine.log",
}
FORMAT = "%(asctime)s %(levelname)s %(name)s [pid %(process)d] %(message)s"


@contextmanager
def run_logs(folder: Path) -> Iterator[dict[str, Path]]:
    """Attach one file handler per component for the duration of the block."""
    folder.mkdir(parents=True, exist_ok=True)
    attached: list[tuple[logging.Logger, logging.Handler, int]] = []
    try:
        for name, file_name in COMPONENTS.items():
            logger = logging.getLogger(name)
            handler = logging.FileHandler(folder / file_name, encoding="utf-8")
            handler.setFormatter(logging.Formatter(FORMAT))
            handler.setLevel(logging.INFO)
            attached.append((logger, handler, logger.level))
            logger.addHandler(handler)
            # Our loggers record INFO; vLLM keeps the level it was given (warnings by default).
            if name.startswith("ub.") and logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
        yield {name: folder / file_name for name, file_name in COMPONENTS.items()}
    finally:
        for attached_logger, attached_handler, level in attached:
            attached_logger.removeHandler(attached_handler)
            attached_logger.setLevel(level)
            attached_handler.close()
