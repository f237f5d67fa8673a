"""``ub sql``'s interactive shell: statements from a terminal, with line editing and a history
kept across sessions, or from a pipe, line by line."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ub.cli.sql_output import MAX_ROWS, print_result
from ub.errors import UbError


def sql_shell(con, root: Path | str, views: list[str], max_rows: int = MAX_ROWS) -> None:
    """Read statements (ending with ``;``) from stdin until EOF or ``.quit``: on a terminal
    with line editing and a history kept across sessions (:class:`_History`), where Ctrl-C
    drops the statement being typed or cancels the one running; from a pipe line by line, as
    they come."""
    import duckdb

    from ub.data.sql import sql_error_line

    interactive = sys.stdin.isatty()
    history = _History.start() if interactive else None
    if interactive:
        print(f"ub sql {root} (read-only). Views: {', '.join(views)}. End statements with ';', "
              "quit with .quit or Ctrl-D; .help lists the shell's commands; Up recalls "
              "earlier statements, Ctrl-C cancels one.")
    buffer, lines = "", list[str]()
    fmt = "table"
    while True:
        try:
            line = input("ub> " if not buffer else "... ") if interactive else sys.stdin.readline()
        except EOFError:
            break
        except KeyboardInterrupt:
            if not interactive:
                raise
            # Ctrl-C at the prompt drops the statement being typed, as psql's and Python's
            # shells do; Ctrl-D or .quit ends the shell.
            print()
            buffer, lines = "", []
            continue
        if not interactive and line == "":
            break
        if line.strip() in (".quit", ".exit"):
            break
        if not buffer and line.strip().startswith("."):  # (a shell command, not SQL)
            try:
                fmt = _dot_command(line.strip(), con, views, fmt)
            except UbError as exc:
                print(f"ub: error: {exc}", file=sys.stderr)
            continue
        buffer += line + ("\n" if interactive else "")
        lines.append(line)
        if buffer.strip().endswith(";"):
            if history is not None:
                history.add(lines)
            try:
                for statement in con.extract_statements(buffer):
                    _interruptible(con, partial(print_result, con, statement.query, fmt,
                                                max_rows))
            except (UbError, duckdb.Error) as exc:
                print(f"ub: error: {sql_error_line(exc)}", file=sys.stderr)
            except KeyboardInterrupt:
                if not interactive:
                    raise
                print("ub: statement cancelled (Ctrl-C)", file=sys.stderr)
            buffer, lines = "", []


SHELL_COMMANDS = {
    ".help": "this list",
    ".tables": "the views a statement can read",
    ".schema [VIEW]": "each view's columns and their types (or VIEW's alone)",
    ".format table|csv": "how results print (a table of the first rows, or every row as CSV)",
    ".quit": "end the shell (Ctrl-D too)",
}
"""The shell's own commands, as DuckDB's and SQLite's shells have them."""


def _dot_command(line: str, con, views: list[str], fmt: str) -> str:
    """Do shell command ``line`` (``.help``, ``.tables``, ``.schema``, ``.format``) and return
    the result format in force after it."""
    from ub.data.sql import run_sql

    command, _, argument = line.partition(" ")
    argument = argument.strip()
    if command == ".help":
        for usage, what in SHELL_COMMANDS.items():
            print(f"{usage:<20} {what}")
    elif command == ".tables":
        print("  ".join(views))
    elif command == ".schema":
        if argument and argument not in views:
            raise UbError(f".schema {argument}: no such view; .tables lists them")
        for view in [argument] if argument else views:
            name = view.replace('"', '""')
            columns = run_sql(con, f'DESCRIBE "{name}"').to_pylist()
            print(f"{view}(" + ", ".join(f"{c['column_name']} {c['column_type']}"
                                         for c in columns) + ")")
    elif command == ".format":
        if argument not in ("table", "csv"):
            raise UbError(f".format {argument}: give .format table or .format csv")
        return argument
    else:
        raise UbError(f"{command}: no such command of the shell; .help lists them (a SQL "
                      "statement never begins with a dot)")
    return fmt


def _interruptible(con, run: Callable[[], None]) -> None:
    """Call ``run`` (a statement on ``con`` and its printing) so that Ctrl-C stops it: in a
    thread, because Python runs its SIGINT handler only between the main thread's bytecodes,
    never while DuckDB computes there; the main thread waits on an event (a ``join`` cut short
    by Ctrl-C can leave the thread taken for ended on Python 3.11) and on Ctrl-C interrupts
    the statement, waits for it to stop and raises ``KeyboardInterrupt``."""
    failure: list[BaseException] = []
    ended = threading.Event()

    def target() -> None:
        try:
            run()
        except BaseException as exc:  # (handed to the main thread, which raises it)
            failure.append(exc)
        finally:
            ended.set()

    threading.Thread(target=target, name="ub-sql-statement", daemon=True).start()
    try:
        while not ended.wait(0.1):
            pass
    except KeyboardInterrupt:
        con.interrupt()
        ended.wait()
        raise
    if failure:
        raise failure[0]


HISTORY_LENGTH = 1000
"""The most statements the shell's history file keeps (the newest)."""


def history_path() -> Path:
    """The shell's history file: ``$XDG_STATE_HOME/ub/sql_history``, by default
    ``~/.local/state/ub/sql_history`` (the XDG base directory spec's place for history, and
    its rule: a relative ``XDG_STATE_HOME`` is ignored)."""
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "ub" / "sql_history"


class _History:
    """The interactive shell's readline history, one entry a statement, kept in
    :func:`history_path` across sessions. Each statement is appended to the file as it runs
    (a killed shell loses none, and two shells at once both keep theirs). A file that cannot
    be read or written is warned about once and left alone for the session: the shell still
    runs every statement (and Up still recalls this session's)."""

    def __init__(self, readline: Any, path: Path) -> None:
        self.readline = readline
        self.path: Path | None = path

    @classmethod
    def start(cls) -> _History | None:
        """The history of a shell on a terminal; None where Python has no readline (some
        platforms): then lines are read without editing, as before."""
        try:
            import readline
        except ImportError:
            return None
        path = history_path()
        history = cls(readline, path)
        # Entries are added by statement, not by line (input() would add each line).
        readline.set_auto_history(False)
        readline.set_history_length(HISTORY_LENGTH)  # (the file is cut to it at each write)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():  # (0600, as shells keep theirs: a query may say too much)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
            readline.read_history_file(str(path))
        except (OSError, UnicodeError) as exc:
            history.failed(exc)
        return history

    def add(self, lines: Sequence[str]) -> None:
        """Add a statement typed as ``lines`` (an Up recalls it whole), and write it to the
        file."""
        readline = self.readline
        entries = _history_entries(lines)
        last = readline.get_current_history_length()
        if entries == [readline.get_history_item(last)]:
            return  # (the same statement again, e.g. recalled: once is enough)
        for entry in entries:
            readline.add_history(entry)
        if self.path is None or not entries:
            return
        try:
            if hasattr(readline, "append_history_file"):  # (GNU readline; libedit may lack it)
                readline.append_history_file(len(entries), str(self.path))
            else:
                readline.write_history_file(str(self.path))
        except OSError as exc:
            self.failed(exc)

    def failed(self, exc: BaseException) -> None:
        print(f"ub: warning: cannot keep the shell's history in {self.path} "
              f"({getattr(exc, 'strerror', None) or exc}): this session's statements are not "
              "kept", file=sys.stderr)
        self.path = None  # (warned once; the file, whatever it holds, is left as it is)


def _history_entries(lines: Sequence[str]) -> list[str]:
    """The history entries of a statement typed as ``lines``: one, its lines joined by
    spaces (a history file holds an entry a line), unless joining would change the statement
    (a ``--`` comment, or a quoted text or name across lines): then one entry a line, as
    readline would keep them."""
    import duckdb

    typed = [line for line in lines if line.strip()]
    if len(typed) <= 1:
        return [line.strip() for line in typed]
    text = "\n".join(typed)
    try:
        tokens = duckdb.tokenize(text)
    except (duckdb.Error, RuntimeError):
        return typed
    ends = [start for start, _ in tokens[1:]] + [len(text)]
    for (start, kind), end in zip(tokens, ends, strict=True):
        token = text[start:end].rstrip()
        if "\n" in token or (kind == duckdb.token_type.comment and token.startswith("--")):
            return typed
    return [" ".join(line.strip() for line in typed)]


