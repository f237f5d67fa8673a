"""How many tokens a learner micro-batch may hold: ``learner.micro_batch_tokens: auto``.

The transformer body's activations grow linearly with a micro-batch's tokens (attention runs
through SDPA, the output layer in chunks: neither holds a tokens-squared or tokens x vocabulary
tensor). So one probe measures the bytes autograd keeps per token on the real model, and the
budget is the memory the learner really has divided by that (:func:`learner_budget_bytes`):

- on a GPU, what is free on the device (the learner's own cached blocks included). While the
  learner shares the GPU with an awake vLLM engine (``device_share``: the run sets it to
  ``1 - engine.gpu_memory_utilization``), at most that share less the learner's own weights
  and optimizer state, even before the engine has allocated its part; while the engine sleeps
  (:class:`ub.run.processes.worker.Worker` then hands the learner no share) everything free;
- on the CPU, half the memory the system has available, and at most
  :data:`CPU_MICRO_BATCH_TOKENS`, the fastest size there.

The same budget bounds the longest row the learner trains (:attr:`MemoryFit.longest_row`): a
row is never split across micro-batches, so a longer one is refused before the update
(:class:`ub.learner.Learner`) rather than run out of memory in it.

Estimates can miss (allocator fragmentation, another process): an out-of-memory error inside an
update retries it at half the micro-batch (:class:`ub.learner.Learner`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ub.errors import UbError

log = logging.getLogger("ub.learner.learner")

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


class MicroBatchBudget:
    """The micro-batch token budget updates use: ``learner.micro_batch_tokens``, with ``auto``
    measured on the policy once (while the settings it depends on stay the same), and halved
    after an out-of-memory error (the smaller size stays for later updates).

    :param measure: measures what the learner's memory holds (``Policy.measure_memory``).
    """

    def __init__(self, measure: Callable[[], MemoryFit]) -> None:
        self._measure = measure
        self._sizing: tuple[Any, ...] | None = None
        self._tokens: int | None = None
        self._sized = False
        self.fit: MemoryFit | None = None  # (auto: what the memory holds)

    def configure(self, setting: int | str | None, gradient_checkpointing: bool,
                  device_share: float | None, compute: Hashable = None) -> None:
        """Apply the settings; a change of any of them forgets what was measured or halved.

        :param compute: the other settings the probe's bytes per token depend on (the
            adapter's compute dtype, the attention kernel).
        """
        sizing = (setting, gradient_checkpointing, device_share, compute)
        if sizing != self._sizing:
            self._sizing = sizing
            self._tokens = setting if isinstance(setting, int) else None
            self._sized = setting != "auto"
            self.fit = None

    def tokens(self) -> int | None:
        """The budget (``None``: no limit)."""
        if not self._sized:
            fit = self.fit = self._measure()
            self._tokens = fit.micro_batch_tokens
            self._sized = True
            log.info("learner: micro_batch_tokens auto -> %d (%.1f GiB for activations at "
                     "%.2f MiB/token; rows up to %d tokens)", self._tokens,
                     fit.budget_bytes / 2**30, fit.bytes_per_token / 2**20, fit.longest_row)
        return self._tokens

    def refuse_rows_too_long(self, longest: int, update: int, advice: str) -> None:
        """A row is never split across micro-batches, so one whose activations alone do not
        fit the memory ``auto`` measured would run out of memory inside the update (on a GPU
        beside a sleeping engine, after the engine's memory went to it): refused before any
        pass, with the setting that bounds it. A given ``micro_batch_tokens`` is trusted: a
        longer row gets a micro-batch of its own."""
        self.tokens()
        fit = self.fit
        if fit is None or longest <= fit.longest_row:
            return
        raise UbError(
            f"update {update}: a row of {longest:,} tokens does not fit the learner's memory "
            f"in one micro-batch ({fit.budget_bytes / 2**30:.1f} GiB for activations at "
            f"{fit.bytes_per_token / 2**20:.2f} MiB/token hold rows of up to "
            f"{fit.longest_row:,} tokens): set batch.max_train_len (ub learn: "
            f"--max-train-len) to at most {fit.longest_row:,}{advice}")

    def halve(self, longest: int, rows: int, update: int, message: str, world: int) -> None:
        """After running out of memory in update ``update``: half the budget, or a one-line
        :class:`UbError` where there is nothing left to halve."""
        old = self._tokens
        if old is None:  # no limit: the whole batch was one micro-batch
            old = longest * rows
        advice = ("set learner.gradient_checkpointing: true, lower engine.gpu_memory_utilization "
                  "or shorten sampling.max_tokens")
        if world > 1:  # every rank must cut the batch the same way
            raise UbError(f"update {update}: out of memory at micro_batch_tokens={old} on a "
                          f"data-parallel rank ({message}): set learner.micro_batch_tokens "
                          f"below {old}, or {advice}")
        if old <= longest:
            raise UbError(f"update {update}: out of memory with one row per micro-batch (the "
                          f"longest has {longest} tokens; {message}): {advice}")
        log.warning("learner: out of memory at micro_batch_tokens=%d in update %d; retrying "
                    "it at %d", old, update, old // 2)
        self._tokens, self._sized = old // 2, True
