"""The games ub knows: their :class:`~ub.games.rules.GameRules`, keyed one way.

The key is the core env's class as TextArena's registry spells its entry point
(``module:Class``): an env id is looked up through TextArena's registry (:func:`entry_point`),
a running env by its core's class (:func:`rules_of`). Legal moves, position keys, the
``expert`` and ``perfect`` players, the exploitability solver's tree, the env fixes, the
checks of a spec and ``ub envs`` all read this registry, and nothing else.

It starts with the built-in games (:mod:`ub.games.builtin`); a game of one's own joins it
when a game spec names its class (``envs[].rules``, ``ub play --rules``: :func:`load_rules`),
in every process that validates that spec.
"""

from __future__ import annotations

from ub.components import import_path, load_class
from ub.errors import UbError
from ub.games.builtin import BUILT_IN_RULES
from ub.games.rules import Capability, GameRules, unwrap

GUIDE = "docs/games.md"
"""Where the docs say how to write a game's rules."""

_RULES: dict[str, GameRules] = {cls.entry_point: cls() for cls in BUILT_IN_RULES}


def class_entry_point(cls: type) -> str:
    """A class as an entry point: ``module:Class``, as TextArena spells one given as a string."""
    return f"{cls.__module__}:{cls.__qualname__}"


def entry_point(env_id: str) -> str | None:
    """The registered ``module:Class`` of ``env_id``, or None if TextArena does not know the id."""
    from textarena.envs.registration import ENV_REGISTRY  # importing textarena registers all envs

    spec = ENV_REGISTRY.get(env_id)
    if spec is None:
        return None
    entry = spec.entry_point
    return entry if isinstance(entry, str) else class_entry_point(entry)


def rules_for(env_id: str) -> GameRules | None:
    """The rules of ``env_id``'s game, or None (an id TextArena does not know, or a game ub
    has no rules for)."""
    return _RULES.get(entry_point(env_id) or "")


def rules_of(env: object) -> GameRules | None:
    """The rules of a running env's game (wrapped or not), by its core env's class."""
    return _RULES.get(class_entry_point(type(unwrap(env))))


def games_with(capability: Capability) -> tuple[str, ...]:
    """The names of the known games whose rules have ``capability``, sorted."""
    return tuple(sorted(r.name for r in _RULES.values() if r.provides(capability)))


def register_rules(cls: type[GameRules]) -> GameRules:
    """Add a game's rules under its entry point (again: no change) and return its instance.

    :raises UbError: ``cls`` lacks a name or a ``module:Class`` entry point, TextArena has
        no env registered with that entry point, or another class already has it.
    """
    where = import_path(cls)
    if not cls.name or cls.entry_point.count(":") != 1:
        raise UbError(f"game rules {where!r} need a name and an entry_point 'module:Class' "
                      f"(the env's class as registered with TextArena): set both ({GUIDE})")
    known = _RULES.get(cls.entry_point)
    if known is not None:
        if type(known) is not cls:
            raise UbError(f"game rules {where!r}: {cls.entry_point} already has rules "
                          f"({import_path(type(known))}); a game has one rules class: name "
                          "that one, or change its entry_point")
        return known
    if not _textarena_has(cls.entry_point):
        raise UbError(f"game rules {where!r}: TextArena has no env registered with entry point "
                      f"{cls.entry_point}: register it (textarena.envs.registration.register) "
                      f"in the module that defines the env, or fix entry_point ({GUIDE})")
    rules = _RULES[cls.entry_point] = cls()
    return rules


def load_rules(path: str) -> GameRules:
    """Import the rules class ``path`` names (``package.module:Class``: importing its module
    also registers the module's envs with TextArena) and register it.

    :raises UbError: it does not import, is not a :class:`GameRules` subclass, or does not
        register (:func:`register_rules`).
    """
    return register_rules(load_class(path, GameRules, "game rules", GUIDE))


def _textarena_has(entry: str) -> bool:
    """Whether an env id of TextArena's registry has ``entry`` as its entry point."""
    from textarena.envs.registration import ENV_REGISTRY

    return any(entry_point(env_id) == entry for env_id in ENV_REGISTRY)
