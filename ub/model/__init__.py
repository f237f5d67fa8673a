"""Models: the locally built tiny CPU default (`ub model tiny`) and its pre-training data.

Names are imported lazily: importing the package costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RECIPE_VERSION": "ub.model.tiny",
    "TinyModelConfig": "ub.model.tiny",
    "build_tiny_model": "ub.model.tiny",
    "cache_key": "ub.model.tiny",
    "measure_legality": "ub.model.tiny",
    "tiny_model_path": "ub.model.tiny",
    "TranscriptStep": "ub.model.transcripts",
    "iter_transcripts": "ub.model.transcripts",
    "transcript_pairs": "ub.model.transcripts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ub.model' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
