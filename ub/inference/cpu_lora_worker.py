"""ub's CPU LoRA ops (:mod:`ub.inference.cpu_lora`) in the process that runs vLLM's model.

vLLM imports :class:`CpuLoraOps` there, as its worker extension (the engine argument
``worker_extension_cls``, set on the CPU by :func:`ub.inference.patches.vllm_engine_args`), and
importing this module installs the ops. The process that runs the model is the caller's own
only with the in-process engine: with vLLM's separate engine process
(``VLLM_ENABLE_V1_MULTIPROCESSING=1``, and ``ub serve``) it is a process vLLM spawns, where an
install in the caller's process never arrives, and base-model requests batched with LoRA
requests got an adapter's delta (vLLM's own CPU ops).
"""

from __future__ import annotations

from ub.inference import cpu_lora

cpu_lora.install()


class CpuLoraOps:
    """vLLM's worker, extended by nothing: importing this module is what counts."""
