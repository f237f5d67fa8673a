"""How many tokens a learner micro-batch may hold: ``learner.micro_batch_tokens: auto``.

The transformer body's activations grow linearly with a micro-batch's tokens (attention runs
through SDPA, the output layer in chunks: neither holds a tokens-squared or tokens x vocabulary
tensor). So one probe measures the bytes autograd keeps per token on the real model, and the
budget is the memory the learner really has divided by that (:func:`learner_budget_bytes`):

- on a GPU, what is free on the device (the learner's own cached blocks included). While the
  learner shares the GPU with an awake vLLM engine (``device_share``: the run sets it to
  ``1 - engine.gpu_memory_utilization``), at most that share less the learner's own weights
  and optimizer state, even before the engine has allocated its part; while the engine sleeps
  (:class:`ub.run.worker.Worker` then hands the learner no share) everything free;
- on the CPU, half the memory the system has available, and at most
  :data:`CPU_MICRO_BATCH_TOKENS`, the fastest size there.

The same budget bounds the longest row the learner trains (:attr:`MemoryFit.longest_row`): a
row is never split across micro-batches, so a longer one is refused before the update
(:class:`ub.learner.Learner`) rather than run out of memory in it.

Estimates can miss (allocator fragmentation, another process): an out-of-memory error inside an
update retries it at half the micro-batch (:class:`ub.learner.Learner`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

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


def longest_row_tokens(budget_bytes: float, bytes_per_token: float) -> int:
    """The most tokens one row may have for its activations to fit ``HEADROOM *
    budget_bytes`` (the rule :func:`auto_micro_batch_tokens` sizes micro-batches by, unrounded
    and uncapped: a CPU's speed cap bounds micro-batches, not rows)."""
    return int(HEADROOM * max(0.0, budget_bytes) / max(bytes_per_token, 1.0))


@dataclass(frozen=True)
class MemoryFit:
    """What the learner's memory holds, measured once (``micro_batch_tokens: auto``).

    :param budget_bytes: the memory its activations may use (:func:`learner_budget_bytes`).
    :param bytes_per_token: an update's peak activation bytes per token (the probe's).
    :param cap: the most tokens a micro-batch takes whatever the memory (the CPU's fastest
        size); ``None``: no cap.
    """

    budget_bytes: float
    bytes_per_token: float
    cap: int | None = None

    @property
    def micro_batch_tokens(self) -> int:
        return auto_micro_batch_tokens(self.budget_bytes, self.bytes_per_token, cap=self.cap)

    @property
    def longest_row(self) -> int:
        return longest_row_tokens(self.budget_bytes, self.bytes_per_token)


def learner_budget_bytes(*, free: float, total: float, own: float,
                         device_share: float | None) -> float:
    """The memory a learner's activations may use on its GPU: the one rule, from the numbers.

    :param free: bytes free on the device for the learner: the driver's free memory plus what
        the learner's allocator has cached but not in use (it reuses that first).
    :param total: the device's bytes.
    :param own: what the learner already holds there (weights, LoRA, optimizer state).
    :param device_share: the fraction of the device the learner may use beside an awake vLLM
        engine, which takes the rest (even before it has allocated it); ``None``: no engine
        holds a share now (it sleeps, or lives elsewhere), so what is free.
    """
    if device_share is None:
        return float(free)
    return min(float(free), device_share * total - own)


class CudaMemoryInfo(Protocol):
    """What :func:`device_budget` reads of a GPU's memory: ``torch.cuda`` (tests pass a fake)."""

    def mem_get_info(self, device: Any = None) -> tuple[int, int]: ...

    def memory_reserved(self, device: Any = None) -> int: ...

    def memory_allocated(self, device: Any = None) -> int: ...


def device_budget(device: torch.device, own_bytes: int, device_share: float | None,
                  memory: CudaMemoryInfo | None = None) -> tuple[float, int | None]:
    """The memory the learner's activations may use on ``device`` (read now), and a token cap.

    :param own_bytes: what the learner already holds there: counted against its share.
    :param device_share: see :func:`learner_budget_bytes`.
    :param memory: where a GPU's figures come from (``None``: ``torch.cuda``).
    """
    if device.type == "cuda":
        cuda: Any = torch.cuda if memory is None else memory
        free, total = cuda.mem_get_info(device)
        cached = cuda.memory_reserved(device) - cuda.memory_allocated(device)
        return learner_budget_bytes(free=free + cached, total=total, own=own_bytes,
                                    device_share=device_share), None
    import psutil

    return psutil.virtual_memory().available / 2, CPU_MICRO_BATCH_TOKENS
