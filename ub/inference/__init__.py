"""Inference backends. Importing this package does not import vLLM (the engine start does)."""

from ub.inference.engine import VLLMEngine
from ub.inference.handle import EngineHandle
from ub.inference.protocols import InferenceEngine
from ub.inference.types import (
    EngineConfig,
    EngineStats,
    Generation,
    GenerationRequest,
    SamplingConfig,
)
from ub.inference.validation import validate_adapter_dir, validate_model_dir
from ub.vllm_environment import configure_vllm_environment

__all__ = [
    "EngineConfig",
    "EngineHandle",
    "EngineStats",
    "Generation",
    "GenerationRequest",
    "InferenceEngine",
    "SamplingConfig",
    "VLLMEngine",
    "configure_vllm_environment",
    "validate_adapter_dir",
    "validate_model_dir",
]
