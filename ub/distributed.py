"""Data-parallel learning: several learner processes (one per GPU), one update.

Every rank holds a full replica (the base model, the LoRA adapter and AdamW's state) and the
whole batch (each assembles it from the same shards with the same seed). A rank forwards and
backwards every ``world``-th micro-batch; the gradients are then summed across ranks with one
``all_reduce`` (LoRA gradients are small: one flat tensor, no DDP buckets or hooks), so every
rank takes the same optimizer step on the full-batch gradient. The loss normaliser is the full
batch's (Dr. GRPO), which makes the sum exactly the one-process gradient up to the order of
floating-point additions. Rank 0 writes the checkpoint.

The process group is ``torch.distributed``: NCCL between GPUs, gloo on the CPU (which is how
the tests run it, with 2 processes). Without a group everything here is the identity.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ub.errors import UbError

T = TypeVar("T")
_JOINED: tuple[int, int] | None = None  # (rank, world) of the group this module created


def rank_and_world() -> tuple[int, int]:
    """This process's learner rank and the number of ranks (``(0, 1)`` outside a group).

    Only the group :func:`join` made counts: an in-process vLLM engine initializes
    ``torch.distributed`` for itself, which does not make the learner data-parallel."""
    return _JOINED or (0, 1)


def join(rank: int, world: int, address: str, *, timeout_minutes: float = 30.0) -> None:
    """Join the learners' process group (all ranks call it at once); ``address`` is
    ``HOST:PORT`` where rank 0 listens. NCCL when this process has a GPU, else gloo."""
    import torch.distributed as dist

    global _JOINED
    if (rank, world) == _JOINED:
        return
    if dist.is_initialized():
        raise UbError(f"learner rank {rank}: this process already has a torch.distributed "
                      "group (a vLLM engine's, or another learner group's); each data-parallel "
                      "learner rank needs a process of its own (cluster.learner_workers)")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    try:
        dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank,
                                world_size=world,
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    except (RuntimeError, ValueError) as exc:
        raise UbError(f"learner rank {rank} of {world} cannot join the process group at "
                      f"{address} ({exc}): check that the learner workers reach each other on "
                      "that port") from None
    _JOINED = (rank, world)


def leave() -> None:
    import torch.distributed as dist

    global _JOINED
    if _JOINED is not None:
        dist.destroy_process_group()
        _JOINED = None


def barrier() -> None:
    """Wait for every rank (no-op outside a group)."""
    import torch.distributed as dist

    if rank_and_world()[1] > 1:
        dist.barrier()


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Replace each parameter's ``.grad`` by its sum over the ranks (one collective)."""
    import torch.distributed as dist

    grads: list[torch.Tensor] = []
    for p in params:
        assert p.grad is not None, "sum_gradients needs every parameter's gradient"
        grads.append(p.grad)
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    dist.all_reduce(flat)
    offset = 0
    for grad in grads:
        count = grad.numel()
        grad.copy_(flat[offset:offset + count].view_as(grad))
        offset += count


def gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (small, picklable), in rank order, on every rank."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


@dataclass(frozen=True)
class Ranks:
    """This process's place among the learner ranks, as an update uses it: its share of the
    micro-batches, the gradients summed over the ranks, the figures of every rank. One rank
    (the default) makes each of these the identity."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        rank, world = rank_and_world()
        return cls(rank, world)

    def share(self, items: list[T]) -> list[T]:
        """This rank's items: every ``world``-th, from its own index."""
        return items[self.rank::self.world]

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        if self.world > 1:
            sum_gradients(params)

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order."""
        return [value] if self.world == 1 else gather(value)
