"""The model in a seat: the engine's base model, with or without a LoRA adapter.

``model`` is the base model; ``model:PATH`` adds the adapter at ``PATH``; a run's checkpoint
``ckpt-NNNNNN`` is its adapter under the run's ``checkpoints/``
(:func:`ub.run.steps.plan.pool_actor`). Its turns go to the rollout's engine, batched with
every other model seat's (:meth:`ub.actors.base.RolloutContext.model_turn`).
"""

from __future__ import annotations

from pathlib import Path

from ub.actors.base import Actor, Pending, Turn


class ModelActor(Actor):
    """The base model with the LoRA adapter at ``adapter`` (``None``: none).

    :param name: the actor's name as written (``model``, ``model:PATH``, ``ckpt-000004``).
    :param adapter: the adapter folder, absolute.
    """

    kind = "model"
    needs_engine = True
    plays_offline = False

    def __init__(self, name: str, adapter: str | None = None) -> None:
        super().__init__(name)
        self._adapter = adapter

    @property
    def adapter(self) -> str | None:
        return self._adapter

    @property
    def checkpoint(self) -> str:
        """The adapter's folder name, or ``base``."""
        return Path(self._adapter).name if self._adapter else "base"

    def take_turn(self, turn: Turn) -> Pending:
        return turn.rollout.model_turn(turn, self._adapter)
