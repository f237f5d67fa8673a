"""The `ub` command as a user runs it: happy paths and every bad input giving one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ub.flows.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_play_then_sql(capsys, tmp_path, engine):
    out_dir = tmp_path / "data"
    code, out, err = run(capsys, "play", "--env", "TicTacToe-v0-train", "--games", "6",
                         "--players", "model,random", "--out", str(out_dir))
    assert code == 0, err
    assert "6 games of TicTacToe-v0-train" in out and "tokens/s" in out
    assert files_under(out_dir) == [
        "games", "games/round-000000", "games/round-000000/shard-0000.parquet",
        "steps", "steps/round-000000", "steps/round-000000/shard-0000.parquet",
    ]
    code, out, _ = run(capsys, "sql", str(out_dir), "SELECT count(*) AS n FROM games",
                       "--format", "csv")
    assert code == 0 and out.splitlines() == ["n", "6"]
    # a second play adds a shard instead of overwriting the first
    assert run(capsys, "play", "--env", "Nim-v0-train", "--games", "2", "--players",
               "random,random", "--out", str(out_dir))[0] == 0
    code, out, _ = run(capsys, "sql", str(out_dir),
                       "SELECT count(DISTINCT shard) AS n FROM games", "--format", "csv")
    assert out.splitlines() == ["n", "2"]


def test_single_player_game_with_the_model(capsys, tmp_path, engine):
    code, out, err = run(capsys, "play", "--env", "TowerOfHanoi-v0-train", "--games", "2",
                         "--players", "model", "--out", str(tmp_path), "--max-tokens", "8")
    assert code == 0, err
    assert "2 games of TowerOfHanoi-v0-train" in out


@pytest.fixture(scope="module")
def rank32_adapter(tiny_model, tmp_path_factory):
    from ub.model.lora import LoraSettings, new_adapter

    return new_adapter(tiny_model, tmp_path_factory.mktemp("r32") / "rank32",
                       LoraSettings(rank=32, alpha=32))


@pytest.fixture(scope="module")
def bad(tiny_adapters, tmp_path_factory) -> Path:
    """Damaged and foreign files the sweep feeds to commands (``{bad}``): configs that are not
    UTF-8, repeat a key or hold a nan, adapters that are pickled or truncated, a Parquet file of
    another schema in a shard's place, and runs (``{bad}/runs``) with a truncated checkpoint
    adapter, a truncated round manifest and a config that is not UTF-8."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ub.run.config.load import load_config
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import open_run

    root = tmp_path_factory.mktemp("bad")
    (root / "latin1.yaml").write_bytes(b"seed: 1  # caf\xe9\n")
    (root / "twice.yaml").write_text("seed: 1\nrounds: 2\nseed: 2\n"
                                     "envs: [{env_id: TicTacToe-v0-train}]\n")
    (root / "nan.yaml").write_text("batch:\n  final: [{name: win_draw_loss, win: .nan}]\n")
    pickled = root / "pickled"
    pickled.mkdir()
    shutil.copy(Path(tiny_adapters[0]) / "adapter_config.json", pickled)
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04K\x01.")  # pickle of 1
    truncated = root / "truncated"
    shutil.copytree(tiny_adapters[0], truncated)
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    for table in ("steps", "games"):
        shard = root / "foreign" / table / "round-000000" / "shard-0000.parquet"
        shard.parent.mkdir(parents=True)
        pq.write_table(pa.table({"x": [1, 2]}), shard)
    runs = root / "runs"
    exp = RunPaths.of(runs, "exp")
    open_run(exp, load_config("tiny-cpu"))
    shutil.copytree(truncated, exp.checkpoint(0))
    broken = RunPaths.of(runs, "broken")
    open_run(broken, load_config("tiny-cpu"))
    broken.manifest(0).parent.mkdir()
    broken.manifest(0).write_text('{"round": 0, "sha')
    latin = RunPaths.of(runs, "latin")
    open_run(latin, load_config("tiny-cpu"))
    latin.config.write_bytes(latin.config.read_bytes() + b"# \xff\n")
    return root


BAD_INPUTS = [
    (["play", "--env", "TicTacToe-v0-trian", "--out", "{out}"], "did you mean: TicTacToe-v0-train"),
    (["play", "--env", "TicTacToe-v0", "--rules", "no_such_module:Rules", "--out", "{out}"],
     "game rules 'no_such_module:Rules': importing no_such_module failed"),
    (["play", "--env", "Wordle-v0", "--players", "random", "--out", "{out}"], "needs the network"),
    (["play", "--env", "TicTacToe-v0", "--games", "-4", "--out", "{out}"], "must be >= 1"),
    (["play", "--env", "TicTacToe-v0", "--games", "many", "--out", "{out}"], "whole number"),
    (["play", "--env", "TicTacToe-v0", "--players", "model,bogus", "--out", "{out}"],
     "unknown actor 'bogus'"),
    (["play", "--env", "TicTacToe-v0", "--players", "random", "--out", "{out}"],
     "failed to start with 1 player"),
    (["play", "--env", "TicTacToe-v0", "--model", "{tmp}/nope", "--out", "{out}"],
     "does not exist"),
    (["play", "--env", "TicTacToe-v0", "--model", "{tmp}", "--out", "{out}"], "config.json"),
    (["play", "--env", "TicTacToe-v0", "--players", "model:{tmp}/no-adapter,random",
      "--out", "{out}"], "no-adapter"),
    (["play", "--env", "TicTacToe-v0", "--players", "model:{rank32},random", "--out", "{out}"],
     "max_lora_rank"),
    (["play", "--env", "TicTacToe-v0", "--players", "random,random", "--out", "{file}/sub"],
     "not writable"),
    (["play", "--env", "TicTacToe-v0", "--template", "fancy", "--out", "{out}"],
     "unknown prompt template"),
    (["play", "--env", "TicTacToe-v0", "--temperature", "-1", "--out", "{out}"], "must be >= 0"),
    (["play", "--out", "{out}"], "--env"),
    (["sql", "{tmp}/missing", "SELECT 1"], "does not exist"),
    (["sql", "{out}", "SELEC 1"], "SQL error"),
    (["sql", "{out}", "COPY (SELECT 1) TO '{tmp}/leak.csv'"], "read-only"),
    (["train", "tiny-gpu", "--root", "{out}"],
     "unknown preset 'tiny-gpu'; did you mean 'tiny-cpu'? Presets: "),
    # Issue 70: hints kept (DuckDB's own) and given (the nearest setting, command).
    (["sql", "{out}", "SELECT invalid_mov FROM steps"],
     'not found in FROM clause!; Candidate bindings: "invalid_move"'),
    (["sql", "{out}", "SELECT * FROM gmes"], 'does not exist!; Did you mean "games"?'),
    (["train", "--root", "{out}", "--set", "learner.learnig_rate=1"],
     "learner.learnig_rate: unknown setting; did you mean learning_rate?"),
    (["train", "--root", "{out}", "--set", "envs.0.legal_move=mask"],
     "envs.0.legal_move: unknown setting; did you mean legal_moves?"),
    (["trian"], "invalid choice: 'trian' (choose from 'model', "),
    (["trian"], "; did you mean 'train'? (see `ub --help`)"),
    (["train", "--root", "{out}", "--set", "rounds=0"], "rounds: Input should be greater"),
    (["train", "--root", "{out}", "--set", "learner.algorithm=sarsa"], "sarsa"),
    (["train", "--root", "{out}", "--set", "rounds"], "expected key=value"),
    (["train", "{tmp}/nope.yaml", "--root", "{out}"], "nope.yaml does not exist"),
    (["train", "--run", "../escape", "--root", "{out}"], "invalid run name"),
    (["train", "--resume", "ghost", "--root", "{out}"], "no run 'ghost' under"),
    (["train", "tiny-cpu", "--resume", "ghost", "--root", "{out}"], "not both"),
    (["train", "--root", "{out}", "--rounds", "0"], "must be >= 1"),
    (["train", "--root", "{file}/sub"], "not writable"),
    (["frobnicate"], "invalid choice"),
    (["envs", "--bogus"], "unrecognized arguments"),
    (["model", "tiny", "--seed", "x"], "--seed: expected a whole number, got 'x'"),
    (["model", "tiny", "--out", "{file}/sub"], "not writable"),
    (["model", "tiny", "--set", "layers=6"], "tiny model settings: layers: unknown setting"),
    (["sql", "{out}", "DROP TABLE steps"], "read-only"),
    (["sql", "{out}", "ATTACH '{tmp}/x.db'"], "read-only"),
    (["batch", "{tmp}/missing"], "does not exist"),
    (["batch", "{out}", "--batch-size", "0"], "must be >= 1"),
    (["batch", "{out}", "--rounds", "5:2"], "rounds window is empty"),
    (["batch", "{out}", "--config", "{tmp}/nope.yaml"], "nope.yaml"),
    (["learn", "--shards", "{tmp}/missing", "--out", "{out}/c"], "does not exist"),
    (["learn", "--shards", "{out}", "--out", "{out}/c", "--algorithm", "sarsa"],
     "unknown algorithm 'sarsa'"),
    (["learn", "--shards", "{out}", "--from", "{out}", "--out", "{out}/c"],
     "not a ub checkpoint"),
    (["sft", "--shards", "{tmp}/missing", "--out", "{out}/c"], "does not exist"),
    (["sft", "--shards", "{out}", "--out", "{out}/c", "--epochs", "0"], "must be >= 1"),
    (["sft", "--shards", "{out}", "--out", "{out}/c", "--where", " "],
     "sft.where: must be a non-empty SQL condition"),
    (["sft", "--shards", "{out}", "--out", "{out}/c", "--max-train-len", "1"],
     "sft.max_train_len: Input should be greater than or equal to 2 (got 1)"),
    (["eval", "ghost", "--root", "{out}"], "no run 'ghost' under"),
    (["eval", "../ghost", "--root", "{out}"], "invalid run name"),
    (["dashboard", "ghost", "--root", "{out}", "--once"], "no run 'ghost'"),
    (["dashboard", "{out}", "--once"], "is not a ub run"),
    (["dashboard", "ghost", "--refresh", "-1"], "must be >= 0"),
    (["report", "ghost", "--root", "{out}"], "no run 'ghost'"),
    (["report", "{out}"], "is not a ub run"),
    (["doctor", "ghost", "--root", "{out}"], "no run 'ghost'"),
    (["doctor", "{out}"], "is not a ub run"),
    (["doctor", "../.ub-no-such-run"], "invalid run name"),  # (a name, as no folder is there)
    # Issue 18: tracebacks before, accepted before, unbounded, or output left behind. Every
    # `ub play` here writes to a folder that does not exist yet: a refusal must not create it.
    (["train", "{bad}/latin1.yaml", "--root", "{out}"], "is not UTF-8 text"),
    (["train", "--resume", "latin", "--root", "{bad}/runs"], "is not UTF-8 text"),
    (["train", "{bad}/twice.yaml", "--root", "{out}"], "'seed' is given twice"),
    (["batch", "{out}", "--config", "{bad}/twice.yaml"], "'seed' is given twice"),
    (["play", "--env", "TicTacToe-v0", "--players", "model:{bad}/pickled,random",
      "--out", "{out}/new"], "adapter_model.bin: pickle files are not loaded"),
    (["play", "--env", "TicTacToe-v0", "--players", "model:{bad}/truncated,random",
      "--out", "{out}/new"], "cannot read adapter_model.safetensors"),
    (["eval", "exp", "--root", "{bad}/runs", "--checkpoint", "0"],
     "cannot read adapter_model.safetensors"),
    (["play", "--env", "TicTacToe-v0", "--temperature", "nan", "--out", "{out}/new"],
     "expected a finite number"),
    (["eval", "exp", "--root", "{bad}/runs", "--checkpoint", "0", "--envs",
      "TicTacToe-v0-trian"],
     "did you mean: TicTacToe-v0-train"),
    (["eval", "exp", "--root", "{bad}/runs", "--games", "1000000000"], "at most 100000 games"),
    (["train", "--run", "name\n", "--root", "{out}"], "invalid run name"),
    (["play", "--env", "TicTacToe-v0", "--round", "-1", "--out", "{out}/new"], "must be >= 0"),
    (["dashboard", "ghost", "--refresh", "nan"], "expected a finite number"),
    (["sql", "{bad}/foreign", "SELECT * FROM games"], "has no ub schema version"),
    (["sql", "{out}", ""], "holds no SQL statement"),
    (["sql", "{out}", "-- only a comment"], "holds no SQL statement"),
    (["play", "--env", "TicTacToe-v0", "--games", "1000000000", "--out", "{out}/new"],
     "at most 100000 games"),
    (["play", "--env", "TicTacToe-v0-trian", "--out", "{out}/new"], "did you mean"),
    (["play", "--env", "TicTacToe-v0", "--players", "random,random,random", "--out",
      "{out}/new"], "failed to start with 3 player(s)"),
    (["play", "--env", "TicTacToe-v0", "--model", "{file}", "--out", "{out}/new"],
     "is not a directory"),
    (["play", "--env", "TicTacToe-v0", "--max-model-len", "1000000000", "--out", "{out}/new"],
     "exceeds the model's context"),
    (["train", "--root", "{out}", "--ray", "127.0.0.1:1"], "cannot reach the Ray cluster"),
    (["train", "--root", "ftp://127.0.0.1:1/runs"], "is unreachable"),
    (["train", "--root", "nosuch://bucket/runs"], "Protocol not known"),
    (["eval", "exp", "--root", "ftp://127.0.0.1:1/runs"], "is unreachable"),
    (["train", "--root", "{out}", "--set", "eval.opponents=[hosted:m@http://127.0.0.1:1/v1]"],
     "is unreachable"),
    (["train", "--resume", "broken", "--root", "{bad}/runs"], "round-000000.json is corrupt"),
    # ... and each run named by its folder as well (issue 70: "invalid run name" before)
    (["train", "--resume", "{bad}/runs/broken"], "round-000000.json is corrupt"),
    (["eval", "{bad}/runs/exp", "--checkpoint", "0"], "cannot read adapter_model.safetensors"),
    # Issue 38, 1: a setting valid in type but not for what it feeds (the game's player counts,
    # the engine's seeds and context, the data's columns, the model's vocabulary, a socket).
    (["train", "--root", "{out}", "--set", "envs=[{{env_id: TicTacToe-v0-train, num_players: 3}}]"],
     "envs.0.num_players: env 'TicTacToe-v0-train' failed to start with 3 player(s)"),
    (["train", "--root", "{out}", "--set", "envs=[{{env_id: TowerOfHanoi-v0-train}}]"],
     "envs.0.num_players: env 'TowerOfHanoi-v0-train' failed to start with 2 player(s)"),
    (["train", "--root", "{out}", "--set", "eval.envs=[TowerOfHanoi-v0-train]"],
     "eval.envs: env 'TowerOfHanoi-v0-train' failed to start with 2 player(s)"),
    (["eval", "exp", "--root", "{bad}/runs", "--checkpoint", "0", "--envs",
      "TowerOfHanoi-v0-train"],
     "--envs: env 'TowerOfHanoi-v0-train' failed to start with 2 player(s)"),
    # Issue 59: legal_moves: mask on a game whose legal moves ub cannot read.
    (["train", "--root", "{out}", "--set", "envs=[{{env_id: Battleship-v0, legal_moves: mask}}]",
      "--set", "eval.envs=null"],
     "envs.0.legal_moves: mask needs the legal moves of Battleship-v0, which ub does not know"),
    (["eval", "exp", "--root", "{bad}/runs", "--checkpoint", "0", "--legal-moves", "mask",
      "--envs", "Battleship-v0"], "--envs: mask needs the legal moves of Battleship-v0"),
    (["play", "--env", "Battleship-v0", "--legal-moves", "mask", "--out", "{out}/new"],
     "mask needs the legal moves of Battleship-v0"),
    (["train", "--root", "{out}", "--set", "seed=18446744073709551616"],
     "seed: got 18446744073709551616; it is also vLLM's engine seed"),
    (["train", "--root", "{out}", "--set", "seed=-1"], "seed: got -1; it is also vLLM's"),
    (["train", "--root", "{out}", "--set", "rounds=3000000000"],
     "rounds: got 3000000000; the data's round column holds round numbers up to 2147483647"),
    (["train", "--root", "{out}", "--rounds", "3000000000"], "--rounds: must be <= 2147483647"),
    (["play", "--env", "TicTacToe-v0", "--players", "random,random", "--round", "2147483648",
      "--out", "{out}/new"], "--round: must be <= 2147483647"),
    (["train", "--root", "{out}", "--set", "engine.max_model_len=4096"],
     "engine.max_model_len 4096 exceeds the model's context of 2048 tokens"),
    (["train", "--root", "{out}", "--set", "batch.pad_token_id=5000"],
     "batch.pad_token_id 5000 is not a token id of the model"),
    (["train", "--root", "{out}", "--set", "batch.pad_token_id=3000000000"],
     "batch.pad_token_id: Input should be less than or equal to 2147483647 (got 3000000000)"),
    (["train", "--root", "{out}", "--set", "engine.dtype=float8"],
     "engine.dtype: got 'float8'; input should be 'auto', 'float32', 'bfloat16' or 'float16'"),
    (["eval", "exp", "--root", "{bad}/runs", "--checkpoint", "-1"], "--checkpoint: must be >= 0"),
    (["model", "tiny", "--set", "learning_rate=-1", "--out", "{out}/m"],
     "learning_rate: Input should be greater than 0 (got -1)"),
    (["model", "tiny", "--set", "env_ids=TowerOfHanoi-v0-train", "--out", "{out}/m"],
     "cannot play 'TowerOfHanoi-v0-train' for transcripts (2 random players)"),
    (["dashboard", "ghost", "--refresh", "1e300"], "--refresh: must be <= 86400"),
    (["train", "--root", "{out}", "--set",
      'eval.opponents=["hosted:m@http://127.0.0.1:1/v1?timeout=1e300"]'],
     "option timeout: Input should be less than or equal to 86400 (got 1e+300)"),
    # Issue 38, 2: every number parsed from text, inside compound values too (actor specs,
    # --set values and config files, ports in URLs and addresses), is finite and in range.
    (["train", "--root", "{out}", "--set",
      'eval.opponents=["hosted:m@http://127.0.0.1:1/v1?timeout=nan"]'],
     "option timeout: Input should be a valid number (got 'nan')"),
    (["play", "--env", "TicTacToe-v0", "--players",
      "random,hosted:m@http://127.0.0.1:1/v1?temperature=inf", "--out", "{out}/new"],
     "option temperature: Input should be a valid number (got 'inf')"),
    (["play", "--env", "TicTacToe-v0", "--players", "random,hosted:m@http://127.0.0.1:nan/v1",
      "--out", "{out}/new"], "a port is a whole number from 1 to 65535, got 'nan'"),
    (["train", "--root", "{out}", "--ray", "127.0.0.1:99999"],
     "cluster.address=127.0.0.1:99999: a port is a whole number from 1 to 65535"),
    (["train", "--root", "http://127.0.0.1:nan/runs"], "a port is a whole number from 1 to"),
    (["serve", "ghost", "--root", "{out}", "--port", "70000"],
     "--port: a port is a whole number from 1 to 65535, got '70000'"),
    (["train", "--root", "{out}", "--set", "learner.algorithm=ppo", "--set",
      "learner.algorithm_params={{clip_eps_high: .inf}}"],
     "learner.algorithm_params.clip_eps_high: expected a finite number, got inf"),
    (["train", "--root", "{out}", "--set", "batch.final=[{{name: win_draw_loss, win: .nan}}]"],
     "batch: final.0.win: expected a finite number, got nan"),
    (["config", "show", "tiny-cpu", "--set", "learner.algorithm_params={{clip_eps: .nan}}"],
     "learner.algorithm_params.clip_eps: expected a finite number, got nan"),
    (["batch", "{out}", "--config", "{bad}/nan.yaml"],
     "nan.yaml: final.0.win: expected a finite number, got nan"),
    (["model", "tiny", "--set", "learning_rate=.nan", "--out", "{out}/m"],
     "learning_rate: Input should be a finite number"),
    (["model", "tiny", "--set", "rope_theta=inf", "--out", "{out}/m"],
     "rope_theta: Input should be a valid number (got 'inf')"),
    # Issue 38, 3: a command refused after it made something (a store run's working copy with
    # its lock, a model build's lock, an output folder) removes it; the sweep checks the disk.
    (["train", "--root", "file://{tmp}/store", "--set",
      "eval.opponents=[hosted:m@http://127.0.0.1:1/v1]"], "is unreachable"),
    (["train", "--root", "file://{tmp}/store", "--ray", "127.0.0.1:1"],
     "cannot reach the Ray cluster"),
    (["train", "--root", "file://{tmp}/store", "--set", "seed=-1"], "seed: got -1"),
    (["train", "--resume", "ghost", "--root", "file://{tmp}/store"],
     "no run ghost under file://"),
    (["eval", "ghost", "--root", "file://{tmp}/store"], "no run ghost under file://"),
    (["train", "--root", "http://127.0.0.1:1/runs"], "http://127.0.0.1:1/runs/tiny-cpu is "
     "unreachable"),
    (["eval", "ghost", "--root", "http://127.0.0.1:1/runs"], "is unreachable"),
    (["model", "tiny", "--set", "env_ids=Foo-v0", "--out", "{out}/deep/m"],
     "cannot play 'Foo-v0' for transcripts"),
    (["learn", "--shards", "{out}", "--out", "{out}/deep/c"], "no committed shards"),
]

# Every section of a training config with a wrong value: the error names the field.
CONFIG_FIELD_CASES = [
    ("seed=minus", "seed"), ("rounds=-2", "rounds"), ("rounds=1.5", "rounds"),
    ("model.base=nope", "model.base"), ("model.base={tmp}/no-model", "model.base"),
    ("model.tiny_seed=x", "tiny_seed"), ("engine.max_loras=0", "engine.max_loras"),
    ("engine.max_model_len=-1", "max_model_len"), ("engine.kv_cache_gib=lots", "kv_cache_gib"),
    ("sampling.temperature=-1", "sampling.temperature"), ("sampling.max_tokens=0", "max_tokens"),
    ("envs=3", "envs"), ("envs=[{{env_id: Chess-v9}}]", "Chess-v9"),
    ("rollout.games_per_round=-3", "games_per_round"), ("rollout.shards=0", "shards"),
    ("rollout.concurrency=x", "concurrency"), ("opponents=[]", "opponents"),
    ("opponents=[{{mode: telepathy}}]", "telepathy"), ("opponents=[{{mode: lagged, k: 0}}]", "k"),
    ("rating.beta=-1", "beta"),
    ("rating.draw_probability=1", "rating.draw_probability: Input should be less than 1"),
    ("opponents=[{{mode: mirror, k: 2}}]", "opponents.modes.0: mode mirror has no parameter k; "
     "it takes: weight"),
    ("opponents=[{{mode: fixed, names: [nobody]}}]", "opponents.modes.0.names: unknown actor "
     "'nobody'"),
    ("batch.batch_size=x", "batch_size"),
    ("batch.final=[{{name: nope}}]", "nope"), ("batch.sampling=7", "sampling"),
    ("learner.learning_rate=abc", "learning_rate"), ("learner.algorithm=sarsa", "sarsa"),
    # One's own component by import path (tests/own_components.py): a module that does not
    # import, a class that is not there, a class of the wrong base.
    ("learner.algorithm=no_such_module:Clip", "learner: algorithm 'no_such_module:Clip': "
     "importing no_such_module failed (ModuleNotFoundError"),
    ("learner.algorithm=own_components:Nope", "own_components:Nope': own_components"),
    ("learner.algorithm=own_components:Nope", "has no Nope; its classes: AsymmetricClip, "
     "Baselines, CountedScale, EnvBaseline, FirstLegal, LengthPenalty, NotATransform"),
    ("envs=[{{env_id: TicTacToe-v0-train, position: 'own_components:cells'}}]", "has no cells; "
     "its functions: guesses_so_far, tictactoe_cells"),
    ("learner.algorithm=own_components:NotATransform", "does not subclass ub.learner.Algorithm"),
    ("batch.step=[own_components:CountedScale]", "batch: step reward transform "
     "'own_components:CountedScale' does not subclass ub.rewards.StepTransform"),
    ("batch.final=[{{name: 'no_such_module:Scale'}}]", "importing no_such_module failed"),
    ("envs=[{{env_id: TicTacToe-v0-train, position: 'no_such_module:key'}}]", "envs.0.position: "
     "position function 'no_such_module:key': importing no_such_module failed"),
    ("envs=[{{env_id: TicTacToe-v0-train, position: 'own_components:NotATransform'}}]",
     "position function 'own_components:NotATransform' is a class, not a function"),
    # A game's rules of one's own (docs/games.md): not importable, not a GameRules, another
    # game's.
    ("envs=[{{env_id: TicTacToe-v0-train, rules: 'no_such_module:Rules'}}]", "envs.0.rules: "
     "game rules 'no_such_module:Rules': importing no_such_module failed"),
    ("envs=[{{env_id: TicTacToe-v0-train, rules: 'own_components:NotATransform'}}]",
     "game rules 'own_components:NotATransform' does not subclass ub.games.rules.GameRules"),
    ("envs=[{{env_id: TicTacToe-v0-train, rules: 'ub.games.builtin.nim:NimRules'}}]",
     "are for entry point textarena.envs.Nim.env:NimEnv, but TicTacToe-v0-train is "
     "textarena.envs.TicTacToe.env:TicTacToeEnv"),
    ("batch.sampling=[{{name: state_baseline, key: board}}]", "state_baseline key must be one "
     "of prompt, position, branch, got 'board'"),
    ("rollout.branch.k=1", "rollout.branch.k: 1 is one move per branch point, which is no "
     "branching: give 0 (off) or 2 or more"),
    ("batch.sampling=[{{name: position_advantage, weight: 0}}]", "position_advantage weight "
     "must be > 0"),
    ("learner.lora.rank=0", "rank"), ("learner.max_grad_norm=-1", "max_grad_norm"),
    ("eval.games=3", "eval.games"), ("eval.every=-1", "eval.every"),
    ("eval.opponents=[nobody]", "nobody"), ("pipeline.max_staleness=4", "max_staleness"),
    ("tracking.wandb=sometimes", "tracking.wandb"), ("tracking.bogus=1", "bogus"),
    ("bogus_section=1", "bogus_section"),
    ("envs=[{{env_id: TicTacToe-v0-train, weight: .inf}}]", "envs.0.weight: Input should be "
     "a finite number"),
    ("engine.kv_cache_gib=.inf", "kv_cache_gib: Input should be a finite number"),
    ("sampling.max_tokens=1000000000", "must be below engine.max_model_len 2048"),
    ("rollout.games_per_round=true", "games_per_round: Input should be a valid integer"),
    ("rollout.games_per_round=1000000000", "less than or equal to 100000"),
    ("rollout.games_per_round=64.0", "games_per_round: Input should be a valid integer"),
    ("eval.games=1000000000", "less than or equal to 100000"),
]
BAD_INPUTS += [(["train", "--root", "{out}", "--set", setting], field)
               for setting, field in CONFIG_FIELD_CASES]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUTS, ids=lambda v: str(v)[:60])
def test_bad_input_is_one_clear_line_and_changes_nothing(
    argv, message, capsys, tmp_path, rank32_adapter, bad, engine, ledger, monkeypatch
):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("UB_WORK_DIR", str(tmp_path / "work"))  # runs in stores: copies here
    argv = [a.format(out=out_dir, tmp=tmp_path, file=blocker, rank32=rank32_adapter, bad=bad)
            for a in argv]
    before = files_under(tmp_path), files_under(bad)
    ledger["bad inputs tried"] += 1
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ub: error:"), err
    assert message in lines[0]
    assert "Traceback" not in err
    assert (files_under(tmp_path), files_under(bad)) == before
    assert not any(name.startswith(".") for name in os.listdir(out_dir))
    ledger["bad inputs clear"] += 1


def test_a_refused_command_leaves_the_disk_as_it_found_it(capsys, tmp_path, monkeypatch,
                                                          tiny_model):
    """Issue 38: what a command makes before it is refused goes with the refusal. Before, a
    store run's working copy kept its lock (an unreachable endpoint, a missing run), a model
    build its lock file and the folders made for it, ``ub learn`` its output's parents."""
    monkeypatch.setenv("UB_WORK_DIR", str(tmp_path / "work"))  # store runs' working copies
    store = f"file://{tmp_path}/store"
    refused = [
        ["train", "--root", store, "--set", "eval.opponents=[hosted:m@http://127.0.0.1:1/v1]"],
        ["train", "--root", store, "--set", "seed=-1"],  # (refused after the copy is made)
        ["eval", "ghost", "--root", store],
        ["model", "tiny", "--set", "env_ids=Foo-v0", "--out", str(tmp_path / "deep" / "m")],
        ["learn", "--shards", str(tmp_path), "--out", str(tmp_path / "deep" / "c")],
    ]
    for argv in refused:
        code, _, err = run(capsys, *argv)
        assert code == 2 and err.startswith("ub: error:"), (argv, err)
        assert files_under(tmp_path) == [], (argv, files_under(tmp_path))


def test_the_installed_command_prints_everything_and_exits_with_its_code(capsys, tmp_path):
    """The console script skips the interpreter's teardown (``ub.flows.cli.entry`` ends in
    ``os._exit``): its piped output, still in Python's buffer when the command returns, is
    whole, and its exit code is the command's, 0 or 2."""
    ub = str(Path(sys.executable).parent / "ub")
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    # (the reference: main() with the interpreter's own exit and flush, in a process of its
    # own, not this one, where other tests may have registered games of their own)
    reference = subprocess.run([sys.executable, "-c", "import sys; from ub.flows.cli import "
                                "main; sys.exit(main(['envs']))"],
                               capture_output=True, text=True, env=buffered, timeout=120)
    shown = subprocess.run([ub, "envs"], capture_output=True, text=True, env=buffered,
                           timeout=120)
    assert shown.returncode == reference.returncode == 0
    assert shown.stdout == reference.stdout and "TicTacToe" in shown.stdout
    refused = subprocess.run([ub, "train", "--root", str(tmp_path), "--rounds", "0"],
                             capture_output=True, text=True, env=buffered, timeout=120)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith("ub: error: argument --rounds: must be >= 1")
    assert refused.stderr.rstrip().endswith("(see `ub train --help`)")


def test_a_pipe_closed_early_ends_the_command_quietly(tmp_path):
    """`ub sql ... | head -2`, as a shell runs it: two lines, nothing on stderr, exit code 0
    (it was a BrokenPipeError traceback and exit code 1, in CSV and in the table)."""
    ub = Path(sys.executable).parent / "ub"
    for form in ("--format csv", "--max-rows 5000"):
        shell = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {ub} sql {tmp_path} "
             f"'SELECT * FROM range(100000)' {form} | head -2"],
            capture_output=True, text=True, timeout=120)
        assert (shell.returncode, shell.stderr) == (0, ""), (form, shell.stderr[-3000:])
        assert len(shell.stdout.splitlines()) == 2


def test_an_unknown_option_names_its_command_once(capsys):
    """`ub sweep --bogus` is refused naming `ub sweep`'s help, without a doubled prefix."""
    assert main(["sweep", "tiny-cpu", "--arm", "a", "--seeds", "0", "--root", "runs",
                 "--bogus", "1"]) == 2
    assert capsys.readouterr().err == (
        "ub: error: unrecognized arguments: --bogus 1 (see `ub sweep --help`)\n")


def test_train_refuses_a_run_held_by_a_live_process(capsys, tmp_path):
    from ub.run.config.load import load_config
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import open_run

    paths = RunPaths.of(tmp_path, "busy")
    open_run(paths, load_config("tiny-cpu"))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from ub.run.folder.lock import RunLock; RunLock(Path(sys.argv[1])).acquire(); "
         "print('held', flush=True); time.sleep(600)", str(paths.lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = run(capsys, "train", "--resume", "busy", "--root", str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and f"in use by pid {holder.pid}" in err and "Traceback" not in err


def test_train_refuses_another_config_on_an_existing_run(capsys, tmp_path):
    from ub.run.config.load import load_config
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import open_run

    open_run(RunPaths.of(tmp_path, "exp"), load_config("tiny-cpu"))
    code, _, err = run(capsys, "train", "tiny-cpu", "--run", "exp", "--root", str(tmp_path),
                       "--set", "seed=5")
    assert code == 2
    assert "was started with another config: seed (0 in the run, 5 now)" in err
    assert f"`ub train --resume exp --root {tmp_path}`" in err  # the command, as it works


def test_the_resume_command_names_the_root_unless_it_is_the_default(tmp_path, monkeypatch):
    from ub.run.folder.layout import RunPaths

    monkeypatch.chdir(tmp_path)
    assert RunPaths.of("runs", "exp").resume_command == "ub train --resume exp"
    assert (RunPaths.of("elsewhere", "exp").resume_command
            == f"ub train --resume exp --root {tmp_path / 'elsewhere'}")
    monkeypatch.setenv("UB_WORK_DIR", str(tmp_path / "work"))
    assert (RunPaths.of("file:///data/runs", "exp").resume_command
            == "ub train --resume exp --root file:///data/runs")


def test_ub_learn_takes_a_runs_own_config_yaml_as_the_run_learns(tmp_path: Path) -> None:
    """A run's stored config.yaml (every setting written out, nulls for "the run's default")
    given to `ub learn --config` resolves to the learner config the run itself uses: the seed,
    temperature and length normalizer from the run, nothing refused."""
    import argparse

    import yaml

    from ub.cli.learn import learner_config
    from ub.run.config.load import load_config

    stored = load_config("tiny-cpu", ["seed=7"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(stored.model_dump(mode="json"), sort_keys=False))
    assert yaml.safe_load(path.read_text())["learner"]["length_normalizer"] is None
    args = argparse.Namespace(config=str(path), base_model=str(tmp_path / "base"),
                              algorithm=None, learning_rate=None, init_adapter=None,
                              from_checkpoint=None)
    resolved = learner_config(args)
    assert (resolved.seed, resolved.length_normalizer) == (7, stored.sampling.max_tokens)
    # (device_share is the run's learner's GPU share beside its own engine: `ub learn` has none)
    run_learner = stored.learner_config(str(tmp_path / "base"))
    assert resolved == run_learner.replace(device_share=None)


def test_a_preset_names_its_run_after_itself(capsys, tmp_path):
    """``qwen3-1.7b-simpletak`` names its run so, not ``qwen3-1`` (its dots are no suffix), so
    the run it started is the one ``ub train --resume qwen3-1.7b-simpletak`` finds; a YAML
    file still names its run after the file."""
    from ub.run.config.load import config_run_name, load_config
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import open_run

    assert config_run_name("qwen3-1.7b-simpletak") == "qwen3-1.7b-simpletak"
    assert config_run_name(str(tmp_path / "my.exp.yaml")) == "my.exp"
    open_run(RunPaths.of(tmp_path, "qwen3-1.7b-simpletak"),
             load_config("qwen3-1.7b-simpletak", ["seed=5"]))
    code, _, err = run(capsys, "train", "qwen3-1.7b-simpletak", "--root", str(tmp_path))
    assert code == 2 and "ub train --resume qwen3-1.7b-simpletak" in err
    assert not (tmp_path / "qwen3-1").exists()


def test_an_explicit_root_always_names_the_run_under_it(tmp_path, monkeypatch):
    """``ub doctor NAME --root R`` (and every command that takes a run by name) reads
    ``R/NAME`` even where ``./NAME`` exists; a bare path names a folder only without --root."""
    import argparse

    from ub.cli.args import run_dir
    from ub.errors import UbError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()  # a run of the same name in the working directory
    (tmp_path / "demo" / "config.yaml").write_text("")
    (tmp_path / "elsewhere" / "demo").mkdir(parents=True)
    root = str(tmp_path / "elsewhere")
    assert run_dir(argparse.Namespace(run="demo", root=root)) == tmp_path / "elsewhere" / "demo"
    assert run_dir(argparse.Namespace(run="demo", root=None)) == Path("demo")
    (tmp_path / "runs" / "other").mkdir(parents=True)
    assert run_dir(argparse.Namespace(run="other", root=None)) == Path("runs") / "other"
    (tmp_path / "solo").mkdir()
    with pytest.raises(UbError, match=r"^no run 'solo' under .*elsewhere; .*elsewhere holds "
                                      r"no run$"):
        run_dir(argparse.Namespace(run="solo", root=root))
    # (a folder that is no run is a name: runs/solo, which is not there)
    with pytest.raises(UbError, match=r"^no run 'solo' under runs; runs holds no run$"):
        run_dir(argparse.Namespace(run="solo", root=None))
