"""Evaluation: Wilson intervals, seat-balanced assignments, per-(env, opponent) summaries."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ub.actors.spec import parse_actor
from ub.evaluation import eval_assignments, summarize, wilson_interval
from ub.games.specs import GameSpec
from ub.rollout import play_games


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    (0, 10, 0.0, 0.27753),
    (5, 10, 0.23659, 0.76341),
    (10, 10, 0.72247, 1.0),
    (107, 400, 0.22648, 0.31294),
])
def test_wilson_interval_matches_known_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_wilson_interval_without_trials_is_uninformative():
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_assignments_balance_seats_and_share_positions_across_checkpoints():
    a, b = parse_actor("expert"), parse_actor("model")
    rival = parse_actor("random")
    specs = [GameSpec("TicTacToe-v0-train"), GameSpec("Nim-v0-train")]
    first = eval_assignments(a, [rival], specs, 6, seed=1)
    second = eval_assignments(b, [rival], specs, 6, seed=1)
    assert len(first) == 12
    for spec in specs:
        seats = [g.actors.index(a) for g in first if g.spec == spec]
        assert sorted(seats) == [0, 0, 0, 1, 1, 1]
    assert [g.seed for g in first] == [g.seed for g in second]


def test_summary_counts_wins_draws_losses_and_move_rates():
    expert, rival = parse_actor("expert"), parse_actor("random")
    played = play_games(eval_assignments(expert, [rival], [GameSpec("TicTacToe-v0-train")], 20,
                                         seed=3))
    [row] = summarize(played.games, played.steps, "expert")
    assert (row.env_id, row.opponent, row.games) == ("TicTacToe-v0-train", "random", 20)
    assert row.wins + row.draws + row.losses == 20 and row.losses == 0
    assert row.win_low <= row.win_rate <= row.win_high
    assert row.invalid_move_rate == 0.0 and row.format_rate == 1.0


def test_errored_games_are_counted_apart():
    games = pa.Table.from_pylist([
        {"game_id": "g1", "env_id": "E", "actors": ["me", "x"], "rewards": [1.0, -1.0],
         "outcome": "decisive"},
        {"game_id": "g2", "env_id": "E", "actors": ["x", "me"], "rewards": None,
         "outcome": "error"},
    ])
    steps = pa.Table.from_pylist([], schema=pa.schema([
        ("game_id", pa.string()), ("env_id", pa.string()), ("actor", pa.string()),
        ("invalid_move", pa.bool_()), ("format_ok", pa.bool_())]))
    [row] = summarize(games, steps, "me")
    assert (row.games, row.wins, row.errors, row.win_rate) == (2, 1, 1, 1.0)
