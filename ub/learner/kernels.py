"""GPU kernels for the learner's transformer body, from a maintained library (Liger Kernel).

``learner.kernels``: ``none`` (transformers' own modules), ``liger`` (Liger Kernel's Triton RoPE,
RMSNorm and SwiGLU, measured 1.31x on an H200 on the Qwen3-1.7B shape: ../shared/GPU.md), or
``auto`` (Liger on CUDA when it is installed and knows the model type, else none). Liger's
cross-entropy kernels stay off: ub's output layer is its own (:mod:`ub.learner.output_layer`).

Liger patches the loaded model's modules in place before PEFT wraps them (LoRA then wraps the
same projections: Liger's SwiGLU calls the MLP's own ``gate_proj``, ``up_proj`` and
``down_proj``). After PEFT it would find the decoder where it looks for it no longer, so
:func:`apply_kernels` refuses a model with LoRA layers. It also replaces the model type's RoPE
function in its transformers module, for every later load in the process. The learner records
the kernels it applied: ``liger_kernels`` in its update's metrics and the round manifest
(``[]`` where none were).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ub.errors import UbError

# Liger's body kernels; its loss kernels compute a mean cross-entropy, not ub's token logprobs.
LIGER_SETTINGS = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False,
                  "fused_linear_cross_entropy": False}
LIGER_DEVICE_TYPES = frozenset({"cuda"})  # (Triton kernels)


def _liger_unavailable(device: torch.device, model_type: str) -> str | None:
    """Why Liger cannot run here (``None``: it can)."""
    if device.type not in LIGER_DEVICE_TYPES:
        return f"the learner runs on {device.type}, and Liger's kernels are CUDA-only (Triton)"
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install -e '.[gpu]')"
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except Exception as e:  # (a broken Triton or transformers mismatch)
        return f"liger_kernel does not import: {' '.join(str(e).split())[:200]}"
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return f"Liger has no kernels for model type {model_type!r}"
    return None


def resolve_kernels(name: str, device: torch.device, model_type: str) -> str:
    """``liger`` or ``none``: what ``learner.kernels`` = ``name`` means on ``device`` for a model
    of ``model_type``.

    :raises UbError: ``liger`` where Liger cannot run (one line: why, and what to do).
    """
    if name == "none":
        return "none"
    why = _liger_unavailable(device, model_type)
    if why is None:
        return "liger"
    if name == "liger":
        raise UbError(f"learner.kernels is liger, but {why}: set learner.kernels to auto or "
                      "none")
    return "none"


def apply_kernels(kernels: str, model: Any) -> list[str]:
    """Patch the loaded, not yet PEFT-wrapped ``model`` with ``kernels`` (``liger``/``none``);
    returns the kernels applied (Liger's names of them: ``rope``, ``rms_norm``, ``swiglu``),
    ``[]`` for none.

    :raises UbError: ``model`` has LoRA layers already (Liger must patch it before PEFT
        wraps it).
    """
    if kernels != "liger":
        return []
    from peft.tuners.tuners_utils import BaseTunerLayer

    if any(isinstance(module, BaseTunerLayer) for module in model.modules()):
        raise UbError("Liger's kernels must patch the base model before PEFT wraps it: this "
                      "model has LoRA layers already")
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    MODEL_TYPE_TO_APPLY_LIGER_FN[model.config.model_type](model=model, **LIGER_SETTINGS)
    return [name for name, on in LIGER_SETTINGS.items() if on]
