"""How many tokens a learner micro-batch may hold: ``learner.micro_batch_tokens: auto``.

The transformer body's activations grow linearly with a micro-batch's tokens (attention runs
through SDPA, the output layer in chunks: neither holds a tokens-squared or tokens x vocabulary
tensor). So one probe measures the bytes autograd keeps per token on the real model, and the
budget is the memory the learner really has divided by that:

- on a GPU, what is free on the device, and at most the learner's share of it when it shares
  the GPU with a vLLM engine (``1 - engine.gpu_memory_utilization``) less the learner's own
  weights and optimizer state;
- on the CPU, half the memory the system has available, and at most
  :data:`CPU_MICRO_BATCH_TOKENS`, the fastest size there.

Estimates can miss (allocator fragmentation, another process): an out-of-memory error inside an
update retries it at half the micro-batch (:class:`ub.learner.Learner`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

CPU_MICRO_BATCH_TOKENS = 4096
"""On a CPU, 2,048-4,096 tokens per micro-batch is also the fastest (bench/learner.py)."""
HEADROOM = 0.85
"""The share of the memory left to the learner that activations may fill: the rest absorbs the
allocator's fragmentation and the output layer's per-chunk temporaries."""
BACKWARD_LAYERS = 2
"""Backward holds, beyond what forward kept, about two layers' worth of activation gradients
at a time (one being computed, one being consumed); with gradient checkpointing also the layer
being recomputed."""
MULTIPLE = 256
MINIMUM = 256


def saved_bytes(forward: Callable[[], Any], exclude: list[torch.Tensor]) -> int:
    """Bytes of the tensors autograd saves for backward while ``forward()`` runs, each storage
    counted once, ``exclude`` (the frozen weights a matmul saves) left out."""
    seen = {t.untyped_storage().data_ptr() for t in exclude}
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return total


def activation_bytes_per_token(kept: int, per_layer: int, tokens: int,
                               checkpointing: bool) -> float:
    """Peak activation bytes per token of an update, from a probe of ``tokens`` tokens that
    kept ``kept`` bytes for backward, ``per_layer`` of them one layer's when nothing is
    recomputed."""
    transient = per_layer * (BACKWARD_LAYERS + (1 if checkpointing else 0))
    return (kept + transient) / tokens


def auto_micro_batch_tokens(budget_bytes: float, bytes_per_token: float, *,
                            cap: int | None = None) -> int:
    """The largest multiple of :data:`MULTIPLE` tokens whose activations fit
    ``HEADROOM * budget_bytes`` (at least :data:`MINIMUM`, at most ``cap``)."""
    fit = int(HEADROOM * max(0.0, budget_bytes) / max(bytes_per_token, 1.0))
    tokens = max(MINIMUM, fit // MULTIPLE * MULTIPLE)
    return min(tokens, cap) if cap is not None else tokens


def learner_budget_bytes(device: torch.device, own_bytes: int,
                         device_share: float | None) -> tuple[float, int | None]:
    """The memory the learner's activations may use on ``device``, and a token cap.

    :param own_bytes: what the learner already holds there (weights, LoRA, optimizer state):
        counted against its share.
    :param device_share: the fraction of the GPU the learner may use (it shares the GPU with
        a vLLM engine); ``None``: whatever is free.
    """
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = float(free)
        if device_share is not None:
            budget = min(budget, device_share * total - own_bytes)
        return budget, None
    import psutil

    return psutil.virtual_memory().available / 2, CPU_MICRO_BATCH_TOKENS
