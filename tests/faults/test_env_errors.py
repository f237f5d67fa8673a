"""A game env raising on some turn: that game is recorded as errored (with the error), the
others finish, and the shard commits."""

from __future__ import annotations

import os
import subprocess
import sys

from ub.data.sql import query


def test_an_env_raising_mid_game_errors_only_that_game(tmp_path, ledger):
    env = {**os.environ, "UB_FAULT_AT": "env.step:9:raise"}
    done = subprocess.run(
        [sys.executable, "-m", "ub.flows.cli", "play", "--env", "TicTacToe-v0-train",
         "--games", "6", "--players", "random,random", "--concurrency", "6",
         "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300)
    ledger["faults injected"] += 1
    assert done.returncode == 0, done.stderr[-2000:]
    games = query(tmp_path, "SELECT outcome, error FROM games ORDER BY game_id").to_pylist()
    errored = [g for g in games if g["outcome"] == "error"]
    assert len(games) == 6 and len(errored) == 1
    assert "injected fault at env.step" in errored[0]["error"]
    ledger["faults survived"] += 1
