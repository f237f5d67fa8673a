"""Progress of long loops: games as they end (rollouts, evaluations) and the tiny model's
training steps. A bar with done/total, rate and ETA on a terminal (a real pty here), plain lines
elsewhere (CI logs), nothing under --quiet."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest
from processes import in_a_terminal

from ub.actors.spec import parse_actor
from ub.games.specs import GameSpec
from ub.progress_bar import progress_bar, show_progress_bars
from ub.rollout import assign_games, play_games


@pytest.fixture(autouse=True)
def bars_on():
    """Bars shown, whatever an earlier quiet ``selfplay`` in this process chose."""
    show_progress_bars(True)
    yield
    show_progress_bars(True)


def test_play_games_reports_each_finished_game():
    spec = GameSpec("TicTacToe-v0-train")
    calls: list[tuple[int, int]] = []
    assignments = assign_games(spec, [parse_actor("random"), parse_actor("random")], 7,
                               base_seed=1)
    played = play_games(assignments, base_seed=1, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(i, 7) for i in range(1, 8)]
    assert played.games.num_rows == 7


def test_plain_lines_when_not_a_terminal(caplog):
    stream = io.StringIO()
    logger = logging.getLogger("ub.eval")
    with (caplog.at_level(logging.INFO, logger="ub.eval"),
          progress_bar("eval ckpt 4", 400, stream=stream, every=0.0, logger=logger) as bar):
        for done in range(1, 401):
            bar(done, 400)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("eval ckpt 4: 1/400 games (") and ", ETA " in lines[0]
    assert lines[-1].startswith("eval ckpt 4: 400/400 games (") and " in " in lines[-1]
    assert len(lines) == 400  # every=0: a line per game here; the default is one per 30 s
    assert caplog.messages == lines  # the same lines reach the run's log files


def test_quiet_shows_nothing():
    stream = io.StringIO()
    show_progress_bars(False)
    try:
        with progress_bar("round 3", 10, stream=stream, every=0.0) as bar:
            for done in range(1, 11):
                bar(done, 10)
    finally:
        show_progress_bars(True)
    assert stream.getvalue() == ""


def test_a_bar_on_a_terminal():
    """In a real pty: Rich draws the bar (count, rate, ETA) and takes it away at the end."""
    script = ("import time\n"
              "from ub.progress_bar import progress_bar\n"
              "with progress_bar('round 0', 6) as bar:\n"
              "    for i in range(1, 7):\n"
              "        time.sleep(0.15); bar(i, 6)\n"
              "print('after the bar')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "CI")}
    env["TERM"] = "xterm-256color"
    _, text = in_a_terminal([sys.executable, "-c", script], env, 60)
    assert "round 0" in text and "/6" in text and "games/s" in text and "ETA" in text
    assert "after the bar" in text


def test_the_engine_start_drops_vllms_numa_notice_and_keeps_the_rest():
    """The NUMA-binding notice that torch's C++ layer writes to fd 2 at every CPU engine start
    is dropped; everything else written meanwhile (native or Python) comes through, in order."""
    script = (
        "import os, sys\n"
        "from ub.inference.noise import NATIVE_NOISE, filtered_stderr\n"
        "with filtered_stderr(NATIVE_NOISE):\n"
        "    os.write(2, b'native before\\n')\n"
        "    os.write(2, b'[W1124 08:21:29.179529078 utils.cpp:68] Warning: NUMA binding: Using "
        "MEMBIND policy for memory allocation on the NUMA nodes (0). (function "
        "init_cpu_memory_env)\\n')\n"
        "    print('python line', file=sys.stderr)\n"
        "os.write(2, b'after\\n')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "native before\npython line\nafter\n"
