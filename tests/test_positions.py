"""Every decision records its position (``steps.position``): read from the game's own state,
canonical (the same state, the same key; another state, another key), the mover's view only in
a game of hidden information, NULL for a game without a key, and a function of one's own by
import path."""

from __future__ import annotations

import copy
import random

import pytest

from ub.actors.spec import parse_actor
from ub.errors import UbError
from ub.games.legal import legal_actions
from ub.games.loop import Game
from ub.games.rules import unwrap
from ub.games.specs import GameSpec
from ub.rollout import assign_games, play_games

# The games with a built-in key: those a shipped preset or the docs name, and ConnectFour.
KEYED = ["TicTacToe-v0-train", "Nim-v0-train", "KuhnPoker-v0-train", "SimpleTak-v0-train",
         "ConnectFour-v0-train", "TowerOfHanoi-v0-train"]


def random_play(spec: GameSpec, games: int, seed: int = 0):
    """(position, seat, the core env's state before the move, the move) of every decision of
    ``games`` random games."""
    rng = random.Random(seed)
    for index in range(games):
        game = Game(spec, seed * 1000 + index, f"g{index}")
        while not game.done:
            core = unwrap(game.env)
            before = copy.deepcopy(core.state.game_state)
            move = game.act_with(lambda env: rng.choice(legal_actions(env)))
            yield game.position, game.current_seat, before, move
            game.apply(move)
        assert game.final.error is None, game.final.error


def players(env_id: str) -> int:
    return 1 if env_id.startswith("TowerOfHanoi") else 2


@pytest.mark.parametrize("env_id", [e for e in KEYED if not e.startswith("KuhnPoker")])
def test_a_position_is_one_state_and_one_state_one_position(env_id):
    """Over random games, decisions with the same key faced the same state and mover (so the
    key can stand for the state), and the same state and mover always gave the same key.
    (Kuhn Poker's key leaves the other card out on purpose: its own test is below.)"""
    spec = GameSpec(env_id, num_players=players(env_id))
    by_key: dict[str, tuple] = {}
    by_state: dict[tuple, str] = {}
    for position, seat, state, _ in random_play(spec, 40):
        assert isinstance(position, str) and position, (env_id, state)
        seen = (repr(sorted(state.items())), seat)
        assert by_key.setdefault(position, seen) == seen, position
        assert by_state.setdefault(seen, position) == position, seen
    assert len(by_key) > 10


def test_keys_read_as_the_docs_say():
    spec = GameSpec("TicTacToe-v0-train")
    game = Game(spec, 1, "g")
    assert game.position == ".../.../... O"  # seat 0 plays O and moves first
    game.apply("[4]")
    assert game.position == ".../.O./... X"
    nim = Game(GameSpec("Nim-v0-train"), 1, "n")
    assert nim.position == "3,4,5 p0"
    nim.apply("[1 4]")
    assert nim.position == "3,0,5 p1"
    hanoi = Game(GameSpec("TowerOfHanoi-v0-train", num_players=1), 1, "h")
    assert hanoi.position == "A:3,2,1 B: C:"


def test_a_kuhn_key_holds_the_movers_card_and_the_betting_never_the_other_card():
    """Kuhn Poker is a game of hidden information: the key names the mover's own card, the round,
    the chips and this round's betting as the moves were made; the same key is reached with
    each of the other cards the opponent may hold."""
    spec = GameSpec("KuhnPoker-v0-train")
    cards = "JQK"
    others: dict[str, set[int]] = {}
    betting: list[str] = []
    last_round = None
    for position, seat, state, move in random_play(spec, 60, seed=4):
        card, round_, chips, bets = position.split(" ")
        if state["current_round"] != last_round:
            betting, last_round = [], state["current_round"]
        assert card == cards[state["player_cards"][seat]]
        assert round_ == f"r{state['current_round']}/3"
        assert chips == f"{state['player_chips'][seat]}:{state['player_chips'][1 - seat]}"
        assert bets == (",".join(betting) or "-")
        others.setdefault(position, set()).add(state["player_cards"][1 - seat])
        betting.append(move.strip("[]"))
    assert max(len(v) for v in others.values()) == 2  # one key, either card across the table


def test_a_variant_of_a_game_has_the_same_keys():
    """The key is read from the state, not the observation: the default and ``-train``
    variants (other prompts) give the same keys for the same moves."""
    keys = {env: [(p, m) for p, _, _, m in random_play(GameSpec(env), 5, seed=2)]
            for env in ("TicTacToe-v0", "TicTacToe-v0-train")}
    assert keys["TicTacToe-v0"] == keys["TicTacToe-v0-train"]


def test_a_game_without_a_key_is_null_and_ones_own_function_gives_it_one():
    spec = GameSpec("GuessTheNumber-v0-train", num_players=1)
    assert {p for p, *_ in random_play(spec, 2)} == {None}
    own = GameSpec("GuessTheNumber-v0-train", num_players=1,
                   position="own_components:guesses_so_far")
    keys = [p for p, *_ in random_play(own, 1)]
    assert keys[0] == "" and all(k.count(",") == i - 1 for i, k in enumerate(keys) if i)
    # One's own replaces a built-in key too.
    mine = GameSpec("TicTacToe-v0-train", position="own_components:tictactoe_cells")
    assert Game(mine, 1, "g").position == "---------"
    with pytest.raises(UbError, match="position function 'own_components:nope': own_components"):
        GameSpec.from_dict({"env_id": "TicTacToe-v0-train", "position": "own_components:nope"})


def test_the_steps_shard_holds_each_decisions_position(rollout):
    """``steps.position`` is the key of the position the row's seat moved in: the first move
    of every game is the empty board, and each later key is the board the earlier moves left."""
    rows = rollout.steps.to_pylist()
    for row in rows:
        board = ["."] * 9
        for earlier in rows:
            if earlier["game_id"] == row["game_id"] and earlier["turn"] < row["turn"]:
                board[int(earlier["action"].strip("[]"))] = "X" if earlier["seat"] == 1 else "O"
        cells = "".join(board)
        mark = "X" if row["seat"] == 1 else "O"
        assert row["position"] == f"{cells[:3]}/{cells[3:6]}/{cells[6:]} {mark}", row["game_id"]


def test_scripted_and_model_seats_alike_record_positions():
    """A rollout records the position of every seat's decisions, whoever sits there."""
    actors = [parse_actor("random"), parse_actor("expert")]
    played = play_games(assign_games(GameSpec("Nim-v0-train"), actors, 4, base_seed=1),
                        run="run", base_seed=1)
    assert played.steps["position"].null_count == 0
    assert {p.rsplit(" ", 1)[1] for p in played.steps["position"].to_pylist()} == {"p0", "p1"}
