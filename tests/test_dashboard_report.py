"""`ub dashboard` and `ub report` on a real 2-round run: the numbers they show are the run's,
the dashboard works in a real terminal (tmux), and the report's plots are real images."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ub.dashboard import sparkline
from ub.dashboard_state import gather
from ub.errors import UbError
from ub.run.folder.layout import RunPaths

CONFIG = {
    "seed": 3, "rounds": 2, "model": {"base": "tiny"},
    "sampling": {"temperature": 1.0, "max_tokens": 12},
    # Two envs with different decisions per game: a per-env mean differs from a per-decision one.
    "envs": [{"env_id": "TicTacToe-v0-train"}, {"env_id": "Nim-v0-train"}],
    "rollout": {"games_per_round": 8},
    "batch": {"batch_size": 32},
    "learner": {"learning_rate": 1e-3, "lora": {"rank": 8, "alpha": 16}},
    "eval": {"every": 1, "games": 6, "opponents": ["random"]},
}


@pytest.fixture(scope="module")
def run_dir(prefect_api, tmp_path_factory, tiny_model) -> Path:

    from ub.flows.selfplay import selfplay

    folder = tmp_path_factory.mktemp("dash")
    config = folder / "dash.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
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
    # Every rate weighs each decision once, like the progress line and SQL over the decisions.
    direct = query(run_dir, "SELECT round, avg(invalid_move::INT) AS invalid, "
                            "avg(format_ok::INT) AS format, avg(num_completion_tokens) AS tokens "
                            "FROM steps WHERE actor_kind = 'model' GROUP BY round ORDER BY round"
                   ).to_pylist()
    assert series["invalid-move rate"] == pytest.approx([row["invalid"] for row in direct])
    assert series["format success"] == pytest.approx([row["format"] for row in direct])
    assert series["response tokens"] == pytest.approx([row["tokens"] for row in direct])
    # Mirror games (a checkpoint against itself) count from each seat's point of view.
    mirror = query(run_dir, """
        SELECT actors[1] AS name, sum((r = 'win')::INT) AS w, sum((r = 'draw')::INT) AS d,
               sum((r = 'loss')::INT) AS l
        FROM (SELECT actors, unnest(results) AS r FROM games
              WHERE actors[1] = actors[2] AND outcome <> 'error') GROUP BY name""").to_pylist()
    assert mirror, "the run has self-play games"
    ladder = {m["name"]: m for m in state.ladder}
    for row in mirror:
        assert state.matches[row["name"]][row["name"]] == [row["w"], row["d"], row["l"]]
        member = ladder[row["name"]]
        assert member["wins"] + member["draws"] + member["losses"] >= row["w"] + row["d"] + row["l"]
        assert member["wins"] >= row["w"] and member["losses"] >= row["l"]
    wins = series["win vs random (TicTacToe-v0-train)"]
    assert len(wins) == 2 and all(w is not None for w in wins)
    # Throughput: the last round's games and generated tokens, as its Parquet files hold them
    # (a plain DuckDB query), over the rollout seconds its manifest records.
    import duckdb

    games_files, steps_files = (f"read_parquet('{run_dir}/{kind}/round-000001/shard-*.parquet')"
                                for kind in ("games", "steps"))
    db = duckdb.connect()  # not the process-wide default: fetchone() leaves a result open
    [games] = db.execute(f"SELECT count(*) FROM {games_files}").fetchone()
    [tokens] = db.execute(f"SELECT sum(num_completion_tokens) FROM {steps_files} "
                          "WHERE actor_kind = 'model'").fetchone()
    assert games == CONFIG["rollout"]["games_per_round"]
    seconds = json.loads((run_dir / "rounds" / "round-000001.json").read_text())["timings"][
        "rollout"]
    assert state.throughput["games/s"] == pytest.approx(games / seconds)
    assert state.throughput["generated tokens/s"] == pytest.approx(tokens / seconds)


def _last_round_health(run_dir: Path) -> dict[str, tuple[float, float]]:
    """Per env, the last round's invalid-move rate and sampled entropy, straight from the
    steps (plain DuckDB over the shards)."""
    import duckdb

    files = [str(p) for p in sorted((run_dir / "steps").rglob("shard-*.parquet"))]
    rows = duckdb.sql(f"""
        SELECT env_id, avg(invalid_move::INT) AS invalid,
               -sum(list_sum(completion_logprobs)) / sum(len(completion_logprobs)) AS entropy
        FROM read_parquet({files}, hive_partitioning = false)
        WHERE actor_kind = 'model' AND round = 1 GROUP BY env_id""").fetchall()
    return {env: (invalid, entropy) for env, invalid, entropy in rows}


def _with_alerts(run_dir: Path, tmp_path: Path, **thresholds: float) -> Path:
    copy = tmp_path / "dash"
    shutil.copytree(run_dir, copy)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["tracking"].update(thresholds)
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    return copy


def test_a_collapsing_env_is_flagged_with_its_numbers(run_dir, tmp_path, capsys):
    """The round line and the dashboard print one warning line per env whose invalid-move
    rate passed ``tracking.alert_invalid_move_rate`` or whose sampled entropy fell below
    ``tracking.alert_entropy`` in the last round, with the numbers the steps hold; none for a
    healthy run."""
    from ub.run.config.load import load_config
    from ub.run.folder.layout import read_json
    from ub.run.steps.progress import Progress
    from ub.run.steps.rounds import Run

    health = _last_round_health(run_dir)
    assert set(health) == {"TicTacToe-v0-train", "Nim-v0-train"}
    quiet = _with_alerts(run_dir, tmp_path / "a", alert_invalid_move_rate=1.0, alert_entropy=0.0)
    assert not [w for w in gather(quiet).warnings if "collapsing" in w]

    # Thresholds every env crosses: an entropy floor above any entropy.
    flagged = _with_alerts(run_dir, tmp_path / "b", alert_entropy=100.0)
    alerts = [w for w in gather(flagged).warnings if "collapsing" in w]
    assert len(alerts) == 2
    for env, (invalid, entropy) in health.items():
        (line,) = [a for a in alerts if f": {env}: " in a]
        assert line.startswith("round 2: warning:") and "entropy low" in line
        assert f"invalid moves {100 * invalid:.1f}%" in line
        assert f"entropy {entropy:.3f} nats/token" in line

    paths = RunPaths.of(flagged.parent, "dash")
    config = load_config(str(paths.config))
    Progress(Run(paths, config, config.model.base)).round_done(1, read_json(paths.manifest(1)))
    out = capsys.readouterr().out
    assert out.count("warning:") == 2 and "Nim-v0-train: entropy low" in out


def test_dashboard_once_prints_every_panel(run_dir, capsys):
    from ub.flows.cli import main

    assert main(["dashboard", str(run_dir), "--once"]) == 0
    out = capsys.readouterr().out
    for title in ("throughput", "TrueSkill ladder", "match matrix", "trends", "host",
                  "ckpt-000002", "invalid-move rate", "[finished]"):
        assert title in out


def _screen(session: str, *expected: str, seconds: float = 30) -> str:
    """The tmux pane's text once it shows every one of ``expected`` (or after ``seconds``)."""
    screen, deadline = "", time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.5)
        screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                capture_output=True, text=True).stdout
        if all(text in screen for text in expected):
            break
    return screen


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_dashboard_in_a_real_terminal_refreshes_and_quits_on_q(run_dir, tmp_path):
    """The live view reads the run again every ``--refresh``: what a process driving the run
    writes after the first frame (a longer config, a fresh log line) shows on the next one."""
    from datetime import datetime

    copy = tmp_path / "live"  # (this test writes into the run: a copy of the module's)
    shutil.copytree(run_dir, copy)
    session = f"ubdash{time.monotonic_ns()}"
    # The test process may export COLUMNS/LINES for its own output; the pane has its own size.
    command = (f"env -u COLUMNS -u LINES {sys.executable} -m ub.flows.cli dashboard {copy} "
               "--refresh 0.5")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "60",
                    command], check=True)
    try:
        first = ("round 2/2  [finished]", "TrueSkill ladder", "ckpt-000001", "q quits")
        screen = _screen(session, *first, seconds=30)
        assert all(text in screen for text in first), screen
        assert "refreshed-by-the-test" not in screen
        # A deployment's worker takes the run on to 5 rounds and logs from its evaluation.
        config = yaml.safe_load((copy / "config.yaml").read_text())
        (copy / "config.yaml").write_text(yaml.safe_dump({**config, "rounds": 5}))
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S,000")
        with (copy / "logs" / "eval.log").open("a") as log:
            log.write(f"{stamp} INFO ub.eval [pid 7] refreshed-by-the-test: 1/8 games\n")
        second = ("round 2/5  [running (log ", "s ago): evaluating]",
                  "now: " + stamp, "refreshed-by-the-test")
        screen = _screen(session, *second, seconds=15)
        assert all(text in screen for text in second), screen
        assert "[finished]" not in screen
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

    from ub.flows.cli import main

    out = tmp_path / "report"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    pngs = sorted(out.glob("*.png"))
    assert {p.stem for p in pngs} >= {"learning_curve", "ratings", "match_matrix",
                                      "move_quality", "entropy", "response_length", "learner",
                                      "throughput"}
    for png in pngs:
        image = matplotlib.image.imread(png)
        assert image.shape[:2] == ((700, 800) if png.stem == "match_matrix" else (450, 800))
        assert image.std() > 0.01, f"{png.name} is blank"
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(pngs)
    # The numbers are on the page: the learning curve with its intervals, and the settings.
    from ub.run.folder.views import RunViews

    for row in RunViews(run_dir).evals().to_pylist():
        assert (f"<td>{100 * row['win_rate']:.1f}% [{100 * row['win_low']:.1f}%, "
                f"{100 * row['win_high']:.1f}%]</td>") in page
    assert "<code>rollout.games_per_round</code></td><td>8</td>" in page
    assert "<code>envs[1].env_id</code></td><td>Nim-v0-train</td>" in page


def test_names_that_look_like_markup_or_tex_are_shown_as_they_are(run_dir, tmp_path, capsys):
    """A rating member's name is anyone's text (a hosted model's, say): `$\\frac{$` made the
    report's mathtext raise, `[/x]` is rich markup to the dashboard (issue 69)."""
    from ub.flows.cli import main

    run = tmp_path / "dash"
    shutil.copytree(run_dir, run)
    odd = "$\\frac{$ [/x]"
    for snapshot in (run / "ratings").glob("*.json"):
        snapshot.write_text(snapshot.read_text().replace('"random"', json.dumps(odd)))
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "ratings.png").exists()
    capsys.readouterr()
    assert main(["dashboard", str(run), "--once"]) == 0
    assert odd[:8] in capsys.readouterr().out


def test_report_plots_put_each_quantity_on_its_own_labelled_axis(run_dir, tmp_path):
    """Loss, gradient norm and clip fraction get a panel each; truncation counts are not drawn
    on the token axis; the match matrix colours scores (0..1), not game counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ub.report import SIZE, _learner, _match_matrix, _response_length
    from ub.run.folder.views import RunViews

    views = RunViews(run_dir)
    t = {name: table.to_pylist() for name, table in views.tables().items()}
    fig = plt.figure(figsize=SIZE)
    assert _learner(t, fig)
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "gradient norm", "clip fraction"]
    fig = plt.figure(figsize=SIZE)
    assert _response_length(t, fig)
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels == ["completion tokens per decision", "truncated sequences in the batch (count)"]
    fig = plt.figure(figsize=SIZE)
    matches = {"ckpt-000001": {"random": [3, 1, 0]}, "random": {"ckpt-000001": [0, 1, 3]}}
    assert _match_matrix(matches, fig)
    image = fig.axes[0].images[0]
    assert image.get_clim() == (0, 1)
    assert image.get_array()[0][1] == pytest.approx(3.5 / 4)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["ckpt 1", "random"]
    plt.close("all")


def test_bad_runs_are_clear(run_dir, tmp_path, capsys):
    from ub.flows.cli import main

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
    from ub.run.folder.lock import RunLock

    copy = tmp_path / "live"
    shutil.copytree(run_dir, copy)
    newest = "2999-01-01 00:00:00,000 INFO ub.rollout [pid 1] train shard 2/0: playing 8 games"
    with (copy / "logs" / "rollout.log").open("a") as log:
        log.write(newest + "\n")
    with RunLock(copy / "run.lock"):
        state = gather(copy)
    assert (state.phase, state.activity) == ("running: playing games", newest)
    assert gather(copy).phase == "finished"


def test_a_run_driven_elsewhere_shows_its_phase_from_its_logs(run_dir, tmp_path):
    """A deployment's worker drives the run from a process whose lock this one cannot see:
    fresh lines in RUN/logs/ say it runs, and which step it is in."""
    from datetime import datetime, timedelta

    from ub.flows.cli import main

    copy = tmp_path / "deployed"
    shutil.copytree(run_dir, copy)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    (copy / "config.yaml").write_text(yaml.safe_dump({**config, "rounds": 5}))
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S,000")
    line = f"{stamp} INFO ub.eval [pid 7] eval ckpt 2: 120/400 games (3.1 games/s, ETA 1m30s)"
    with (copy / "logs" / "eval.log").open("a") as log:
        log.write(line + "\n")
    state = gather(copy)
    assert state.phase.startswith("running (log ") and state.phase.endswith(": evaluating")
    assert state.activity == line
    assert main(["dashboard", str(copy), "--once"]) == 0
    # An old line: the run stopped there, and the line says where.
    old = (datetime.now() - timedelta(hours=2)).strftime("%Y-%m-%d %H:%M:%S,000")
    (copy / "logs" / "eval.log").write_text(line.replace(stamp, old) + "\n")
    for other in (copy / "logs").glob("*.log"):
        if other.name != "eval.log":
            other.unlink()
    state = gather(copy)
    assert state.phase == "stopped" and state.activity.endswith("ETA 1m30s)")


def test_sparkline_scales_to_the_series():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([None, 2.0, 2.0]) == " ▅▅"  # flat: the middle, not the floor
    assert sparkline([]) == ""
    # A rate on its fixed 0..1 range: a 1.000 -> 0.998 dip is no dip at all.
    assert sparkline([1.0, 0.998, 1.0], bounds=(0.0, 1.0)) == "███"
    # Elsewhere a tiny relative change stays small (at least 10% of the magnitude is shown).
    assert sparkline([100.0, 99.8, 100.0]) in ("▅▄▅", "▅▅▅")
    assert sparkline([10.0, 20.0, 30.0]) == "▁▅█"
