"""An algorithm, reward transforms and a seat of one's own, outside the ub package, named by
import path (tests/own_components.py, found through ``PYTHONPATH``): two real ``ub train``
rounds of the tiny model train with them (against the seat, and evaluate against it too), the
run records them, and its resume takes the same classes. The
algorithm owns state (a learned baseline per env, in a file of its own) and a statistic of its
own, declared to ub, which no file of ub names: the statistic reaches the round manifest, the
learner view and the tracked metrics (W&B's), and a resume after round 1 writes checkpoint 2
bit for bit as the uninterrupted run did."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import own_components
import own_game
import pytest
import yaml
from safetensors.torch import load_file

from ub.components import load_class
from ub.data.sql import query
from ub.errors import UbError
from ub.learner.algorithms import algorithm_class
from ub.run.config.load import validate_config
from ub.run.folder.layout import RunPaths, read_json
from ub.run.steps.rounds import resolve_run_config

HERE = Path(__file__).resolve().parent
ALGORITHM = "own_components:EnvBaseline"  # (AsymmetricClip's loss, less a learned baseline)
FINAL = "own_components:CountedScale"
STEP = "own_components:LengthPenalty"
POSITION = "own_components:tictactoe_cells"
RULES = "own_game:TakeAwayRules"  # (tests/own_game.py: a TextArena game of one's own)
ENVS = ["TicTacToe-v0-train", "TakeAway-v0-train"]
SEAT = "own_components:FirstLegal"
EVAL_GAMES = 4
GAMES = 8

# Two rounds of a few TicTacToe games, as tests/test_train_flow.py's config but smaller.
CONFIG = {
    "seed": 5,
    "rounds": 2,
    "model": {"base": "tiny"},
    "sampling": {"temperature": 1.0, "max_tokens": 12, "stop": ["]"]},
    "envs": [{"env_id": ENVS[0], "position": POSITION},
             {"env_id": ENVS[1], "rules": RULES, "legal_moves": "mask"}],
    "rollout": {"games_per_round": GAMES, "concurrency": GAMES},
    "opponents": [{"mode": "mirror", "weight": 1.0},
                  {"mode": "fixed", "names": [SEAT], "weight": 1.0}],
    "eval": {"every": 2, "games": EVAL_GAMES, "opponents": [SEAT]},
    "batch": {"batch_size": 32,
              "final": ["win_draw_loss", {"name": FINAL, "factor": 0.5}],
              "step": [{"name": STEP, "cost": 0.01}],
              # (The algorithm reads the returns and makes its own advantages: no sampling.)
              "sampling": []},
    # Two optimizer steps: the second one's ratios move off 1, so the clip range matters.
    "learner": {"algorithm": ALGORITHM,
                "algorithm_params": {"envs": ENVS, "learning_rate": 0.1,
                                     "clip_low": 0.2, "clip_high": 0.28},
                "minibatches": 2, "learning_rate": 1e-3, "lora": {"rank": 8, "alpha": 16}},
}
OWN_STATISTIC = "baseline_mse"  # EnvBaseline's own, a per-row mean it declares
LOSS_STATISTICS = ("clip_low_fraction", "clip_high_fraction")  # its loss's, undeclared


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


def test_rounds_train_with_ones_own_algorithm_and_transforms(run):
    assert run.committed_rounds() == [0, 1]
    for update in (1, 2):
        checkpoint = run.checkpoint(update)
        metrics = json.loads((checkpoint / "metrics.json").read_text())
        # The algorithm's statistics: its loss ran, in both optimizer steps.
        assert metrics["algorithm_statistics"] == sorted((*LOSS_STATISTICS, OWN_STATISTIC))
        assert metrics["optimizer_steps"] == 2 and metrics[OWN_STATISTIC] > 0
        # Its module, in the file it named, its AdamW state beside the adapter's.
        manifest = json.loads((checkpoint / "ub_checkpoint.json").read_text())
        assert "env_baseline.safetensors" in manifest["files"]
        baseline = load_file(checkpoint / "env_baseline.safetensors")["env_baseline.values"]
        assert baseline.shape == (2,) and all(baseline != 0.0)  # learned from 0
        assert "exp_avg/env_baseline.values" in load_file(checkpoint / "optimizer.safetensors")
    # The final transform of one's own folded every game of the round, under its path.
    state = read_json(run.final_rewards_state(0))
    assert state["transforms"][1] == {"name": FINAL, "params": {"factor": 0.5},
                                      "state": {"games": GAMES}}


def test_its_statistics_reach_the_manifest_the_learner_view_and_the_tracked_metrics(
        run, capsys):
    """Its own statistic and its loss's, though no file of ub names them: in each round's
    manifest, a column of the learner view (``ub sql``), and the tracked metrics W&B logs."""
    from ub.flows.cli import main

    statistics = (OWN_STATISTIC, *LOSS_STATISTICS)
    for round_ in (0, 1):
        learner = json.loads(run.manifest(round_).read_text())["learner"]
        assert set(statistics) <= set(learner), round_
    assert main(["sql", str(run.root), f"SELECT round, {', '.join(statistics)} FROM learner "
                 "ORDER BY round", "--format", "csv"]) == 0
    header, *rows = capsys.readouterr().out.split()
    assert header == f"round,{','.join(statistics)}"
    assert [row.split(",")[0] for row in rows] == ["0", "1"]
    assert all(value for row in rows for value in row.split(","))  # none NULL
    # The round's tracked figures (metrics/round-N.parquet), which W&B's history rows carry.
    from ub.run.folder.views import RunViews
    from ub.run.steps.tracking import read_metrics, wandb_rows

    tracked = {(r["round"], r["metric"]) for r in RunViews(run.root).metrics().to_pylist()}
    assert {(r, f"learner/{name}") for r in (0, 1) for name in statistics} <= tracked
    (_, logged), *_ = wandb_rows(1, read_metrics(run, 1), {})
    assert {f"learner/{name}" for name in statistics} <= set(logged)


def test_a_resume_after_round_1_writes_checkpoint_2_bit_for_bit(run, tmp_path):
    """Round 1's learn step again in a fresh learner (this process's, as a resumed run's
    process starts one) from checkpoint 1: every file of checkpoint 2 as the uninterrupted run
    wrote it (the baseline's file and AdamW state included), but the update's timings."""
    from ub.run.config.base_model import resolve_base_model
    from ub.run.processes.worker import Worker
    from ub.run.steps.learn import learn_round
    from ub.run.steps.rounds import Run

    copy = RunPaths.of(tmp_path, "own")
    shutil.copytree(run.root, copy.root)
    shutil.rmtree(copy.checkpoint(2))
    config, _ = resolve_run_config(copy, None)
    worker = Worker()
    try:
        metrics = learn_round(Run(copy, config, resolve_base_model(config)), 1, worker=worker)
    finally:
        worker.close()
    assert not metrics.get("reused")
    found, expected = copy.checkpoint(2), run.checkpoint(2)
    assert sorted(p.name for p in found.iterdir()) == sorted(p.name for p in expected.iterdir())
    for path in sorted(expected.iterdir()):
        if path.name not in ("metrics.json", "ub_checkpoint.json"):
            assert (found / path.name).read_bytes() == path.read_bytes(), path.name
    # metrics.json: the same figures but the timings and where the run lives
    differ = ("seconds", "tokens_per_second", "peak_rss_mb", "from_checkpoint", "batch")
    mine, theirs = ({k: v for k, v in json.loads((c / "metrics.json").read_text()).items()
                     if k not in differ} for c in (found, expected))
    assert mine == theirs
    mine, theirs = (json.loads((c / "ub_checkpoint.json").read_text()) for c in (found, expected))
    for manifest in (mine, theirs):
        del manifest["files"]["metrics.json"]
    assert mine == theirs


def test_a_batch_that_the_algorithm_would_not_read_is_refused_in_one_line():
    """It reads returns and makes its own advantages: a sampling stage is refused before the
    run starts, in one line."""
    with pytest.raises(UbError) as refusal:
        validate_config({**CONFIG, "batch": {**CONFIG["batch"],
                                             "sampling": ["normalize_per_env"]}}, "own.yaml")
    assert str(refusal.value) == (
        "invalid config own.yaml: batch.sampling: [normalize_per_env] makes the batch's "
        f"advantages, and learner.algorithm {ALGORITHM!r} reads its returns (each decision's "
        "reward after the final and step stages), not its advantages: set batch.sampling: [] "
        "(the algorithm makes its own advantages)")


def test_ones_own_seat_is_trained_against_and_evaluated_against(run):
    """The seat of one's own, named by its path alone, sat in training games (as the fixed
    opponent, in both seats) and in the evaluations of checkpoints 0 and 2, where the random
    player in the checkpoint's seats was measured too (the seat needs neither the engine nor
    the network); every one of its moves was the position's first legal move."""
    moves = query(run.root, "SELECT seat, action, legal_moves, actor_kind, checkpoint FROM "
                            f"steps WHERE actor = '{SEAT}'").to_pylist()
    assert {m["seat"] for m in moves} == {0, 1}
    assert all(m["action"] == m["legal_moves"][0] and m["actor_kind"] == "own"
               and m["checkpoint"] is None for m in moves)
    from ub.run.folder.views import RunViews

    evals = sorted(RunViews(run.root).evals().to_pylist(),
                   key=lambda e: (e["update"], e["env_id"]))
    assert [(e["update"], e["env_id"], e["opponent"], e["games"]) for e in evals] == [
        (update, env, SEAT, EVAL_GAMES) for update in (0, 2) for env in sorted(ENVS)]
    assert all(e["baseline_win_rate"] is not None for e in evals)


def test_ub_play_seats_ones_own_actor_by_its_path(tmp_path):
    """``ub play`` with the seat against random: no engine (neither needs one), a shard whose
    every move of the seat is the first legal move."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-m", "ub.flows.cli", "play", "--env", "TicTacToe-v0-train",
         "--players", f"{SEAT},random", "--games", "4", "--out", str(tmp_path / "play")],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    moves = query(tmp_path / "play", "SELECT action, legal_moves FROM steps WHERE actor = "
                                     f"'{SEAT}'").to_pylist()
    assert moves and all(m["action"] == m["legal_moves"][0] for m in moves)


def test_an_actor_path_that_names_no_actor_is_refused_in_one_line():
    with pytest.raises(UbError) as refusal:
        validate_config({**CONFIG, "eval": {**CONFIG["eval"],
                                            "opponents": ["own_components:NotATransform"]}},
                        "own.yaml")
    assert str(refusal.value) == (
        "invalid config own.yaml: eval.opponents: actor 'own_components:NotATransform' does not "
        "subclass ub.actors.Actor: make it a subclass (docs/pool.md)")


def test_a_game_of_ones_own_trains_masked_to_its_rules_legal_moves(run):
    """TakeAway, a TextArena env registered by tests/own_game.py and named by its rules' path
    alone: the model's every move in it was masked to the rules' legal moves, and every
    decision is keyed by the rules' position (the pile and the seat to move)."""
    steps = query(run.root, "SELECT actor_kind, action, legal_moves, legal_moves_mode, "
                            "invalid_move, position FROM steps WHERE env_id = "
                            f"'{ENVS[1]}'").to_pylist()
    model = [s for s in steps if s["actor_kind"] == "model"]
    assert model and all(s["legal_moves_mode"] == "mask" and s["action"] in s["legal_moves"]
                         and not s["invalid_move"] for s in model)
    assert all(re.fullmatch(r"\d+ p[01]", s["position"]) for s in steps)
    assert any(s["position"].startswith(f"{own_game.PILE} p") for s in steps)  # (full pile)


def test_a_game_keyed_by_ones_own_position_function(run):
    """Every decision's position is the function's key of the board its seat faced (the
    cells the earlier moves filled)."""
    steps = query(run.root, "SELECT game_id, turn, seat, action, position FROM steps "
                            f"WHERE env_id = '{ENVS[0]}' ORDER BY game_id, turn").to_pylist()
    assert len(steps) > GAMES // 2 * 4
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
    source, game_source = (hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest()
                           for module in (own_components, own_game))
    assert components == {
        "learner.algorithm": ALGORITHM,
        "batch.final": ["ub.rewards.final:WinDrawLoss", FINAL],
        "batch.step": [STEP],
        "batch.sampling": [],
        "envs.position": {ENVS[0]: POSITION},
        "envs.rules": {ENVS[1]: RULES},
        "actors": [SEAT],
        "sources": {"own_components": source, "own_game": game_source},
    }


def test_a_resume_takes_the_same_classes_and_refuses_others(run):
    config, _ = resolve_run_config(run, None)
    assert algorithm_class(config.learner.algorithm) is own_components.EnvBaseline
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
    manifest = json.loads(copy.manifest(1).read_text())  # (the last round's)
    manifest["components"]["sources"]["own_components"] = "0" * 64  # as an older file had it
    copy.manifest(1).write_text(json.dumps(manifest))
    (note,) = preflight(RunRequest(name="own", root=str(tmp_path))).notes
    assert note.startswith("own_components changed since round 2 recorded it (sha256 "
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
        # the algorithm, two transforms, the position function, the game's rules and the seat
        # (an opponent, an eval opponent)
        assert len(notes) == 7
        assert "problem" not in done.stdout and "quarantined" not in done.stdout
        assert "own: 2 committed round(s), ok" in done.stdout
    assert not (run.root / "quarantine").exists()


def test_a_loss_only_algorithms_statistics_answer_in_the_learner_view(tiny_model, tmp_path,
                                                                      capsys):
    """AsymmetricClip declares nothing but its loss: the statistics that loss returns reach the
    round manifest (as a round makes it from the update's metrics) and answer in ``ub sql``'s
    learner view (one update of a random model, in this process)."""
    from ub.flows.cli import main
    from ub.learner import Learner, LearnerConfig
    from ub.learner.testing import build_random_model, synthetic_batch
    from ub.model.lora import LoraSettings
    from ub.run.steps.manifest import round_manifest
    from ub.run.steps.rounds import Run, commit_round, open_run

    loss_only = "own_components:AsymmetricClip"
    learner = Learner(LearnerConfig(
        base_model=str(build_random_model(tmp_path / "model")), algorithm=loss_only,
        lora=LoraSettings(rank=8, alpha=16), minibatches=2, length_normalizer=16, seed=3))
    metrics = learner.update(synthetic_batch(8, vocab_size=500, seed=1))
    assert metrics["algorithm_statistics"] == ["clip_high_fraction", "clip_low_fraction"]
    paths = RunPaths.of(tmp_path, "loss-only")
    config = open_run(paths, validate_config({**CONFIG, "learner": {
        **CONFIG["learner"], "algorithm": loss_only, "algorithm_params": {}}}))
    run = Run(paths, config, "tiny")
    commit_round(run, 0, round_manifest(run, [], metrics, {}, [], 1.0, {}))
    assert main(["sql", str(paths.root), "SELECT round, clip_low_fraction, clip_high_fraction "
                 "FROM learner", "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == [
        "round,clip_low_fraction,clip_high_fraction",
        f"0,{metrics['clip_low_fraction']},{metrics['clip_high_fraction']}"]


def test_its_statistic_is_reduced_as_it_declares(tmp_path):
    """EnvBaseline declares ``baseline_mse`` a per-row figure (reduction ``row``): the update
    reports the mean over the step's rows of (baseline - return)**2, whatever micro-batches
    the rows were cut into (not a sum over them, nor a mean per completion token, ub's
    default), and an update of several optimizer steps the mean of its steps' figures. Worked
    out here from the returns and the baseline the learner holds between updates (one update
    of a random model in this process; the run's figures are these over its real batches)."""
    import pyarrow as pa

    from ub.learner import Learner, LearnerConfig
    from ub.learner.testing import build_random_model, synthetic_batch
    from ub.model.lora import LoraSettings

    model = build_random_model(tmp_path / "model")
    batch = synthetic_batch(12, vocab_size=500, seed=2, prompt_lengths=(20, 40),
                            completion_lengths=(4, 12))
    batch.rows = pa.table({"env_id": ["TicTacToe-v0-train"] * len(batch)})
    returns = batch.returns.double()

    def learner(epochs: int) -> Learner:
        return Learner(LearnerConfig(
            base_model=str(model), algorithm=ALGORITHM,
            algorithm_params={"envs": ["TicTacToe-v0-train"], "learning_rate": 0.1},
            lora=LoraSettings(rank=4, alpha=8), epochs=epochs, length_normalizer=16,
            micro_batch_tokens=128, seed=3))

    def per_row(baseline: float) -> float:
        return float(((baseline - returns) ** 2).mean())

    one = learner(1)
    first = one.update(batch)
    assert first["micro_batches"] > 2 and first["optimizer_steps"] == 1
    assert first[OWN_STATISTIC] == pytest.approx(per_row(0.0), rel=1e-6)  # (it starts at 0)
    learned = float(one.algorithm.baselines.values.detach()[0])
    assert learned != 0.0
    second = one.update(batch)
    assert second[OWN_STATISTIC] == pytest.approx(per_row(learned), rel=1e-6)
    # Two steps over the same rows: the first step's figure and the second's, averaged.
    both = learner(2).update(batch)
    assert both["optimizer_steps"] == 2
    assert both[OWN_STATISTIC] == pytest.approx((per_row(0.0) + per_row(learned)) / 2,
                                                rel=1e-6)


def test_a_run_written_before_reads_with_its_statistics_as_columns(tmp_path, capsys):
    """Manifests of an older ub (its closed list of learner figures, ppo's among them) and of
    this one (an algorithm's own statistic) read side by side: a column each, typed."""
    from ub.flows.cli import main
    from ub.run.folder.layout import mark_run_format, write_json_atomic

    paths = RunPaths.of(tmp_path, "old")
    paths.root.mkdir(parents=True)
    mark_run_format(paths.root)
    write_json_atomic(paths.manifest(0), {"round": 0, "learner": {
        "update": 1, "loss": 0.5, "clip_fraction": 0.25, "ratio_mean": 1.0, "reused": False}})
    write_json_atomic(paths.manifest(1), {"round": 1, "learner": {
        "update": 2, "loss": 0.25, "baseline_mse": 0.125, "early_stopped": True}})
    assert main(["sql", str(paths.root), "SELECT round, update, loss, clip_fraction, "
                 "baseline_mse, early_stopped FROM learner ORDER BY round", "--format",
                 "csv"]) == 0
    assert capsys.readouterr().out.split() == [
        "round,update,loss,clip_fraction,baseline_mse,early_stopped",
        "0,1,0.5,0.25,,", "1,2,0.25,,0.125,True"]


# A module of one's own that ends or stops the process while it is imported, and what ub says.
ENDS_AT_IMPORT = [
    ("sys.exit(0)", "it called sys.exit(0) at import"),
    # (sys.exit() itself: wandb.init, run earlier in the same test process, replaces sys.exit
    # with one whose default code is 0)
    ("raise SystemExit", "it called sys.exit() at import"),
    ("raise GeneratorExit('stopped')", "it raised GeneratorExit at import: stopped"),
]


@pytest.mark.parametrize(("option", "code_and_problem"),
                         itertools.product(("--players", "--rules"), ENDS_AT_IMPORT),
                         ids=lambda value: value if isinstance(value, str) else value[0])
def test_a_component_whose_module_ends_the_process_at_import_is_refused_in_one_line(
        option, code_and_problem, tmp_path, monkeypatch, capsys):
    """Issue 76: SystemExit (and any BaseException but Ctrl-C's) raised while one's own
    module is imported escaped ``except Exception``: ``ub play`` ended with its code (0), no
    message, nothing written. Now it is the one line every failed import gets, exit 2."""
    from ub.cli import play
    from ub.cli.parser import build_parser
    from ub.cli.parser import run as run_command

    code, problem = code_and_problem
    # (a name of its own per case: importing the same name again would take the first file)
    module = f"ends_{option.strip('-')}_{ENDS_AT_IMPORT.index(code_and_problem)}"
    (tmp_path / f"{module}.py").write_text(f"import sys\n\n{code}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    component = {"--players": ["--players", f"{module}:Seat,random"],
                 "--rules": ["--rules", f"{module}:Rules"]}[option]
    argv = ["play", "--env", "TicTacToe-v0-train", *component, "--out", str(out)]
    assert run_command(build_parser([play]), argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    what = {"--players": "actor", "--rules": "game rules"}[option]
    assert line.startswith("ub: error:")
    assert f"{what} '{module}:" in line and f"importing {module} failed ({problem})" in line
    assert not out.exists()


def test_ctrl_c_while_a_component_is_imported_stays_an_interrupt(tmp_path, monkeypatch):
    (tmp_path / "interrupted_at_import.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        load_class("interrupted_at_import:Seat", object, "actor", "docs/pool.md")
