"""TrueSkill ratings of the pool: hand-computed updates, mirror games, snapshots, leaderboard."""

from __future__ import annotations

import pytest
import trueskill

from ub.errors import UbError
from ub.pool.ratings import RatingConfig, RatingTable


def game(actors, rewards, outcome="decisive"):
    return {"actors": actors, "rewards": rewards, "outcome": outcome}


def test_a_decisive_game_equals_a_hand_computed_trueskill_update():
    config = RatingConfig(beta=3.0)
    table = RatingTable(config)
    table.add_checkpoint("ckpt-000000")
    table.add_fixed("random")
    table.rate_games([game(["random", "ckpt-000000"], [-1.0, 1.0])])

    env = trueskill.TrueSkill(mu=25.0, sigma=25 / 3, beta=3.0, tau=25 / 300,
                              draw_probability=0.1)
    (winner,), (loser,) = env.rate([(env.create_rating(),), (env.create_rating(),)],
                                   ranks=[0, 1])
    assert table.members["ckpt-000000"].mu == winner.mu
    assert table.members["ckpt-000000"].sigma == winner.sigma
    assert table.members["random"].mu == loser.mu
    assert (table.members["ckpt-000000"].wins, table.members["random"].losses) == (1, 1)
    assert table.matches["ckpt-000000"]["random"] == [1, 0, 0]


def test_a_draw_is_rated_as_a_tie():
    table = RatingTable()
    table.add_fixed("a")
    table.add_fixed("b")
    table.rate_games([game(["a", "b"], [0.0, 0.0], "draw")])
    env = RatingConfig().env()
    (a,), (b,) = env.rate([(env.create_rating(),), (env.create_rating(),)], ranks=[0, 0])
    assert table.members["a"].mu == pytest.approx(a.mu) and table.members["a"].draws == 1
    assert table.members["a"].sigma == b.sigma


def test_mirror_and_errored_games_are_counted_not_rated():
    table = RatingTable()
    table.add_checkpoint("ckpt-000000")
    before = table.members["ckpt-000000"].mu, table.members["ckpt-000000"].sigma
    table.rate_games([game(["ckpt-000000", "ckpt-000000"], [1.0, -1.0]),
                      game(["ckpt-000000", "random"], None, "error")])
    m = table.members["ckpt-000000"]
    assert (m.mu, m.sigma) == before
    assert (m.games, m.rated_games) == (2, 0)
    assert table.errored_games == 1 and table.members["random"].games == 1


def test_a_new_checkpoint_inherits_its_parents_mu_with_more_sigma():
    table = RatingTable(RatingConfig(checkpoint_sigma_boost=0.5))
    table.add_checkpoint("ckpt-000000")
    table.add_fixed("random")
    table.rate_games([game(["ckpt-000000", "random"], [1.0, -1.0])] * 5)
    parent = table.members["ckpt-000000"]
    child = table.add_checkpoint("ckpt-000001", parent="ckpt-000000")
    assert child.mu == parent.mu and child.sigma == pytest.approx(parent.sigma + 0.5)
    assert child.games == 0


def test_snapshot_round_trips_exactly_and_rating_continues_identically():
    games = [game(["ckpt-000000", "random"], [1.0, -1.0]),
             game(["random", "ckpt-000000"], [0.0, 0.0], "draw"),
             game(["random", "ckpt-000000"], [1.0, -1.0])]
    live = RatingTable()
    live.add_checkpoint("ckpt-000000")
    live.rate_games(games[:2])
    restored = RatingTable.from_snapshot(live.snapshot())
    live.rate_games(games[2:])
    restored.rate_games(games[2:])
    assert restored.snapshot() == live.snapshot()


def test_leaderboard_is_sorted_by_conservative_rating():
    table = RatingTable()
    for name in ("a", "b", "c"):
        table.add_fixed(name)
    table.rate_games([game(["a", "b"], [1.0, -1.0]), game(["a", "c"], [1.0, -1.0]),
                      game(["b", "c"], [1.0, -1.0])])
    board = table.leaderboard()
    assert [m["name"] for m in board] == ["a", "b", "c"]
    assert board[0]["conservative"] == pytest.approx(board[0]["mu"] - 3 * board[0]["sigma"])
    assert (board[0]["wins"], board[0]["losses"]) == (2, 0)


@pytest.mark.parametrize(("data", "message"), [
    ({"beta": -1}, r"^rating\.beta: Input should be greater than 0 \(got -1\)$"),
    ({"draw_probability": 1.5}, r"^rating\.draw_probability: Input should be less than 1"),
    ({"tau": -0.5}, r"^rating\.tau: Input should be greater than or equal to 0"),
    ({"mu": "high"}, r"^rating\.mu: Input should be a valid number \(got 'high'\)$"),
    ({"mu": True}, r"^rating\.mu: Input should be a valid number"),
    ({"bta": 3}, r"^rating\.bta: unknown setting; did you mean beta\?$"),
])
def test_bad_rating_settings(data, message):
    with pytest.raises(UbError, match=message):
        RatingConfig.from_dict(data)


def test_an_int_setting_is_read_as_the_float_it_means():
    # `beta: 3` in a YAML file rates exactly as `beta: 3.0` (snapshots compare bit for bit).
    config = RatingConfig.from_dict({"beta": 3, "mu": 20})
    assert config == RatingConfig(beta=3.0, mu=20.0)
    assert type(config.beta) is float and type(config.to_dict()["mu"]) is float
    table = RatingTable(config)
    table.add_checkpoint("a")
    assert RatingTable.from_snapshot(table.snapshot()).snapshot() == table.snapshot()


def test_a_snapshot_with_a_bad_config_is_refused():
    table = RatingTable()
    data = {**table.snapshot(), "config": {**table.config.to_dict(), "beta": -1.0}}
    with pytest.raises(UbError, match=r"not a rating snapshot: config\.beta: Input should be "
                                      r"greater than 0"):
        RatingTable.from_snapshot(data)
