"""The `ub` command as a user runs it: happy paths and every bad input giving one clear line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ub.cli import main


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
        "games", "games/round=000000", "games/round=000000/shard-0000.parquet",
        "steps", "steps/round=000000", "steps/round=000000/shard-0000.parquet",
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


BAD_INPUTS = [
    (["play", "--env", "TicTacToe-v0-trian", "--out", "{out}"], "did you mean: TicTacToe-v0-train"),
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
    (["sql", "{out}", "COPY (SELECT 1) TO '{tmp}/leak.csv'"], "SQL error"),
    (["frobnicate"], "invalid choice"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUTS, ids=lambda v: str(v)[:60])
def test_bad_input_is_one_clear_line_and_changes_nothing(
    argv, message, capsys, tmp_path, rank32_adapter, engine
):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = [a.format(out=out_dir, tmp=tmp_path, file=blocker, rank32=rank32_adapter)
            for a in argv]
    before = files_under(tmp_path)
    code, _, err = run(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ub: error:"), err
    assert message in lines[0]
    assert "Traceback" not in err
    assert files_under(tmp_path) == before
    assert not any(name.startswith(".") for name in os.listdir(out_dir))
