"""`ub dashboard` and `ub report` on a real 2-round run: the numbers they show are the run's,
the dashboard works in a real terminal (tmux), and the report's plots are real images."""

from __future__ import annotations

import html
import json
import re
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
    # Mirror games, and games against a fixed opponent for the report's training figure.
    "opponents": [{"mode": "mirror", "weight": 0.5}, {"mode": "fixed", "names": ["random"],
                                                      "weight": 0.5}],
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
    from ub.report.common import SIZE, SIZES

    out = tmp_path / "report"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.html")
    pngs = sorted(out.glob("*.png"))
    assert {p.stem for p in pngs} >= {"learning_curve", "training_by_opponent", "ratings",
                                      "match_matrix", "move_quality", "entropy",
                                      "response_length", "learner", "throughput"}
    for png in pngs:
        image = matplotlib.image.imread(png)
        width, height = SIZES.get(png.stem, SIZE)
        assert image.shape[:2] == (100 * height, 100 * width)
        assert image.std() > 0.01, f"{png.name} is blank"
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(pngs)
    # The numbers are on the page: the learning curve with its intervals, and the settings.
    from ub.run.folder.views import RunViews

    for row in RunViews(run_dir).evals().to_pylist():
        assert (f"<td>{100 * row['win_rate']:.1f}% [{100 * row['win_low']:.1f}%, "
                f"{100 * row['win_high']:.1f}%]</td>") in page
    assert "<code>rollout.games_per_round</code></td><td>8</td>" in page
    # keyed as --set takes them, a list as one value that --set takes back
    envs = re.search(r"<code>envs</code></td><td>(.*?)</td>", page)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert envs and yaml.safe_load(html.unescape(envs[1])) == config["envs"], page


def test_the_artifacts_command_works_from_any_folder(run_dir, tmp_path, capsys, monkeypatch):
    """Prefect's report artifact says how to write the page again: `ub report pf` failed from
    every folder but the runs root's parent (issue 78); now it names the root, and the output
    folder where it is not the run's own."""
    import shlex

    from ub.flows.cli import main
    from ub.report.page import artifact_markdown, build_report

    run = tmp_path / "runs elsewhere" / "pf"
    shutil.copytree(run_dir, run)
    for out in (run / "report", tmp_path / "pages"):
        markdown = artifact_markdown(build_report(run, out))
        [again] = re.findall(r"`(ub report [^`]*)` writes it again", markdown)
        (out / "report.html").unlink()
        monkeypatch.chdir(tmp_path)  # (not where the run is)
        assert main(shlex.split(again)[1:]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.strip() == str(out / "report.html")


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

    from ub.report.common import SIZE
    from ub.report.health import learner, response_length
    from ub.report.pool import match_matrix
    from ub.run.folder.views import RunViews

    views = RunViews(run_dir)
    t = {name: table.to_pylist() for name, table in views.tables().items()}
    fig = plt.figure(figsize=SIZE)
    assert learner(t, fig)
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "loss", "gradient norm", "clip fraction", "KL (nats per token)", "learning rate",
        "reward (batch mean)"]
    # Each panel draws the learner view's own numbers (the learning rate: the optimizer's).
    rates = [r["learning_rate"] for r in t["learner"]]
    assert list(fig.axes[4].lines[0].get_ydata()) == rates
    fig = plt.figure(figsize=SIZE)
    assert response_length(t, fig)
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels == ["completion tokens per decision", "truncated sequences in the batch (count)"]
    fig = plt.figure(figsize=SIZE)
    matches = {"ckpt-000001": {"random": [3, 1, 0]}, "random": {"ckpt-000001": [0, 1, 3]}}
    assert match_matrix(matches, fig)
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


def test_training_results_credit_the_newest_checkpoint_by_opponent_kind():
    """The learner of a round is its newest seated checkpoint; each of its seats counts once,
    against the kind of whoever else sits: past checkpoints, a fixed opponent, or itself."""
    from ub.report.curves import MIRROR, PAST, training_results

    rows = [
        {"round": 4, "env_id": "E", "actors": ["ckpt-000004", "random"],
         "results": ["win", "loss"], "games": 3},
        {"round": 4, "env_id": "E", "actors": ["random", "ckpt-000004"],
         "results": ["draw", "draw"], "games": 1},
        {"round": 4, "env_id": "E", "actors": ["ckpt-000002", "ckpt-000004"],
         "results": ["win", "loss"], "games": 2},
        {"round": 4, "env_id": "E", "actors": ["ckpt-000004", "ckpt-000004"],
         "results": ["win", "loss"], "games": 5},
        # The pool playing itself without the learner: not the learner's game.
        {"round": 4, "env_id": "E", "actors": ["ckpt-000001", "ckpt-000002"],
         "results": ["win", "loss"], "games": 7},
    ]
    got = {r["opponent"]: (r["seats"], r["wins"], r["draws"], r["losses"])
           for r in training_results(rows)}
    assert got == {"random": (4, 3, 1, 0), PAST: (2, 0, 0, 2), MIRROR: (10, 5, 0, 5)}


def test_training_figure_is_the_games_as_plain_duckdb_counts_them(run_dir):
    """The report's training win rates against `random`, per round and env, equal a query of
    plain DuckDB over the run's game shards."""
    import duckdb

    from ub.report.page import training_rows
    from ub.run.folder.views import RunViews

    mine = {(r["round"], r["env_id"]): (r["wins"], r["seats"])
            for r in training_rows(RunViews(run_dir)) if r["opponent"] == "random"}
    direct = duckdb.sql(f"""
        WITH seats AS (
            SELECT round, env_id, results[list_position(actors, printf('ckpt-%06d', round))]
                   AS result
            FROM read_parquet('{run_dir}/games/*/*.parquet')
            WHERE outcome <> 'error' AND parent_game_id IS NULL
              AND list_contains(actors, 'random'))
        SELECT round, env_id, count(*) FILTER (result = 'win'), count(*)
        FROM seats GROUP BY ALL""").fetchall()
    assert mine and mine == {(r, e): (w, n) for r, e, w, n in direct}


def test_figures_say_which_lines_coincide_and_tick_whole_rounds():
    """Issue 78: two vs-perfect lines at 0, or two arms that learned alike, lay one under the
    other with nothing to say so; one round ticked the axis at -0.045, -0.030, ...; the
    exploitability figure left out how much free play is off the legal moves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ub.report.common import ROUND_AXIS, note_coinciding, round_axis
    from ub.report.curves import exploitability

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0.0, 0.0], label="win vs perfect")
    ax.plot([0, 1], [0.0, 0.0], label="win vs perfect, masked")
    ax.plot([0, 1], [0.5, 0.6], label="win vs random")
    ax.plot([0], [0.3], label="_hidden")
    round_axis(ax)
    note_coinciding(ax)
    assert [t.get_text() for t in ax.texts] == [
        "lines on top of each other: win vs perfect = win vs perfect, masked"]
    fig, ax = plt.subplots()
    ax.plot([3], [0.5], label="one round")
    round_axis(ax)
    fig.canvas.draw()
    assert ax.get_xlabel() == ROUND_AXIS
    shown = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert shown == [3]
    row = {"env_id": "Nim-v0-train", "policy": "greedy", "unit": "games", "exact": True,
           "nash_conv_low": 2.0, "nash_conv_high": 2.0, "random_nash_conv": 1.9998}
    rows = [{**row, "update": u, "legal_moves": mode, "nash_conv": 2.0,
             "illegal": illegal if mode == "free" else 0.0}
            for u, illegal in ((0, 0.9), (32, 0.6)) for mode in ("mask", "free")]
    fig = plt.figure()
    assert exploitability({"exploitability": rows}, fig)
    main, share = fig.axes
    assert share.get_ylabel() == "share of free play off the legal moves"
    assert [list(line.get_ydata()) for line in share.get_lines()] == [[0.9, 0.6]]
    assert [t.get_text() for t in main.texts] == [
        "lines on top of each other: greedy, free = greedy, mask"]
    plt.close("all")


def test_report_figures_say_what_they_leave_out():
    """Each env has its own learning-curve panel (one env's line cannot hide another's); mu
    over rounds draws a few labelled checkpoints and says how many of how many; the match
    matrix names the checkpoints it leaves out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ub.report.curves import learning_curve
    from ub.report.pool import MAX_LINES, MAX_MATRIX, match_matrix, ratings

    row = {"update": 0, "opponent": "random", "games": 10, "wins": 5, "draws": 0, "losses": 5,
           "win_rate": 0.5, "win_low": 0.2, "win_high": 0.8, "baseline_win_rate": 0.5}
    evals = [{**row, "env_id": env, "update": u} for env in ("Nim-v0", "TicTacToe-v0")
             for u in (0, 8)]
    fig = plt.figure()
    assert learning_curve({"evals": evals}, fig)
    assert [ax.get_title() for ax in fig.axes] == ["Nim-v0", "TicTacToe-v0"]
    assert fig.axes[0].get_xlabel() == "checkpoint (evaluated: 0, 8)"
    members = [f"ckpt-{u:06d}" for u in range(30)] + ["random"]
    fig = plt.figure()
    assert ratings({"ratings": [{"name": n, "round": r, "mu": 25.0 + r, "sigma": 1.0}
                                for n in members for r in range(3)]}, fig)
    over_time = fig.axes[1]
    labels = [line.get_label() for line in over_time.lines]
    assert labels[:MAX_LINES] == ["ckpt 0", "ckpt 6", "ckpt 12", "ckpt 17", "ckpt 23",
                                  "ckpt 29"][:MAX_LINES] and labels[-1] == "random"
    assert f"{MAX_LINES} of 30 checkpoints" in over_time.get_title()
    fig = plt.figure()
    assert match_matrix({a: {"random": [1, 0, 1]} for a in members[:-1]}, fig)
    assert f"left out: checkpoints 0-{30 - MAX_MATRIX}" in fig.axes[0].get_xlabel()
    plt.close("all")


def test_report_of_a_folder_of_runs_overlays_them_by_arm(run_dir, tmp_path, capsys):
    """`ub report FOLDER`: every run's learning curve in its arm's colour with each arm's mean,
    a legend of the arms' names and settings and the arms' figures as `ub compare` gives them."""
    from ub.compare import compare, latest_common_checkpoint, measured
    from ub.flows.cli import main
    from ub.run.folder.sweep import sweep_tables

    folder = tmp_path / "sweep"
    for name, rate in (("a-s0", None), ("a-s1", None), ("b-s0", 0.01)):
        shutil.copytree(run_dir, folder / name)
        config = yaml.safe_load((folder / name / "config.yaml").read_text())
        config["seed"] = int(name[-1])
        if rate is not None:
            config["learner"]["learning_rate"] = rate
        (folder / name / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["report", str(folder)]) == 0
    page = Path(capsys.readouterr().out.strip())
    assert page == folder / "report" / "report.html"
    assert {p.stem for p in page.parent.glob("*.png")} == {"sweep_learning_curves",
                                                          "sweep_health"}
    text = page.read_text()
    # Each arm by the name its runs' names give it (ARM-sSEED, as ub sweep names them)
    assert "<td>a</td><td>learner.learning_rate=0.001</td><td>a-s0 (seed 0), a-s1 (seed 1)" \
        in text
    assert "<td>b</td><td>learner.learning_rate=0.01</td><td>b-s0 (seed 0)" in text
    tables, _ = sweep_tables(folder)
    evals = tables["evals"].to_pylist()
    checkpoint = latest_common_checkpoint(evals, ["a-s0", "a-s1", "b-s0"])
    summaries, _ = compare(measured(tables["runs"].to_pylist(), evals, [], checkpoint))
    for s in summaries:
        assert f"<td>{s.mean:.3f} [{s.low:.3f}, {s.high:.3f}]</td>" in text
