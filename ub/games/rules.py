"""A game, as ub knows it: one :class:`GameRules` subclass per TextArena game.

Everything ub reads from a game beyond its text lives in its rules class: the legal moves (the
legal-move mask, the ``random`` player, ``steps.legal_moves``), the position key
(``steps.position``, position-keyed advantages, branching), an expert move (the ``expert``
player), the optimal mix (the ``perfect`` player), the tree the exploitability solver walks,
and a fix to an env that breaks its own rules. Each is optional: a game without legal moves is
played as free text, one without a position key records a NULL ``position``, and so on.

A class is keyed by one string, :attr:`GameRules.entry_point`: the core env's class as
TextArena's registry spells it (``module:Class``), so every registered variant of the game
(``-train``, ``-raw``, ``-medium``, ...) shares its rules. The built-in games are in
:mod:`ub.games.builtin`, one module each; a game of one's own names its class in the game
spec (``envs[].rules: package.module:Class``, ``ub play --rules``), which registers it
(:mod:`ub.games.registry`, docs/games.md).

Every method reads the *core* env (unwrapped, ``core.state.game_state`` and the like), never
the observation text, whose wording differs between an env's variants.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

Capability = Literal["legal_moves", "position", "expert_move", "perfect_distribution", "tree"]
"""What a game's rules may provide (:meth:`GameRules.provides`)."""


@dataclass(frozen=True)
class TreeRules:
    """A game's tree, as the exploitability solver's best response walks it
    (:mod:`ub.games.game_tree`).

    :param game: its name.
    :param unit: what a payoff counts (``game``: +1 a win, -1 a loss; ``chips``).
    :param worst: the worst payoff of the measured game (an illegal move's, to its mover).
    :param roots: the chance outcomes at the start, from the env id: ``(env seed,
        probability)`` pairs.
    :param payoff: the payoffs by seat if a move ends the measured game, from the core env
        before it and the move (``None``: it goes on); by default the env's own end.
    :param perfect_information: every decision is its own information set.
    """

    game: str
    unit: str
    worst: float
    roots: Callable[[str], list[tuple[int, float]]]
    payoff: Callable[[Any, str], tuple[float, ...] | None] | None = None
    perfect_information: bool = True


# How many `.env` hops `unwrap` follows before deciding the chain is cyclic (TextArena stacks 2-3).
_MAX_WRAPPER_DEPTH = 64


def unwrap(env: Any) -> Any:
    """Return the core TextArena env under any stack of wrappers: what a rules method reads.

    Wrappers (TextArena's and any of ours) keep the wrapped env in ``.env``; the core env has none.
    """
    for _ in range(_MAX_WRAPPER_DEPTH):
        inner = getattr(env, "env", None)
        if inner is None:
            return env
        env = inner
    raise RuntimeError(f"env wrapper chain deeper than {_MAX_WRAPPER_DEPTH}: is it cyclic?")


def one_root(_env_id: str) -> list[tuple[int, float]]:
    """The roots of a game without chance: every seed starts the same game (seed 0 stands for
    them)."""
    return [(0, 1.0)]


class GameRules:
    """What ub knows of one TextArena game. Subclass it, set :attr:`name` and
    :attr:`entry_point`, and override what the game has; what it leaves alone, ub does
    without (see the module docstring). ub makes one instance per class and keeps no state
    in it: every method is given the core env it reads."""

    name: ClassVar[str] = ""
    """The game's name in ub's lists and messages (``TicTacToe``)."""

    entry_point: ClassVar[str] = ""
    """The core env's class, ``module:Class``, exactly as TextArena's registry spells the
    entry point its ids were registered with (``textarena.envs.Nim.env:NimEnv``): the one key
    by which ub finds the rules of an env id or of a running env."""

    tree: ClassVar[TreeRules | None] = None
    """The game's tree for the exploitability solver (two seats, zero-sum); ``None``: none."""

    def legal_moves(self, core: Any) -> list[str]:
        """Every move the player to move in ``core`` may submit, each exactly as the game
        accepts it and in brackets (``"[4]"``, ``"[col 3]"``: the legal-move mask needs the
        ``[``), in an order that depends only on the game state (a seeded chooser is then
        reproducible). Never called once the game is over.

        :param core: the core env (unwrapped), reset and not over.
        """
        raise NotImplementedError

    def position(self, core: Any, seat: int) -> str | None:
        """The key of the position ``seat`` is to move in: a short canonical string of the
        game state as that seat faces it (only what it can see), or ``None`` for a state with
        none. Decisions with one key were taken in the same situation (docs/data.md).

        :param core: the core env (unwrapped); ``seat``: the seat to move.
        """
        raise NotImplementedError

    def expert_move(self, core: Any, rng: random.Random) -> str:
        """The ``expert`` player's move for the player to move in ``core``: strong play, as
        cheaply as the game allows.

        :param core: the core env (unwrapped); ``rng``: the player's own generator, the only
            randomness a move may draw on (never the global ``random``, which deals the game).
        """
        raise NotImplementedError

    def perfect_distribution(self, core: Any) -> dict[str, float]:
        """The ``perfect`` player's probability of each move for the player to move in
        ``core``: uniform over the moves that keep the position's game-theoretic value (an
        equilibrium mix in a game of hidden information), by legal move.

        :param core: the core env (unwrapped).
        """
        raise NotImplementedError

    def fixed_class(self) -> type | None:
        """A subclass of the core env that plays by the rules its prompt states, where the
        env does not (ub gives it to every env of the game it makes: :mod:`ub.games.env_fixes`);
        it must keep the env's module and name. ``None`` (the default): the env is right."""
        return None

    @classmethod
    def provides(cls, capability: Capability) -> bool:
        """Whether these rules have ``capability``: its method is overridden (or, for
        ``tree``, the tree rules given)."""
        if capability == "tree":
            return cls.tree is not None
        return getattr(cls, capability) is not getattr(GameRules, capability)
