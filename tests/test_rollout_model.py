"""Rollouts with the real vLLM engine on the tiny model: stored tokens, replay, LoRA seats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pytest

from ub.actors.spec import parse_actor
from ub.data.shards import ShardId, write_shard
from ub.data.sql import query
from ub.games.specs import GameSpec
from ub.inference.types import EngineConfig
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


def test_a_prompt_without_room_for_a_whole_completion_stops_its_game(engine):
    """A prompt that leaves less of the context than sampling.max_tokens would get a
    completion cut at the context's end, scored as an invalid move: the game is stopped
    instead, as errored (never trained on), saying what to change."""
    from ub.inference.types import SamplingConfig

    spec = GameSpec("TicTacToe-v0-train")
    games = assign_games(spec, [parse_actor("model"), parse_actor("random")], 2, base_seed=1)
    room = SamplingConfig(temperature=1.0, max_tokens=engine.config.max_model_len - 20)
    rollout = play_games(games, engine=engine, base_seed=1, sampling=room)
    rows = rollout.games.to_pylist()
    assert [r["outcome"] for r in rows] == ["error", "error"]
    for row in rows:
        assert f"for a completion of up to sampling.max_tokens {room.max_tokens}" in row["error"]
        assert "raise engine.max_model_len" in row["error"]
    assert not model_steps(rollout)  # nothing the model said: no invalid move to score


def _with_swapped_end_tokens(model: Path, out: Path) -> Path:
    """The tiny model as a Qwen3-Base-like model: it ends its moves with the token now named
    ``<|im_end|>`` (id 0, its old EOS), while its EOS is ``<|endoftext|>`` (now id 2, which it
    never says); its chat template is its own prompt format, ending a turn with
    ``<|im_end|>``."""
    shutil.copytree(model, out)
    (out / "ub_model.json").unlink()
    tok = json.loads((out / "tokenizer.json").read_text())
    names = {"<|endoftext|>": "<|im_end|>", "<|im_end|>": "<|endoftext|>"}
    for token in tok["added_tokens"]:
        token["content"] = names.get(token["content"], token["content"])
    vocab = tok["model"]["vocab"]
    vocab["<|endoftext|>"], vocab["<|im_end|>"] = vocab["<|im_end|>"], vocab["<|endoftext|>"]
    (out / "tokenizer.json").write_text(json.dumps(tok))
    for name, key in (("generation_config.json", "eos_token_id"), ("config.json", "eos_token_id"),
                      ("generation_config.json", "pad_token_id")):
        data = json.loads((out / name).read_text())
        data[key] = 2
        (out / name).write_text(json.dumps(data))
    (out / "chat_template.jinja").write_text(
        "{%- for m in messages %}{%- if m['role'] == 'user' %}"
        "{{- m['content'] | trim + '\\n\\nYour action:' }}"
        "{%- elif m['role'] == 'assistant' %}{{- m['content'] + '<|im_end|>' }}{%- endif %}"
        "{%- endfor %}")
    return out


def test_a_completion_ends_at_its_formats_end_of_turn(tiny_model, tmp_path):
    """Qwen3-Base's EOS is <|endoftext|>, its chat format ends a turn with <|im_end|>: a model
    that closes its turn would run on, up to max_tokens. Generation stops at the prompt
    format's end of turn too: each move ends there, stored with it."""
    from ub.games.templates import get_template
    from ub.inference.types import GenerationRequest, SamplingConfig
    from ub.run.processes.worker import process_worker

    folder = _with_swapped_end_tokens(Path(tiny_model), tmp_path / "model")
    sampling = SamplingConfig(temperature=1.0, max_tokens=16)
    handle = process_worker().engine(EngineConfig(model=str(folder)), sampling)
    end = handle.tokenizer.get_vocab()["<|im_end|>"]
    assert get_template("chat").end_token_ids(handle.tokenizer) == (end,) == (0,)
    assert get_template("qwen3-zs").end_token_ids(handle.tokenizer) == (end,)
    assert get_template("plain").end_token_ids(handle.tokenizer) == ()

    spec = GameSpec("TicTacToe-v0-train", template="chat")
    games = assign_games(spec, [parse_actor("model"), parse_actor("random")], 8, base_seed=3)
    rows = model_steps(play_games(games, engine=handle, base_seed=3))
    ended = [r for r in rows if r["completion_token_ids"][-1] == end]
    assert len(ended) > len(rows) / 2
    assert all(end not in r["completion_token_ids"][:-1] for r in rows)
    assert all(r["finish_reason"] == "stop" for r in ended)
    assert sum(r["format_ok"] for r in ended) > len(ended) / 2
    # The same prompts and seeds without the stop: the model goes on past its end of turn.
    free = handle.generate([GenerationRequest(f"free-{i}", r["prompt_token_ids"],
                                              r["sampling_seed"]) for i, r in enumerate(ended)])
    assert any(len(g.completion_token_ids) > g.completion_token_ids.index(end) + 1
               for g in free if end in g.completion_token_ids)
