"""A game of one's own, in one file outside ub: a TextArena env and its ub rules.

**TakeAway**: one pile of objects; in turn each player takes 1, 2 or 3 (``[2]``); who takes
the last object wins. A pile that is a multiple of 4 loses for the player to move: whatever it
takes, the other restores the multiple.

Importing this module registers the env with TextArena (``TakeAway-v0``, and
``TakeAway-v0-train`` with the board observation ub's training presets use); naming
:class:`TakeAwayRules` in a game spec (``envs[].rules: own_game:TakeAwayRules``, ``ub play
--rules own_game:TakeAwayRules``) imports it and gives ub the game's legal moves (so
``legal_moves: mask`` and the ``random`` player work), its position keys and an ``expert``.
Put this file's folder on ``PYTHONPATH`` (docs/games.md).
"""

from __future__ import annotations

import random
import re
from typing import Any

import textarena as ta
from textarena.envs.registration import ENV_REGISTRY, register
from textarena.wrappers import (
    ActionFormattingWrapper,
    GameMessagesAndCurrentBoardObservationWrapper,
    LLMObservationWrapper,
)

from ub.games.rules import GameRules

PILE = 10
"""Objects on the pile at the start."""
MOST = 3
"""The most objects a player may take in one turn."""
ENV_ID = "TakeAway-v0"
"""The env's id as registered (``ENV_ID + "-train"``: with the board observation)."""

_MOVE = re.compile(r"\[\s*(\d+)\s*\]")


class TakeAwayEnv(ta.Env):
    """The TextArena env: a two-player subtraction game on one pile (see the module
    docstring)."""

    def __init__(self, pile: int = PILE) -> None:
        super().__init__()
        self.start_pile = pile

    def reset(self, num_players: int, seed: int | None = None) -> None:
        """Start a game with a full pile."""
        self.state = ta.TwoPlayerState(num_players=num_players, seed=seed)
        self.state.reset(game_state={"pile": self.start_pile},
                         player_prompt_function=self._prompt)
        self.state.add_observation(message=self.get_board_str(),
                                   observation_type=ta.ObservationType.GAME_BOARD)

    def get_board_str(self) -> str:
        """The pile as the players see it."""
        return f"Objects on the pile: {self.state.game_state['pile']}"

    def _prompt(self, player_id: int, game_state: dict[str, Any]) -> str:
        return (f"Welcome to TakeAway, Player {player_id}!\nRules:\n- On your turn, take 1 to "
                f"{MOST} objects from the pile, with the format '[n]', e.g. '[2]'.\n"
                "- Whoever takes the last object wins!")

    def step(self, action: str) -> tuple[bool, ta.Info]:
        """Take the objects ``action`` names, or mark it invalid."""
        self.state.add_observation(from_id=self.state.current_player_id, message=action,
                                   observation_type=ta.ObservationType.PLAYER_ACTION)
        match = _MOVE.search(action.strip())
        pile = self.state.game_state["pile"]
        taken = int(match.group(1)) if match else 0
        if not 1 <= taken <= min(MOST, pile):
            self.state.set_invalid_move(reason=f"Take 1 to {min(MOST, pile)} objects: '[n]'.")
            return self.state.step()
        self.state.game_state["pile"] = pile - taken
        self.state.add_observation(message=self.get_board_str(),
                                   observation_type=ta.ObservationType.GAME_BOARD)
        if self.state.game_state["pile"] == 0:
            self.state.set_winner(player_id=self.state.current_player_id,
                                  reason=f"Player {self.state.current_player_id} took the last "
                                  "object!")
        return self.state.step()


class TakeAwayRules(GameRules):
    """All ub knows of TakeAway: legal moves, position keys and an expert."""

    name = "TakeAway"
    # The env's class as TextArena's registry spells the entry point (below); __name__ keeps
    # it right under whatever name this module is imported.
    entry_point = f"{__name__}:{TakeAwayEnv.__qualname__}"

    def legal_moves(self, core: Any) -> list[str]:
        """``[1]`` to ``[3]``, no more than the pile holds."""
        return [f"[{n}]" for n in range(1, min(MOST, core.state.game_state["pile"]) + 1)]

    def position(self, core: Any, seat: int) -> str:
        """The pile and the seat to move: ``7 p1``."""
        return f"{core.state.game_state['pile']} p{seat}"

    def expert_move(self, core: Any, rng: random.Random) -> str:
        """Leave a multiple of 4 when it can (that wins), else take one and wait."""
        return f"[{expert_take(core.state.game_state['pile'])}]"


def expert_take(pile: int) -> int:
    """How many objects the expert takes from ``pile``."""
    return pile % (MOST + 1) or 1


# Registered once a process (a module imported under a second name finds its ids taken).
if ENV_ID not in ENV_REGISTRY:
    register(id=ENV_ID, entry_point=TakeAwayRules.entry_point,
             default_wrappers=[LLMObservationWrapper, ActionFormattingWrapper])
    register(id=f"{ENV_ID}-train", entry_point=TakeAwayRules.entry_point,
             default_wrappers=[GameMessagesAndCurrentBoardObservationWrapper,
                               ActionFormattingWrapper])
