"""Rollouts with the real vLLM engine on the tiny model: stored tokens, replay, LoRA seats."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from ub.actors.spec import parse_actor
from ub.data.shards import ShardId, write_shard
from ub.data.sql import query
from ub.games.specs import GameSpec
from ub.rollout import assign_games, play_games

TIMINGS = ["gen_seconds", "env_seconds"]


def model_steps(rollout):
    return rollout.steps.filter(pc.equal(rollout.steps["actor_kind"], "model")).to_pylist()


def test_model_games_store_exactly_what_the_model_saw_and_said(engine, tmp_path):
    spec = GameSpec("TicTacToe-v0-train")
    games = assign_games(spec, [parse_actor("model"), parse_actor("random")], 12, base_seed=1)
    rollout = play_games(games, engine=engine, run="t", base_seed=1)
    write_shard(tmp_path, ShardId(0, 0), "t", rollout.steps, rollout.games)

    counts = query(tmp_path, "SELECT (SELECT count(*) FROM games) AS g, "
                             "(SELECT sum(num_turns) FROM games) AS turns, "
                             "(SELECT count(*) FROM steps) AS s").to_pylist()[0]
    assert counts == {"g": 12, "turns": counts["s"], "s": rollout.steps.num_rows}
    tok = engine.tokenizer
    rows = model_steps(rollout)
    assert rows, "the model played no move"
    for row in rows:
        assert row["prompt_token_ids"] == tok.encode(row["prompt"])
        text = tok.decode(row["completion_token_ids"], skip_special_tokens=True)
        assert text == row["completion"]
        assert len(row["completion_logprobs"]) == len(row["completion_token_ids"])
        assert all(lp <= 0 for lp in row["completion_logprobs"])
        assert row["finish_reason"] in ("stop", "length")
        assert row["checkpoint"] == "base" and row["template"] == "plain"
    # the tiny model was pre-trained on the format: most of its moves parse and are legal
    assert sum(r["format_ok"] for r in rows) / len(rows) > 0.6


def test_same_seed_replays_the_same_model_games(engine):
    spec = GameSpec("KuhnPoker-v0-train")
    games = assign_games(spec, [parse_actor("model"), parse_actor("random")], 8, base_seed=5)
    a = play_games(games, engine=engine, base_seed=5, concurrency=8)
    b = play_games(games, engine=engine, base_seed=5, concurrency=3)  # other batch mix
    # The same moves from the same seeds; only the log-probs of the sampled tokens may differ
    # in their last bits, as a batch of another size sums in another order.
    exact = [*TIMINGS, "completion_logprobs"]
    assert a.steps.drop_columns(exact).equals(b.steps.drop_columns(exact))
    for x, y in zip(a.steps["completion_logprobs"].to_pylist(),
                    b.steps["completion_logprobs"].to_pylist(), strict=True):
        assert (x is None) == (y is None)
        assert x is None or x == pytest.approx(y, abs=1e-4)
    c = play_games(games, engine=engine, base_seed=6)
    assert [r["completion_token_ids"] for r in model_steps(a)] != [
        r["completion_token_ids"] for r in model_steps(c)
    ]


def test_lora_seats_mix_in_one_batch_and_change_the_play(engine, tiny_adapters):
    first, second = (parse_actor(f"model:{p}") for p in tiny_adapters)
    spec = GameSpec("TicTacToe-v0-train")
    base = play_games(assign_games(spec, [parse_actor("model"), parse_actor("model")], 8,
                                   base_seed=2), engine=engine, base_seed=2)
    mixed = play_games(assign_games(spec, [first, second], 8, base_seed=2), engine=engine,
                       base_seed=2)
    rows = model_steps(mixed)
    assert {r["checkpoint"] for r in rows} == {"adapter-1", "adapter-2"}
    # same games and seeds: any difference comes from the adapters (logprobs move even where a
    # confident model still samples the same token)
    assert [r["completion_logprobs"] for r in rows] != [
        r["completion_logprobs"] for r in model_steps(base)
    ]
    # the hot-swapped second adapter yields different play than the first on the same games
    only_first = play_games(assign_games(spec, [first, first], 8, base_seed=2), engine=engine,
                            base_seed=2)
    assert [r["completion_logprobs"] for r in model_steps(only_first)] != [
        r["completion_logprobs"] for r in rows
    ]
