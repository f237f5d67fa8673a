"""The self-play flow end to end: a real 2-round run of the tiny model under Prefect, resumed
after SIGKILLs at several points, compared with the uninterrupted run."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from faults.runs import train

from ub.data.shards import committed_shards
from ub.learner.checkpoint import is_checkpoint
from ub.run.layout import RunPaths, find_orphans

# Small enough for the test suite, big enough to exercise every step: two envs, two rounds,
# evaluation of the first and last checkpoints.
TEST_CONFIG = {
    "seed": 7,
    "rounds": 2,
    "model": {"base": "tiny"},
    "sampling": {"temperature": 1.0, "max_tokens": 12},
    "envs": [{"env_id": "TicTacToe-v0-train", "weight": 3}, {"env_id": "Nim-v0-train"}],
    "rollout": {"games_per_round": 12, "concurrency": 16},
    "opponents": [{"mode": "mirror", "weight": 1.0}],
    "batch": {"batch_size": 48},
    "learner": {"learning_rate": 1e-3, "lora": {"rank": 8, "alpha": 16}},
    "eval": {"every": 2, "games": 8, "opponents": ["random"], "envs": ["TicTacToe-v0-train"]},
}

GAME_COLUMNS = ["game_id", "env_id", "seed", "actors", "rewards", "outcome", "num_turns"]
STEP_COLUMNS = ["game_id", "turn", "actor", "prompt_token_ids", "completion_token_ids",
                "completion_logprobs", "action", "invalid_move"]


@pytest.fixture(scope="module")
def prefect_api():
    """A Prefect test server for this module; its URL lets subprocesses share it."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "small.yaml"
    path.write_text(yaml.safe_dump(TEST_CONFIG))
    return path


@pytest.fixture(scope="module")
def reference_run(prefect_api, config_file, tiny_model, tmp_path_factory) -> RunPaths:
    """An uninterrupted 2-round run, in this process."""
    from flows.selfplay import selfplay

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


def _adapter_bytes(paths: RunPaths, update: int) -> bytes:
    return (paths.checkpoint(update) / "adapter_model.safetensors").read_bytes()


def test_two_rounds_commit_shards_checkpoints_ratings_and_evals(reference_run):
    paths = reference_run
    assert paths.committed_rounds() == [0, 1]
    assert [(s.round, s.shard) for s in committed_shards(paths.data)] == [(0, 0), (1, 0)]
    games = _games(paths.root)
    assert len(games) == 2 * TEST_CONFIG["rollout"]["games_per_round"]
    # Mirror self-play: the checkpoint of the round sits in every seat.
    assert {tuple(g["actors"]) for g in games} == {("ckpt-000000", "ckpt-000000"),
                                                  ("ckpt-000001", "ckpt-000001")}
    assert {g["env_id"] for g in games} == {"TicTacToe-v0-train", "Nim-v0-train"}
    for update in (0, 1, 2):
        assert is_checkpoint(paths.checkpoint(update))
    for round_ in (0, 1):
        assert paths.ratings(round_).exists()
        assert paths.final_rewards_state(round_).exists()
    # Checkpoints 0 and 2 were evaluated against the random player, seats balanced.
    manifests = [json.loads(paths.manifest(r).read_text()) for r in (0, 1)]
    assert set(manifests[0]["evals"]) == {"0"} and set(manifests[1]["evals"]) == {"2"}
    row = manifests[1]["evals"]["2"][0]
    assert row["opponent"] == "random" and row["games"] == 8
    assert row["wins"] + row["draws"] + row["losses"] + row["errors"] == 8
    assert 0.0 <= row["win_low"] <= row["win_rate"] <= row["win_high"] <= 1.0
    eval_games = _games(paths.root, "eval")
    assert len(eval_games) == 16
    seats = [g["actors"].index("ckpt-000002") for g in eval_games if "ckpt-000002" in g["actors"]]
    assert sorted(seats) == [0] * 4 + [1] * 4
    # The learner trained on round r's decisions of checkpoint r.
    learner = manifests[1]["learner"]
    assert learner["update"] == 2 and learner["tokens"] > 0
    # Each component kept its own log.
    logs = paths.root / "logs"
    assert "train shard 1/0 committed: 12 games" in (logs / "rollout.log").read_text()
    assert "round 1: ckpt-000001 -> ckpt-000002" in (logs / "learner.log").read_text()
    assert "ckpt-000002 vs random on TicTacToe-v0-train: 8 games" in (
        logs / "eval.log").read_text()
    assert "ratings after round 1" in (logs / "pool.log").read_text()
    # Ratings are a function of the games: a rebuild from the shards equals the snapshot.
    from ub.run.rounds import Run, rebuild_ratings, resolve_run_config

    run = Run(paths, resolve_run_config(paths, None)[0], "unused")
    assert rebuild_ratings(run, 1).snapshot() == json.loads(paths.ratings(1).read_text())
    board = manifests[1]["leaderboard"]
    assert {m["name"] for m in board} == {"ckpt-000000", "ckpt-000001", "ckpt-000002", "random"}
    assert [m["conservative"] for m in board] == sorted((m["conservative"] for m in board),
                                                        reverse=True)


def test_rerun_changes_nothing_and_more_rounds_extend(reference_run, config_file, tmp_path):
    from flows.selfplay import selfplay

    paths = reference_run

    def files() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in paths.root.rglob("*")
                if p.is_file() and p.name != "run.lock"}

    before = files()
    selfplay(run_name="ref", config=str(config_file), root=str(paths.root.parent), quiet=True)
    assert files() == before, "a finished run started again must not rewrite anything"

    # A copy extended by one round: rounds 0-1 stay as they were, round 2 is added.
    copy = RunPaths.of(tmp_path, "ref")
    shutil.copytree(paths.root, copy.root)
    summary = selfplay(run_name="ref", root=str(tmp_path), rounds=3, quiet=True)
    assert summary["rounds"] == 3 and copy.committed_rounds() == [0, 1, 2]
    assert _games(copy.root)[:24] == _games(paths.root)
    assert is_checkpoint(copy.checkpoint(3))


def test_ub_eval_adds_an_unrated_shard_and_leaves_the_run_alone(reference_run, capsys):
    from ub.cli import main

    paths = reference_run
    ratings = paths.ratings(1).read_text()
    assert main(["eval", "ref", "--root", str(paths.root.parent), "--checkpoint", "1",
                 "--games", "4"]) == 0
    out = capsys.readouterr().out
    assert "ckpt-000001" in out and "random" in out
    shard = paths.eval_data / "games" / "round-000001" / "shard-0001.parquet"
    games = pq.read_table(shard, columns=["actors"]).to_pylist()
    assert len(games) == 4 and all("ckpt-000001" in g["actors"] for g in games)
    assert paths.ratings(1).read_text() == ratings
    assert main(["eval", "ref", "--root", str(paths.root.parent), "--checkpoint", "9"]) == 2


SQL_DOC = Path(__file__).resolve().parents[1] / "docs" / "sql.md"


def test_documented_queries_and_run_views_describe_the_run(reference_run, capsys):
    import re

    from ub.cli import main
    from ub.data.sql import query
    from ub.run.views import RunViews

    root = reference_run.root
    blocks = re.findall(r"```sql\n(.*?)```", SQL_DOC.read_text(), re.S)
    assert len(blocks) >= 12
    for block in blocks:
        assert main(["sql", str(root), block, "--format", "csv"]) == 0, block
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) >= 2, f"no rows from:\n{block}"  # a header and at least one row

    views = RunViews(root).tables()
    assert views["rounds"].column("round").to_pylist() == [0, 1]
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
    direct = query(root, "SELECT round, env_id, avg(invalid_move::INT) AS rate FROM steps "
                         "WHERE actor_kind = 'model' GROUP BY ALL").to_pylist()
    for row in direct:
        key = (row["round"], f"collection/{row['env_id']}/invalid_move_rate")
        assert metrics[key] == pytest.approx(row["rate"])
    assert metrics[(1, "eval/TicTacToe-v0-train/random/checkpoint")] == 2.0


def test_a_corrupt_metrics_file_is_skipped_with_a_warning(reference_run, tmp_path, capsys):
    from ub.cli import main

    copy = tmp_path / "ref"
    shutil.copytree(reference_run.root, copy)
    (copy / "metrics" / "round-000000.parquet").write_bytes(b"not parquet")
    assert main(["sql", str(copy), "SELECT DISTINCT round FROM metrics"]) == 0
    out, err = capsys.readouterr()
    assert "warning: skipped" in err and "round-000000.parquet" in err
    assert "1" in out


def test_wandb_offline_files_hold_the_logged_metrics(reference_run, tmp_path, monkeypatch):
    from ub.run.rounds import Run, resolve_run_config
    from ub.run.tracking import finish_wandb, log_wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    copy = RunPaths.of(tmp_path, "ref")
    shutil.copytree(reference_run.root, copy.root)
    run = Run(copy, resolve_run_config(copy, None)[0], "unused")
    log_wandb(run, 0, {"collection/TicTacToe-v0-train/invalid_move_rate": 0.25})
    log_wandb(run, 1, {"collection/TicTacToe-v0-train/invalid_move_rate": 0.125})
    finish_wandb(run)
    [log] = list((copy.root / "wandb").glob("offline-run-*/run-ref.wandb"))
    # W&B's writer is its own process and may still be flushing when finish() returns:
    # wait for the run's exit record, which is written last.
    deadline = time.monotonic() + 60
    while "exit" not in (kinds := [r.WhichOneof("record_type") for r in _wandb_records(log)]):
        assert time.monotonic() < deadline, f"no exit record in {log}: {kinds}"
        time.sleep(0.5)
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in r.history.item}
               for r in _wandb_records(log) if r.WhichOneof("record_type") == "history"]
    assert [(h["_step"], h["collection/TicTacToe-v0-train/invalid_move_rate"])
            for h in history] == [(0, 0.25), (1, 0.125)]


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
    from ub.run.config import validate_config
    from ub.run.rounds import resolve_run_config

    changed = validate_config({**TEST_CONFIG, "seed": 8})
    with pytest.raises(UbError, match=r"another config: seed \(7 in the run, 8 now\)"):
        resolve_run_config(reference_run, changed)
    # More rounds and other eval settings are fine.
    longer = validate_config({**TEST_CONFIG, "rounds": 5})
    assert resolve_run_config(reference_run, longer)[0].rounds == 5


def test_killed_anywhere_and_resumed_equals_uninterrupted(reference_run, config_file,
                                                          prefect_api, tmp_path):
    """SIGKILL mid-rollout, mid-checkpoint-write and just before a round's commit, resuming
    after each: the data, ratings and final adapter equal the uninterrupted run's."""
    root = tmp_path / "runs"
    for fault in ("rollout.step:3", "checkpoint.before-rename:2", "round.before-commit"):
        result = train(config_file, root, prefect_api, name="ref", env={"UB_FAULT_AT": fault})
        assert result.returncode == -signal.SIGKILL, (fault, result.stderr[-2000:])
    result = train(config_file, root, prefect_api, name="ref")
    assert result.returncode == 0, result.stderr[-2000:]

    killed, ref = RunPaths.of(root, "ref"), reference_run
    assert killed.committed_rounds() == [0, 1]
    assert not find_orphans(killed.root)
    assert _games(killed.root) == _games(ref.root)
    assert _steps(killed.root) == _steps(ref.root)
    # (The reference run also has an ad-hoc `ub eval` shard 1: compare the run's own evals.)
    assert (_games(killed.root, "eval", "shard-0000.parquet")
            == _games(ref.root, "eval", "shard-0000.parquet"))
    for round_ in (0, 1):
        assert (json.loads(killed.ratings(round_).read_text())
                == json.loads(ref.ratings(round_).read_text()))
    for update in (1, 2):
        assert _adapter_bytes(killed, update) == _adapter_bytes(ref, update)
        assert ((killed.checkpoint(update) / "optimizer.safetensors").read_bytes()
                == (ref.checkpoint(update) / "optimizer.safetensors").read_bytes())


def test_pipelined_rounds_play_the_previous_checkpoint(prefect_api, config_file, tmp_path):
    """max_staleness 1: round r+1 is played by checkpoint r while the learner makes r+1, and
    PPO's ratio sees the older behaviour policy."""
    from flows.selfplay import selfplay

    selfplay(run_name="piped", config=str(config_file), root=str(tmp_path), quiet=True,
             overrides=["pipeline.max_staleness=1", "learner.algorithm=ppo", "eval.every=0",
                        "rollout.games_per_round=6"])
    paths = RunPaths.of(tmp_path, "piped")
    assert paths.committed_rounds() == [0, 1]
    by_round = {}
    for f in sorted((paths.data / "games").rglob("shard-*.parquet")):
        for g in pq.read_table(f, columns=["actors"]).to_pylist():
            by_round.setdefault(f.parent.name, set()).update(g["actors"])
    assert by_round == {"round-000000": {"ckpt-000000"}, "round-000001": {"ckpt-000000"}}
    learner = json.loads(paths.manifest(1).read_text())["learner"]
    # Checkpoint 1 scores checkpoint 0's tokens: the ratio is no longer exactly 1.
    assert learner["update"] == 2 and learner["ratio_mean"] != pytest.approx(1.0, abs=1e-7)
