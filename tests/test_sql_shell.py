"""`ub sql` as a user types it: the interactive shell edits lines and recalls earlier
statements, across sessions, from a history under the user's state folder; a query may
follow `--root`; and nested values (the `runs` view's `settings` MAP, lists, structs) print
as JSON in tables and CSV alike. The shell had no line editing (Up printed `^[[A`), the query
after `--root` was refused, and a MAP printed as Python's list of pairs."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
from processes import as_from_a_terminal

from ub.data.shards import ShardId, write_shard
from ub.flows.cli import main

UP = "\x1b[A"


class Terminal:
    """`ub sql` in a pseudo-terminal of its own, typed into as a user would."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.fd, child = os.openpty()
        # (a terminal's size: rich draws its tables to it)
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        # (SIGINT as a terminal's program gets it: a pytest-xdist worker ignores it, and a
        # child inherits that)
        self.process = subprocess.Popen([sys.executable, "-m", "ub.flows.cli", *argv],
                                        stdin=child, stdout=child, stderr=child, env=env,
                                        start_new_session=True, close_fds=True,
                                        preexec_fn=as_from_a_terminal)
        os.close(child)
        self.seen = ""
        self.at = 0  # (where the next wait_for looks from)

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """What the terminal showed, once it shows ``text`` (after what an earlier call
        waited for)."""
        deadline = time.monotonic() + timeout
        while text not in self.seen[self.at:]:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"the terminal never showed {text!r}; it showed:\n"
                                     f"{self.seen!r}")
        self.at = self.seen.index(text, self.at) + len(text)
        return self.seen

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], min(timeout, 1.0))
        if ready:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # (EIO: the shell has ended)
                return False
            if not chunk:
                return False
            self.seen += chunk.decode(errors="replace")
        return True

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def close(self) -> int:
        """Quit at the next prompt with Ctrl-D; the shell's exit code."""
        try:
            # (at the prompt: typed before it, Ctrl-D is the terminal's, not readline's)
            self.wait_for("ub> ")
            self.type("\x04")
            deadline = time.monotonic() + 60
            while self.process.poll() is None and time.monotonic() < deadline:
                self._read(1.0)
            return self.process.wait(timeout=1)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            os.close(self.fd)


@pytest.fixture()
def data(tmp_path, rollout) -> Path:
    """A data folder of 30 games, as `ub play --out` writes it (no model involved)."""
    write_shard(tmp_path / "data", ShardId(0, 0), "run", rollout.steps, rollout.games)
    return tmp_path / "data"


def user_env(tmp_path: Path, **more: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}
    return {**env, "HOME": str(home), "TERM": "xterm", **more}


def test_up_recalls_a_statement_of_an_earlier_session(data, tmp_path):
    env = user_env(tmp_path)
    first = Terminal(["sql", str(data)], env)
    first.wait_for("ub> ")
    # A statement over two lines, recalled below as one.
    first.type("SELECT count(*) * 1000 + 7\r")
    first.wait_for("... ")
    first.type("AS recalled FROM games;\r")
    first.wait_for("30007")
    assert first.close() == 0

    second = Terminal(["sql", str(data)], env)
    second.wait_for("ub> ")
    second.type(UP)
    second.wait_for("AS recalled FROM games;")  # (readline redraws the line)
    second.type("\r")
    shown = second.wait_for("30007")
    assert second.close() == 0
    assert "^[[A" not in shown and "error" not in shown, shown
    # One entry, kept once (recalled and run again, it is not added twice), for its user only.
    history = tmp_path / "home" / ".local" / "state" / "ub" / "sql_history"
    assert history.read_text().splitlines() == [
        "SELECT count(*) * 1000 + 7 AS recalled FROM games;"]
    assert history.stat().st_mode & 0o077 == 0


def test_the_history_follows_xdg_state_home_and_is_capped(data, tmp_path):
    state = tmp_path / "state"
    env = user_env(tmp_path, XDG_STATE_HOME=str(state))
    history = state / "ub" / "sql_history"
    history.parent.mkdir(parents=True)
    history.write_text("".join(f"SELECT {i} + 100000 AS n;\n" for i in range(1200)))
    shell = Terminal(["sql", str(data)], env)
    shell.wait_for("ub> ")
    shell.type(UP + "\r")  # the newest statement of the file
    shell.wait_for("101199")
    shell.wait_for("ub> ")
    shell.type("SELECT 'ke' || 'pt' AS word;\r")
    shell.wait_for("kept")
    assert shell.close() == 0
    lines = history.read_text().splitlines()
    assert len(lines) == 1000 and lines[-1] == "SELECT 'ke' || 'pt' AS word;"
    assert not (tmp_path / "home" / ".local").exists()


def test_a_history_that_cannot_be_kept_warns_once_and_loses_no_query(data, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    shell = Terminal(["sql", str(data)], user_env(tmp_path, XDG_STATE_HOME=str(blocker)))
    shell.wait_for("ub> ")
    shell.type("SELECT 40 + 2 AS answer;\r")
    shell.wait_for("42")
    shell.wait_for("ub> ")
    shell.type("SELECT count(*) + 1000 AS games FROM games;\r")
    shell.wait_for("1030")
    shell.wait_for("ub> ")
    shell.type(UP + UP + "\r")  # this session's statements are still recalled
    shown = shell.wait_for("42")
    assert shell.close() == 0
    assert shown.count("cannot keep the shell's history") == 1, shown
    assert "Traceback" not in shown


def test_ctrl_c_stops_a_statement_duckdb_is_computing_and_the_connection_goes_on():
    """The shell runs each statement through `_interruptible`: Ctrl-C (SIGINT) stops a
    statement at once, where it used to run on to the end (Python runs its handler only
    between the main thread's bytecodes, never inside DuckDB's call), and the connection
    answers the next one. (In-process, with Python's own SIGINT handler for the test: a
    pytest-xdist worker ignores SIGINT.)"""
    import duckdb

    from ub.cli.sql_shell import _interruptible

    con = duckdb.connect()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    started = time.monotonic()
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            # Hours of work for DuckDB: only the interrupt ends it within the test.
            _interruptible(con, lambda: con.execute(
                "SELECT sum(a * b) FROM range(10000000000) t(a), range(10) u(b)").fetchall())
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 30
    assert con.execute("SELECT 40 + 2").fetchall() == [(42,)]


@pytest.mark.parametrize(("lines", "entries"), [
    (["SELECT 1", "  AS x;"], ["SELECT 1 AS x;"]),
    (["SELECT 1 -- one", ", 2;"], ["SELECT 1 -- one", ", 2;"]),  # joined: 2 commented out
    (["SELECT 'a", "b';"], ["SELECT 'a", "b';"]),  # the text holds the line break
    (["SELECT 1;"], ["SELECT 1;"]),
])
def test_a_statement_is_one_history_entry_where_joining_keeps_it(lines, entries):
    from ub.cli.sql_shell import _history_entries

    assert _history_entries(lines) == entries


def test_statements_from_a_pipe_are_read_as_before_and_keep_no_history(data, tmp_path):
    env = user_env(tmp_path)
    done = subprocess.run([sys.executable, "-m", "ub.flows.cli", "sql", str(data)],
                          input="SELECT 40 + 2\nAS answer;\nSELECT 'two' AS n; SELECT 3 AS n;\n",
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "42" in done.stdout and "two" in done.stdout and "3" in done.stdout
    assert "ub>" not in done.stdout and done.stderr == ""
    assert not (tmp_path / "home" / ".local").exists()


@pytest.fixture()
def runs(tmp_path) -> Path:
    """A folder of two runs that differ in their learning rate (their configs alone: `ub sql`
    reads a run's records as they are)."""
    for name, rate, seed in (("lr1", "1.0e-05", 1), ("lr2", "2.0e-05", 2)):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "config.yaml").write_text(
            f"seed: {seed}\nlearner:\n  learning_rate: {rate}\n  lora: {{rank: 8}}\n"
            "envs:\n- env_id: TicTacToe-v0-train\n")
    return tmp_path / "runs"


def test_the_query_may_come_before_or_after_root(runs, capsys):
    query = "SELECT 40 + 2 AS answer"
    for argv in (["lr1", "--root", str(runs), query],  # (refused before)
                 ["lr1", "--format", "csv", "--root", str(runs), query],  # (refused before)
                 ["lr1", query, "--root", str(runs)],
                 ["--root", str(runs), "lr1", query]):
        if "--format" not in argv:
            argv = [*argv, "--format", "csv"]
        assert main(["sql", *argv]) == 0, (argv, capsys.readouterr().err)
        assert capsys.readouterr().out.splitlines() == ["answer", "42"], argv


def test_words_past_the_query_are_still_refused(runs, capsys):
    assert main(["sql", "lr1", "--root", str(runs), "SELECT 1", "more"]) == 2
    assert "unrecognized arguments: more" in capsys.readouterr().err


def test_nested_values_print_as_json_in_csv_and_tables(runs, capsys):
    query = ("SELECT run, seed, settings, envs, {'rank': 8, 'on': [true, NULL]} AS s, "
             "MAP {1: ['x, y']} AS by_number, 'plain, text' AS t, 1e-5 AS f FROM runs "
             "ORDER BY run")
    assert main(["sql", str(runs), query, "--format", "csv"]) == 0
    import csv

    header, *rows = csv.reader(capsys.readouterr().out.splitlines())
    assert header == ["run", "seed", "settings", "envs", "s", "by_number", "t", "f"]
    assert rows[0] == ["lr1", "1", '{"learner.learning_rate": "1.0e-05"}',
                       '["TicTacToe-v0-train"]', '{"rank": 8, "on": [true, null]}',
                       '{"1": ["x, y"]}', "plain, text", "1e-05"]  # (scalars as they are)
    assert json.loads(rows[1][2]) == {"learner.learning_rate": "2.0e-05"}
    assert main(["sql", str(runs), "SELECT run, settings, envs FROM runs ORDER BY run"]) == 0
    table = capsys.readouterr().out
    assert '{"learner.learning_rate": "1.0e-05"}' in table and '["TicTacToe-v0-train"]' in table
    assert "('learner" not in table


def test_the_shell_has_its_own_commands_as_duckdbs_and_sqlites_do(data, tmp_path):
    """Issue 78: `.format`, `.help` were sent to DuckDB as SQL. Now `.tables`, `.schema VIEW`,
    `.format csv|table` and `.help` are the shell's; an unknown one is named, not run."""
    typed = (".help\n.tables\n.schema games\n.format csv\nSELECT 1 AS a, 'x' AS b;\n"
             ".format table\nSELECT 2 AS c;\n.bogus\n.schema nope\n.format json\n")
    done = subprocess.run([sys.executable, "-m", "ub.flows.cli", "sql", str(data)],
                          input=typed, capture_output=True, text=True,
                          env=user_env(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert any(line.startswith(".schema [VIEW]") for line in out)
    assert "games  steps" in out
    assert any(line.startswith("games(run VARCHAR, round INTEGER, ") for line in out), out
    assert out[out.index("a,b"):out.index("a,b") + 2] == ["a,b", "1,x"]  # (csv)
    assert any("┃ c ┃" in line for line in out)  # (a table again)
    assert done.stderr.splitlines() == [
        "ub: error: .bogus: no such command of the shell; .help lists them (a SQL statement "
        "never begins with a dot)",
        "ub: error: .schema nope: no such view; .tables lists them",
        "ub: error: .format json: give .format table or .format csv"]


def test_a_table_wider_than_the_terminal_names_the_columns_it_leaves_out(data, capsys,
                                                                       monkeypatch):
    """Issue 78: `SELECT * FROM games` at 80 columns showed columns of `…` and cut names
    (`rou…`). The columns that fit with their names whole are shown; a line names the rest."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["sql", str(data), "SELECT * FROM games LIMIT 2"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("┃"))
    shown = [name.strip() for name in header.strip("┃").split("┃")]
    assert all(name and "…" not in name for name in shown), header
    assert max(len(line) for line in out if line[:1] in "┏┃┡│└") <= 80
    [hint] = [line for line in out if "more columns than 80 characters hold" in line]
    assert hint.endswith("; select fewer columns, widen the terminal, or use --format csv "
                         "(.format csv in the shell))")
    columns = main(["sql", str(data), "SELECT * FROM games LIMIT 0", "--format", "csv"]) == 0 \
        and capsys.readouterr().out.strip().split(",")
    assert columns[:len(shown)] == shown
    assert hint.split(": ", 1)[1].split("; ")[0].split(", ") == columns[len(shown):]
