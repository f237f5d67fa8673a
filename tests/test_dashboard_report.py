"""`ub dashboard` and `ub report` on a real 2-round run: the numbers they show are the run's,
the dashboard works in a real terminal (tmux), and the report's plots are real images."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ub.dashboard import gather, sparkline
from ub.errors import UbError
from ub.run.layout import RunPaths

CONFIG = {
    "seed": 3, "rounds": 2, "model": {"base": "tiny"},
    "sampling": {"temperature": 1.0, "max_tokens": 12},
    "envs": [{"env_id": "TicTacToe-v0-train"}],
    "rollout": {"games_per_round": 8},
    "batch": {"batch_size": 32},
    "learner": {"learning_rate": 1e-3, "lora": {"rank": 8, "alpha": 16}},
    "eval": {"every": 1, "games": 6, "opponents": ["random"]},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model) -> Path:
    from prefect.testing.utilities import prefect_test_harness

    from flows.selfplay import selfplay

    folder = tmp_path_factory.mktemp("dash")
    config = folder / "dash.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    with prefect_test_harness(server_startup_timeout=120):
        selfplay(run_name="dash", config=str(config), root=str(folder / "runs"), quiet=True)
    return RunPaths.of(folder / "runs", "dash").root


def test_dashboard_state_is_the_runs_data(run_dir):
    from ub.data.sql import query

    state = gather(run_dir)
    assert (state.name, state.phase, state.rounds_done, state.rounds_total) == (
        "dash", "finished", 2, 2)
    names = {m["name"] for m in state.ladder}
    assert names == {"ckpt-000000", "ckpt-000001", "ckpt-000002", "random"}
    assert [m["mu"] - 3 * m["sigma"] for m in state.ladder] == sorted(
        (m["mu"] - 3 * m["sigma"] for m in state.ladder), reverse=True)
    series = {s.label: s.values for s in state.series}
    direct = query(run_dir, "SELECT round, avg(invalid_move::INT) AS r FROM steps WHERE "
                            "actor_kind = 'model' GROUP BY round ORDER BY round").to_pylist()
    assert series["invalid-move rate"] == pytest.approx([row["r"] for row in direct])
    wins = series["win vs random (TicTacToe-v0-train)"]
    assert len(wins) == 2 and all(w is not None for w in wins)
    assert state.throughput["games/s"] > 0


def test_dashboard_once_prints_every_panel(run_dir, capsys):
    from ub.cli import main

    assert main(["dashboard", str(run_dir), "--once"]) == 0
    out = capsys.readouterr().out
    for title in ("throughput", "TrueSkill ladder", "match matrix", "trends", "host",
                  "ckpt-000002", "invalid-move rate", "[finished]"):
        assert title in out


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_dashboard_in_a_real_terminal_refreshes_and_quits_on_q(run_dir):
    session = f"ubdash{time.monotonic_ns()}"
    # The test process may export COLUMNS/LINES for its own output; the pane has its own size.
    command = (f"env -u COLUMNS -u LINES {sys.executable} -m ub.cli dashboard {run_dir} "
               "--refresh 0.5")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "60",
                    command], check=True)
    try:
        screen, expected = "", ("TrueSkill ladder", "ckpt-000001", "q quits")
        for _ in range(60):
            time.sleep(0.5)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                    capture_output=True, text=True).stdout
            if all(text in screen for text in expected):
                break
        assert all(text in screen for text in expected), screen
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        for _ in range(20):
            time.sleep(0.25)
            alive = subprocess.run(["tmux", "has-session", "-t", session],
                                   capture_output=True).returncode == 0
            if not alive:
                break
        assert not alive, "q did not quit the dashboard"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_report_writes_real_plots_and_one_page(run_dir, tmp_path, capsys):
    import matplotlib.image

    from ub.cli import main

    out = tmp_path / "report"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    pngs = sorted(out.glob("*.png"))
    assert {p.stem for p in pngs} >= {"learning_curve", "ratings", "match_matrix",
                                      "move_quality", "learner", "throughput"}
    for png in pngs:
        image = matplotlib.image.imread(png)
        assert image.shape[:2] == (450, 800)
        assert image.std() > 0.01, f"{png.name} is blank"
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(pngs)


def test_bad_runs_are_clear(run_dir, tmp_path, capsys):
    from ub.cli import main

    with pytest.raises(UbError, match="is not a ub run"):
        gather(tmp_path)
    assert main(["dashboard", "ghost", "--root", str(tmp_path), "--once"]) == 2
    assert "no run 'ghost'" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    assert gather(empty).phase == "waiting for the first round"
    assert main(["report", str(empty)]) == 2
    assert "no committed round yet" in capsys.readouterr().err
    # A corrupt metrics file is skipped with a warning naming it.
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    (copy / "metrics" / "round-000001.parquet").write_text("garbage")
    state = gather(copy)
    assert any("round-000001.parquet" in w for w in state.warnings)


def test_a_running_run_shows_its_newest_log_line(run_dir, tmp_path):
    from ub.run.lock import RunLock

    copy = tmp_path / "live"
    shutil.copytree(run_dir, copy)
    newest = "2999-01-01 00:00:00,000 INFO ub.rollout [pid 1] train shard 2/0: playing 8 games"
    with (copy / "logs" / "rollout.log").open("a") as log:
        log.write(newest + "\n")
    with RunLock(copy / "run.lock"):
        state = gather(copy)
    assert (state.phase, state.activity) == ("running", newest)
    assert gather(copy).phase == "finished"


def test_sparkline_scales_to_the_series():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▄█"
    assert sparkline([None, 2.0, 2.0]) == " ▁▁"
    assert sparkline([]) == ""
