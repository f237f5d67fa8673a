"""`ub sft`: a warm-start adapter fine-tuned on decisions picked by SQL over real shards."""

from __future__ import annotations

from pathlib import Path

import pytest

from ub.actors.spec import parse_actor
from ub.data.shards import ShardId, write_shard
from ub.errors import UbError
from ub.games.specs import GameSpec
from ub.learner import LearnerConfig
from ub.model.lora import LoraSettings
from ub.rollout import assign_games, play_games
from ub.run.processes.worker import process_worker
from ub.sft import SftConfig, select_decisions, train_sft


def config(model: Path, **overrides) -> LearnerConfig:
    settings = dict(base_model=str(model), lora=LoraSettings(rank=8, alpha=16),
                    learning_rate=5e-3, length_normalizer=12, max_grad_norm=1.0)
    return LearnerConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_model):
    """48 TicTacToe games of the tiny model against the random player, through vLLM."""
    from ub.inference.types import EngineConfig, SamplingConfig

    engine = process_worker().engine(EngineConfig(model=str(tiny_model)),
                                     SamplingConfig(temperature=1.0, max_tokens=16))
    root = tmp_path_factory.mktemp("sft-data")
    actors = [parse_actor("model"), parse_actor("random")]
    rollout = play_games(assign_games(GameSpec("TicTacToe-v0-train"), actors, 48, base_seed=3),
                         engine=engine, run="sft", base_seed=3)
    write_shard(root, ShardId(0, 0), "sft", rollout.steps, rollout.games)
    return root


def _selected_batch(root: Path, sft: SftConfig):
    import torch

    from ub.batch import Batch, collate

    rows = select_decisions(root, sft)
    t = collate(rows, 0, None)
    return Batch(t.input_ids, t.completion_mask, t.behaviour_logprobs,
                      torch.ones(rows.num_rows), t.lengths)


def _winners_valid_moves(root: Path) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """(the decisions the default selection must be, every model decision), worked out in
    Python from the shard files (not with ub's SQL): the model's well-formatted, legal moves
    by the winning seat of a decisive game."""
    import pyarrow.parquet as pq

    [steps_file] = (root / "steps").rglob("shard-*.parquet")
    [games_file] = (root / "games").rglob("shard-*.parquet")
    games = {g["game_id"]: g for g in pq.read_table(games_file).to_pylist()}
    model = [s for s in pq.read_table(steps_file).to_pylist() if s["actor_kind"] == "model"]
    chosen = {(s["game_id"], s["turn"]) for s in model
              if games[s["game_id"]]["outcome"] == "decisive"
              and s["seat"] == games[s["game_id"]]["winner"]
              and s["format_ok"] and not s["invalid_move"]}
    return chosen, {(s["game_id"], s["turn"]) for s in model}


def test_sft_raises_the_likelihood_of_the_winners_moves(shards, tiny_model, tmp_path, engine):
    sft = SftConfig(epochs=2, batch_size=16)
    # The default selection is the winners' legal moves, and only those: the games hold others
    # (the losers', invalid and badly formatted ones), which it leaves out.
    winners, every = _winners_valid_moves(shards)
    assert winners and winners < every
    selected = select_decisions(shards, sft)
    assert set(zip(selected["game_id"].to_pylist(), selected["turn"].to_pylist(),
                   strict=True)) == winners
    batch = _selected_batch(shards, sft)
    learner = process_worker().learner(config(tiny_model, algorithm="sft"))
    learner.start(None)
    before = (learner.token_logprobs(batch) * batch.completion_mask).sum() / \
        batch.completion_mask.sum()

    summary = train_sft(shards, sft, config(tiny_model), tmp_path / "warm", worker=process_worker())
    after = (learner.token_logprobs(batch) * batch.completion_mask).sum() / \
        batch.completion_mask.sum()
    assert summary["decisions"] == len(winners) and summary["steps"] == 2 * -(-len(batch) // 16)
    assert float(after) > float(before) + 0.01

    # An ordinary checkpoint: vLLM serves it as a LoRA adapter.
    from ub.inference.types import GenerationRequest

    [out] = engine.generate([GenerationRequest("w", batch.input_ids[0, :5].tolist(), 1,
                                               str(tmp_path / "warm"))])
    assert out.completion_token_ids


def test_same_seed_same_adapter_and_learn_continues_from_it(shards, tiny_model, tmp_path):
    from ub.batch import BatchConfig
    from ub.learner import learn_step

    sft = SftConfig(batch_size=32, seed=4)
    train_sft(shards, sft, config(tiny_model), tmp_path / "a", worker=process_worker())
    train_sft(shards, sft, config(tiny_model), tmp_path / "b", worker=process_worker())
    weights = "adapter_model.safetensors"
    assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()
    metrics = learn_step(shards, BatchConfig(batch_size=32), config(tiny_model),
                         tmp_path / "a", tmp_path / "rl", worker=process_worker())
    assert metrics["update"] > 0 and (tmp_path / "rl" / weights).exists()


def test_an_empty_selection_or_bad_sql_is_a_clear_error_and_writes_nothing(
        shards, tiny_model, tmp_path):
    with pytest.raises(UbError, match=r"selection .* is empty: no model decision matches"):
        train_sft(shards, SftConfig(where="s.turn > 1000"), config(tiny_model), tmp_path / "x")
    with pytest.raises(UbError, match="SQL error"):
        train_sft(shards, SftConfig(where="s.nope = 1"), config(tiny_model), tmp_path / "y")
    assert list(tmp_path.iterdir()) == []


def test_cli_sft(shards, tmp_path, capsys):
    from ub.flows.cli import main

    out = tmp_path / "warm"
    assert main(["sft", "--shards", str(shards), "--out", str(out), "--batch-size", "32",
                 "--learning-rate", "1e-3"]) == 0
    assert "decisions" in capsys.readouterr().out and (out / "ub_checkpoint.json").exists()
    assert main(["sft", "--shards", str(shards), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["sft", "--shards", str(shards), "--out", str(tmp_path / "z"), "--epochs",
                 "0"]) == 2
