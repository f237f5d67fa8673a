"""Actor names: who sits in a seat, as written in configs, the CLI and the data.

- ``model``: the engine's base model (no adapter);
- ``model:PATH``: the base model with the PEFT LoRA adapter at ``PATH``;
- a scripted player name (``random``, ``expert``): see :mod:`ub.actors.scripted`;
- ``hosted:MODEL@BASE_URL[?options]``: an OpenAI-compatible chat endpoint
  (:mod:`ub.actors.hosted`).

A training run's checkpoints are ``ckpt-NNNNNN`` in the data; which names play a model is
decided in :mod:`ub.actors.names` alone.

The name is stored verbatim in ``steps.actor`` and ``games.actors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ub.actors.names import ADAPTER_PREFIX, MODEL
from ub.errors import UbError


@dataclass(frozen=True)
class ActorSpec:
    """A parsed actor name.

    :param name: the name as given (stored with the data).
    :param kind: ``model``, ``scripted`` or ``hosted``.
    :param adapter: the LoRA adapter path for ``model:PATH``; ``None`` for the base model.
    :param checkpoint: a short label of the adapter (its folder name), stored in ``steps``.
    """

    name: str
    kind: str
    adapter: str | None = None

    @property
    def checkpoint(self) -> str | None:
        if self.kind != "model":
            return None
        return Path(self.adapter).name if self.adapter else "base"


def scripted_names() -> list[str]:
    from ub.actors.scripted import SCRIPTED_PLAYERS

    return sorted(SCRIPTED_PLAYERS)


def parse_actor(name: str) -> ActorSpec:
    """Parse ``model``, ``model:PATH`` or a scripted player name (unknown names list valid ones)."""
    name = name.strip()
    if name == MODEL:
        return ActorSpec(name, "model")
    if name.startswith(ADAPTER_PREFIX):
        path = name[len(ADAPTER_PREFIX):]
        if not path:
            raise UbError("actor 'model:' needs an adapter path, e.g. model:runs/x/checkpoints/3")
        return ActorSpec(name, "model", adapter=str(Path(path).expanduser().resolve()))
    if name in scripted_names():
        return ActorSpec(name, "scripted")
    if name.startswith("hosted:"):
        from ub.actors.hosted import parse_hosted

        parse_hosted(name)
        return ActorSpec(name, "hosted")
    raise UbError(
        f"unknown actor {name!r}; valid actors: model, model:ADAPTER_PATH, "
        + ", ".join(scripted_names()) + ", hosted:MODEL@BASE_URL"
    )
