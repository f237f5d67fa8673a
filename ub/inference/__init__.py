"""Inference backends. Importing this package does not import vLLM (the engine start does)."""

from ub.inference.vllm_engine import (
    EngineConfig,
    EngineStats,
    Generation,
    GenerationRequest,
    SamplingConfig,
    VLLMEngine,
    configure_vllm_environment,
    get_engine,
    shutdown_engine,
    validate_adapter_dir,
    validate_model_dir,
)

__all__ = [
    "EngineConfig",
    "EngineStats",
    "Generation",
    "GenerationRequest",
    "SamplingConfig",
    "VLLMEngine",
    "configure_vllm_environment",
    "get_engine",
    "shutdown_engine",
    "validate_adapter_dir",
    "validate_model_dir",
]
