"""Models: the locally built tiny CPU default (`ub model tiny`) and its pre-training data."""

from ub.model.tiny import (
    RECIPE_VERSION,
    TinyModelConfig,
    build_tiny_model,
    cache_key,
    measure_legality,
    tiny_model_path,
)
from ub.model.transcripts import TranscriptStep, iter_transcripts, transcript_pairs

__all__ = [
    "RECIPE_VERSION",
    "TinyModelConfig",
    "TranscriptStep",
    "build_tiny_model",
    "cache_key",
    "iter_transcripts",
    "measure_legality",
    "tiny_model_path",
    "transcript_pairs",
]
