"""A sweep's runs together (issue 70): `ub sweep` trains arms over seeds as a Prefect flow
that a SIGKILL does not lose, `ub sql` reads a folder of runs as one, `ub compare` pairs the
arms by seed, and every command names a run one way, by its name under `--root` or by its
folder; `ub.analysis` opens them from Python as the commands do (docs/sql.md's analysis). Two
arms (a learning rate) of two seeds, one round each; plain DuckDB over the runs' files and a run
trained alone are the references."""

from __future__ import annotations

import csv as csv_module
import json
import math
import os
import re
import signal
from pathlib import Path

import duckdb
import pytest
import yaml
from faults.runs import differences
from float_rounding import sum_rounding
from warm import run_ub

import ub.analysis
from ub.errors import UbError
from ub.flows.cli import main
from ub.run.folder.layout import RunPaths

CONFIG = {
    "rounds": 1,
    "model": {"base": "tiny"},
    "sampling": {"temperature": 1.0, "max_tokens": 12, "stop": ["]"]},
    "envs": [{"env_id": "TicTacToe-v0-train"}],
    "rollout": {"games_per_round": 6, "concurrency": 8},
    "opponents": [{"mode": "mirror", "weight": 1.0}],
    "batch": {"batch_size": 24},
    "learner": {"learning_rate": 1e-3, "lora": {"rank": 8, "alpha": 16}},
    "eval": {"every": 1, "games": 4, "opponents": ["random"]},
}
ARMS = ["--arm", "lr1", "--arm", "lr2", "learner.learning_rate=0.002"]
RUNS = ["lr1-s1", "lr1-s2", "lr2-s1", "lr2-s2"]  # (by name; they ran seed by seed)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep-config") / "sweep.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture(scope="module")
def runs(prefect_api, tiny_model, config_file, tmp_path_factory):
    """The sweep's folder, killed (SIGKILL) at the commit of its third run and started again."""
    root = tmp_path_factory.mktemp("sweep") / "runs"
    argv = ["sweep", str(config_file), *ARMS, "--seeds", "1-2", "--root", str(root), "--quiet"]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("UB_FAULT")},
           "PREFECT_API_URL": prefect_api}
    killed = run_ub(argv, env={**env, "UB_FAULT_AT": "round.before-commit:3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # Seed 1's arms done, seed 2's first one cut (arm by arm, lr1-s2 would be done and lr2-s1
    # cut: the same three folders).
    assert {p.name: len(RunPaths(p).committed_rounds()) for p in root.iterdir()
            if p.name != ".prefect"} == {"lr1-s1": 1, "lr2-s1": 1, "lr1-s2": 0}
    again = run_ub(argv, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"4 runs under {root}: `ub compare {root}` compares the arms" in again.stdout
    return root


def test_a_sweep_killed_mid_run_and_started_again_loses_nothing(runs, config_file,
                                                               tmp_path):
    """The run the kill cut (lr1-s2: `runs` checks it is the one) equals the same run trained
    alone, uninterrupted."""
    from ub.flows.selfplay import selfplay

    selfplay(run_name="lr1-s2", config=str(config_file), root=str(tmp_path),
             overrides=["seed=2"], quiet=True)
    assert differences(runs / "lr1-s2", tmp_path / "lr1-s2") == []
    for name in RUNS:
        assert main(["doctor", str(runs / name)]) == 0


def csv(capsys, *argv: str) -> list[str]:
    assert main([*argv, "--format", "csv"]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


def test_ub_sql_over_a_folder_of_runs_agrees_with_plain_duckdb(runs, capsys):
    plain = duckdb.sql(f"SELECT run, count(*) AS games, sum(num_turns) AS turns FROM "
                       f"read_parquet('{runs}/*/games/*/*.parquet') GROUP BY run ORDER BY run"
                       ).fetchall()
    assert [row[0] for row in plain] == RUNS
    got = csv(capsys, "sql", str(runs), "SELECT run, count(*) AS games, sum(num_turns) AS turns "
              "FROM games GROUP BY run ORDER BY run")
    assert got[1:] == [",".join(map(str, row)) for row in plain]
    # A record view has the run's name first, and each run's rows are its own `ub sql` rows.
    together = csv(capsys, "sql", str(runs), "SELECT * FROM evals ORDER BY run, update")
    assert together[0].startswith("run,update,round,")
    for name in RUNS:
        alone = csv(capsys, "sql", str(runs / name), "SELECT * FROM evals ORDER BY update")
        assert [line.split(",", 1)[1] for line in together[1:] if line.startswith(f"{name},")] \
            == alone[1:]


def test_the_runs_view_says_how_the_runs_differ(runs, capsys):
    got = csv(capsys, "sql", str(runs), "SELECT run, arm, seed, rounds, "
              "settings['learner.learning_rate'] AS rate, cardinality(settings) AS differ "
              "FROM runs ORDER BY run")
    assert got[1:] == ["lr1-s1,lr1,1,1,0.001,1", "lr1-s2,lr1,2,1,0.001,1",
                       "lr2-s1,lr2,1,1,0.002,1", "lr2-s2,lr2,2,1,0.002,1"]


def test_ub_compare_pairs_the_arms_by_seed(runs, capsys):
    """Each arm's mean over its seeds and the second arm less the first, seed by seed, as
    worked out here from the runs' evaluations (`ub sql`'s evals view, checked above)."""
    evals = csv(capsys, "sql", str(runs), "SELECT run, win_rate FROM evals WHERE update = 1 "
                "ORDER BY run")
    rate = {line.split(",")[0]: float(line.split(",")[1]) for line in evals[1:]}
    header, *rows = csv_module.reader(csv(capsys, "compare", str(runs)))
    assert header == ["checkpoint", "figure", "arm", "moves", "seeds", "mean", "95% interval",
                      "clears random", "less the reference", "se", "seeds up", "settings"]
    lr1, lr2 = [dict(zip(header, row, strict=True)) for row in rows
                if row[1].startswith("TicTacToe-v0-train vs random")
                and row[1].endswith(": win rate")]
    # (the sweep's names for its arms, issue 78: "arm A" and "arm B" before)
    assert [(row["arm"], row["settings"]) for row in (lr1, lr2)] == [
        ("lr1", "learner.learning_rate=0.001"), ("lr2", "learner.learning_rate=0.002")]
    for arm, row in (("lr1", lr1), ("lr2", lr2)):
        assert row["checkpoint"] == "1" and row["seeds"] == "2"
        assert row["mean"] == f"{(rate[f'{arm}-s1'] + rate[f'{arm}-s2']) / 2:.3f}"
    assert (lr1["less the reference"], lr1["seeds up"]) == ("(reference)", "-")
    diffs = [rate["lr2-s1"] - rate["lr1-s1"], rate["lr2-s2"] - rate["lr1-s2"]]
    assert lr2["less the reference"] == f"{sum(diffs) / 2:+.3f}"
    assert lr2["seeds up"] == f"{sum(d > 0 for d in diffs)} of 2"
    # The reference by its name, exactly (a part of a name named 0 or 2 arms before), or by
    # its settings; the table says each arm's name and settings.
    header, *rows = csv_module.reader(csv(capsys, "compare", str(runs), "--reference", "lr2"))
    back = [rate["lr1-s1"] - rate["lr2-s1"], rate["lr1-s2"] - rate["lr2-s2"]]
    assert {row[2]: row[8] for row in rows if row[1] == lr1["figure"]} == {
        "lr1": f"{sum(back) / 2:+.3f}", "lr2": "(reference)"}
    assert main(["compare", str(runs), "--reference", "learner.learning_rate=0.002"]) == 0
    table = capsys.readouterr().out
    assert "arm lr1: learner.learning_rate=0.001\n" in table
    assert "arm lr2: learner.learning_rate=0.002 (the reference)\n" in table
    assert main(["compare", str(runs), "--reference", "lr"]) == 2
    assert capsys.readouterr().err == ("ub: error: --reference 'lr' is none of the arms: give "
                                       "one of lr1; lr2\n")


def test_a_run_is_named_by_its_name_under_root_or_by_its_folder(runs, capsys, monkeypatch):
    query = "SELECT count(*) AS n FROM games"
    by_path = csv(capsys, "sql", str(runs / "lr1-s1"), query)
    assert csv(capsys, "sql", "lr1-s1", query, "--root", str(runs)) == by_path
    monkeypatch.chdir(runs.parent)  # (the default --root, runs)
    assert csv(capsys, "sql", "lr1-s1", query) == by_path
    assert main(["doctor", "runs/lr1-s1"]) == 0 and main(["doctor", "lr1-s2"]) == 0
    capsys.readouterr()
    for argv in (["sql", "lr1-s3", query], ["doctor", "lr1-s3"],
                 ["dashboard", "runs/lr1-s3", "--once"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no run 'lr1-s3' under runs" in err, err
        assert "did you mean 'lr1-s2'? runs holds lr1-s1, lr1-s2, lr2-s1, lr2-s2" in err, err


def test_the_python_api_runs_docs_analysis_as_the_commands_do(runs, capsys, tmp_path,
                                                              monkeypatch, tiny_model):
    """docs/sql.md's worked analysis with `ub.analysis` (issue 78), run as written: the arms'
    means are `ub compare`'s, the run's checkpoints are `ub sql`'s, and checkpoint 0's
    probability of each move it played is what the sampler logged (vLLM there, transformers
    and PEFT here: equal to float32 rounding). A write is refused as `ub sql` refuses it; a
    folder of runs has no config of its own."""
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "lr").symlink_to(runs)  # (the docs' folder)
    monkeypatch.chdir(tmp_path)
    docs = (Path(__file__).parents[1] / "docs" / "sql.md").read_text()
    [code] = re.findall(r"## From Python.*?```python\n(.*?)```", docs, re.S)
    scope: dict = {}
    exec(compile(code, "docs/sql.md", "exec"), scope)
    capsys.readouterr()
    compared = {(row["arm"], row["mean"]) for row in csv_module.DictReader(
        csv(capsys, "compare", str(runs)))
        if row["figure"] == "TicTacToe-v0-train vs random: win rate"}
    assert {(a, f"{w:.3f}") for a, w in zip(scope["arms"]["arm"], scope["arms"]["win_rate"],
                                           strict=True)} == compared
    assert set(scope["arms"]["seeds"]) == {2}
    checkpoints = csv(capsys, "sql", "lr1-s1", "--root", "sweeps/lr",
                      "SELECT update FROM checkpoints ORDER BY update")
    with ub.analysis.open("lr1-s1", root="sweeps/lr") as run:
        assert run.kind == "run" and run.checkpoints == [int(c) for c in checkpoints[1:]]
        with pytest.raises(UbError, match="ub sql is read-only: CREATE statements are refused"):
            run.sql("CREATE TABLE t AS SELECT 1")
    # The log-probability: a softmax over the vocabulary and logits summed over the hidden size
    # in each of the tiny model's layers, in two orders (vLLM's kernels, torch's).
    shape = json.loads((tiny_model / "config.json").read_text())
    tolerance = sum_rounding(shape["vocab_size"] + shape["hidden_size"]
                             * (shape["num_hidden_layers"] + 1), 1.0)
    played = scope["played"]
    assert len(played) == 20
    for env_id, observation, legal_moves, action, logprobs in played:
        p = scope["policy"].move_probabilities(env_id, observation, legal_moves)[action]
        assert abs(math.log(p) - sum(logprobs)) <= tolerance, (action, p, logprobs)
    with (ub.analysis.open("sweeps/lr") as sweep,
          pytest.raises(UbError, match="is a folder of runs, not a run: its config belongs to "
                        "each run")):
        sweep.config  # noqa: B018
