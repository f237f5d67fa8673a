"""The rollout inference engine, by its long-standing import path.

The engine is cut into modules along its seams; this one gathers their public names so that
``from ub.inference.vllm_engine import ...`` keeps working:

- :mod:`ub.inference.environment`: the environment vLLM reads (:func:`configure_vllm_environment`);
- :mod:`ub.inference.noise`: vLLM's expected warnings dropped;
- :mod:`ub.inference.patches`: vLLM's engine arguments and the workarounds around its start;
- :mod:`ub.inference.types`: :class:`EngineConfig`, :class:`SamplingConfig`,
  :class:`GenerationRequest`, :class:`Generation`, :class:`EngineStats`;
- :mod:`ub.inference.validation`: model and adapter checks;
- :mod:`ub.inference.engine`: :class:`VLLMEngine` itself (what it guarantees is described there);
- :mod:`ub.inference.handle`, :mod:`ub.inference.protocols`: a caller's handle on a shared
  engine, and the interface rollouts and evaluation use.

A process's engine is kept by a :class:`ub.run.worker.Worker`, passed to what uses it.
"""

from __future__ import annotations

from ub.inference.engine import VLLMEngine
from ub.inference.environment import (
    configure_vllm_environment,
    core_list,
    vllm_server_environment,
)
from ub.inference.handle import EngineHandle
from ub.inference.patches import vllm_engine_args
from ub.inference.protocols import InferenceEngine
from ub.inference.types import (
    VLLM_LORA_RANKS,
    EngineConfig,
    EngineStats,
    Generation,
    GenerationRequest,
    SamplingConfig,
)
from ub.inference.validation import validate_adapter_dir, validate_model_dir

__all__ = [
    "VLLM_LORA_RANKS",
    "EngineConfig",
    "EngineHandle",
    "EngineStats",
    "Generation",
    "GenerationRequest",
    "InferenceEngine",
    "SamplingConfig",
    "VLLMEngine",
    "configure_vllm_environment",
    "core_list",
    "validate_adapter_dir",
    "validate_model_dir",
    "vllm_engine_args",
    "vllm_server_environment",
]
