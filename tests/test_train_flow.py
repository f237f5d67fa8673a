"""The self-play flow end to end: a real 2-round run of the tiny model under Prefect, resumed
with other execution settings and compared with the uninterrupted run. (A run SIGKILLed at
several points and resumed is tests/faults/test_kill_resume.py's, against the faults' own
reference run.)"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

import ub.progress_bar as progress_bar
import ub.run.steps.exploitability as exploitability_step
from ub.data.shards import committed_shards
from ub.data.sql import query
from ub.learner.checkpoint import is_checkpoint
from ub.run.folder.layout import RunPaths

# Small enough for the test suite, big enough to exercise every step: two envs, two rounds,
# evaluation of the first and last checkpoints; every game branches once (rollout.branch: 3
# copies at the learner's least sure decision), and the batch compares each point's moves.
TEST_CONFIG = {
    "seed": 7,
    "rounds": 2,
    "model": {"base": "tiny"},
    "sampling": {"temperature": 1.0, "max_tokens": 12, "stop": ["]"]},  # as tiny-cpu
    # Nim's moves held to the legal ones (legal_moves: mask), TicTacToe's free: a batch of both.
    "envs": [{"env_id": "TicTacToe-v0-train", "weight": 3},
             {"env_id": "Nim-v0-train", "legal_moves": "mask"}],
    "rollout": {"games_per_round": 8, "concurrency": 16,
                "branch": {"k": 4, "select": "surprisal"}},
    "opponents": [{"mode": "mirror", "weight": 1.0}],
    "batch": {"batch_size": 48, "sampling": [{"name": "state_baseline", "key": "branch"},
                                             "normalize_per_env"]},
    "learner": {"learning_rate": 1e-3, "lora": {"rank": 8, "alpha": 16}},
    "eval": {"every": 2, "games": 8, "opponents": ["random"], "envs": ["TicTacToe-v0-train"],
             "exploitability": {"enabled": True}},
}

GAME_COLUMNS = ["game_id", "env_id", "seed", "actors", "rewards", "outcome", "num_turns"]
COPIES = TEST_CONFIG["rollout"]["branch"]["k"] - 1  # per game (one branch point each)
GAMES = TEST_CONFIG["rollout"]["games_per_round"]
STEP_COLUMNS = ["game_id", "turn", "actor", "prompt_token_ids", "completion_token_ids",
                "completion_logprobs", "action", "invalid_move"]


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "small.yaml"
    path.write_text(yaml.safe_dump(TEST_CONFIG))
    return path


@pytest.fixture(scope="module")
def reference_run(prefect_api, config_file, tiny_model, tmp_path_factory) -> RunPaths:
    """An uninterrupted 2-round run, in this process."""
    from ub.flows.selfplay import selfplay

    root = tmp_path_factory.mktemp("runs")
    summary = selfplay(run_name="ref", config=str(config_file), root=str(root), quiet=True)
    assert summary["rounds"] == 2
    return RunPaths.of(root, "ref")


def _games(root: Path, kind: str = "", pattern: str = "shard-*.parquet") -> list[dict]:
    base = root / kind if kind else root
    files = sorted((base / "games").rglob(pattern))
    return [row for f in files for row in pq.read_table(f, columns=GAME_COLUMNS).to_pylist()]


def _steps(root: Path) -> list[dict]:
    files = sorted((root / "steps").rglob("shard-*.parquet"))
    return [row for f in files for row in pq.read_table(f, columns=STEP_COLUMNS).to_pylist()]


def test_two_rounds_commit_shards_checkpoints_ratings_and_evals(reference_run):
    paths = reference_run
    assert paths.committed_rounds() == [0, 1]
    assert [(s.round, s.shard) for s in committed_shards(paths.train_data)] == [(0, 0), (1, 0)]
    games = _games(paths.root)
    assert len(games) == 2 * TEST_CONFIG["rollout"]["games_per_round"] * (1 + COPIES)
    # Mirror self-play: the checkpoint of the round sits in every seat.
    assert {tuple(g["actors"]) for g in games} == {("ckpt-000000", "ckpt-000000"),
                                                  ("ckpt-000001", "ckpt-000001")}
    assert {g["env_id"] for g in games} == {"TicTacToe-v0-train", "Nim-v0-train"}
    for update in (0, 1, 2):
        assert is_checkpoint(paths.checkpoint(update))
    manifests = [json.loads(paths.manifest(r).read_text()) for r in (0, 1)]
    for round_, manifest in enumerate(manifests):
        _assert_manifest_counts_its_shards(paths, round_, manifest)
    # Checkpoints 0 and 2 were evaluated against the random player, seats balanced.
    assert set(manifests[0]["evals"]) == {"0"} and set(manifests[1]["evals"]) == {"2"}
    row = manifests[1]["evals"]["2"][0]
    assert row["opponent"] == "random" and row["games"] == 8
    assert row["wins"] + row["draws"] + row["losses"] + row["errors"] == 8
    assert 0.0 <= row["win_low"] <= row["win_rate"] <= row["win_high"] <= 1.0
    eval_games = _games(paths.root, "eval")
    assert len(eval_games) == 16
    seats = [g["actors"].index("ckpt-000002") for g in eval_games if "ckpt-000002" in g["actors"]]
    assert sorted(seats) == [0] * 4 + [1] * 4
    # sampling.stop ends every completion at its first "]", in training and evaluation alike.
    completions = [c for kind in ("", "eval") for f in sorted(
        (paths.root / kind / "steps").rglob("shard-*.parquet"))
        for c in pq.read_table(f, columns=["completion"])["completion"].to_pylist() if c]
    assert completions and all("]" not in c.rstrip()[:-1] for c in completions)
    assert any(c.rstrip().endswith("]") for c in completions)
    # The learner trained on round r's decisions of checkpoint r.
    learner = manifests[1]["learner"]
    assert learner["update"] == 2 and learner["tokens"] > 0
    # Each component kept its own log.
    logs = paths.root / "logs"
    assert (f"train shard 1/0 committed: {GAMES * (1 + COPIES)} games, {GAMES * COPIES} of them "
            "branch copies") in (logs / "rollout.log").read_text()
    assert "round 2: ckpt-000001 -> ckpt-000002" in (logs / "learner.log").read_text()
    assert "ckpt-000002 vs random on TicTacToe-v0-train: 8 games" in (
        logs / "eval.log").read_text()
    assert "ratings after round 1" in (logs / "pool.log").read_text()
    # Ratings are a function of the games: a rebuild from the shards equals each snapshot.
    from ub.run.steps.rate import rebuild_ratings
    from ub.run.steps.rounds import Run, resolve_run_config

    run = Run(paths, resolve_run_config(paths, None)[0], "unused")
    for round_ in (0, 1):
        assert rebuild_ratings(run, round_).snapshot() == json.loads(
            paths.ratings(round_).read_text())
    # Rated: the games played, not the copies made at branch points; and the eval games.
    assert json.loads(paths.ratings(1).read_text())["games_seen"] == 2 * GAMES + 2 * 8
    board = manifests[1]["leaderboard"]
    assert {m["name"] for m in board} == {"ckpt-000000", "ckpt-000001", "ckpt-000002", "random"}
    assert [m["conservative"] for m in board] == sorted((m["conservative"] for m in board),
                                                        reverse=True)


def _assert_manifest_counts_its_shards(paths: RunPaths, round_: int, manifest: dict) -> None:
    """A round's manifest, its batch and its final-reward state agree with a plain DuckDB query
    over the round's Parquet files (and the config's games per round)."""
    import duckdb

    # Its own connection: fetchone() leaves a result open, which would make the process-wide
    # default connection refuse the next test's query.
    db = duckdb.connect()
    per_round = TEST_CONFIG["rollout"]["games_per_round"]
    games = f"read_parquet('{paths.root}/games/round-{round_:06d}/shard-*.parquet')"
    steps = f"read_parquet('{paths.root}/steps/round-{round_:06d}/shard-*.parquet')"
    assert db.execute(f"SELECT count(*) FROM {games}").fetchone()[0] == per_round * (1 + COPIES)
    assert db.execute(f"SELECT count(*) FROM {games} WHERE parent_game_id IS NULL"
                      ).fetchone()[0] == per_round
    assert manifest["games"] == per_round * (1 + COPIES)
    assert manifest["copies"] == per_round * COPIES
    assert manifest["outcomes"] == dict(
        db.execute(f"SELECT outcome, count(*) FROM {games} GROUP BY outcome").fetchall())
    decisions, model, invalid, tokens = db.execute(
        "SELECT count(*), count(*) FILTER (actor_kind = 'model'), "
        "count(*) FILTER (actor_kind = 'model' AND invalid_move), "
        f"sum(num_completion_tokens) FILTER (actor_kind = 'model') FROM {steps}").fetchone()
    assert model == decisions  # mirror self-play: every decision is the checkpoint's
    assert (manifest["decisions"], manifest["model_decisions"], manifest["invalid_moves"],
            manifest["generated_tokens"]) == (decisions, model, invalid, tokens)
    # The learner's batch: batch_size of the round's decisions (all of them if fewer).
    assert manifest["batch"]["size"] == min(TEST_CONFIG["batch"]["batch_size"], decisions)
    # The final-reward state saved after the round has folded in every game so far, and the
    # role baselines count each finished game's seats.
    state = json.loads(paths.final_rewards_state(round_).read_text())
    assert state["games"] == (round_ + 1) * per_round * (1 + COPIES)  # (copies are trained on)
    seats = db.execute(
        "SELECT env_id, role, count(*) FROM (SELECT env_id, unnest(roles) AS role FROM "
        f"read_parquet('{paths.root}/games/round-*/shard-*.parquet') "
        f"WHERE outcome <> 'error' AND round <= {round_}) GROUP BY ALL").fetchall()
    counts = {t["name"]: t["state"] for t in state["transforms"]}["role_advantage"]["counts"]
    assert counts == _nested(seats)


def _nested(rows: list[tuple]) -> dict:
    out: dict = {}
    for env, role, n in rows:
        out.setdefault(env, {})[role] = n
    return out


def _artifacts(*keys: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=list(keys))))


def test_artifacts_count_rounds_as_the_summary_does_and_show_the_report(
        reference_run, prefect_api):
    import base64
    import re

    from ub.run.folder.views import RunViews

    rounds = _artifacts("ub-ref-round")
    shown = set()
    for artifact in rounds:
        title = artifact.data.splitlines()[0]  # "# ref: round 2 of 2"
        assert title == f"# {artifact.description}", (title, artifact.description)
        shown.add(title)
    assert {"# ref: round 1 of 2", "# ref: round 2 of 2"} <= shown
    ladders = {a.description for a in _artifacts("ub-ref-leaderboard")}
    assert {"TrueSkill ladder of ref after round 1 of 2",
            "TrueSkill ladder of ref after round 2 of 2"} <= ladders
    reports = _artifacts("ub-ref-report")
    assert reports
    for artifact in reports:  # what the UI shows: the numbers and the figures inline
        assert artifact.type == "markdown" and "file://" not in artifact.data
        images = dict(re.findall(r"!\[([^\]]+)\]\(data:image/png;base64,([^)]+)\)",
                                 artifact.data))
        # (the reference run plays mirror games only: no training figure by opponent)
        assert set(images) == {"Learning curve",
                               "Exploitability (NashConv: what best responses win)"}
        assert all(base64.b64decode(data).startswith(b"\x89PNG") for data in images.values())
        for row in RunViews(reference_run.root).evals().to_pylist():
            assert (f"| {row['update']} | {row['env_id']} | {row['opponent']} | "
                    f"{row['legal_moves'] or '-'} | {row['games']} | "
                    f"{100 * row['win_rate']:.1f}% [") in artifact.data
        [page] = re.findall(r"`([^`]+report\.html)`", artifact.data)
        assert Path(page).read_text().startswith("<!doctype html>")


def test_evaluate_run_returns_and_logs_its_result(reference_run, prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from ub.flows.evaluate import CheckpointEvaluation, evaluate_run

    state = evaluate_run(run_name="ref", root=str(reference_run.root.parent), checkpoint=2,
                         return_state=True)
    result = state.result()
    assert isinstance(result, CheckpointEvaluation)
    assert (result.checkpoint, result.actor, result.reused) == (2, "ckpt-000002", True)
    stored = json.loads(reference_run.manifest(1).read_text())["evals"]["2"]
    assert [row.to_dict() for row in result.rows] == stored
    # Its summary and ub's component lines are in the flow run's logs, not only on stdout.
    run_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
    deadline = time.monotonic() + 30
    while True:
        with get_client(sync_client=True) as client:
            logs = [(log.name, log.message) for log in client.read_logs(log_filter=run_filter)]
        summary = [m for n, m in logs if n == "ub.flow" and m.startswith(
            "ckpt-000002 vs random on TicTacToe-v0-train: win ")]
        component = [m for n, m in logs if n == "ub.eval" and "ckpt-000002 vs random" in m]
        if summary and component:
            break
        assert time.monotonic() < deadline, logs
        time.sleep(1)
    assert f"over {stored[0]['games']} games" in summary[0]


def test_rerun_changes_nothing_and_more_rounds_extend(reference_run, config_file, tmp_path,
                                                       capsys):
    import re

    from ub.flows.selfplay import selfplay

    paths = reference_run

    def files() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in paths.root.rglob("*")
                if p.is_file() and p.name != "run.lock"}

    before = files()
    selfplay(run_name="ref", config=str(config_file), root=str(paths.root.parent), quiet=True)
    assert files() == before, "a finished run started again must not rewrite anything"

    # A copy extended by two rounds: round-000000 and -000001 stay as they were, two are added.
    copy = RunPaths.of(tmp_path, "ref")
    shutil.copytree(paths.root, copy.root)
    capsys.readouterr()
    summary = selfplay(run_name="ref", root=str(tmp_path), rounds=4)
    assert summary["rounds"] == 4 and copy.committed_rounds() == [0, 1, 2, 3]
    assert _games(copy.root)[:2 * GAMES * (1 + COPIES)] == _games(paths.root)
    assert is_checkpoint(copy.checkpoint(4))
    # What it printed counts rounds one way, from 1 (round-000002 is the third), with the
    # whole run's time so far and the time left after each round until the last.
    out = capsys.readouterr().out
    assert "(resuming at round 3; 4 rounds of" in out.splitlines()[0]
    # (a round's time ends its block: the round's line and its evaluations' lines)
    assert re.search(r"^round 3/4  .*\(\d+ s; run \S+, ETA \S+\)$", out, re.M), out
    assert re.search(r"^round 4/4  (.|\n)*?\(\d+ s; run [^,]+\)$", out, re.M), out


def test_the_flow_takes_ub_trains_preflight_and_resolves_the_config_once(reference_run,
                                                                          tmp_path):
    """`ub train` hands its preflight to the flow (issue 44): the flow runs on that config
    and makes no preflight of its own, which would refuse the config file it is named here
    (none); without the handover it does."""
    from ub.errors import UbError
    from ub.flows.selfplay import preflighted, selfplay
    from ub.run.checks.preflight import RunRequest, preflight

    root, missing = str(reference_run.root.parent), str(tmp_path / "no-such.yaml")
    start = preflight(RunRequest("ref", root))
    with preflighted(start):
        summary = selfplay(run_name="ref", config=missing, root=root, quiet=True)
    assert summary["rounds"] == 2
    with pytest.raises(UbError, match=r"no-such\.yaml does not exist"):
        selfplay(run_name="ref", config=missing, root=root, quiet=True)


def test_ub_eval_adds_an_unrated_shard_once_and_leaves_the_run_alone(reference_run, capsys,
                                                                    tmp_path):
    from ub.flows.cli import main

    paths = RunPaths.of(tmp_path, "ref")  # (it writes eval shards: a copy of the module's run)
    shutil.copytree(reference_run.root, paths.root)
    ratings = paths.ratings(1).read_text()
    assert main(["eval", "ref", "--root", str(paths.root.parent), "--checkpoint", "1",
                 "--games", "4"]) == 0
    out = capsys.readouterr().out
    assert "ckpt-000001" in out and "random" in out
    shard = paths.eval_data / "games" / "round-000001" / "shard-0001.parquet"
    games = pq.read_table(shard, columns=["actors"]).to_pylist()
    assert len(games) == 4 and all("ckpt-000001" in g["actors"] for g in games)
    assert paths.ratings(1).read_text() == ratings
    # The same evaluation again reads those games; another one gets its own shard.
    assert main(["eval", "ref", "--root", str(paths.root.parent), "--checkpoint", "1",
                 "--games", "4"]) == 0
    assert "(stored earlier)" in capsys.readouterr().out
    assert not shard.with_name("shard-0002.parquet").exists()
    assert main(["eval", "ref", "--root", str(paths.root.parent), "--checkpoint", "1",
                 "--games", "6"]) == 0
    assert "(stored earlier)" not in capsys.readouterr().out
    assert pq.read_table(shard.with_name("shard-0002.parquet")).num_rows == 6
    assert main(["eval", "ref", "--root", str(paths.root.parent), "--checkpoint", "9"]) == 2


def test_evaluations_measure_exploitability_into_the_runs_data(reference_run, capsys,
                                                              tmp_path, monkeypatch):
    """Each evaluated checkpoint's best responses: in its manifest, its own file (read by
    plain DuckDB), the view, the metrics and the round's line; ``ub eval --exploitability``
    measures a checkpoint again (sampled too, with bounds) and replaces its file."""
    import duckdb

    from ub.flows.cli import main
    from ub.run.folder.views import RunViews

    env = "TicTacToe-v0-train"  # (trained free: measured free, greedy as evaluated)
    manifests = [json.loads(reference_run.manifest(r).read_text()) for r in (0, 1)]
    assert set(manifests[0]["exploitability"]) == {"0"}
    assert set(manifests[1]["exploitability"]) == {"2"}
    [row] = manifests[1]["exploitability"]["2"]
    assert (row["policy"], row["legal_moves"], row["exact"]) == ("greedy", "free", True)
    assert 0.0 <= row["nash_conv"] <= 2.0
    assert row["random_nash_conv"] == pytest.approx(1.91966, abs=1e-5)
    assert row["nash_conv"] == row["best_response_seat0"] + row["best_response_seat1"]
    file = reference_run.exploitability_rows(2, env)
    plain = duckdb.sql(f"SELECT nash_conv, line_seat0 FROM read_parquet('{file}')").fetchall()
    assert plain == [(row["nash_conv"], row["line_seat0"])]
    view = RunViews(reference_run.root).exploitability().to_pylist()
    assert sorted(r["update"] for r in view) == [0, 2]
    metrics = {(r["round"], r["metric"]): r["value"]
               for r in RunViews(reference_run.root).metrics().to_pylist()}
    assert metrics[(1, f"exploitability/{env}/greedy/free/nash_conv")] == row["nash_conv"]

    paths = RunPaths.of(tmp_path, "ref")  # (it writes rows: a copy of the module's run)
    shutil.copytree(reference_run.root, paths.root)
    argv = ["eval", "ref", "--root", str(paths.root.parent), "--exploitability"]
    monkeypatch.setattr(progress_bar, "_SHOW_BARS", True)  # (as a new process has them)
    assert main([*argv, "--checkpoint", "2", "--sampled", "--cut", "0.2"]) == 0
    out, err = capsys.readouterr()
    assert "greedy" in out and "sampled" in out and "1.920" in out
    # The sampled walk says how far it is (issue 78: minutes of silence)
    assert f"ckpt-000002 on {env} (sampled, free): NashConv walk: 100/100 %" in err
    rows = RunViews(paths.root).exploitability().to_pylist()
    sampled = [r for r in rows if r["update"] == 2 and r["policy"] == "sampled"]
    assert len(sampled) == 1 and not sampled[0]["exact"] and sampled[0]["cut"] == 0.2
    assert sampled[0]["nash_conv_low"] <= sampled[0]["nash_conv"] <= sampled[0]["nash_conv_high"]
    greedy = [r for r in rows if r["update"] == 2 and r["policy"] == "greedy"]
    assert len(greedy) == 1 and greedy[0]["nash_conv"] == row["nash_conv"]  # replaced, once
    assert main([*argv, "--envs", "SimpleTak-v0-train"]) == 2
    assert "--exploitability: no exploitability solver for SimpleTak-v0-train" in (
        capsys.readouterr().err)

    # Stopped in the sampled walk, the checkpoint keeps its greedy row, measured just before,
    # and its sampled row of the last measurement.
    measure = exploitability_step.measure

    def stopped_when_sampled(env_id, policy, mode, **options):
        if not mode.greedy:
            raise KeyboardInterrupt
        return measure(env_id, policy, mode, **options)

    before = {r["policy"]: r["measured_at"] for r in RunViews(paths.root).exploitability()
              .to_pylist() if r["update"] == 2}
    time.sleep(1.1)  # (measured_at counts seconds)
    monkeypatch.setattr(exploitability_step, "measure", stopped_when_sampled)
    assert main([*argv, "--checkpoint", "2", "--sampled", "--cut", "0.2"]) == 130
    after = {r["policy"]: r["measured_at"] for r in RunViews(paths.root).exploitability()
             .to_pylist() if r["update"] == 2}
    assert after["greedy"] > before["greedy"] and after["sampled"] == before["sampled"]


def test_masked_moves_are_legal_and_scored_as_the_sampler_scored_them(reference_run):
    """Nim plays under the legal-move mask (docs/training.md): no invalid move, the mode in
    the data, and each update's first scores (one step: the weights that sampled the round)
    equal the sampler's on every token of a batch that mixes masked and free decisions."""
    from ub.run.folder.views import RunViews

    rows = query(reference_run.train_data, """
        SELECT env_id, list(DISTINCT legal_moves_mode) AS modes, count(*) AS decisions,
               sum(invalid_move::INT) AS invalid, count(legal_moves) AS with_legal_moves
        FROM steps GROUP BY env_id ORDER BY env_id""").to_pylist()
    nim, tictactoe = rows
    assert nim["modes"] == ["mask"] and nim["invalid"] == 0 and tictactoe["modes"] == ["free"]
    assert nim["with_legal_moves"] == nim["decisions"]
    assert tictactoe["with_legal_moves"] == tictactoe["decisions"]
    gaps = RunViews(reference_run.root).learner()["logprob_abs_diff_max"].to_pylist()
    assert len(gaps) == 2 and max(gaps) < 1e-3, gaps


def test_each_branch_point_samples_k_moves_from_one_position_and_the_batch_compares_them(
        reference_run):
    """rollout.branch (k 4, surprisal): each game branched once at one of the learner's
    decisions; the point's 4 decisions (the game's own and its 3 copies') share the position
    and the turn, most of them tried 2 or more distinct moves, each copy is a game of its own
    whose rows start at the point and whose moves are sampled from seeds of its own; the
    batch takes a point's decisions together, and state_baseline (key branch) centres them."""
    from ub.batch import BatchConfig, assemble_batch

    paths = reference_run
    groups = query(paths.train_data, """
        SELECT s.round, s.branch_group, count(*) AS decisions, count(DISTINCT s.turn) AS turns,
               count(DISTINCT s.position) AS positions, count(s.position) AS keyed,
               count(DISTINCT s.action) AS moves, count(DISTINCT s.sampling_seed) AS seeds,
               count(DISTINCT s.game_id) AS games, count(g.parent_game_id) AS copies
        FROM steps s JOIN games g USING (game_id)
        WHERE s.branch_group IS NOT NULL GROUP BY ALL ORDER BY ALL""").to_pylist()
    assert len(groups) == 2 * GAMES  # one point per game
    for g in groups:
        assert (g["decisions"], g["turns"], g["positions"], g["keyed"], g["seeds"], g["games"],
                g["copies"]) == (4, 1, 1, 4, 4, 4, 3), g
    assert sum(g["moves"] >= 2 for g in groups) > len(groups) / 2, groups
    copies = query(paths.train_data, """
        SELECT g.game_id, g.parent_game_id, g.branch_turn, min(s.turn) AS first_turn,
               any_value(p.game_index) = any_value(g.game_index) AS same_index
        FROM games g JOIN steps s USING (game_id) JOIN games p ON p.game_id = g.parent_game_id
        GROUP BY ALL""").to_pylist()
    assert len(copies) == 2 * GAMES * COPIES
    for c in copies:
        assert c["game_id"].startswith(f"{c['parent_game_id']}-t{c['branch_turn']:03d}-c")
        assert c["first_turn"] == c["branch_turn"] and c["same_index"], c
    # A batch smaller than the round's decisions holds whole points (but the last it reached).
    config = BatchConfig(batch_size=40, seed=3, first_round=1, last_round=1,
                         final=["win_draw_loss"],
                         sampling=[{"name": "state_baseline", "key": "branch"}])
    batch = assemble_batch(paths.train_data, config)
    sizes: dict = {}
    for group in batch.rows["branch_group"].to_pylist():
        if group is not None:
            sizes[group] = sizes.get(group, 0) + 1
    assert sizes and sum(n != 4 for n in sizes.values()) <= 1, sizes
    rows = batch.rows.select(["branch_group", "reward", "advantage"]).to_pylist()
    for group, n in sizes.items():
        if n == 4:
            mine = [r for r in rows if r["branch_group"] == group]
            for r in mine:
                others = sum(o["reward"] for o in mine) - r["reward"]
                assert r["advantage"] == pytest.approx(r["reward"] - others / 3, abs=1e-9)


def test_ub_eval_plays_a_masked_env_free_when_asked(reference_run, capsys, monkeypatch,
                                                   tmp_path):
    """An env evaluated as it trains (Nim: masked); ``--legal-moves free`` plays the same games
    unconstrained into an ad-hoc shard of its own, read again when asked again."""
    from ub.flows.cli import main

    paths = RunPaths.of(tmp_path, "ref")  # (it writes eval shards: a copy of the module's run)
    shutil.copytree(reference_run.root, paths.root)
    monkeypatch.setenv("COLUMNS", "200")  # (the table's cells whole)
    argv = ["eval", "ref", "--root", str(paths.root.parent), "--checkpoint", "0", "--envs",
            "Nim-v0-train", "--games", "8"]

    def evaluated(*extra: str) -> tuple[str, set[str]]:
        assert main([*argv, *extra]) == 0
        out = capsys.readouterr().out
        shard = Path(out.split("games: ")[-1].split(" (stored earlier)")[0].strip())
        steps = pq.read_table(str(shard).replace("/games/", "/steps/"),
                              columns=["actor_kind", "legal_moves_mode"]).to_pylist()
        return out, {s["legal_moves_mode"] for s in steps if s["actor_kind"] == "model"}

    masked, masked_modes = evaluated()
    free, free_modes = evaluated("--legal-moves", "free")
    assert masked_modes == {"mask"} and free_modes == {"free"}
    assert "│ Nim-v0-train (mask) │" in masked and "│ Nim-v0-train │" in free
    assert masked.split("games: ")[-1] != free.split("games: ")[-1]
    again, _ = evaluated("--legal-moves", "free")
    assert again.split("games: ")[-1].strip() == free.split("games: ")[-1].strip() + \
        " (stored earlier)"


SQL_DOC = Path(__file__).resolve().parents[1] / "docs" / "sql.md"


def test_documented_queries_and_run_views_describe_the_run(reference_run, capsys):
    import re

    import duckdb

    from ub.flows.cli import main
    from ub.run.folder.views import RunViews

    root = reference_run.root
    blocks = re.findall(r"```sql\n(.*?)```", SQL_DOC.read_text(), re.S)
    assert len(blocks) >= 14
    plain = "read_parquet('runs/demo/"
    for block in blocks:
        if plain in block:  # written for plain DuckDB on the run's files, as users run it
            rows = duckdb.sql(block.replace(plain, f"read_parquet('{root}/")).fetchall()
            assert rows, f"no rows from:\n{block}"
            continue
        # (a sweep's query, on the runs view: over the folder of runs this run is in)
        where = root.parent if re.search(r"\b(FROM|JOIN) runs\b", block) else root
        assert main(["sql", str(where), block, "--format", "csv"]) == 0, block
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) >= 2, f"no rows from:\n{block}"  # a header and at least one row

    views = RunViews(root).tables()
    assert views["rounds"].column("round").to_pylist() == [0, 1]
    assert views["rounds"].column("copies").to_pylist() == [GAMES * COPIES] * 2
    assert views["learner"].column("update").to_pylist() == [1, 2]
    assert sorted(views["evals"].column("update").to_pylist()) == [0, 2]
    assert views["checkpoints"].column("name").to_pylist() == [
        "ckpt-000000", "ckpt-000001", "ckpt-000002"]
    snapshot = json.loads(reference_run.ratings(1).read_text())
    last = views["ratings"].filter(pc.equal(views["ratings"]["round"], 1))
    assert sorted(last.column("name").to_pylist()) == sorted(
        m["name"] for m in snapshot["members"])
    # The tracked metrics agree with the decisions they summarize.
    metrics = {(r["round"], r["metric"]): r["value"] for r in views["metrics"].to_pylist()}
    direct = query(root, "SELECT s.round, s.env_id, avg(s.invalid_move::INT) AS rate "
                         "FROM steps s JOIN games g USING (game_id) WHERE s.actor_kind = "
                         "'model' AND g.parent_game_id IS NULL GROUP BY ALL").to_pylist()
    for row in direct:
        key = (row["round"], f"collection/{row['env_id']}/invalid_move_rate")
        assert metrics[key] == pytest.approx(row["rate"])
    assert metrics[(1, "eval/TicTacToe-v0-train/random/checkpoint")] == 2.0


def test_a_corrupt_metrics_file_is_skipped_with_a_warning(reference_run, tmp_path, capsys):
    from ub.flows.cli import main

    copy = tmp_path / "ref"
    shutil.copytree(reference_run.root, copy)
    (copy / "metrics" / "round-000000.parquet").write_bytes(b"not parquet")
    assert main(["sql", str(copy), "SELECT DISTINCT round FROM metrics ORDER BY round",
                 "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert "warning: skipped" in err and "round-000000.parquet" in err
    assert out == "round\n1\n"  # round 0's metrics skipped, round 1's read


def test_wandb_offline_files_plot_evals_by_checkpoint_under_the_runs_own_id(
        reference_run, tmp_path, monkeypatch):
    """W&B's offline files, as `wandb sync` would upload them: the run id made when the run
    started (not its name), kept by a resumed process; a sweep's run in its arm's group
    (issue 78); round figures against `round`, each evaluation against the `checkpoint` it
    measured (checkpoint 2 was evaluated in round 1)."""
    from ub.report.page import build_report
    from ub.run.steps.rounds import Run, resolve_run_config
    from ub.run.steps.tracking import finish_wandb, log_wandb, log_wandb_figures, round_metrics

    monkeypatch.setenv("WANDB_MODE", "offline")
    config = resolve_run_config(reference_run, None)[0]
    copy = RunPaths.of(tmp_path / "sweep", f"base-s{config.seed}")  # (as ub sweep names it)
    shutil.copytree(reference_run.root, copy.root)
    run = Run(copy, config, "unused")
    run_id = json.loads((copy.root / "ub-run.json").read_text())["wandb_id"]
    assert run_id.startswith("ref-") and run_id != "ref"
    manifests = [json.loads(copy.manifest(r).read_text()) for r in (0, 1)]
    for round_ in (0, 1):  # one process per round: the second resumes the W&B run
        manifest = manifests[round_]
        log_wandb(run, round_, round_metrics(run, round_, manifest, manifest["leaderboard"]),
                  manifest["evals"])
        if round_ == 1:  # the flow's report, before it finishes W&B
            report = build_report(copy.root, tmp_path / "report")
            log_wandb_figures(run, {f.name: f.path for f in report.figures})
        finish_wandb(run)
    logs = sorted((copy.root / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(logs) == 2, list((copy.root / "wandb").iterdir())
    records = [r for log in logs for r in _finished_records(log)]
    assert {(r.run.run_id, r.run.run_group) for r in records
            if r.WhichOneof("record_type") == "run"} == {(run_id, "sweep/base")}  # (its arm)
    axes = {(r.metric.glob_name or r.metric.name): r.metric.step_metric
            for r in records if r.WhichOneof("record_type") == "metric"}
    assert axes["eval/*"] == "checkpoint" and axes["collection/*"] == "round"
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    win = "eval/TicTacToe-v0-train/random/win_rate"
    assert [(h["checkpoint"], h[win]) for h in history if "checkpoint" in h] == [
        (int(u), rows[0]["win_rate"]) for m in manifests for u, rows in m["evals"].items()]
    rate = "collection/TicTacToe-v0-train/invalid_move_rate"
    rounds = [h for h in history if "round" in h and not any(k.startswith("report/") for k in h)]
    assert [h["round"] for h in rounds] == [0, 1]
    assert all(rate in h for h in rounds)
    # The report's figures, as images in the last row (what W&B's UI shows as media).
    [shown] = [h for h in history if "report/learning_curve/path" in h]
    assert shown is history[-1]
    assert {f"report/{f.name}/_type" for f in report.figures} <= set(shown)
    assert shown["report/learning_curve/_type"] == "image-file"
    assert (logs[1].parent / "files" / shown["report/learning_curve/path"]).read_bytes() == (
        tmp_path / "report" / "learning_curve.png").read_bytes()
    assert not any(k.startswith("eval/") for h in history if "round" in h for k in h)


def _finished_records(log: Path) -> list:
    """The records of a W&B offline run file once its writer (its own process, which may still
    be flushing when finish() returns) has written the exit record, which comes last."""
    deadline = time.monotonic() + 60
    while "exit" not in (kinds := [r.WhichOneof("record_type") for r in _wandb_records(log)]):
        assert time.monotonic() < deadline, f"no exit record in {log}: {kinds}"
        time.sleep(0.5)
    return _wandb_records(log)


def _wandb_records(path: Path) -> list:
    """The protobuf records of a W&B offline run file (a LevelDB-style log: a 7-byte file
    header, then records of checksum, length and type, in 32 KiB blocks)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, records, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if pos + 7 + length > len(data):  # still being written
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a FULL record, or the LAST part of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_another_config_on_an_existing_run_is_refused(reference_run, tmp_path):
    from ub.errors import UbError
    from ub.run.config.load import validate_config
    from ub.run.steps.rounds import resolve_run_config

    changed = validate_config({**TEST_CONFIG, "seed": 8})
    with pytest.raises(UbError, match=r"another config: seed \(7 in the run, 8 now\)"):
        resolve_run_config(reference_run, changed)
    # More rounds and other eval settings are fine.
    longer = validate_config({**TEST_CONFIG, "rounds": 5})
    assert resolve_run_config(reference_run, longer)[0].rounds == 5


def test_keep_run_config_continues_a_run_whatever_config_is_passed(reference_run, config_file):
    """The nightly deployment passes its config every night: with keep_run_config an existing
    run goes on with its own, as `ub train --resume` does."""
    from ub.errors import UbError
    from ub.flows.selfplay import selfplay

    root = str(reference_run.root.parent)
    with pytest.raises(UbError, match="another config: seed"):
        selfplay(run_name="ref", config=str(config_file), overrides=["seed=8"], root=root,
                 quiet=True)
    summary = selfplay(run_name="ref", config=str(config_file), overrides=["seed=8"],
                       root=root, quiet=True, keep_run_config=True)
    assert summary["rounds"] == 2
    assert yaml.safe_load(reference_run.config.read_text())["seed"] == 7


def test_pipelined_rounds_play_the_previous_checkpoint(prefect_api, config_file, tmp_path,
                                                        capsys):
    """max_staleness 1: round r+1 is played by checkpoint r while the learner makes r+1, and
    the importance weights see the older behaviour policy."""
    from ub.flows.cli import main
    from ub.flows.selfplay import selfplay

    selfplay(run_name="piped", config=str(config_file), root=str(tmp_path), quiet=True,
             overrides=["pipeline.max_staleness=1", "learner.algorithm=ppo", "eval.every=0",
                        "rollout.games_per_round=6", "learner.kl_coef=0.05"])
    paths = RunPaths.of(tmp_path, "piped")
    assert paths.committed_rounds() == [0, 1]
    by_round = {}
    for f in sorted((paths.train_data / "games").rglob("shard-*.parquet")):
        for g in pq.read_table(f, columns=["actors"]).to_pylist():
            by_round.setdefault(f.parent.name, set()).update(g["actors"])
    assert by_round == {"round-000000": {"ckpt-000000"}, "round-000001": {"ckpt-000000"}}
    learner = json.loads(paths.manifest(1).read_text())["learner"]
    # Checkpoint 1 scores checkpoint 0's tokens: the learner-to-sampler ratio is no longer
    # exactly 1 (PPO's own ratio is, against the update's start, in a one-step update).
    assert learner["update"] == 2
    assert learner["tis_ratio_mean"] != pytest.approx(1.0, abs=1e-7)
    assert learner["approx_kl"] > 0 and learner["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    # Which kernels ran and the micro-batch size (auto: the CPU's 4,096) are recorded, and
    # queryable in the learner view.
    assert learner["kernels"] == "none" and learner["micro_batch_tokens"] == 4096
    assert learner["liger_kernels"] == []
    capsys.readouterr()
    assert main(["sql", str(paths.root), "SELECT round, kernels, len(liger_kernels) AS liger, "
                 "micro_batch_tokens FROM learner ORDER BY round", "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ["round,kernels,liger,micro_batch_tokens",
                                               "0,none,0,4096", "1,none,0,4096"]
    # The KL penalty: nothing to pay on the fresh adapter (the base model), then a divergence.
    assert json.loads(paths.manifest(0).read_text())["learner"]["kl_to_base"] == 0.0
    assert learner["kl_to_base"] > 0


# How the work is executed, changed when a run resumes (each value differs from the run's):
# nothing of the run's games, steps or adapters may change beyond float summation order.
FREE_CHANGES = {
    "engine.max_num_seqs": 4,            # vLLM batches 4 sequences instead of 256
    "engine.max_loras": 2,
    "engine.max_lora_rank": 32,
    "engine.kv_cache_gib": 0.5,
    "engine.gpu_memory_utilization": 0.5,  # (a GPU setting: the CPU engine ignores it)
    "engine.sleep_mode": False,          # (a GPU setting too)
    "rollout.shards": 3,
    "rollout.concurrency": 3,
    "learner.micro_batch_tokens": 256,   # several micro-batches instead of one
    "learner.micro_batch_size": 3,
    "learner.gradient_checkpointing": True,
    "learner.kernels": "none",
    "learner.num_threads": 1,
    "learner.attn_implementation": "eager",
    "cluster.learner_workers": 2,        # (applies on Ray only: a warning here)
    "tracking.project": "elsewhere",
    "eval.games": 4,
}


def test_every_execution_setting_is_free_and_every_other_is_locked():
    from ub.run.config.load import validate_config

    config = validate_config(TEST_CONFIG)
    free = config.execution_settings()
    for key in FREE_CHANGES:
        section, _, name = key.partition(".")
        assert name in free[section], f"{key} is not an execution setting"
        assert name not in config.training_settings().get(section, {})
    assert set(free) == {"rounds", "engine", "rollout", "learner", "eval", "tracking",
                         "cluster"}
    locked = config.training_settings()
    assert set(locked["engine"]) == {"dtype", "max_model_len"}
    assert set(locked["rollout"]) == {"games_per_round", "branch"}
    for key in ("learning_rate", "algorithm", "lora", "dtype", "device", "minibatches"):
        assert key in locked["learner"]


@pytest.fixture(scope="module")
def first_round_run(prefect_api, config_file, tiny_model, tmp_path_factory) -> RunPaths:
    """The reference config stopped after its first round (the run a resume continues), its
    shards as a ub before data schema 3 wrote them (no ``steps.position``): every resume
    below also continues an older ub's run, and must still equal the uninterrupted run."""
    from ub.flows.selfplay import selfplay

    root = tmp_path_factory.mktemp("first")
    selfplay(run_name="ref", config=str(config_file), root=str(root), rounds=1, quiet=True)
    paths = RunPaths.of(root, "ref")
    written_by_schema_2(paths)
    return paths


def written_by_schema_2(paths: RunPaths) -> None:
    """Rewrite a run's shards as a ub of data schema 2 wrote them: no ``steps.position`` (nor
    the legal moves of schema 4, nor the branching columns of schema 5), and
    ``ub.schema_version`` 2 in every shard's metadata."""
    from ub.data.schema import ADDED

    later = [name for table in ADDED.values() for name, since in table.items() if since > 2]
    rewritten = 0
    for path in sorted(paths.root.rglob("*.parquet")):
        table = pq.read_table(path)
        meta = dict(table.schema.metadata or {})
        if b"ub.schema_version" not in meta:
            continue  # (metrics, not a shard)
        meta[b"ub.schema_version"] = json.dumps(2).encode()
        table = table.drop_columns([c for c in later if c in table.column_names])
        pq.write_table(table.replace_schema_metadata(meta), path, compression="zstd")
        rewritten += 1
    assert rewritten >= 4  # steps and games, training and evaluation


def test_a_run_written_before_positions_passes_doctor(first_round_run, capsys):
    from ub.flows.cli import main

    assert main(["doctor", str(first_round_run.root)]) == 0
    out = capsys.readouterr().out
    assert "1 committed round(s), ok" in out and "data schema v2: round 1 (v2 older" in out


def _adapter(paths: RunPaths, update: int) -> dict:
    from safetensors.torch import load_file

    return load_file(str(paths.checkpoint(update) / "adapter_model.safetensors"))


def _assert_same_data(resumed: RunPaths, reference: RunPaths) -> None:
    """The same games and moves (log-probs to 1e-4: vLLM batches that sum in another order)
    and the same final adapter up to float summation order."""
    import torch

    assert _games(resumed.root) == _games(reference.root)
    exact = [c for c in STEP_COLUMNS if c != "completion_logprobs"]
    got, want = _steps(resumed.root), _steps(reference.root)
    assert [{k: r[k] for k in exact} for r in got] == [{k: r[k] for k in exact} for r in want]
    for a, b in zip(got, want, strict=True):
        assert (a["completion_logprobs"] is None) == (b["completion_logprobs"] is None)
        assert a["completion_logprobs"] is None or a["completion_logprobs"] == pytest.approx(
            b["completion_logprobs"], abs=1e-4)
    # The branch points of the round played after the resume (the first round's copies are
    # there too, as a ub of schema 2 wrote them: without their columns).
    branching = ("SELECT g.game_id, g.parent_game_id, g.branch_turn, s.turn, s.branch_group "
                 "FROM games g JOIN steps s USING (game_id) WHERE g.round = 1 ORDER BY ALL")
    assert query(resumed.root, branching).equals(query(reference.root, branching))
    mine, theirs = _adapter(resumed, 2), _adapter(reference, 2)
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.allclose(mine[name], theirs[name], rtol=1e-3, atol=1e-5), name


def test_a_runs_result_depends_on_its_seed_not_its_name(first_round_run, config_file, tmp_path):
    """Two runs of one config and seed under two names play the same games and train the same
    adapter (up to float summation order): the batch samples by the game's key within its run,
    never by its id, which begins with the run's name. A seed study reproduces the demo."""
    import torch

    from ub.flows.selfplay import selfplay

    selfplay(run_name="another-name", config=str(config_file), root=str(tmp_path), rounds=1,
             quiet=True)
    other = RunPaths.of(tmp_path, "another-name")
    exact = [c for c in STEP_COLUMNS if c not in ("game_id", "completion_logprobs")]
    assert ([{k: r[k] for k in exact} for r in _steps(other.root)]
            == [{k: r[k] for k in exact} for r in _steps(first_round_run.root)])
    mine, theirs = _adapter(other, 1), _adapter(first_round_run, 1)
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.allclose(mine[name], theirs[name], rtol=1e-3, atol=1e-5), name


def test_a_run_resumes_with_other_execution_settings_and_computes_the_same(
        first_round_run, reference_run, config_file, tmp_path):
    """Out of GPU memory, a run resumes with a smaller micro-batch, checkpointing, another
    engine share; a one-GPU run moves to a Ray node: none of these are refused, and the
    resumed run's second round is the uninterrupted run's. Every free key changes at once, in
    one resume (a real one-round run, ~50 s on two cores): any of them changing what is
    computed shows in the data. (It was one resume per config section, six runs.)"""
    from ub.flows.selfplay import selfplay

    copy = RunPaths.of(tmp_path, "ref")
    shutil.copytree(first_round_run.root, copy.root)
    summary = selfplay(run_name="ref", config=str(config_file), root=str(tmp_path), rounds=2,
                       overrides=[f"{key}={json.dumps(value)}"
                                  for key, value in FREE_CHANGES.items()],
                       quiet=True)
    assert summary["rounds"] == 2
    _assert_same_data(copy, reference_run)
    # The older ub's round reads no positions; the round this ub played records every one.
    keyed = [(r["keyed"], r["decisions"]) for r in query(
        copy.root, "SELECT round, count(position) AS keyed, count(*) AS decisions FROM steps "
                   "GROUP BY round ORDER BY round").to_pylist()]
    assert keyed[0][0] == 0 and keyed[1][0] == keyed[1][1] > 0
    first, second = (json.loads(copy.manifest(r).read_text())["execution"] for r in (0, 1))
    stored = yaml.safe_load(copy.config.read_text())
    for key, value in FREE_CHANGES.items():
        part, _, name = key.partition(".")
        assert second[part][name] == value != first[part][name], key
        assert stored[part][name] == value, key


def test_a_round_left_unfinished_keeps_its_shards_when_resumed_with_others(
        first_round_run, reference_run, config_file, tmp_path):
    """A process committed round 1's first shard and died; the run resumes with 3 shards a
    round: round 1 is finished in the one shard it started with (no game played twice or
    never), the next round would be split in 3."""
    from ub.flows.selfplay import selfplay
    from ub.run.config.base_model import resolve_base_model
    from ub.run.processes.worker import process_worker
    from ub.run.steps.plan import plan_round, round_shards
    from ub.run.steps.play import rollout_shard
    from ub.run.steps.rounds import Run, resolve_run_config

    copy = RunPaths.of(tmp_path, "ref")
    shutil.copytree(first_round_run.root, copy.root)
    stored = resolve_run_config(copy, None)[0]
    run = Run(copy, stored, resolve_base_model(stored))
    (games,) = plan_round(run, 1)
    rollout_shard(run, 1, 0, games, 1, worker=process_worker())
    wider = Run(copy, stored.model_copy(update={"rollout": stored.rollout.model_copy(
        update={"shards": 3})}), run.base_model)
    assert round_shards(wider, 1) == 1 and round_shards(wider, 2) == 3
    selfplay(run_name="ref", config=str(config_file), root=str(tmp_path), rounds=2,
             overrides=["rollout.shards=3"], quiet=True)
    assert [(s.round, s.shard) for s in committed_shards(copy.train_data)] == [(0, 0), (1, 0)]
    assert json.loads(copy.manifest(1).read_text())["execution"]["rollout"]["shards"] == 1
    _assert_same_data(copy, reference_run)
