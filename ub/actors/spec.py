"""Actor names: who sits in a seat, as written in configs, the CLI and the data.

- ``model``: the engine's base model (no adapter);
- ``model:PATH``: the base model with the PEFT LoRA adapter at ``PATH``;
- a scripted player name (``random``, ``expert``, ``perfect``): see :mod:`ub.actors.scripted`;
- ``hosted:MODEL@BASE_URL[?options]``: an OpenAI-compatible chat endpoint
  (:mod:`ub.actors.hosted`);
- ``package.module:Class``: an actor of one's own, a subclass of
  :class:`ub.actors.base.Actor` built as ``Class(name)`` (docs/pool.md).

A training run's checkpoints are ``ckpt-NNNNNN`` in the data; which names play a model is
decided in :mod:`ub.actors.names` alone.

The name is stored verbatim in ``steps.actor`` and ``games.actors``.
"""

from __future__ import annotations

from pathlib import Path

from ub.actors.base import Actor
from ub.actors.hosted import PREFIX as HOSTED_PREFIX
from ub.actors.hosted import HostedActor
from ub.actors.model import ModelActor
from ub.actors.names import ADAPTER_PREFIX, MODEL
from ub.actors.scripted import SCRIPTED_PLAYERS, ScriptedActor
from ub.components import is_import_path, load_class
from ub.errors import UbError

GUIDE = "docs/pool.md"
"""Where an actor of one's own is explained."""


def scripted_names() -> list[str]:
    """The scripted players' names."""
    return sorted(SCRIPTED_PLAYERS)


def parse_actor(name: str) -> Actor:
    """The actor ``name`` names (unknown names list the valid ones).

    :raises UbError: the name is unknown, an adapter path is missing, a hosted name is
        malformed, or an import path does not name an :class:`~ub.actors.base.Actor`.
    """
    name = name.strip()
    if name == MODEL:
        return ModelActor(name)
    if name.startswith(ADAPTER_PREFIX):
        path = name[len(ADAPTER_PREFIX):]
        if not path:
            raise UbError("actor 'model:' needs an adapter path, e.g. model:runs/x/checkpoints/3")
        return ModelActor(name, adapter=str(Path(path).expanduser().resolve()))
    if name in SCRIPTED_PLAYERS:
        return ScriptedActor(name)
    if name.startswith(HOSTED_PREFIX):
        return HostedActor(name)
    if is_import_path(name):
        return load_class(name, Actor, "actor", GUIDE)(name)  # type: ignore[type-abstract]
    raise UbError(
        f"unknown actor {name!r}; valid actors: model, model:ADAPTER_PATH, "
        + ", ".join(scripted_names()) + ", hosted:MODEL@BASE_URL, or one's own as "
        "package.module:Class"
    )
