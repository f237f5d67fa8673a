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

``learner.attention_kernel`` picks the kernel of PyTorch's scaled-dot-product attention (the
``sdpa`` implementation the learner runs) while the learner scores tokens
(:func:`attention_kernel`): ``torch`` leaves the choice to PyTorch, which on a Hopper GPU takes
cuDNN's attention and builds a plan for every new shape; ``flash`` takes PyTorch's
FlashAttention kernel, which plans nothing per shape; ``cudnn`` asks for cuDNN's first (each
falls back to the memory-efficient kernel, then the math one, where it cannot run). On an
H200 (docs/scaling.md), 1.7B at 32 GiB, batches of new lengths: cuDNN with lengths as they come
26,552 tokens/s, FlashAttention 35,705, cuDNN with widths padded to multiples of 128
(``learner.pad_to_multiple``: its plans repeat) 35,862. ``auto``: the last on CUDA (``cudnn``,
with ``pad_to_multiple: auto`` = 128), else ``torch``. Neither kernel's backward is bitwise
repeatable on a GPU at real lengths (measured: the same update twice differs).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
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


AUTO_ATTENTION_KERNEL = "cudnn"
"""``attention_kernel: auto`` on CUDA (measured: docs/scaling.md)."""


def resolve_attention_kernel(name: str, device: torch.device) -> str:
    """``torch``, ``flash`` or ``cudnn``: what ``learner.attention_kernel`` = ``name`` means on
    ``device`` (``auto``: :data:`AUTO_ATTENTION_KERNEL` on CUDA, else ``torch``)."""
    if name == "auto":
        return AUTO_ATTENTION_KERNEL if device.type == "cuda" else "torch"
    if name not in ("torch", "flash", "cudnn"):
        raise UbError(f"learner.attention_kernel must be auto, torch, flash or cudnn, got "
                      f"{name!r}")
    return name


@contextlib.contextmanager
def attention_kernel(name: str) -> Iterator[None]:
    """Run the block with SDPA restricted to the kernels of ``name`` (a resolved
    ``attention_kernel``; ``torch``: PyTorch's own choice), in that order of preference."""
    if name == "torch":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fallbacks = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    first = [SDPBackend.FLASH_ATTENTION] if name == "flash" else \
        [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]
    with sdpa_kernel(first + fallbacks, set_priority=True):
        yield
