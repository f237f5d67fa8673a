"""The LoRA adapter's compute: ``learner.adapter_compute``.

The adapter's weights, their gradients and AdamW's moments are float32 whatever the base
model's dtype (they are small: ~35 M values at rank 32 on every projection of a 1.7B model).
PEFT computes the adapter in its weights' dtype: on a bfloat16 model every LoRA layer casts
its input up to float32, runs two float32 matmuls and adds a float32 product to the bf16
output: float32 GEMMs, and ``copy_`` kernels around every projection (a profile on an H200 put
them at ~2 s and 17.7% of a 9.3 s update of the 1.7B shape; docs/scaling.md has the figures
before and after).

``model`` (the default on CUDA) computes the adapter in the base model's dtype instead, as
training under bf16 autocast with float32 master weights does (transformers' Trainer with
``bf16=True``, torchtune's bf16 recipes), but for the LoRA layers alone, so nothing else of the
model computes otherwise: the input stays in the model's dtype; A and B are cast to it for the
matmuls (a differentiable cast: their gradients arrive in float32, in float32 ``.grad``, and
AdamW steps float32 weights); and the adapter's product is added into the base layer's output
by the GEMM itself (``addmm_``, scaled by ``alpha``), with no (tokens x features) temporary.
``float32`` keeps PEFT's own forward, exactly.

Mechanism: each PEFT ``lora.Linear`` gets the subclass :func:`model_dtype_class` (its
``__class__`` is swapped, nothing else changes: parameter names, the saved adapter, PEFT's
loading). Its forward takes the fast path only for one plain LoRA adapter on an input in the
compute dtype; anything else (the adapter disabled for the KL to the base model, merged
weights, DoRA or another variant, mixed adapters) goes to PEFT's forward.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ub.errors import UbError


def resolve_adapter_compute(name: str, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype the adapter's matmuls run in: ``learner.adapter_compute`` = ``name`` for a
    base model of ``dtype`` on ``device`` (``auto``: the model's on CUDA, else float32)."""
    if name == "float32":
        return torch.float32
    if name == "model" or (name == "auto" and device.type == "cuda"):
        return dtype
    if name == "auto":
        return torch.float32
    raise UbError(f"learner.adapter_compute must be auto, model or float32, got {name!r}")


@functools.cache
def model_dtype_class() -> type:
    """PEFT's ``lora.Linear`` with the forward that computes in the model's dtype (made once,
    on first use: PEFT is imported only where a learner is)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    class ModelDtypeLoraLinear(LoraLinear):
        """A PEFT LoRA ``Linear`` whose adapter computes in ``ub_compute_dtype`` (``None``:
        PEFT's own forward)."""

        ub_compute_dtype: torch.dtype | None = None

        def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            name = self._ub_fast_adapter(x, args, kwargs)
            if name is None:
                return super().forward(x, *args, **kwargs)
            lora_a, lora_b = self.lora_A[name], self.lora_B[name]
            dtype = x.dtype
            flat = x.reshape(-1, x.shape[-1])
            # A fresh 2-D output (no view), updated in place: the base layer's backward keeps
            # its input, not its output, and an in-place op on a view would copy gradients.
            result = self.base_layer(flat)
            down = torch.nn.functional.linear(self.lora_dropout[name](flat),
                                              lora_a.weight.to(dtype))
            result.addmm_(down, lora_b.weight.to(dtype).t(), alpha=self.scaling[name])
            return result.view(*x.shape[:-1], result.shape[-1])

        def _ub_fast_adapter(self, x: torch.Tensor, args: tuple[Any, ...],
                             kwargs: dict[str, Any]) -> str | None:
            """The one plain adapter the fast path computes, or ``None`` (PEFT's forward)."""
            if self.ub_compute_dtype is None or x.dtype != self.ub_compute_dtype or args \
                    or kwargs or self.disable_adapters or self.merged:
                return None
            active = [a for a in self.active_adapters if a in self.lora_A]
            if len(active) != 1:
                return None
            name = active[0]
            if name in getattr(self, "lora_variant", {}) or self.lora_B[name].bias is not None \
                    or self.lora_A[name].bias is not None \
                    or not isinstance(self.base_layer, torch.nn.Linear):
                return None
            return name

    return ModelDtypeLoraLinear


def set_adapter_compute(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Make every PEFT LoRA ``Linear`` of ``model`` compute its adapter in ``dtype`` (float32:
    PEFT's own forward); returns how many layers that is."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    fast = model_dtype_class()
    count = 0
    for module in model.modules():
        if type(module) is LoraLinear:
            module.__class__ = fast
        if isinstance(module, fast):
            layer: Any = module
            layer.ub_compute_dtype = None if dtype == torch.float32 else dtype
            count += 1
    return count


def adapter_compute_name(dtype: torch.dtype) -> str:
    """``bfloat16``, ``float32``, ...: a compute dtype as the metrics record it."""
    return str(dtype).removeprefix("torch.")
