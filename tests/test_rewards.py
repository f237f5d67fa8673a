"""Reward transforms: hand-computed values, state save/restore, SQL forms in DuckDB."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import ClassVar

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from ub.actors.spec import parse_actor
from ub.data.schema import GAMES_SCHEMA
from ub.errors import UbError
from ub.games.specs import GameSpec
from ub.rewards import (
    REGISTRY,
    FinalRewardChain,
    FinalTransform,
    GameView,
    StepTransform,
    apply_final_transforms,
    build_transforms,
    register,
    seat_rows,
    sort_games,
    step_reward_sql,
)
from ub.rollout import assign_games, play_games


def game(round_, index, rewards, env="E", roles=("P0", "P1"), actors=("model", "model"),
         outcome=None):
    """A games row. ``rewards=None`` is an errored game."""
    results = None
    if rewards is not None:
        best = max(rewards)
        results = ["draw" if rewards.count(best) == len(rewards) else
                   "win" if r == best else "loss" for r in rewards]
    return {
        "run": "t", "round": round_, "shard": 0, "game_id": f"t-r{round_:06d}-g{index:06d}",
        "game_index": index, "env_id": env, "seed": index, "num_players": len(roles),
        "actors": list(actors), "roles": list(roles), "rewards": rewards, "results": results,
        "invalid_moves": None,
        "outcome": outcome or ("error" if rewards is None else
                               "draw" if len(set(rewards)) == 1 else "decisive"),
        "winner": None, "num_turns": 5, "reason": "", "error": None, "seconds": 0.1,
    }


def table(rows):
    return pa.Table.from_pylist(rows, schema=GAMES_SCHEMA)


def rewards_by(result, column="reward"):
    return {(r["game_id"], r["seat"]): r[column] for r in result.table.to_pylist()}


@pytest.fixture(scope="module")
def real_games():
    """Real random-vs-random games of two envs over three rounds, relabelled as self-play."""
    parts = []
    for round_ in range(3):
        for env in ("TicTacToe-v0-train", "Nim-v0-train"):
            first = 0 if env.startswith("Tic") else 100
            assignments = assign_games(GameSpec(env), [parse_actor("random")] * 2, 25,
                                       base_seed=round_, round_=round_, first_index=first)
            parts.append(play_games(assignments, run="t", round_=round_).games)
    games = pa.concat_tables(parts)
    return games.set_column(games.schema.get_field_index("actors"), "actors",
                            pa.array([["model", "model"]] * games.num_rows))


# ---------------------------------------------------------------------------------- final stage


def test_win_draw_loss_maps_results():
    games = table([game(0, 0, [1.0, -1.0]), game(0, 1, [0.0, 0.0]), game(0, 2, [-0.5, 3.0])])
    got = rewards_by(apply_final_transforms(games, ["win_draw_loss"]))
    assert got == {("t-r000000-g000000", 0): 1.0, ("t-r000000-g000000", 1): -1.0,
                   ("t-r000000-g000001", 0): 0.0, ("t-r000000-g000001", 1): 0.0,
                   ("t-r000000-g000002", 0): -1.0, ("t-r000000-g000002", 1): 1.0}
    custom = [{"name": "win_draw_loss", "win": 2.0, "draw": 0.5, "loss": -3.0}]
    got = rewards_by(apply_final_transforms(games, custom))
    assert [got[("t-r000000-g000001", 0)], got[("t-r000000-g000002", 0)]] == [0.5, -3.0]


def test_role_advantage_hand_computed():
    # ema 0.5. Baselines start at 0 and are read before the game updates them.
    games = table([game(0, 0, [1.0, -1.0]), game(0, 1, [-1.0, 1.0]), game(1, 0, [1.0, -1.0])])
    result = apply_final_transforms(games, [{"name": "role_advantage", "ema": 0.5}])
    got = [r["reward"] for r in result.table.to_pylist()]
    # game 1: 1-0, -1-0            -> b0 = 0.5,   b1 = -0.5
    # game 2: -1-0.5, 1+0.5        -> b0 = -0.25, b1 = 0.25
    # game 3: 1+0.25, -1-0.25      -> b0 = 0.375, b1 = -0.375
    assert got == [1.0, -1.0, -1.5, 1.5, 1.25, -1.25]
    assert result.state["transforms"][0]["state"]["baselines"] == {"E": {"P0": 0.375,
                                                                         "P1": -0.375}}
    assert result.state["through"] == [1, 0, "t-r000001-g000000"]
    assert result.state["games"] == 3
    assert set(result.state_by_round) == {0, 1}
    assert result.state_by_round[0]["transforms"][0]["state"]["baselines"]["E"]["P0"] == -0.25
    late = FinalRewardChain([{"name": "role_advantage", "ema": 0.5}]).fold(games, snapshot_from=1)
    assert late.table.equals(result.table) and late.state == result.state
    assert late.state_by_round == {1: result.state_by_round[1]}


def test_role_advantage_seats_sharing_a_role_read_the_baseline_before_the_game():
    games = table([game(0, 0, [1.0, -1.0], roles=("P", "P")),
                   game(0, 1, [1.0, -1.0], roles=("P", "P"))])
    spec = [{"name": "role_advantage", "ema": 0.5}]
    # game 1 reads b = 0 for both seats, then b -> 0.5 -> -0.25; game 2 reads -0.25
    got = apply_final_transforms(games, spec)
    assert got.table["reward"].to_pylist() == [1.0, -1.0, 1.25, -0.75]
    slow = build_transforms("final", spec)[0]
    ordered = seat_rows(sort_games(games))
    assert FinalTransform.apply(slow, ordered.raw_reward, ordered).tolist() == [
        1.0, -1.0, 1.25, -0.75]
    assert slow.state_dict() == got.state["transforms"][0]["state"]


def test_role_advantage_baselines_are_per_env_and_role():
    games = table([game(0, 0, [1.0, -1.0], env="A"), game(0, 1, [1.0, -1.0], env="B"),
                   game(0, 2, [1.0, -1.0], env="A", roles=("X", "Y"))])
    got = [r["reward"] for r in apply_final_transforms(
        games, [{"name": "role_advantage", "ema": 0.5}]).table.to_pylist()]
    assert got == [1.0, -1.0, 1.0, -1.0, 1.0, -1.0]  # every (env, role) seen for the first time


def test_role_advantage_after_win_draw_loss():
    games = table([game(0, 0, [5.0, -5.0]), game(0, 1, [5.0, -5.0])])
    chain = ["win_draw_loss", {"name": "role_advantage", "ema": 0.9}]
    result = apply_final_transforms(games, chain)
    rows = result.table.to_pylist()
    assert [r["raw_reward"] for r in rows] == [5.0, -5.0, 5.0, -5.0]
    assert [r["reward"] for r in rows] == pytest.approx([1.0, -1.0, 0.9, -0.9])


def test_role_advantage_only_model_seats_update_by_default():
    games = table([game(0, 0, [1.0, -1.0], actors=("model", "random")),
                   game(0, 1, [1.0, -1.0], actors=("model:/ckpt/3", "random"))])
    model_only = apply_final_transforms(games, [{"name": "role_advantage", "ema": 0.5}])
    assert [r["reward"] for r in model_only.table.to_pylist()] == [1.0, -1.0, 0.5, -1.0]
    every = apply_final_transforms(games, [{"name": "role_advantage", "ema": 0.5,
                                            "update_from": "all"}])
    assert [r["reward"] for r in every.table.to_pylist()] == [1.0, -1.0, 0.5, -0.5]


def test_role_advantage_by_opponent_keeps_a_baseline_per_opponent():
    """Losses to the perfect player are the expected result against it: they lower its own
    baseline, not the one the random player's games are judged by (issue 68)."""
    games = table([game(0, 0, [-1.0, 1.0], actors=("model", "perfect")),
                   game(0, 1, [-1.0, 1.0], actors=("model", "perfect")),
                   game(0, 2, [1.0, -1.0], actors=("ckpt-000003", "random")),
                   game(0, 3, [0.0, 0.0], actors=("model", "perfect")),
                   game(0, 4, [1.0, -1.0], actors=("model", "model"))])
    spec = [{"name": "role_advantage", "ema": 0.5, "by_opponent": True}]
    got = [r["reward"] for r in apply_final_transforms(games, spec).table.to_pylist()]
    # P0 vs perfect: b 0 -> -0.5 -> -0.75; the draw is +0.75 above it; vs random and vs a
    # model each start at 0; the model seats of game 4 read their own keys (P1 vs model too).
    assert got == [-1.0, 1.0, -0.5, 1.0, 1.0, -1.0, 0.75, 0.0, 1.0, -1.0]
    chain = FinalRewardChain(spec)
    chain.fold(games)
    baselines = chain.transforms[0].baselines["E"]
    assert baselines["P0 vs perfect"] == pytest.approx(-0.375)
    assert set(baselines) == {"P0 vs perfect", "P0 vs random", "P0 vs model", "P1 vs model"}
    # The per-game path (what a transform of one's own inherits) gives the same figures.
    transform = build_transforms("final", spec)[0]
    views = seat_rows(sort_games(games)).views()
    assert [r for v in views for r in transform.transform_game(v.raw_rewards, v)] == got


def test_errored_games_give_no_rewards_and_leave_state_unchanged():
    spec = [{"name": "role_advantage", "ema": 0.5}]
    clean = table([game(0, 0, [1.0, -1.0]), game(0, 2, [1.0, -1.0])])
    noisy = table([game(0, 0, [1.0, -1.0]), game(0, 1, None), game(0, 2, [1.0, -1.0]),
                   game(0, 3, None)])
    a, b = apply_final_transforms(clean, spec), apply_final_transforms(noisy, spec)
    assert a.table.equals(b.table)
    assert a.state["transforms"] == b.state["transforms"]
    assert b.state["through"] == [0, 3, "t-r000000-g000003"]  # the watermark still moves
    assert apply_final_transforms(table([game(0, 0, None)]), spec).table.num_rows == 0


def test_games_are_folded_in_canonical_order(real_games):
    spec = ["win_draw_loss", {"name": "role_advantage", "ema": 0.8}]
    shuffled = real_games.take(np.random.default_rng(0).permutation(real_games.num_rows))
    a = apply_final_transforms(real_games, spec)
    b = apply_final_transforms(shuffled, spec)
    assert a.table.equals(b.table)
    assert a.state == b.state
    keys = [(r["round"], r["game_index"], r["game_id"]) for r in a.table.to_pylist()]
    assert keys == sorted(keys)


def test_state_save_restore_equals_one_pass(real_games):
    spec = ["win_draw_loss", {"name": "role_advantage", "ema": 0.9}]
    ordered = sort_games(real_games)
    half = ordered.num_rows // 2 + 7  # mid-round on purpose
    whole = apply_final_transforms(ordered, spec)

    first = FinalRewardChain(spec)
    part1 = first.fold(ordered.slice(0, half))
    saved = json.dumps(first.state_dict())  # what a run persists
    restored = FinalRewardChain(spec)
    restored.load_state_dict(json.loads(saved))
    part2 = restored.fold(ordered.slice(half))

    assert pa.concat_tables([part1.table, part2.table]).equals(whole.table)  # bit-identical
    assert restored.state_dict() == whole.state
    assert json.loads(json.dumps(whole.state)) == whole.state  # plain JSON
    assert whole.state["transforms"][1]["state"]["baselines"]  # the state is not trivial
    with pytest.raises(UbError, match="already folded in"):
        restored.fold(ordered.slice(half - 1, 1))


def test_state_of_another_config_is_refused(real_games):
    state = apply_final_transforms(real_games, [{"name": "role_advantage", "ema": 0.9}]).state
    with pytest.raises(UbError, match="was saved with final transforms"):
        apply_final_transforms(real_games, [{"name": "role_advantage", "ema": 0.5}], state)
    with pytest.raises(UbError, match="format"):
        apply_final_transforms(real_games, [], {"format": 99})


def test_columnar_and_per_game_paths_agree(real_games):
    """Built-ins override ``apply``; it must equal the simple per-game ``transform_game``."""
    ordered = sort_games(real_games)
    seats = seat_rows(ordered.filter(pa.compute.not_equal(ordered["outcome"], "error")))
    for spec in (["win_draw_loss"], [{"name": "role_advantage", "ema": 0.7}],
                 [{"name": "role_advantage", "ema": 0.7, "update_from": "all"}]):
        fast, slow = build_transforms("final", spec)[0], build_transforms("final", spec)[0]
        got = fast.apply(seats.raw_reward.copy(), seats)
        want = FinalTransform.apply(slow, seats.raw_reward.copy(), seats)
        assert got.tolist() == want.tolist()
        assert fast.state_dict() == slow.state_dict()


# Every kind of actor name a run or `ub play` writes (ub.actors.names is the one definition).
PRODUCTION_ACTORS = ["ckpt-000000", "ckpt-000007", "ckpt-000123", "model", "model:/runs/x/ckpt-3",
                     "random", "expert", "hosted:gpt@http://127.0.0.1:9/v1"]


@pytest.mark.parametrize("seed", range(12))
def test_columnar_and_per_game_paths_agree_on_production_actor_names(real_games, seed):
    """The two final-stage paths give identical rewards and state on random seatings of real
    games with the actor names runs actually write (a run's seats are ``ckpt-NNNNNN``)."""
    rng = np.random.default_rng(seed)
    names = rng.choice(PRODUCTION_ACTORS, size=(real_games.num_rows, 2)).tolist()
    games = real_games.set_column(real_games.schema.get_field_index("actors"), "actors",
                                  pa.array(names, pa.list_(pa.string())))
    ordered = sort_games(games)
    seats = seat_rows(ordered.filter(pa.compute.not_equal(ordered["outcome"], "error")))
    spec = [{"name": "role_advantage", "ema": float(rng.uniform(0.5, 0.99))}]
    fast, slow = build_transforms("final", spec)[0], build_transforms("final", spec)[0]
    got = fast.apply(seats.raw_reward.copy(), seats)
    want = FinalTransform.apply(slow, seats.raw_reward.copy(), seats)
    assert got.tolist() == want.tolist()
    assert fast.state_dict() == slow.state_dict()


def test_role_advantage_learns_from_a_runs_checkpoint_seats(real_games):
    """A training run's seats are ``ckpt-NNNNNN``: their returns must move the baselines."""
    games = real_games.set_column(real_games.schema.get_field_index("actors"), "actors",
                                  pa.array([["ckpt-000003", "random"]] * real_games.num_rows))
    result = apply_final_transforms(games, [{"name": "role_advantage", "ema": 0.9}])
    counts = result.state["transforms"][0]["state"]["counts"]
    played = int(pa.compute.sum(pa.compute.not_equal(games["outcome"], "error")).as_py())
    assert sum(counts["TicTacToe-v0-train"].values()) + sum(
        counts["Nim-v0-train"].values()) == played  # one update per ckpt seat, none for random


def test_missing_roles_fall_back_to_seat_names():
    row = game(0, 0, [1.0, -1.0])
    row["roles"] = None
    got = apply_final_transforms(table([row]), ["win_draw_loss"]).table
    assert got["role"].to_pylist() == ["seat 0", "seat 1"]


# ---------------------------------------------------------------------------------- registry


def test_config_errors_are_clear():
    with pytest.raises(UbError, match=r"unknown final reward transform 'nope'.*role_advantage"):
        build_transforms("final", ["nope"])
    with pytest.raises(UbError, match=r"has no parameter.*its parameters: ema, update_from"):
        build_transforms("final", [{"name": "role_advantage", "alpha": 0.9}])
    with pytest.raises(UbError, match=r"ema must be in \[0, 1\)"):
        build_transforms("final", [{"name": "role_advantage", "ema": 1.0}])
    with pytest.raises(UbError, match="must be <= 0"):
        build_transforms("step", [{"name": "invalid_move_penalty", "penalty": 1.0}])
    with pytest.raises(UbError, match="not finite"):
        build_transforms("step", [{"name": "format_reward", "bonus": float("nan")}])
    with pytest.raises(UbError, match="must be a name or a mapping"):
        build_transforms("sampling", [3])


def test_user_transform_subclass_and_register():
    @register
    @dataclass
    class LengthPenalty(StepTransform):
        """-cost per completion token."""

        name: ClassVar[str] = "test_length_penalty"
        cost: float = 0.01

        def sql(self, reward: str) -> str:
            return f"({reward}) - {self.cost!r} * num_completion_tokens"

    @register
    @dataclass
    class Doubler(FinalTransform):
        name: ClassVar[str] = "test_doubler"

        def transform_game(self, rewards: list[float], game: GameView) -> list[float]:
            return [2 * r for r in rewards]

    try:
        (t,) = build_transforms("step", [{"name": "test_length_penalty", "cost": 0.5}])
        assert duckdb.sql(f"SELECT {t.sql('1.0')} AS r FROM (SELECT 4 AS num_completion_tokens)"
                          ).fetchall() == [(-1.0,)]
        got = apply_final_transforms(table([game(0, 0, [1.0, -1.0])]),
                                     ["win_draw_loss", "test_doubler"]).table
        assert got["reward"].to_pylist() == [2.0, -2.0]
        with pytest.raises(TypeError, match="already registered"):
            @register
            @dataclass
            class Clash(StepTransform):
                name: ClassVar[str] = "format_reward"
    finally:
        REGISTRY["step"].pop("test_length_penalty")
        REGISTRY["final"].pop("test_doubler")


# ---------------------------------------------------------------------------------- SQL stages


def test_step_transforms_in_duckdb():
    steps = pa.table({"format_ok": [True, True, False, False],
                      "invalid_move": [False, True, False, True],
                      "base": [1.0, 1.0, -1.0, 0.0],
                      "game_min_final_reward": [-1.0, -1.0, -1.0, -0.5]})
    transforms = build_transforms("step", [{"name": "format_reward", "bonus": 0.25},
                                           {"name": "invalid_move_penalty", "penalty": -2.0}])
    sql = f"SELECT {step_reward_sql(transforms, 'base')} AS r FROM steps"
    got = [r[0] for r in duckdb.connect().register("steps", steps).sql(sql).fetchall()]
    # An invalid move scores `penalty` below its game's lowest final reward, bonus or not.
    assert got == [1.25, -3.0, -1.0, -2.5]
    rows = steps.to_pylist()
    python = []
    for row in rows:
        reward = row["base"]
        for t in transforms:
            reward = t.apply_row(reward, row)
        python.append(reward)
    assert python == got


def _sampling(spec, values, envs, invalid=None, positions=None, rewards=None, groups=None):
    """``spec``'s sampling transforms, in order, in DuckDB (one query layer each, as the batch
    query runs them) and in Python; they must agree. ``rewards`` (the step stage's output, the
    ``reward`` column) default to ``values``, as the batch's first layer starts from them."""
    n = len(values)
    invalid = [False] * n if invalid is None else invalid
    positions = [None] * n if positions is None else positions
    rewards = list(values) if rewards is None else rewards
    groups = [None] * n if groups is None else groups
    columns = {"env_id": envs, "invalid_move": invalid,
               "position": pa.array(positions, pa.string()),
               "reward": pa.array(rewards, pa.float64()),
               "branch_group": pa.array(groups, pa.string())}
    con = duckdb.connect()
    con.register("t0", pa.table({"i": range(n), **columns,
                                 "advantage": pa.array(values, pa.float64())}))
    transforms = build_transforms("sampling", spec if isinstance(spec, list) else [spec])
    python = list(values)
    rows = [dict(zip(columns, row, strict=True)) for row in zip(
        envs, invalid, positions, rewards, groups, strict=True)]
    for k, t in enumerate(transforms):
        con.sql(f"CREATE TABLE t{k + 1} AS SELECT * REPLACE ({t.sql('advantage')} AS advantage) "
                f"FROM t{k}")
        python = t.apply_rows(python, rows)
    got = [r[0] for r in con.sql(f"SELECT advantage FROM t{len(transforms)} ORDER BY i"
                                 ).fetchall()]
    assert python == pytest.approx(got, abs=1e-12)
    assert all(math.isfinite(x) for x in got)
    return got


def test_normalize_hand_computed():
    got = _sampling("normalize", [1.0, 3.0, 5.0, 7.0], ["a"] * 4)
    std = math.sqrt(5.0)  # population std of 1, 3, 5, 7
    assert got == pytest.approx([-3 / std, -1 / std, 1 / std, 3 / std])
    got = _sampling({"name": "normalize", "scale": False}, [1.0, 3.0, 5.0, 7.0], ["a"] * 4)
    assert got == [-3.0, -1.0, 1.0, 3.0]


def test_normalize_per_env_handles_one_row_and_zero_variance_groups():
    values = [1.0, 3.0, 0.7, 2.0, 2.0, 2.0]
    envs = ["a", "a", "single", "flat", "flat", "flat"]
    got = _sampling("normalize_per_env", values, envs)
    assert got == pytest.approx([-1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    got = _sampling({"name": "normalize_per_env", "scale": False}, values, envs)
    assert got == pytest.approx([-1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    # whole batch of one row, and of identical values
    assert _sampling("normalize", [4.2], ["a"]) == [0.0]
    assert _sampling("normalize", [0.1] * 5, ["a"] * 5) == [0.0] * 5


def test_invalid_move_advantage_survives_the_normalization_of_a_collapsed_env():
    """A policy collapsed onto one invalid Nim move: every Nim decision is the same invalid
    move with the same reward, so normalize_per_env gives each an advantage of 0 and nothing
    pushes it away. invalid_move_advantage, after it, keeps a negative advantage on each; an
    invalid move that already scores lower, and every valid move, are left as they are."""
    values = [-2.0, -2.0, -2.0, 1.0, -1.0, -3.0]
    envs = ["nim", "nim", "nim", "ttt", "ttt", "ttt"]
    invalid = [True, True, True, False, False, True]
    normalized = _sampling("normalize_per_env", values, envs, invalid)
    assert normalized[:3] == [0.0, 0.0, 0.0]
    guarded = _sampling(["normalize_per_env", {"name": "invalid_move_advantage",
                                               "advantage": -0.5}], values, envs, invalid)
    assert guarded[:3] == [-0.5, -0.5, -0.5]
    assert guarded[3:5] == normalized[3:5] and guarded[5] == normalized[5] < -0.5


def test_invalid_move_advantage_must_be_negative():
    for bad in (0.0, 0.5):
        with pytest.raises(UbError, match=r"invalid_move_advantage advantage .* must be < 0"):
            build_transforms("sampling", [{"name": "invalid_move_advantage", "advantage": bad}])


def _step_term(rewards, envs, positions, scale=True):
    """GiGPO's step advantage by hand: each decision's reward less its position group's mean
    (over the std when ``scale``), 0 alone or without a position."""
    out = []
    for r, e, p in zip(rewards, envs, positions, strict=True):
        group = [x for x, e2, p2 in zip(rewards, envs, positions, strict=True)
                 if p is not None and (e2, p2) == (e, p)]
        if len(group) < 2:
            out.append(0.0)
            continue
        std = float(np.std(group))
        centered = r - float(np.mean(group))
        out.append(centered if not scale else centered / std if std > 1e-6 else 0.0)
    return out


def test_position_advantage_hand_computed():
    """The step term compares a decision with the others taken in its position (same env and
    key): a group of one, a NULL position and a group of equal rewards add nothing; the same
    key in another env is another group."""
    rewards = [1.0, -1.0, 0.5, 2.0, 2.0, 0.3, 0.9, 4.0]
    envs = ["nim", "nim", "nim", "nim", "nim", "ttt", "nim", "nim"]
    positions = ["a", "a", "a", "b", "b", "a", None, "c"]
    episode = [0.1, -0.2, 0.3, 0.0, 0.5, -0.1, 0.7, 1.0]
    got = _sampling({"name": "position_advantage", "weight": 0.5}, episode, envs,
                    positions=positions, rewards=rewards)
    mean, std = 0.5 / 3, math.sqrt(((1 - 0.5 / 3) ** 2 + (-1 - 0.5 / 3) ** 2 +
                                    (0.5 - 0.5 / 3) ** 2) / 3)
    step = [(r - mean) / std for r in rewards[:3]] + [0.0] * 5
    assert got == pytest.approx([e + 0.5 * s for e, s in zip(episode, step, strict=True)])
    unscaled = _sampling({"name": "position_advantage", "scale": False}, episode, envs,
                         positions=positions, rewards=rewards)
    assert unscaled == pytest.approx([e + r - mean for e, r in zip(episode[:3], rewards[:3],
                                                                   strict=True)] + episode[3:])


@pytest.mark.parametrize("seed", range(20))
def test_position_advantage_sql_python_and_hand_agree(seed):
    """Random batches (few keys, so groups of every size; NULL positions; two envs sharing
    keys; after normalize_per_env as a config lists it): DuckDB, the Python form and the hand
    computation give the same advantages."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    envs = [str(e) for e in rng.choice(["nim", "ttt"], n)]
    positions = [None if rng.random() < 0.2 else f"k{rng.integers(0, 6)}" for _ in range(n)]
    rewards = [float(x) for x in rng.choice([-3.0, -1.0, -0.5, 0.0, 0.25, 1.0], n)]
    weight = float(rng.choice([0.5, 1.0, 2.0]))
    scale = bool(rng.random() < 0.7)
    spec = ["normalize_per_env", {"name": "position_advantage", "weight": weight,
                                  "scale": scale}]
    got = _sampling(spec, rewards, envs, positions=positions)
    episode = _sampling("normalize_per_env", rewards, envs)
    step = _step_term(rewards, envs, positions, scale)
    assert got == pytest.approx([e + weight * s for e, s in zip(episode, step, strict=True)],
                                abs=1e-9)


def test_state_baseline_keyed_on_the_position():
    """``state_baseline`` with ``key: position`` subtracts the mean of the other decisions of
    the same env and position; a decision alone there or without a position keeps its value."""
    values = [1.0, -1.0, 0.5, 2.0, 0.3, 0.9]
    envs = ["nim", "nim", "nim", "nim", "ttt", "nim"]
    positions = ["a", "a", "a", "b", "a", None]
    got = _sampling({"name": "state_baseline", "key": "position"}, values, envs,
                    positions=positions)
    assert got == pytest.approx([1.0 - (-0.25), -1.0 - 0.75, 0.5 - 0.0, 2.0, 0.3, 0.9])
    with pytest.raises(UbError, match="state_baseline key must be one of prompt, position"):
        build_transforms("sampling", [{"name": "state_baseline", "key": "prompts"}])


@pytest.mark.parametrize("seed", range(20))
def test_branch_keyed_transforms_sql_python_and_hand_agree(seed):
    """``key: branch`` (rollout.branch's groups: the moves sampled from one position of one
    game) on random batches with groups of every size and decisions at no branch point:
    ``state_baseline`` subtracts the mean of the group's other moves, ``position_advantage``
    adds the move's standardized return within its group only (other decisions in the same
    position are not in it); DuckDB, Python and the hand computation agree, and a decision
    outside every group keeps its value."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 50))
    envs = [str(e) for e in rng.choice(["nim", "ttt"], n)]
    groups = [None if rng.random() < 0.3 else f"g{rng.integers(0, 5)}" for _ in range(n)]
    # (a branch point's moves share one position; other decisions may share it too)
    positions = [f"p-{g}" if g is not None else f"p-g{rng.integers(0, 5)}" for g in groups]
    values = [float(x) for x in rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0], n)]
    rewards = [float(x) for x in rng.choice([-1.0, 0.0, 1.0], n)]
    members = {}
    for i, (e, g) in enumerate(zip(envs, groups, strict=True)):
        if g is not None:
            members.setdefault((e, g), []).append(i)
    baseline, step = list(values), [0.0] * n
    for group in members.values():
        if len(group) < 2:
            continue
        mean = sum(rewards[i] for i in group) / len(group)
        std = math.sqrt(sum((rewards[i] - mean) ** 2 for i in group) / len(group))
        for i in group:
            others = [values[j] for j in group if j != i]
            baseline[i] = values[i] - sum(others) / len(others)
            step[i] = (rewards[i] - mean) / std if std > 1e-6 else 0.0
    got = _sampling({"name": "state_baseline", "key": "branch"}, values, envs,
                    positions=positions, rewards=rewards, groups=groups)
    assert got == pytest.approx(baseline, abs=1e-9)
    got = _sampling({"name": "position_advantage", "key": "branch", "weight": 0.5}, values,
                    envs, positions=positions, rewards=rewards, groups=groups)
    assert got == pytest.approx([v + 0.5 * s for v, s in zip(values, step, strict=True)],
                                abs=1e-9)
    with pytest.raises(UbError, match="position_advantage key must be one of position, branch"):
        build_transforms("sampling", [{"name": "position_advantage", "key": "prompt"}])
