"""Opponent sampling modes: each empirical distribution matches its definition."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from ub.errors import UbError
from ub.pool.ratings import RatingTable
from ub.pool.sampling import OpponentConfig, PoolView, sample_opponents, seat_players

CKPTS = tuple(f"ckpt-{i:06d}" for i in range(6))
N = 20_000


def view(ratings: RatingTable | None = None) -> PoolView:
    table = ratings or RatingTable()
    for c in CKPTS:
        table.add_checkpoint(c)
    table.add_fixed("random")
    return PoolView(current=CKPTS[-1], checkpoints=CKPTS, fixed=("random",), ratings=table)


def freqs(config, pool: PoolView, seed: int = 0) -> dict[str, float]:
    drawn = sample_opponents(OpponentConfig.from_dict(config), pool, N, seed)
    counts = Counter(o for (o,) in drawn)
    return {k: v / N for k, v in counts.items()}


def close(observed: dict[str, float], expected: dict[str, float], tol: float = 0.015) -> None:
    assert set(observed) == {k for k, v in expected.items() if v > 0}
    for key, p in expected.items():
        assert observed.get(key, 0.0) == pytest.approx(p, abs=tol), key


def test_mirror_is_always_the_current_checkpoint():
    assert freqs([{"mode": "mirror"}], view()) == {CKPTS[-1]: 1.0}


def test_lagged_is_uniform_over_the_last_k_older_checkpoints():
    close(freqs([{"mode": "lagged", "k": 3}], view()), {c: 1 / 3 for c in CKPTS[2:5]})


def test_random_is_uniform_over_checkpoints_and_fixed_opponents():
    members = [*CKPTS, "random"]
    close(freqs([{"mode": "random"}], view()), {m: 1 / len(members) for m in members})


def test_fixed_picks_only_fixed_opponents():
    assert freqs([{"mode": "fixed"}], view()) == {"random": 1.0}


def test_a_mixture_draws_modes_by_weight():
    observed = freqs([{"mode": "mirror", "weight": 0.8}, {"mode": "lagged", "k": 1,
                                                          "weight": 0.2}], view())
    close(observed, {CKPTS[-1]: 0.8, CKPTS[-2]: 0.2})


def _rated_view() -> PoolView:
    table = RatingTable()
    pool = view(table)
    # Spread the members' ratings: older checkpoints weaker, random weakest.
    for i, c in enumerate(CKPTS):
        table.members[c].mu = 20.0 + 2 * i
    table.members["random"].mu, table.members["random"].sigma = 15.0, 3.0
    table.members[CKPTS[1]].games = 50
    return pool


def _normalized(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {k: v / total for k, v in weights.items()}


def test_match_quality_weights_by_trueskill_quality():
    pool = _rated_view()
    env, me = pool.ratings.config.env(), pool.ratings.rating(CKPTS[-1])
    others = [*CKPTS[:-1], "random"]
    expected = _normalized({o: env.quality_1vs1(me, pool.ratings.rating(o)) for o in others})
    close(freqs([{"mode": "match-quality"}], pool), expected)


def test_ts_dist_weights_by_closeness_of_mu():
    pool = _rated_view()
    mu = pool.ratings.members[CKPTS[-1]].mu
    others = [*CKPTS[:-1], "random"]
    expected = _normalized({o: math.exp(-abs(pool.ratings.members[o].mu - mu) / 2.0)
                            for o in others})
    close(freqs([{"mode": "ts-dist", "scale": 2.0}], pool), expected)


def test_exploration_prefers_uncertain_and_rarely_played_members():
    pool = _rated_view()
    others = [*CKPTS[:-1], "random"]
    expected = _normalized({o: pool.ratings.members[o].sigma / (1 + pool.ratings.members[o].games)
                            for o in others})
    observed = freqs([{"mode": "exploration"}], pool)
    close(observed, expected)
    assert observed[CKPTS[1]] < observed[CKPTS[2]]  # played 50 times


def test_max_active_lora_bounds_the_checkpoints_that_can_be_drawn():
    config = {"modes": [{"mode": "random"}], "max_active_lora": 3}
    observed = freqs(config, view())
    assert set(observed) == {CKPTS[-1], CKPTS[-2], CKPTS[-3], "random"}


def test_modes_without_candidates_fall_back_to_self_play():
    first = PoolView(current=CKPTS[0], checkpoints=CKPTS[:1], fixed=(), ratings=RatingTable())
    for mode in ("lagged", "fixed", "exploration"):
        assert freqs([{"mode": mode}], first) == {CKPTS[0]: 1.0}


def test_draws_are_deterministic_for_a_seed():
    config = OpponentConfig.from_dict([{"mode": "random"}])
    assert sample_opponents(config, view(), 50, 3) == sample_opponents(config, view(), 50, 3)
    assert sample_opponents(config, view(), 50, 3) != sample_opponents(config, view(), 50, 4)


def test_seats_rotate_so_the_learner_plays_every_role():
    seats = [seat_players("me", ["a", "b"], 3, i, seed=i).index("me") for i in range(9)]
    assert Counter(seats) == {0: 3, 1: 3, 2: 3}


@pytest.mark.parametrize(("data", "message"), [
    ([{"mode": "telepathy"}], r"^opponents\.modes\.0\.mode: got 'telepathy'; input should be "
     r"'mirror', 'lagged'"),
    ([{"mode": "mirror", "weight": 0}], r"^opponents\.modes: the modes' weights must sum to a "
     r"positive number$"),
    ([{"mode": "mirror", "weight": -1}], r"^opponents\.modes\.0\.weight: Input should be "
     r"greater than or equal to 0"),
    ([{"mode": "lagged", "k": 0}], r"^opponents\.modes\.0\.k: Input should be greater than or "
     r"equal to 1 \(got 0\)$"),
    ([{"mode": "lagged", "k": True}], r"^opponents\.modes\.0\.k: Input should be a valid "
     r"integer"),
    ([{"mode": "mirror", "k": 2}], r"^opponents\.modes\.0: mode mirror has no parameter k; it "
     r"takes: weight$"),
    (["mirror", {"mode": "fixed", "k": 2}], r"^opponents\.modes\.1: mode fixed has no "
     r"parameter k; it takes: names, weight$"),
    ([{"mode": "lagged", "kk": 2}], r"^opponents\.modes\.0: mode lagged has no parameter kk; "
     r"it takes: k, weight$"),
    ([{"mode": "ts-dist", "scale": 0}], r"^opponents\.modes\.0\.scale: Input should be "
     r"greater than 0"),
    ([{"mode": "fixed", "names": ["grandmaster"]}], r"^opponents\.modes\.0\.names: unknown "
     r"actor 'grandmaster'; valid actors: model"),
    ([], r"^opponents\.modes: must be a non-empty list of modes"),
    ("mirror", r"^opponents: must be a list of modes"),
    ({"modes": [{"mode": "mirror"}], "max_active_lora": 0}, r"^opponents\.max_active_lora: "
     r"Input should be greater than or equal to 1 \(got 0\)$"),
    ({"modes": ["mirror"], "bogus": 1}, r"^opponents\.bogus: unknown setting$"),
])
def test_bad_opponent_configs(data, message):
    with pytest.raises(UbError, match=message):
        OpponentConfig.from_dict(data)
