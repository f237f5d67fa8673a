"""The `expert` scripted player: perfect TicTacToe, winning Nim, unexploitable Kuhn poker."""

from __future__ import annotations

import itertools

import pytest

from ub.actors.spec import parse_actor
from ub.errors import UbError
from ub.games.builtin.kuhn_poker import KUHN_ALPHA, kuhn_policy
from ub.games.builtin.nim import nim_move
from ub.games.builtin.tictactoe import (
    TICTACTOE_MARKS,
    completing_cells,
    tictactoe_board,
    tictactoe_move,
    tictactoe_move_values,
)
from ub.games.specs import GameSpec
from ub.rollout import assign_games, play_games

EXPERT, RANDOM = parse_actor("expert"), parse_actor("random")


def _results(env_id: str, actors, games: int, rotate: bool = True):
    played = play_games(assign_games(GameSpec(env_id), actors, games, base_seed=11,
                                     rotate_seats=rotate))
    return played.games.to_pylist(), played.steps.to_pylist()


def test_tictactoe_expert_never_loses_to_random_in_either_seat():
    games, steps = _results("TicTacToe-v0-train", [EXPERT, RANDOM], 120)
    assert {g["outcome"] for g in games} <= {"decisive", "draw"}
    for g in games:
        seat = g["actors"].index("expert")
        assert g["outcome"] == "draw" or g["winner"] == seat, g
    assert sum(g["winner"] == g["actors"].index("expert") for g in games) >= 90
    assert not any(s["invalid_move"] for s in steps)


def test_tictactoe_expert_against_itself_always_draws():
    games, _ = _results("TicTacToe-v0-train", [EXPERT, EXPERT], 4)
    assert {g["outcome"] for g in games} == {"draw"}


def test_tictactoe_expert_takes_a_win_and_blocks_a_loss():
    assert tictactoe_move("XX.OO....", "X") == 2  # win now
    assert tictactoe_move("XX.O.....", "O") == 2  # block


def test_move_grades_name_the_lines_and_the_optimal_moves():
    """What bench/learning.py grades a model's TicTacToe moves with."""
    cells = "XX.OO...."  # X to move: 2 wins at once; O threatens 5
    assert completing_cells(cells, "X") == {2} and completing_cells(cells, "O") == {5}
    values = tictactoe_move_values(cells, "X")
    assert set(values) == {2, 5, 6, 7, 8}
    assert max(values, key=values.__getitem__) == 2 == tictactoe_move(cells, "X")
    assert values[5] < values[2]  # blocking instead of winning is not optimal


def test_the_board_graded_is_the_board_the_player_was_shown():
    """bench/learning.py and bench/line_probe.py read the board off real observations."""
    _, steps = _results("TicTacToe-v0-train", [RANDOM, RANDOM], 1, rotate=False)
    for turn, step in enumerate(steps):
        cells, me = tictactoe_board(step["observation"])
        assert me == TICTACTOE_MARKS[step["seat"]]
        expected = ["."] * 9
        for earlier in steps[:turn]:
            expected[int(earlier["action"].strip("[]"))] = TICTACTOE_MARKS[earlier["seat"]]
        assert cells == "".join(expected)
    for not_a_board in ("Current Board:\n\n pile 0: 3\n", "Welcome to Nim, Player 1!"):
        with pytest.raises(UbError, match="not a TicTacToe observation"):
            tictactoe_board(not_a_board)


def test_nim_expert_wins_every_game_it_starts_from_a_winning_position():
    # [3, 4, 5] has nim-sum 2: the first player (seat 0) wins with perfect play.
    games, steps = _results("Nim-v0-train", [EXPERT, RANDOM], 60, rotate=False)
    assert all(g["winner"] == 0 for g in games)
    assert not any(s["invalid_move"] for s in steps)


def test_nim_move_reaches_a_zero_nim_sum():
    for piles in ([3, 4, 5], [1, 2, 4], [7, 0, 2], [5, 5, 1]):
        pile, quantity = nim_move(piles)
        after = list(piles)
        after[pile] -= quantity
        assert 1 <= quantity <= piles[pile]
        assert after[0] ^ after[1] ^ after[2] == 0


# --- Kuhn poker: the expert's exact expected chips against every pure strategy ------------

CARDS = (0, 1, 2)


def _showdown(mine: int, theirs: int, stake: int) -> int:
    return stake if mine > theirs else -stake


def _ev_first(me: int, opp: int, strategy: dict) -> float:
    """The expert's expected chips acting first with card ``me``."""
    bet = kuhn_policy(me, "")["bet"]
    v_bet = 1 if strategy[(opp, "bet")] == "fold" else _showdown(me, opp, 2)
    if strategy[(opp, "check")] == "check":
        v_check = _showdown(me, opp, 1)
    else:
        call = kuhn_policy(me, "check bet")["call"]
        v_check = call * _showdown(me, opp, 2) - (1 - call)
    return bet * v_bet + (1 - bet) * v_check


def _ev_second(me: int, opp: int, strategy: dict) -> float:
    """The expert's expected chips acting second with card ``me``."""
    if strategy[(opp, "")] == "bet":
        call = kuhn_policy(me, "bet")["call"]
        return call * _showdown(me, opp, 2) - (1 - call)
    bet = kuhn_policy(me, "check")["bet"]
    v_bet = 1 if strategy[(opp, "check bet")] == "fold" else _showdown(me, opp, 2)
    return bet * v_bet + (1 - bet) * _showdown(me, opp, 1)


def _strategies(points: tuple[str, str], moves: tuple[tuple[str, str], tuple[str, str]]):
    keys = [(c, p) for p in points for c in CARDS]
    options = [moves[points.index(p)] for _, p in keys]
    for choice in itertools.product(*options):
        yield dict(zip(keys, choice, strict=True))


def _mean_ev(ev, strategy) -> float:
    deals = [(a, b) for a in CARDS for b in CARDS if a != b]
    return sum(ev(a, b, strategy) for a, b in deals) / len(deals)


def test_kuhn_expert_is_an_equilibrium_no_pure_strategy_exploits_it():
    # As the first to act the game is worth -1/18 to the expert, as second +1/18: no opposing
    # strategy (all 64 pure ones per seat, so no mixture either) does better against it.
    against_second = list(_strategies(("check", "bet"), (("check", "bet"), ("call", "fold"))))
    against_first = list(_strategies(("", "check bet"), (("check", "bet"), ("call", "fold"))))
    worst_first = min(_mean_ev(_ev_first, s) for s in against_second)
    worst_second = min(_mean_ev(_ev_second, s) for s in against_first)
    assert worst_first == pytest.approx(-1 / 18, abs=1e-12)
    assert worst_second == pytest.approx(1 / 18, abs=1e-12)
    assert KUHN_ALPHA <= 1 / 3


def test_kuhn_expert_plays_real_games_legally():
    games, steps = _results("KuhnPoker-v0-train", [EXPERT, RANDOM], 60)
    assert {g["outcome"] for g in games} <= {"decisive", "draw"}
    assert not any(s["invalid_move"] for s in steps)


def test_expert_refuses_games_it_cannot_play(tmp_path, capsys):
    from ub.flows.cli import main
    from ub.run.config.load import validate_config

    assert main(["play", "--env", "SimpleTak-v0-train", "--players", "expert,random",
                 "--out", str(tmp_path / "x")]) == 2
    assert "expert player cannot play SimpleTak-v0-train" in capsys.readouterr().err
    with pytest.raises(UbError, match=r"eval\.opponents: the expert player cannot play"):
        validate_config({"envs": [{"env_id": "SimpleTak-v0-train"}],
                         "eval": {"opponents": ["expert"]}})
