"""Kuhn Poker: all ub knows of it. Legal moves, position keys, the Nash equilibrium the
``expert`` and ``perfect`` players play, one hand's tree for the exploitability solver, and
the fix to TextArena's env, which does not play by its own prompt's rules.

- **The equilibrium** (Kuhn, 1950) with ``alpha = 1/6``. First to act: bet a J with
  probability alpha (a bluff), check a Q, bet a K with probability 3 alpha; after check-bet:
  fold a J, call a Q with probability alpha + 1/3, call a K. Second to act: facing a bet, fold
  a J, call a Q with probability 1/3, call a K; after a check, bet a J with probability 1/3 (a
  bluff), check a Q, bet a K. No strategy wins chips from it on average over both seats (the
  first seat's value is -1/18 chip per hand).
- **The fix**: the prompt says ``[bet]`` and ``[call]`` add a chip to the pot, but the env
  never adds them (its pot stays at the two antes), so every hand is won or lost by one chip
  whatever was bet, a fold costs what a lost showdown does, and betting means nothing. Fixed:
  a bet and a call take the chip from the player and put it in the pot, as in Kuhn (1950).
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from typing import Any

from ub.games.rules import GameRules, TreeRules, unwrap

KUHN_ALPHA = 1 / 6
"""The equilibrium's bluffing parameter the players use (any in [0, 1/3] is an equilibrium)."""

_KUHN_CARDS = "JQK"
_KUHN_MOVE = re.compile(r"\[(Check|Bet|Fold|Call)\]", re.IGNORECASE)  # the env's own reading


def kuhn_history(core: Any) -> str:
    """The betting so far in Kuhn Poker's current round, as the player to move faces it:
    ``""`` (it opens), ``"check"``, ``"bet"`` or ``"check bet"``, read from the betting tree's
    current node and whether the mover opened the round (each node is reached two ways)."""
    state = core.state
    node = state.game_state["current_legal_action_tree"]
    if "check" in node:
        # The opening node's "check" leads to another decision; after a check it ends the hand.
        return "" if isinstance(node["check"], dict) else "check"
    first_to_act = state.current_player_id == state.game_state["starting_player"]
    return "check bet" if first_to_act else "bet"


def kuhn_policy(card: int, history: str, alpha: float = KUHN_ALPHA) -> dict[str, float]:
    """Equilibrium move probabilities for ``card`` (0 = J, 1 = Q, 2 = K) after ``history``
    (``""``: first to act; ``"check"``/``"bet"``: second to act; ``"check bet"``: first to
    act facing a bet)."""
    if history == "":
        bet = (alpha, 0.0, 3 * alpha)[card]
        return {"bet": bet, "check": 1 - bet}
    if history == "check":
        bet = (1 / 3, 0.0, 1.0)[card]
        return {"bet": bet, "check": 1 - bet}
    if history == "bet":
        call = (0.0, 1 / 3, 1.0)[card]
        return {"call": call, "fold": 1 - call}
    if history == "check bet":
        call = (0.0, alpha + 1 / 3, 1.0)[card]
        return {"call": call, "fold": 1 - call}
    raise ValueError(f"not a Kuhn poker decision point: {history!r}")


def kuhn_chips(cards: tuple[int, int], opener: int, betting: Sequence[str]
               ) -> tuple[float, float] | None:
    """One hand of Kuhn Poker's chips by seat, as the rules the env's prompt states them
    (each player antes 1; ``bet`` and ``call`` add a chip to the pot; a fold gives the pot to
    the other player, else the higher card takes it), or ``None`` while the hand goes on.

    :param cards: each seat's card (0 = J, 1 = Q, 2 = K); ``opener``: the seat that acts
        first; ``betting``: the moves so far, in order (``check``, ``bet``, ``call``, ``fold``).
    """
    put = [1, 1]
    for i, move in enumerate(betting):
        seat = opener if i % 2 == 0 else 1 - opener
        if move in ("bet", "call"):
            put[seat] += 1
        if move == "fold":
            return (float(put[1]), -float(put[1])) if seat == 1 else (-float(put[0]),
                                                                    float(put[0]))
    over = (list(betting[-2:]) in (["check", "check"], ["bet", "call"]))
    if not over:
        return None
    winner = 0 if cards[0] > cards[1] else 1
    stake = float(put[1 - winner])
    return (stake, -stake) if winner == 0 else (-stake, stake)


def _first_hand(core: Any, move: str) -> tuple[float, ...] | None:
    """The first hand's chips once ``move`` (by the seat to move in ``core``) ends it. Read
    from the state before the move: the env deals the next hand in the same step. TextArena's
    env never adds a bet to its pot (its every hand is won or lost by the ante), so the chips
    are the stated rules', not the env's (docs/exploitability.md)."""
    game = core.state.game_state
    opener = game["starting_player"]
    history = kuhn_history(core).split()
    cards = (game["player_cards"][0], game["player_cards"][1])
    return kuhn_chips(cards, opener, [*history, move.strip("[]")])


@functools.cache
def _deals(env_id: str) -> list[tuple[int, float]]:
    """The six deals, each with probability 1/6 (TextArena shuffles the three cards at
    reset), each as the first seed that deals it (so its prompts are the env's own)."""
    import textarena as ta  # (heavy: only where a tree is walked)

    found: dict[tuple[int, int], int] = {}
    seed = 0
    outer = random.getstate()  # TextArena reseeds the global RNG; leave the caller's alone
    try:
        while len(found) < 6:
            env = ta.make(env_id=env_id)  # (ub's fix changes a step, never the deal)
            env.reset(num_players=2, seed=seed)
            cards = unwrap(env).state.game_state["player_cards"]
            found.setdefault((cards[0], cards[1]), seed)
            seed += 1
    finally:
        random.setstate(outer)
    return [(found[deal], 1 / 6) for deal in sorted(found)]


@functools.cache
def _fixed_kuhn_poker() -> type:
    from textarena.envs.KuhnPoker.env import KuhnPokerEnv

    def step(self: Any, action: str) -> Any:
        state = self.state
        match = _KUHN_MOVE.search(action.strip())
        move = match.group(1).lower() if match else None
        node = state.game_state.get("current_legal_action_tree")
        if move in ("bet", "call") and isinstance(node, dict) and move in node:
            state.game_state["pot"] += 1
            state.game_state["player_chips"][state.current_player_id] -= 1
        return KuhnPokerEnv.step(self, action)

    return type(KuhnPokerEnv.__name__, (KuhnPokerEnv,), {
        "step": step, "__module__": KuhnPokerEnv.__module__,
        "__qualname__": KuhnPokerEnv.__qualname__,
        "__doc__": "TextArena's KuhnPoker, a bet and a call paid into the pot (ub)."})


class KuhnPokerRules(GameRules):
    """Kuhn Poker: ``[check]``/``[bet]`` or ``[fold]``/``[call]``; the key is the mover's own
    card, the round, the chips (mover:other) and the round's betting (``K r1/3 -1:-1
    check``), never the opponent's card; the equilibrium (see the module docstring)."""

    name = "KuhnPoker"
    entry_point = "textarena.envs.KuhnPoker.env:KuhnPokerEnv"
    # One hand, in chips: the unit the game's equilibrium is known in (its first seat's value
    # is -1/18). The env's own game is several hands won by the most chips, whose best
    # response also plays on the score: docs/exploitability.md.
    tree = TreeRules("KuhnPoker", "chips", -2.0, _deals, _first_hand, perfect_information=False)

    def legal_moves(self, core: Any) -> list[str]:
        """The betting tree's current node's keys: exactly the allowed moves (check/bet at
        the start, fold/call facing a bet)."""
        # Leaves are strings ("showdown"/"loser"), but the env deals the next round before
        # returning, so the current node is always a dict mid-game.
        node = core.state.game_state["current_legal_action_tree"]
        if not isinstance(node, dict):
            return []
        return [f"[{move}]" for move in node]

    def position(self, core: Any, seat: int) -> str | None:
        """Own card, round, chips (mover:other) and the round's betting (``-`` for none)."""
        game = core.state.game_state
        if not isinstance(game["current_legal_action_tree"], dict):
            return None
        chips = game["player_chips"]
        betting = kuhn_history(core).replace(" ", ",") or "-"
        return (f"{_KUHN_CARDS[game['player_cards'][seat]]} r{game['current_round']}/"
                f"{core.max_rounds} {chips[seat]}:{chips[1 - seat]} {betting}")

    def expert_move(self, core: Any, rng: random.Random) -> str:
        """A move drawn from ``rng`` by the equilibrium's probabilities (moves in name
        order)."""
        probs = self._policy(core)
        moves = sorted(probs)
        return f"[{rng.choices(moves, weights=[probs[m] for m in moves])[0]}]"

    def perfect_distribution(self, core: Any) -> dict[str, float]:
        """The equilibrium the expert plays (a game of hidden information has no "optimal
        move", only an optimal mix)."""
        return {f"[{move}]": p for move, p in sorted(self._policy(core).items())}

    def fixed_class(self) -> type:
        """The env with a bet and a call paid into the pot (see the module docstring)."""
        return _fixed_kuhn_poker()

    @staticmethod
    def _policy(core: Any) -> dict[str, float]:
        state = core.state
        card = state.game_state["player_cards"][state.current_player_id]
        return kuhn_policy(card, kuhn_history(core))
