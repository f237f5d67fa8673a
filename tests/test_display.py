"""What ub prints shows values as they are (ub/display.py): a move such as `[check]` is no
rich markup, and no escape sequence in a value reaches the terminal. `ub sql` lost Kuhn Poker's
and Connect Four's moves from its cells, crashed on `[/fold]`, and passed OSC sequences through
(issue 69)."""

from __future__ import annotations

from ub.data.shards import ShardId, write_shard
from ub.display import in_markup, printable
from ub.flows.cli import main

VALUES = ("[check]", "x[col 3]", "[/fold]", ":smile:")
OSC = "a\x1b]0;retitled\x07b"  # sets a terminal window's title


def test_ub_sql_shows_moves_and_markup_like_text_as_they_are(tmp_path, rollout, capsys):
    write_shard(tmp_path, ShardId(0, 0), "run", rollout.steps, rollout.games)
    cells = ", ".join(f"'{v}' AS c{i}" for i, v in enumerate(VALUES))
    query = f"SELECT {cells}, 'a' || chr(27) || ']0;retitled' || chr(7) || 'b' AS \"[red]x\""
    assert main(["sql", str(tmp_path), query]) == 0
    out = capsys.readouterr().out
    assert all(value in out for value in VALUES), out
    assert "[red]x" in out and r"a\x1b]0;retitled\x07b" in out
    assert "\x1b" not in out and "\x07" not in out
    # CSV is data for a pipe: the values' characters unchanged.
    assert main(["sql", str(tmp_path), query, "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == ",".join([*VALUES, OSC])


def test_a_line_of_markup_shows_a_value_in_it_as_it_is():
    from rich.console import Console

    console = Console(record=True, width=200, color_system=None)
    console.print(f"[dim]vs {in_markup('[/fold] ' + OSC)}[/dim]")
    assert console.export_text().strip() == r"vs [/fold] a\x1b]0;retitled\x07b"
    assert printable("tab\tand\nnewline\x9b") == "tab\tand\nnewline\\x9b"


def test_a_cut_cell_says_so_and_how_to_see_it_whole(tmp_path, rollout, capsys):
    write_shard(tmp_path, ShardId(0, 0), "run", rollout.steps, rollout.games)
    assert main(["sql", str(tmp_path), "SELECT repeat('x', 81) AS long, 'short' AS s"]) == 0
    out = capsys.readouterr().out
    assert "…" in out
    assert "(values longer than 80 characters are cut, ending in …: --format csv writes them " \
           "whole)" in out
    assert main(["sql", str(tmp_path), "SELECT 'short' AS s"]) == 0
    assert "are cut" not in capsys.readouterr().out
