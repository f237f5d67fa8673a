"""What the read-only commands read of a folder of runs (issue 76): `ub sql`, `ub report`,
`ub compare` and `ub dashboard --once` follow no link inside a run or a folder of runs (each is
skipped, with a warning naming it, and its target never shows), skip a run folder whose name
holds a newline, keep a run whose config is damaged out of the `runs` view's comparison, and
show the evaluation shards as `eval_*` and the training shards as `steps`/`games`.

The runs are made here as ub writes them, without training: real shards (the session's
`rollout` fixture, its first games the evaluation's, the rest training's), a round's manifest,
ratings, metrics, a checkpoint's record, benchmark and exploitability rows, a log."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from ub.data.shards import ShardId, write_shard
from ub.flows.cli import main
from ub.run.folder.sweep import sweep_tables
from ub.run.folder.views import BENCHMARKS_SCHEMA, EXPLOITABILITY_SCHEMA, METRICS_SCHEMA

ENV = "TicTacToe-v0-train"
EVAL_GAMES = 12
"""Of the rollout fixture's 30 games, the first 12 are a run's evaluation games, the other 18
its training games."""
SECRET = "S3CR3T"
"""In every file of the private run, which links in the sweep point at: it never shows."""
RUNS = ["a-s1", "a-s2", "b-s1", "b-s2"]  # two arms (a learning rate) over seeds 1 and 2


def _games_of(rollout, ids: list[str], run: str) -> tuple[pa.Table, pa.Table]:
    """The rollout's steps and games of the games ``ids``, as run ``run`` played them."""
    parts = []
    for table in (rollout.steps, rollout.games):
        part = table.filter(pc.is_in(table["game_id"], pa.array(ids)))
        parts.append(part.set_column(part.schema.get_field_index("run"), "run",
                                     pa.array([run] * part.num_rows, pa.string())))
    return parts[0], parts[1]


def make_run(root: Path, rollout, *, seed: int, rate: float, tag: str,
             config: dict | None = None) -> Path:
    """A run of one committed round, evaluated at checkpoint 1, every record of it holding
    ``tag`` (its shards' run column, the evaluated actor, a rated member, ...)."""
    ids = rollout.games["game_id"].to_pylist()
    write_shard(root, ShardId(0, 0), tag, *_games_of(rollout, ids[EVAL_GAMES:], tag))
    write_shard(root / "eval", ShardId(1, 0), tag, *_games_of(rollout, ids[:EVAL_GAMES], tag))
    (root / "config.yaml").write_text(yaml.safe_dump({
        "seed": seed, "rounds": 1, "model": {"base": "tiny"},
        "envs": [{"env_id": ENV, "weight": 1.0}], "learner": {"learning_rate": rate},
        **(config or {})}))
    wins = 3 + seed + int(rate * 1000)
    files = {
        "ub-run.json": {"format": 2, "ub_version": tag},
        "rounds/round-000000.json": {
            "games": len(ids) - EVAL_GAMES, "copies": 0, "decisions": 40,
            "model_decisions": 20, "invalid_moves": 1, "generated_tokens": 200,
            "learner": {"update": 1, "loss": 0.5, "grad_norm": 1.0, "tokens": 100},
            "batch": {"size": 8, "total_tokens": 100, "truncated": 0, "reward_mean": 0.1,
                      "advantage_std": 1.0},
            "evals": {"1": [{"actor": tag, "env_id": ENV, "opponent": "random",
                             "games": EVAL_GAMES, "wins": wins, "draws": 0,
                             "losses": EVAL_GAMES - wins, "errors": 0,
                             "win_rate": wins / EVAL_GAMES, "win_low": 0.1, "win_high": 0.9,
                             "invalid_move_rate": 0.0, "format_rate": 1.0,
                             "legal_moves": "mask"}]},
            "timings": {"round": 10.0, "rollout": 5.0, "eval": 2.0, "learner": 2.0,
                        "other": 1.0}},
        "ratings/round-000000.json": {"members": [
            {"name": tag, "kind": "checkpoint", "parent": None, "mu": 25.0, "sigma": 2.0,
             "games": 4, "rated_games": 4, "wins": 2, "draws": 0, "losses": 2}],
            "matches": {}},
        "checkpoints/ckpt-000001/ub_checkpoint.json": {},
        "checkpoints/ckpt-000001/metrics.json": {"from_checkpoint": tag, "loss": 0.5,
                                                 "grad_norm": 1.0},
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(json.dumps(data))
    rows = {
        "metrics/round-000000.parquet": (METRICS_SCHEMA, {
            "round": 0, "metric": f"collection/{tag}/{ENV}", "value": 1.0}),
        f"benchmarks/ckpt-000001/{tag}.parquet": (BENCHMARKS_SCHEMA, {
            "checkpoint": 1, "benchmark": tag, "task": tag, "metric": "acc", "value": 0.5,
            "stderr": 0.1, "n": 10}),
        f"exploitability/ckpt-000001/{ENV}.parquet": (EXPLOITABILITY_SCHEMA, {
            "update": 1, "env_id": ENV, "policy": "greedy", "legal_moves": "mask",
            "temperature": 0.0, "unit": "game", "nash_conv": 1.0, "nash_conv_low": 1.0,
            "nash_conv_high": 1.0, "exact": True, "random_nash_conv": 1.5,
            "line_seat0": tag}),
    }
    for name, (schema, row) in rows.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([row], schema=schema), root / name)
    (root / "logs").mkdir()
    (root / "logs" / "flow.log").write_text(f"2026-01-01 00:00:00,000 INFO ub.flow {tag}\n")
    return root


@pytest.fixture()
def sweep(tmp_path, rollout) -> Path:
    """A folder of four runs, and beside it (not in it) a private run whose every file holds
    :data:`SECRET`, its config a reader's private settings (``~/.docker/config.json``'s)."""
    folder = tmp_path / "sw"
    for name in RUNS:
        make_run(folder / name, rollout, seed=int(name[-1]), tag=name,
                 rate=0.001 if name.startswith("a") else 0.002)
    private = make_run(tmp_path / "private" / "run", rollout, seed=2, rate=0.002, tag=SECRET,
                       config={"auths": {"registry.example": {"auth": SECRET}}})
    (private / "ub-run.json").write_text(json.dumps({"format": 99, "ub_version": SECRET}))
    return folder


def csv(capsys, *argv: str) -> list[str]:
    assert main([*argv, "--format", "csv"]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


def test_over_a_folder_eval_views_hold_the_evaluation_games_and_the_others_the_training_games(
        sweep, capsys):
    """Each run's rows of a folder's shard views are exactly its own `ub sql RUN` rows: the
    evaluation games in `eval_games`/`eval_steps`, the training games in `games`/`steps`."""
    for table, games in (("games", 30 - EVAL_GAMES), ("eval_games", EVAL_GAMES),
                         ("steps", None), ("eval_steps", None)):
        query = f"SELECT run, game_id, count(*) AS n FROM {table} GROUP BY ALL ORDER BY ALL"
        together = csv(capsys, "sql", str(sweep), query)[1:]
        for name in RUNS:
            alone = csv(capsys, "sql", str(sweep / name), query)[1:]
            assert [line for line in together if line.startswith(f"{name},")] == alone
            if games is not None:
                assert len(alone) == games, (table, name)
    ids = set(csv(capsys, "sql", str(sweep), "SELECT DISTINCT game_id FROM games")[1:])
    eval_ids = set(csv(capsys, "sql", str(sweep), "SELECT DISTINCT game_id FROM eval_games")[1:])
    assert len(ids) == 30 - EVAL_GAMES and len(eval_ids) == EVAL_GAMES and not ids & eval_ids


# --- links -------------------------------------------------------------------------------

FOLDER_COMMANDS = {"sql", "compare", "report"}
"""The commands over the whole folder (`ub sql FOLDER`, `ub compare`, `ub report FOLDER`): each
reads every part of every run but its logs."""


def _link(at: Path, to: Path) -> Path:
    """``at`` (a file or folder of the sweep) replaced by a link to ``to``."""
    if at.is_dir() and not at.is_symlink():
        shutil.rmtree(at)
    else:
        at.unlink(missing_ok=True)
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(to)
    return at


# a link's place in run b-s2 (and the same place in the private run, its target), and the
# commands besides FOLDER_COMMANDS that read that place of one run
LINKS: dict[str, tuple[str, set[str]]] = {
    "config.yaml": ("config.yaml", {"report-run", "dashboard"}),
    "the run format marker": ("ub-run.json", {"sql-run", "report-run", "dashboard"}),
    "the rounds folder": ("rounds", {"sql-run", "report-run", "dashboard"}),
    "a round's manifest": ("rounds/round-000000.json", {"sql-run", "report-run", "dashboard"}),
    "a rating snapshot": ("ratings/round-000000.json", {"sql-run", "report-run", "dashboard"}),
    "a metrics file": ("metrics/round-000000.parquet", {"sql-run", "report-run", "dashboard"}),
    "a benchmark's folder": ("benchmarks/ckpt-000001", {"sql-run", "report-run"}),
    "an exploitability file": (f"exploitability/ckpt-000001/{ENV}.parquet",
                               {"sql-run", "report-run"}),
    "a checkpoint's folder": ("checkpoints/ckpt-000001", {"sql-run", "report-run"}),
    "a games shard": ("games/round-000000/shard-0000.parquet",
                      {"sql-run", "report-run", "dashboard"}),
    "a steps shard": ("steps/round-000000/shard-0000.parquet", {"sql-run"}),
    "a shard folder": ("games/round-000000", {"sql-run", "report-run", "dashboard"}),
    "the eval folder": ("eval", {"sql-run"}),
}


# Which run of the sweep each place is linked in: a linked folder is never listed, so nothing
# inside it is reached (a shard folder's shard, the rounds folder's manifest); a run with no
# round left is no report's (it stops before its config and its shards are read); a shard's
# steps are looked at only beside its games.
LINKED_IN = {
    "the rounds folder": "b-s2", "a benchmark's folder": "b-s2", "a checkpoint's folder": "b-s2",
    "the eval folder": "b-s2", "the run format marker": "b-s2", "a shard folder": "b-s1",
    "a round's manifest": "a-s2", "a rating snapshot": "a-s2", "a metrics file": "a-s2",
    "an exploitability file": "a-s2", "a games shard": "a-s2",
    "config.yaml": "a-s1", "a steps shard": "a-s1",
}


def _outputs(capsys, tmp_path: Path, folder: Path, run: Path | None) -> dict[str, str]:
    """What each read-only command shows of ``folder`` (and of its run ``run``): its output,
    its warnings and the report's page."""
    views = ["steps", "games", "eval_steps", "eval_games", "evals", "ratings", "checkpoints",
             "learner", "rounds", "metrics", "benchmarks", "exploitability"]

    def shown(argv: list[str], page: Path | None = None) -> str:
        main(argv)
        out = capsys.readouterr()
        return out.out + out.err + (page.read_text() if page and page.exists() else "")

    outputs = {
        "sql": "".join(shown(["sql", str(folder), f"SELECT * FROM {view}", "--format", "csv"])
                       for view in [*views, "runs"]),
        "compare": shown(["compare", str(folder), "--checkpoint", "1"]),
        "report": shown(["report", str(folder), "--out", str(tmp_path / "folder-report")],
                        tmp_path / "folder-report" / "report.html"),
    }
    if run is not None:
        outputs |= {
            "sql-run": "".join(shown(["sql", str(run), f"SELECT * FROM {view}", "--format",
                                      "csv"]) for view in views),
            "report-run": shown(["report", str(run), "--out", str(tmp_path / f"{run.name}-report")],
                                tmp_path / f"{run.name}-report" / "report.html"),
            "dashboard": shown(["dashboard", str(run), "--once"]),
        }
    return outputs


def test_a_link_inside_a_run_is_skipped_named_and_its_target_never_shown(
        sweep, tmp_path, capsys, monkeypatch):
    """Someone who can write a shared sweep folder links parts of a run to files of the
    reader's (here: the private run's, every file of it holding SECRET): no command shows
    what a link leads to, and each that would have read it names it in a warning. Every place
    at once, spread over three runs so that no link hides another from a command that reads
    it (:data:`LINKED_IN`), and each command runs once per run rather than once per place (a
    report draws its figures)."""
    monkeypatch.setenv("COLUMNS", "1000")  # (the dashboard's lines whole, not wrapped)
    links = {place: _link(sweep / LINKED_IN[place] / where,
                          tmp_path / "private" / "run" / where)
             for place, (where, _) in LINKS.items()}
    for run in sorted(set(LINKED_IN.values())):
        outputs = _outputs(capsys, tmp_path, sweep, sweep / run)
        for command, output in outputs.items():
            assert SECRET not in output, (run, command, output[-3000:])
        for place, (_, readers) in LINKS.items():
            for command, output in outputs.items():
                if command in FOLDER_COMMANDS or (command in readers and run == LINKED_IN[place]):
                    assert f"skipped {links[place]}: a link" in output, (place, command,
                                                                         output[-3000:])


def test_a_run_folder_that_is_a_link_is_no_run_of_the_folder(sweep, tmp_path, capsys):
    link = _link(sweep / "evil", tmp_path / "private" / "run")
    for command, output in _outputs(capsys, tmp_path, sweep, None).items():
        assert SECRET not in output, (command, output[-3000:])
        assert f"skipped {link}: a link" in output, (command, output[-3000:])
    assert csv(capsys, "sql", str(sweep), "SELECT run FROM runs ORDER BY run")[1:] == RUNS


def test_a_log_that_is_a_link_is_not_the_dashboards_activity(sweep, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    link = _link(sweep / "b-s2" / "logs" / "flow.log",
                 tmp_path / "private" / "run" / "logs" / "flow.log")
    assert main(["dashboard", str(sweep / "b-s2"), "--once"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out and f"skipped {link}: a link" in out


def test_a_runs_root_or_a_run_named_through_a_link_is_read(sweep, tmp_path, capsys):
    """The path a command is given is its user's choice (`runs -> /data/runs`): a link there,
    or above it, is followed; only links inside what it names are not."""
    query = "SELECT run, count(*) AS n FROM eval_games GROUP BY run ORDER BY run"
    direct = csv(capsys, "sql", str(sweep), query)
    (tmp_path / "runs").symlink_to(sweep)
    assert csv(capsys, "sql", str(tmp_path / "runs"), query) == direct
    assert capsys.readouterr().err == ""
    (tmp_path / "one").symlink_to(sweep / "a-s1")
    assert csv(capsys, "sql", str(tmp_path / "one"), query) == [direct[0], direct[1]]
    assert csv(capsys, "sql", "a-s1", "--root", str(tmp_path / "runs"), query) == \
        [direct[0], direct[1]]


def test_ub_report_writes_no_file_through_a_link_in_a_run(sweep, tmp_path, capsys):
    """A link where the report's page or a figure goes is replaced, never written through (it
    overwrote the file it named: a reader's ~/.bashrc); a linked report folder is refused."""
    run = sweep / "a-s1"
    victim = tmp_path / "victim.txt"
    victim.write_text("the reader's own file\n")
    (run / "report").mkdir()
    for name in ("report.html", "learning_curve.png"):
        (run / "report" / name).symlink_to(victim)
    assert main(["report", str(run)]) == 0, capsys.readouterr().err
    assert victim.read_text() == "the reader's own file\n"
    for name in ("report.html", "learning_curve.png"):
        assert not (run / "report" / name).is_symlink(), name
    assert "<title>ub report: a-s1</title>" in (run / "report" / "report.html").read_text()

    shutil.rmtree(run / "report")
    theirs = tmp_path / "readers-folder"
    theirs.mkdir()
    (run / "report").symlink_to(theirs)
    capsys.readouterr()
    assert main(["report", str(run)]) == 2
    assert f"{run / 'report'} is a link" in capsys.readouterr().err
    assert list(theirs.iterdir()) == []


# --- names ------------------------------------------------------------------------------


def test_a_run_folder_whose_name_holds_a_newline_is_skipped_with_its_name_escaped(
        sweep, capsys):
    """`ub sql FOLDER`'s table drew such a name on two lines: a row that no run has."""
    forged = sweep / "x\nb-s9"
    shutil.copytree(sweep / "b-s2", forged)
    assert main(["sql", str(sweep), "SELECT run FROM runs ORDER BY run"]) == 0
    out, err = capsys.readouterr()
    assert [line.split("│")[1].strip() for line in out.splitlines()
            if line.startswith("│")] == RUNS, out
    assert f"skipped {str(forged)!r}: its name holds a character that is not printable" in err
    assert all(line.startswith("ub: warning: ") for line in err.splitlines()), err


# --- damaged configs ---------------------------------------------------------------------

DAMAGED_CONFIGS: dict[str, tuple[str, str]] = {  # config.yaml's text, what the warning says
    "not YAML": (": : [bad\n", "not YAML"),
    "no mapping": ("- seed\n- 1\n", "not a mapping"),
    "a seed of the wrong type": ("seed: [1, 2]\n", "its seed is [1, 2], not a whole number"),
    "rounds of the wrong type": ("seed: 2\nrounds: many\n", 'its rounds is "many"'),
    "envs of the wrong type": ("seed: 2\nenvs: TicTacToe-v0\n", 'its envs are "TicTacToe-v0"'),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_CONFIGS))
def test_a_run_whose_config_is_damaged_has_no_settings_and_the_others_still_differ_in_one(
        sweep, capsys, damage):
    """One damaged config made every setting of every run count as differing (105 of them),
    silently: now it is named, its run has no settings and no seed, and the other runs
    differ in their learning rate alone."""
    text, said = DAMAGED_CONFIGS[damage]
    config = sweep / "b-s2" / "config.yaml"
    config.write_text(text)
    tables, warnings = sweep_tables(sweep)
    assert [w for w in warnings if str(config) in w and said in w], warnings
    runs = {r["run"]: r for r in tables["runs"].to_pylist()}
    assert (runs["b-s2"]["settings"], runs["b-s2"]["seed"]) == (None, None)
    for name in ("a-s1", "a-s2", "b-s1"):
        assert runs[name]["settings"] == [
            ("learner.learning_rate", "0.001" if name.startswith("a") else "0.002")]
        assert runs[name]["seed"] == int(name[-1])
    got = csv(capsys, "sql", str(sweep), "SELECT run, cardinality(settings) FROM runs "
              "ORDER BY run")
    assert got[1:] == ["a-s1,1", "a-s2,1", "b-s1,1", "b-s2,"]

