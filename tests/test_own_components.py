"""An algorithm and reward transforms of one's own, outside the ub package, named by import path
(tests/own_components.py, found through ``PYTHONPATH``): a real ``ub train`` round of the tiny
model trains with them, the run records them, and its resume takes the same classes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import own_components
import pytest
import yaml

from ub.data.sql import query
from ub.errors import UbError
from ub.learner.algorithms import algorithm_class
from ub.run.config.load import validate_config
from ub.run.folder.layout import RunPaths, read_json
from ub.run.steps.rounds import resolve_run_config

HERE = Path(__file__).resolve().parent
ALGORITHM = "own_components:AsymmetricClip"
FINAL = "own_components:CountedScale"
STEP = "own_components:LengthPenalty"
POSITION = "own_components:tictactoe_cells"
GAMES = 8

# One round of a few TicTacToe games, as tests/test_train_flow.py's config but smaller.
CONFIG = {
    "seed": 5,
    "rounds": 1,
    "model": {"base": "tiny"},
    "sampling": {"temperature": 1.0, "max_tokens": 12, "stop": ["]"]},
    "envs": [{"env_id": "TicTacToe-v0-train", "position": POSITION}],
    "rollout": {"games_per_round": GAMES, "concurrency": GAMES},
    "opponents": [{"mode": "mirror", "weight": 1.0}],
    "batch": {"batch_size": 32,
              "final": ["win_draw_loss", {"name": FINAL, "factor": 0.5}],
              "step": [{"name": STEP, "cost": 0.01}],
              "sampling": ["normalize_per_env", "position_advantage"]},
    # Two optimizer steps: the second one's ratios move off 1, so the clip range matters.
    "learner": {"algorithm": ALGORITHM, "algorithm_params": {"clip_low": 0.2, "clip_high": 0.28},
                "minibatches": 2, "learning_rate": 1e-3, "lora": {"rank": 8, "alpha": 16}},
}


@pytest.fixture(scope="module")
def run(tiny_model, tmp_path_factory) -> RunPaths:
    """``ub train`` as a user runs it, in a child process whose PYTHONPATH holds this folder
    (and no Prefect API: it starts its own temporary server, as on a fresh machine)."""
    root = tmp_path_factory.mktemp("own")
    config = root / "own.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "ub.flows.cli", "train", str(config), "--run", "own",
         "--root", str(root), "--quiet"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return RunPaths.of(root, "own")


def test_a_round_trains_with_ones_own_algorithm_and_transforms(run):
    assert run.committed_rounds() == [0]
    metrics = json.loads((run.checkpoint(1) / "metrics.json").read_text())
    # The algorithm's own statistics: its loss ran, in both optimizer steps.
    assert {"clip_low_fraction", "clip_high_fraction"} <= set(metrics)
    assert metrics["optimizer_steps"] == 2
    # The final transform of one's own folded every game of the round, under its path.
    state = read_json(run.final_rewards_state(0))
    assert state["transforms"][1] == {"name": FINAL, "params": {"factor": 0.5},
                                      "state": {"games": GAMES}}


def test_a_game_keyed_by_ones_own_position_function(run):
    """Every decision's position is the function's key of the board its seat faced (the
    cells the earlier moves filled): the run trained with position_advantage over these keys."""
    steps = query(run.root, "SELECT game_id, turn, seat, action, position FROM steps "
                            "ORDER BY game_id, turn").to_pylist()
    assert len(steps) > GAMES * 4
    board: dict[str, list[str]] = {}
    for row in steps:
        cells = board.setdefault(row["game_id"], ["-"] * 9)
        assert row["position"] == "".join(cells), row
        if row["action"] and row["action"].strip("[]").isdigit():
            cells[int(row["action"].strip("[]"))] = "X" if row["seat"] == 1 else "O"
    openings = [r for r in steps if r["turn"] == 0]
    assert {r["position"] for r in openings} == {"-" * 9}  # one group: every game's first move


def test_the_run_records_each_component_and_its_source(run):
    stored = yaml.safe_load(run.config.read_text())
    assert stored["learner"]["algorithm"] == ALGORITHM
    assert stored["batch"]["final"][1]["name"] == FINAL
    assert stored["batch"]["step"][0]["name"] == STEP
    components = json.loads(run.manifest(0).read_text())["components"]
    source = hashlib.sha256(Path(own_components.__file__).read_bytes()).hexdigest()
    assert components == {
        "learner.algorithm": ALGORITHM,
        "batch.final": ["ub.rewards.final:WinDrawLoss", FINAL],
        "batch.step": [STEP],
        "batch.sampling": ["ub.rewards.sql:NormalizePerEnv", "ub.rewards.sql:PositionAdvantage"],
        "envs.position": {"TicTacToe-v0-train": POSITION},
        "sources": {"own_components": source},
    }


def test_a_resume_takes_the_same_classes_and_refuses_others(run):
    config, _ = resolve_run_config(run, None)
    assert algorithm_class(config.learner.algorithm) is own_components.AsymmetricClip
    final = config.batch.transforms.final
    assert [type(t) for t in final][1] is own_components.CountedScale
    other = validate_config({**CONFIG, "learner": {**CONFIG["learner"], "algorithm": "ppo",
                                                   "algorithm_params": {}}})
    with pytest.raises(UbError, match=re.escape(f"learner.algorithm ({ALGORITHM!r} in the run, "
                                                "'ppo' now)")):
        resolve_run_config(run, other)


def test_a_resume_says_when_the_code_of_ones_own_component_changed(run, tmp_path):
    from ub.run.checks.preflight import RunRequest, preflight

    # The config keeps the import path only: a resume trains with the module as it is now,
    # which the run's log says when the module is not what the last round recorded.
    assert preflight(RunRequest(name="own", root=str(run.root.parent))).notes == ()
    copy = RunPaths.of(tmp_path, "own")
    shutil.copytree(run.root, copy.root)
    manifest = json.loads(copy.manifest(0).read_text())
    manifest["components"]["sources"]["own_components"] = "0" * 64  # as an older file had it
    copy.manifest(0).write_text(json.dumps(manifest))
    (note,) = preflight(RunRequest(name="own", root=str(tmp_path))).notes
    assert note.startswith("own_components changed since round 0 recorded it (sha256 "
                           "000000000000, now ")
    assert "the rounds from here train with the code as it is now" in note


def test_doctor_in_a_shell_without_the_components_module_checks_the_data_and_says_why(run):
    """A shell whose PYTHONPATH lacks the module: the config cannot be checked there, which
    is the shell's matter, not damage to the run (`--repair` has nothing to do)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p and Path(p).resolve() != HERE)}
    for repair in ([], ["--repair"]):
        done = subprocess.run([sys.executable, "-m", "ub.flows.cli", "doctor", str(run.root),
                               *repair], env=env, capture_output=True, text=True, timeout=300,
                              cwd=run.root)
        assert done.returncode == 0, done.stdout + done.stderr
        notes = [line for line in done.stdout.splitlines() if line.startswith("note: ")]
        assert notes[0] == (
            f"note: config.yaml's learner.algorithm is {ALGORITHM!r}, which this shell cannot "
            "import (ModuleNotFoundError: No module named 'own_components'): put the folder "
            "that holds own_components on PYTHONPATH (PYTHONPATH=DIR ub doctor ...) to check "
            "the config as well; the run's data was checked without it")
        assert len(notes) == 4  # the algorithm, two transforms and the position function
        assert "problem" not in done.stdout and "quarantined" not in done.stdout
        assert "own: 1 committed round(s), ok" in done.stdout
    assert not (run.root / "quarantine").exists()
