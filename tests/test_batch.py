"""Batch assembly: DuckDB vs a plain-Python reference on real shards, tensors, errors."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from batch_reference import reference_rows
from pydantic import ValidationError

from ub.actors.spec import parse_actor
from ub.batch import (
    BatchConfig,
    assemble_batch,
    batch_sql,
    collate,
    explain,
)
from ub.data.schema import GAMES_SCHEMA, STEPS_SCHEMA
from ub.data.shards import (
    ShardId,
    provenance,
    shard_path,
    write_parquet_atomic,
    write_shard,
)
from ub.data.sql import query
from ub.errors import UbError
from ub.games.specs import GameSpec
from ub.rollout import assign_games, play_games

ENVS = ("TicTacToe-v0-train", "Nim-v0-train")


def modelize(steps: pa.Table, games: pa.Table, checkpoint: str, model_seats: set[int],
             rng: np.random.Generator, error_games: int = 0,
             real_prompts: bool = False) -> tuple[pa.Table, pa.Table]:
    """Turn random-player rows into model rows: token ids of realistic lengths, logprobs.

    Seats in ``model_seats`` become the model (actor ``model``); the first ``error_games``
    games are marked errored (rewards NULL), as a crashed env would leave them. With
    ``real_prompts`` the prompt tokens are the observation's bytes, so a position that recurs
    (every game's first one, at least) has the same prompt tokens, as in a real run.
    """
    game_rows = games.to_pylist()
    errored = {g["game_id"] for g in game_rows[:error_games]}
    for g in game_rows:
        g["actors"] = ["model" if s in model_seats else a for s, a in enumerate(g["actors"])]
        if g["game_id"] in errored:
            g.update(rewards=None, results=None, outcome="error", winner=None, error="boom")
    rows = steps.to_pylist()
    for r in rows:
        if r["game_id"] in errored:
            r["env_reward"] = None
        if r["seat"] not in model_seats:
            continue
        n_prompt, n_completion = int(rng.integers(100, 301)), int(rng.integers(2, 31))
        r.update(
            actor="model", actor_kind="model", checkpoint=checkpoint, template="qwen3",
            prompt_token_ids=rng.integers(1, 4096, n_prompt).tolist(),
            completion_token_ids=rng.integers(1, 4096, n_completion).tolist(),
            completion_logprobs=(-rng.exponential(0.5, n_completion)).tolist(),
            num_prompt_tokens=n_prompt, num_completion_tokens=n_completion,
            format_ok=bool(rng.random() < 0.8), finish_reason="stop",
        )
        if real_prompts:
            prompt = list(r["observation"].encode())
            r.update(prompt_token_ids=prompt, num_prompt_tokens=len(prompt))
    return (pa.Table.from_pylist(rows, schema=STEPS_SCHEMA),
            pa.Table.from_pylist(game_rows, schema=GAMES_SCHEMA))


def write_round(root, round_: int, model: bool = True, error_games: int = 0,
                real_prompts: bool = False) -> None:
    """Two shards: TicTacToe self-play and Nim model (seat 0) vs random."""
    for shard, env in enumerate(ENVS):
        first = shard * 1000
        rollout = play_games(
            assign_games(GameSpec(env), [parse_actor("random")] * 2, 16, base_seed=round_,
                         round_=round_, first_index=first),
            run="t", round_=round_, shard=shard, base_seed=round_)
        steps, games = rollout.steps, rollout.games
        if model:
            seats = {0, 1} if shard == 0 else {0}
            steps, games = modelize(steps, games, f"ckpt-{round_:06d}", seats,
                                    np.random.default_rng([round_, shard]),
                                    error_games if shard == 0 else 0, real_prompts)
        write_shard(root, ShardId(round_, shard), "t", steps, games)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("data")
    for round_ in range(3):
        write_round(path, round_, error_games=2)
    return path


def assert_same(batch, reference):
    got = batch.rows.to_pylist()
    assert [(r["game_id"], r["turn"]) for r in got] == [
        (r["game_id"], r["turn"]) for r in reference]
    for g, r in zip(got, reference, strict=True):
        for key in ("raw_reward", "final_reward", "reward", "advantage"):
            assert g[key] == pytest.approx(r[key], abs=1e-6), key
        assert (g["env_id"], g["seat"], g["round"]) == (r["env_id"], r["seat"], r["round"])
    assert batch.advantages.tolist() == pytest.approx([r["advantage"] for r in reference],
                                                      abs=1e-6)
    for i, r in enumerate(reference):  # the tensors hold exactly the reference's tokens
        n = int(batch.lengths[i])
        assert batch.input_ids[i, :n].tolist() == (
            r["prompt_token_ids"] + r["completion_token_ids"])[:n]


CONFIGS = {
    "defaults": BatchConfig(batch_size=64, seed=1),
    "shaped-window-filtered": BatchConfig(
        batch_size=40, seed=7, first_round=1, last_round=2,
        checkpoints=["ckpt-000002", "ckpt-000001"], final=["win_draw_loss"],
        step=[{"name": "format_reward", "bonus": 0.5}, {"name": "discount", "gamma": 0.8},
              {"name": "invalid_move_penalty", "penalty": -1.0}],
        sampling=[{"name": "normalize", "scale": False}], drop_zero_reward=True),
    "drop-draws-two-normalizations": BatchConfig(
        batch_size=50, seed=3, final=["win_draw_loss"], drop_zero_reward=True,
        sampling=["normalize_per_env", "normalize"], actors=["model"]),
    "pool-smaller-than-batch": BatchConfig(batch_size=100_000, seed=2, first_round=2,
                                           last_round=2),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_batch_equals_python_reference(root, name):
    config = CONFIGS[name]
    batch = assemble_batch(root, config)
    reference = reference_rows(root, config)
    assert len(batch) == len(reference) > 0
    assert_same(batch, reference)
    if name == "drop-draws-two-normalizations":
        assert all(abs(r["reward"]) > 0 for r in reference)
    if name == "pool-smaller-than-batch":
        assert batch.stats.size < batch.stats.requested
        assert {r["round"] for r in reference} == {2}


@pytest.fixture(scope="module")
def recurring_root(tmp_path_factory):
    path = tmp_path_factory.mktemp("recurring")
    for round_ in range(2):
        write_round(path, round_, real_prompts=True)
    return path


def test_state_baseline_compares_decisions_taken_in_the_same_position(recurring_root):
    """Each decision's advantage is its reward less the mean reward of the batch's other
    decisions with the same prompt tokens; a position seen once keeps its reward."""
    config = BatchConfig(batch_size=10_000, seed=4, sampling=["state_baseline"])
    rows = assemble_batch(recurring_root, config).rows.to_pylist()
    reference = reference_rows(recurring_root, config)
    assert [(r["game_id"], r["turn"]) for r in rows] == [
        (r["game_id"], r["turn"]) for r in reference]
    assert [r["advantage"] for r in rows] == pytest.approx(
        [r["advantage"] for r in reference], abs=1e-9)
    states: dict[tuple[int, ...], list[dict]] = {}
    for row in reference:
        states.setdefault(tuple(row["prompt_token_ids"]), []).append(row)
    assert sum(len(group) > 1 for group in states.values()) >= 3  # (every game opens alike)
    for group in states.values():
        for row in group:
            others = [r["reward"] for r in group if r is not row]
            expected = row["reward"] - sum(others) / len(others) if others else row["reward"]
            assert row["advantage"] == pytest.approx(expected, abs=1e-9)
    # Before normalize_per_env, as a config would list it: the same as the Python reference.
    config = BatchConfig(batch_size=60, seed=5, sampling=["state_baseline", "normalize_per_env"])
    assert_same(assemble_batch(recurring_root, config), reference_rows(recurring_root, config))


def test_position_advantage_compares_decisions_taken_in_the_same_position(recurring_root):
    """GiGPO's step term on real games (TicTacToe and Nim, both keyed): each decision's
    advantage is its env's normalized reward plus its reward's standing among the batch's
    decisions of the same env and position; DuckDB equals the Python reference, and the
    preset's order of transforms too."""
    config = BatchConfig(batch_size=10_000, seed=4, final=["win_draw_loss"],
                         step=[{"name": "discount", "gamma": 0.5}],
                         sampling=["normalize_per_env", "position_advantage"])
    batch = assemble_batch(recurring_root, config)
    assert_same(batch, reference_rows(recurring_root, config))
    rows = batch.rows.to_pylist()
    episode = {(r["game_id"], r["turn"]): r["advantage"] for r in assemble_batch(
        recurring_root, config.replace(sampling=["normalize_per_env"])).rows.to_pylist()}
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        assert row["position"] is not None
        groups.setdefault((row["env_id"], row["position"]), []).append(row)
    shared = [g for g in groups.values() if len(g) > 1]
    assert {g[0]["env_id"] for g in shared} == set(ENVS)
    for group in groups.values():
        rewards = np.array([r["reward"] for r in group])
        std = rewards.std()
        for row in group:
            step = (row["reward"] - rewards.mean()) / std if len(group) > 1 and std > 1e-6 else 0
            assert row["advantage"] == pytest.approx(
                episode[(row["game_id"], row["turn"])] + step, abs=1e-9)
    # As the preset lists it: between the normalization and the invalid-move cap.
    config = config.replace(batch_size=70, sampling=[
        "normalize_per_env", {"name": "position_advantage", "weight": 0.5},
        {"name": "state_baseline", "key": "position"}, "invalid_move_advantage"])
    assert_same(assemble_batch(recurring_root, config), reference_rows(recurring_root, config))
    # Position keys are a scalar column: phase 1 reads no token lists for them.
    assert "prompt_token_ids" not in batch_sql(recurring_root, config)


def test_discount_gives_a_seats_last_move_the_whole_reward(root):
    """Each earlier move of the seat gets a factor gamma less, counted in its own moves only."""
    config = BatchConfig(batch_size=100_000, seed=1, final=["win_draw_loss"],
                         step=[{"name": "discount", "gamma": 0.5}], sampling=[])
    by_seat: dict[tuple[str, int], list[dict]] = {}
    for row in assemble_batch(root, config).rows.to_pylist():
        by_seat.setdefault((row["game_id"], row["seat"]), []).append(row)
    two_seated = 0
    for rows in by_seat.values():
        rows.sort(key=lambda r: r["turn"])
        assert [r["reward"] for r in rows] == pytest.approx(
            [rows[0]["final_reward"] * 0.5 ** k for k in reversed(range(len(rows)))])
        two_seated += rows[0]["env_id"] == ENVS[0]  # TicTacToe: both seats are the model
    assert two_seated > 10 and any(len(rows) > 2 for rows in by_seat.values())


@pytest.fixture(scope="module")
def sloppy_root(tmp_path_factory):
    """Real games whose model decisions are marked invalid at random (a third of them), in won,
    drawn and lost games alike, as a model that retried its way to a win would leave them."""
    path = tmp_path_factory.mktemp("sloppy")
    rng = np.random.default_rng(11)
    for round_ in range(2):
        write_round(path, round_)
        for shard in range(len(ENVS)):
            file = shard_path(path, "steps", ShardId(round_, shard))
            steps = pq.read_table(file)
            flip = (rng.random(steps.num_rows) < 0.33) & (
                steps["actor_kind"].to_numpy(zero_copy_only=False) == "model")
            steps = steps.set_column(steps.schema.get_field_index("invalid_move"), "invalid_move",
                                     pa.array(flip))
            write_parquet_atomic(steps, file)
    return path


@pytest.mark.parametrize("step", [
    [{"name": "invalid_move_penalty", "penalty": -1.0}],
    [{"name": "format_reward", "bonus": 0.5}, {"name": "invalid_move_penalty", "penalty": 0.0}],
    [{"name": "discount", "gamma": 0.5}, {"name": "invalid_move_penalty", "penalty": -1.0}],
])
@pytest.mark.parametrize("sampling", [["normalize_per_env"], ["normalize"], []])
def test_an_invalid_move_never_scores_above_a_valid_move_of_its_game(sloppy_root, step,
                                                                     sampling):
    config = BatchConfig(batch_size=100_000, seed=1, step=step, sampling=sampling,
                         final=["win_draw_loss", {"name": "role_advantage", "ema": 0.9}])
    rows = assemble_batch(sloppy_root, config).rows.to_pylist()
    by_game: dict[str, list[dict]] = {}
    for row in rows:
        by_game.setdefault(row["game_id"], []).append(row)
    compared = 0
    for game_rows in by_game.values():
        invalid = [r["advantage"] for r in game_rows if r["invalid_move"]]
        valid = [r["advantage"] for r in game_rows if not r["invalid_move"]]
        if invalid and valid:
            assert max(invalid) <= min(valid) + 1e-12
            compared += 1
    assert compared > 10
    assert any(r["invalid_move"] and r["final_reward"] > 0 for r in rows)  # won games covered


def test_invalid_move_penalty_must_come_last():
    with pytest.raises(UbError, match=r"^batch: step transforms .*: list invalid_move_penalty "
                                      "last"):
        BatchConfig.from_dict({"step": ["invalid_move_penalty", "format_reward"]})


def test_batch_is_a_pure_function_of_seed_and_data(root):
    a = assemble_batch(root, BatchConfig(batch_size=30, seed=5))
    b = assemble_batch(root, BatchConfig(batch_size=30, seed=5))
    c = assemble_batch(root, BatchConfig(batch_size=30, seed=6))
    assert a.rows.equals(b.rows) and torch.equal(a.input_ids, b.input_ids)
    assert a.rows["game_id"].to_pylist() != c.rows["game_id"].to_pylist()
    assert a.final_state == b.final_state


def test_one_config_builds_its_transforms_once_and_its_batches_alike(root):
    """A config's transforms are built once and reused by every batch it makes; the final
    stage folds copies, so role_advantage's baselines do not carry from one batch to the next."""
    config = BatchConfig(batch_size=30, seed=5)
    first, second = assemble_batch(root, config), assemble_batch(root, config)
    assert first.rows.equals(second.rows) and first.final_state == second.final_state
    assert config.transforms is config.transforms
    (role_advantage,) = [t for t in config.transforms.final if t.name == "role_advantage"]
    assert role_advantage.state_dict()["baselines"] == {}


def test_errored_games_and_scripted_seats_are_not_sampled(root):
    batch = assemble_batch(root, BatchConfig(batch_size=100_000))
    rows = batch.rows.to_pylist()
    errored = {r["game_id"] for r in query(
        root, "SELECT game_id FROM games WHERE outcome = 'error'").to_pylist()}
    assert errored and not errored & {r["game_id"] for r in rows}
    assert {r["actor"] for r in rows} == {"model"}
    assert not any(r["env_id"] == "Nim-v0-train" and r["seat"] == 1 for r in rows)


def test_persisted_state_equals_replay(root):
    config = BatchConfig(batch_size=32, seed=4, first_round=2, last_round=2)
    replay = assemble_batch(root, config)
    earlier = assemble_batch(root, BatchConfig(batch_size=8, first_round=0, last_round=1))
    saved = earlier.final_state_by_round[1]
    resumed = assemble_batch(root, config, final_rewards_state=saved)
    assert resumed.rows.equals(replay.rows)
    assert resumed.final_state == replay.final_state
    assert_same(resumed, reference_rows(root, config, saved))
    with pytest.raises(UbError, match=r"already includes games of round 2.*saved after round 1"):
        assemble_batch(root, config, final_rewards_state=replay.final_state)


def test_stats(root):
    batch = assemble_batch(root, BatchConfig(batch_size=48, seed=9, max_train_len=150))
    s = batch.stats
    assert s.size == 48 == sum(s.per_env.values())
    assert s.total_tokens == int(batch.attention_mask.sum()) == s.prompt_tokens + (
        s.completion_tokens)
    assert s.completion_tokens == int(batch.completion_mask.sum())
    raw = batch.rows["num_prompt_tokens"].to_numpy() + batch.rows[
        "num_completion_tokens"].to_numpy()
    assert s.truncated == int((raw > 150).sum()) > 0
    assert s.truncated_tokens == int(np.maximum(raw - 150, 0).sum())
    assert s.max_len == 150 == batch.input_ids.shape[1]
    assert s.advantage_mean == pytest.approx(0.0, abs=1e-9)
    assert s.window == (0, 2) and s.shards == 6
    assert set(s.to_dict()) >= {"size", "reward_mean", "advantage_std", "per_env"}


def test_sql_is_inspectable(root):
    config = BatchConfig(batch_size=16, first_round=1, last_round=1,
                         step=[{"name": "format_reward", "bonus": 0.5}])
    batch = assemble_batch(root, config)
    assert batch.sql == batch_sql(root, config)
    assert "round-000001" in batch.sql and "round-000000" not in batch.sql
    assert "format_ok" in batch.sql and "LIMIT 16" in batch.sql
    text = explain(root, config)
    assert batch.sql in text and "phase 2" in text


# ---------------------------------------------------------------------------------- tensors


def rows(prompts, completions, logprobs=None):
    logprobs = logprobs or [[-0.5 - i for i in range(len(c))] for c in completions]
    return pa.table({
        "prompt_token_ids": pa.array(prompts, pa.list_(pa.int32())),
        "completion_token_ids": pa.array(completions, pa.list_(pa.int32())),
        "completion_logprobs": pa.array(logprobs, pa.list_(pa.float32())),
    })


def test_collate_pads_and_masks():
    out = collate(rows([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]]), pad_token_id=0)
    assert out.input_ids.tolist() == [[1, 2, 3, 5, 6], [4, 7, 8, 9, 0]]
    assert out.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert out.completion_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0]]
    assert out.behaviour_logprobs.tolist() == [[0, 0, 0, -0.5, -1.5], [0, -0.5, -1.5, -2.5, 0]]
    assert out.lengths.tolist() == [5, 4]
    assert (out.input_ids.dtype, out.attention_mask.dtype, out.completion_mask.dtype) == (
        torch.int64, torch.int64, torch.float32)
    assert (out.prompt_tokens, out.completion_tokens, out.truncated) == (4, 5, 0)


def test_collate_keeps_the_first_max_train_len_tokens():
    out = collate(rows([[1, 2, 3], [4], [1, 2, 3, 4, 5]], [[5, 6], [7, 8], [9]]),
                  pad_token_id=-1, max_train_len=4)
    assert out.input_ids.tolist() == [[1, 2, 3, 5], [4, 7, 8, -1], [1, 2, 3, 4]]
    assert out.completion_mask.tolist() == [[0, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]]
    assert out.behaviour_logprobs[0].tolist() == [0, 0, 0, -0.5]
    assert out.lengths.tolist() == [4, 3, 4]
    assert (out.truncated, out.truncated_tokens, out.truncated_no_completion) == (2, 3, 1)
    assert (out.prompt_tokens, out.completion_tokens) == (8, 3)


def test_collate_refuses_inconsistent_rows():
    with pytest.raises(UbError, match="2 completion tokens but 1 logprobs"):
        collate(rows([[1]], [[2, 3]], [[-0.1]]))
    bad = rows([[1]], [[2]]).set_column(0, "prompt_token_ids",
                                         pa.array([None], pa.list_(pa.int32())))
    with pytest.raises(UbError, match="without prompt_token_ids"):
        collate(bad)


# ---------------------------------------------------------------------------------- errors


def test_empty_root(tmp_path):
    with pytest.raises(UbError, match="no committed shards under"):
        assemble_batch(tmp_path, BatchConfig())
    with pytest.raises(UbError, match="is not a directory"):
        assemble_batch(tmp_path / "missing", BatchConfig())


def test_window_without_rounds(root):
    with pytest.raises(UbError, match=r"no committed shards in rounds \[5, 6\].*are 0-2"):
        assemble_batch(root, BatchConfig(first_round=5, last_round=6))


def test_no_model_decisions(tmp_path):
    write_round(tmp_path, 0, model=False)
    with pytest.raises(UbError, match=r"no model decisions.*all by scripted players"):
        assemble_batch(tmp_path, BatchConfig())


def test_filter_matches_nothing(root):
    with pytest.raises(UbError, match=r"no model decisions match .*checkpoints=\['ckpt-9'\].*"
                                      r"found .*model @ ckpt-000000"):
        assemble_batch(root, BatchConfig(checkpoints=["ckpt-9"]))


def test_all_games_errored(tmp_path):
    write_round(tmp_path, 0, error_games=16)  # every TicTacToe game errored; Nim's are fine
    batch = assemble_batch(tmp_path, BatchConfig())
    assert set(batch.rows["env_id"].to_pylist()) == {"Nim-v0-train"}
    for table in ("steps", "games"):  # without the Nim shard, only errored games remain
        shard_path(tmp_path, table, ShardId(0, 1)).unlink()
    with pytest.raises(UbError, match="come from errored games"):
        assemble_batch(tmp_path, BatchConfig())


def test_everything_dropped_as_zero_reward(root):
    zero = [{"name": "win_draw_loss", "win": 0.0, "draw": 0.0, "loss": 0.0}]
    with pytest.raises(UbError, match="zero reward after the final and step stages"):
        assemble_batch(root, BatchConfig(final=zero, drop_zero_reward=True))
    assert len(assemble_batch(root, BatchConfig(final=zero, batch_size=8))) == 8


def test_the_old_name_of_drop_zero_reward_is_still_read(caplog):
    with caplog.at_level("WARNING", logger="ub.config"):
        config = BatchConfig.from_dict({"drop_zero_advantage": True})
    assert config.drop_zero_reward is True
    assert "batch.drop_zero_advantage is deprecated, read as batch.drop_zero_reward" in caplog.text
    with pytest.raises(UbError, match="give only drop_zero_reward"):
        BatchConfig.from_dict({"drop_zero_advantage": True, "drop_zero_reward": True})


def test_bad_shards_are_named(tmp_path):
    write_round(tmp_path, 0)
    path = shard_path(tmp_path, "steps", ShardId(0, 1))
    steps = pq.read_table(path).replace_schema_metadata(None)
    write_parquet_atomic(steps.drop_columns(["completion_logprobs"]), path,
                         provenance("t", "steps", ShardId(0, 1)))
    with pytest.raises(UbError, match=f"{path} is missing columns completion_logprobs"):
        assemble_batch(tmp_path, BatchConfig())
    meta = provenance("t", "steps", ShardId(0, 1))
    meta["schema_version"] = 99
    write_parquet_atomic(steps, path, meta)
    with pytest.raises(UbError, match=f"{path} has schema version 99"):
        assemble_batch(tmp_path, BatchConfig())


@pytest.mark.parametrize(("data", "message"), [
    ({"batch_size": 0}, "batch.batch_size: Input should be greater than or equal to 1 (got 0)"),
    ({"first_round": 3, "last_round": 1},
     "batch: the rounds window is empty: first_round 3 > last_round 1"),
    ({"first_round": -1}, "batch.first_round: Input should be greater than or equal to 0"),
    ({"last_round": -2}, "batch.last_round: Input should be greater than or equal to 0"),
    ({"max_train_len": 0}, "batch.max_train_len: Input should be greater than or equal to 1"),
    ({"actors": []}, "batch.actors: List should have at least 1 item"),
    ({"checkpoints": "ckpt-000001"}, "batch.checkpoints: Input should be a valid list"),
    ({"pad_token_id": -1}, "batch.pad_token_id: Input should be greater than or equal to 0"),
    ({"pad_token_id": 2**31}, "batch.pad_token_id: Input should be less than or equal to "
                              "2147483647"),
    ({"batchsize": 3}, "batch.batchsize: unknown setting"),
    ({"batch_size": True}, "batch.batch_size: Input should be a valid integer"),  # strictly
    ({"sampling": ["zscore"]}, "batch: unknown sampling reward transform 'zscore'"),
    ({"step": [{"name": "discount", "gama": 0.5}]},
     "batch: step reward transform 'discount' has no parameter(s) gama"),
    ({"final": [{"name": "win_draw_loss", "win": float("nan")}]},
     "batch: final.0.win: expected a finite number, got nan"),
])
def test_bad_config_is_refused_when_built(data, message):
    with pytest.raises(UbError) as refused:
        BatchConfig.from_dict(data)
    assert str(refused.value).startswith(message)
    with pytest.raises(ValidationError):  # built in Python: refused alike
        BatchConfig(**data)
    with pytest.raises(UbError, match=re.escape(message)):  # a copy is validated too
        BatchConfig().replace(**data)


def test_the_transforms_are_built_once_and_are_no_setting():
    config = BatchConfig(step=[{"name": "format_reward", "bonus": 0.5}])
    assert config.transforms is config.transforms
    assert [t.bonus for t in config.transforms.step] == [0.5]
    assert "transforms" not in config.to_dict() and "transforms" not in config.model_dump()
    assert BatchConfig.from_dict(config.to_dict()) == config  # built anew, still equal
    other = config.replace(step=[{"name": "format_reward", "bonus": 0.25}], seed=3)
    assert [t.bonus for t in other.transforms.step] == [0.25] and other.seed == 3
    assert [t.bonus for t in config.transforms.step] == [0.5]
