"""What an actor name means: the one place that decides it.

Actor names are stored verbatim in ``steps.actor`` and ``games.actors``. Three kinds play a model:

- ``model``: the engine's base model, no adapter;
- ``model:PATH``: the base model with the PEFT LoRA adapter at ``PATH`` (``ub play``);
- ``ckpt-NNNNNN``: checkpoint ``N`` of a training run (the pool's name for the run's adapters).

Everything else is a fixed opponent: a scripted player (``random``, ``expert``) or a hosted
endpoint (``hosted:MODEL@BASE_URL``). Rewards, ratings, evaluation and the dashboard all ask this
module, so they can never disagree on who is a model.
"""

from __future__ import annotations

import re

MODEL = "model"
ADAPTER_PREFIX = "model:"
CHECKPOINT_PREFIX = "ckpt-"
_CHECKPOINT = re.compile(r"ckpt-(\d{6,})")


def checkpoint_actor(update: int) -> str:
    """The actor name (and folder name) of a run's checkpoint ``update``: ``ckpt-000004``."""
    if update < 0:
        raise ValueError(f"checkpoint number must be >= 0, got {update}")
    return f"{CHECKPOINT_PREFIX}{update:06d}"


def checkpoint_update(name: str) -> int | None:
    """The checkpoint number of ``ckpt-NNNNNN``; ``None`` for any other name."""
    match = _CHECKPOINT.fullmatch(name)
    return int(match.group(1)) if match else None


def is_checkpoint_actor(name: str) -> bool:
    """``True`` for a run's checkpoint (``ckpt-NNNNNN``)."""
    return checkpoint_update(name) is not None


def is_model_actor(name: str) -> bool:
    """``True`` when a model plays: ``model``, ``model:PATH`` or a run's ``ckpt-NNNNNN``."""
    return name == MODEL or name.startswith(ADAPTER_PREFIX) or is_checkpoint_actor(name)
