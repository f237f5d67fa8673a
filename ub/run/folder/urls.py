"""Runs roots: the default one, which roots are URLs, and where this machine keeps a stored
run's copy.

A leaf (no ub imports): :mod:`ub.run.folder.layout` resolves a run's paths with it, and
:mod:`ub.run.folder.store`, which reads and writes a run's durable copy, builds on layout.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

DEFAULT_RUNS_ROOT = "runs"
"""Where runs live unless ``--root`` says otherwise (relative to the working directory)."""

SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_url(root: str | os.PathLike[str]) -> bool:
    """``s3://bucket/runs`` and ``file:///data/runs`` are store URLs; plain paths are not."""
    return isinstance(root, str) and bool(SCHEME.match(root))


def working_copy(url: str) -> Path:
    """Where this machine keeps its copy of the run stored at ``url``."""
    base = Path(os.environ.get("UB_WORK_DIR")
                or Path(os.environ.get("UB_CACHE_DIR") or "~/.cache/ub") / "runs")
    scheme, _, rest = url.partition("://")
    parts = [p for p in rest.split("/") if p and p not in (".", "..")]
    return (base.expanduser() / scheme / Path(*parts)).absolute()
