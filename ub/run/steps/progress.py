"""What ``ub train`` prints: a line per round and, at the end, the learning curve (the
progress bars of a round's games and evaluations are :mod:`ub.progress_bar`'s).

Everything shown is read back from the round manifests, so a resumed run's summary covers the
rounds of earlier processes too.
"""

from __future__ import annotations

import time
from statistics import mean, median
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ub.display import counted, in_markup, shown
from ub.progress_bar import duration, show_progress_bars
from ub.run.folder.layout import read_json, round_label
from ub.run.steps.evaluate import eval_due
from ub.run.steps.health import env_alerts
from ub.run.steps.tracking import read_metrics

if TYPE_CHECKING:
    from ub.run.steps.rounds import Run


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def eval_cell(row: dict[str, Any]) -> str:
    return f"{_pct(row['win_rate'])} [{_pct(row['win_low'])}, {_pct(row['win_high'])}]"


def env_cell(row: dict[str, Any]) -> str:
    """An eval row's env, and ``(mask)`` where its moves were held to the legal ones."""
    return row["env_id"] + (" (mask)" if row.get("legal_moves") == "mask" else "")


def exploitability_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per (env, policy) of a checkpoint's exploitability rows: NashConv under each
    legal-move mode (free with its illegal share), the random policy's beside it."""
    out = []
    for env_id, policy in dict.fromkeys((r["env_id"], r["policy"]) for r in rows):
        mine = sorted((r for r in rows if (r["env_id"], r["policy"]) == (env_id, policy)),
                      key=lambda r: r["legal_moves"] != "mask")
        parts = [f"{r['legal_moves']} {nash_conv_cell(r)}"
                 + (f" (illegal {_pct(r['illegal'])})" if r["legal_moves"] == "free" else "")
                 for r in mine]
        out.append(f"NashConv on {env_id} ({policy}): {', '.join(parts)}; random "
                   f"{mine[0]['random_nash_conv']:.3f} {mine[0]['unit']}")
    return out


def nash_conv_cell(row: dict[str, Any]) -> str:
    """NashConv, with its interval where the tree was cut."""
    if row["exact"]:
        return f"{row['nash_conv']:.3f}"
    return f"{row['nash_conv']:.3f} [{row['nash_conv_low']:.3f}, {row['nash_conv_high']:.3f}]"


def baseline_cell(row: dict[str, Any]) -> str:
    """The random player's win rate in the same seats on the same seeds, or ``-``."""
    if row.get("baseline_win_rate") is None:
        return "-"
    return (f"{_pct(row['baseline_win_rate'])} [{_pct(row['baseline_low'])}, "
            f"{_pct(row['baseline_high'])}]")


class Progress:
    """Round-by-round console output of one ``selfplay`` call."""

    def __init__(self, run: Run, quiet: bool = False) -> None:
        self.run = run
        self.console = Console(quiet=quiet, highlight=False)
        show_progress_bars(not quiet)
        if not self.console.is_terminal:  # logs and CI: rich would wrap at 80 columns
            self.console.width = max(self.console.width, 120)
        self.started = time.perf_counter()
        self.play_seconds: list[float] = []  # (this process's rounds, less their evaluation)
        self.eval_seconds: list[float] = []

    def note(self, text: str) -> None:
        self.console.print(f"[dim]{in_markup(text)}[/dim]")

    def start(self, first_round: int, settings: tuple[str, ...] = ()) -> None:
        """The run's first line, and the settings ``--set`` changed (``settings``)."""
        c = self.run.config
        what = "starting" if first_round == 0 else f"resuming at {round_label(first_round)}"
        self.console.print(
            f"[bold]ub train[/bold] run [cyan]{self.run.name}[/cyan] ({what}; "
            f"{counted(c.rounds, 'round')} of {counted(c.rollout.games_per_round, 'game')} on "
            f"{in_markup(', '.join(e.env_id for e in c.envs))}) -> "
            f"{in_markup(self.run.paths.location)}")
        if settings:
            self.console.print(f"  settings changed by --set: {in_markup(', '.join(settings))}")

    def round_done(self, round_: int, m: dict[str, Any]) -> None:
        t = m["timings"]
        play = t["rollout"]
        rate = (f"{m['games'] / play:.1f} games/s, {m['generated_tokens'] / play:.0f} tok/s"
                if play > 0 else "reused")
        invalid = m["invalid_moves"] / m["model_decisions"] if m["model_decisions"] else 0.0
        learner = m["learner"]
        line = (f"{round_label(round_)}/{self.run.config.rounds}  {m['games']} games ({rate})  "
                f"invalid {_pct(invalid)}  loss {learner.get('loss', 0.0):+.4f}  "
                f"grad {learner.get('grad_norm', 0.0):.3f}")
        for update, rows in sorted(m["evals"].items(), key=lambda kv: int(kv[0])):
            for row in rows:
                line += (f"\n    eval ckpt {int(update)} vs {in_markup(row['opponent'])} on "
                         f"{in_markup(env_cell(row))}: win {eval_cell(row)}, "
                         f"draw {_pct(row['draws'] / max(row['games'], 1))}, "
                         f"invalid {_pct(row['invalid_move_rate'])}")
            for text in exploitability_lines(m.get("exploitability", {}).get(update, [])):
                line += f"\n    eval ckpt {int(update)} {in_markup(text)}"
        # (unwrapped: a log's reader greps the round's time on its line)
        self.console.print(f"{line}  [dim]({t['round']:.0f} s{self._eta(round_, t)})[/dim]",
                           soft_wrap=True)
        tracking = self.run.config.tracking
        for alert in env_alerts(read_metrics(self.run.paths, round_),
                                tracking.alert_invalid_move_rate, tracking.alert_entropy):
            self.console.print(f"    [yellow]{in_markup(alert)}[/yellow]")

    def _eta(self, round_: int, timings: dict[str, float]) -> str:
        """The run's time so far and to go: the rounds left at this process's median round
        less its evaluation (the first also starts the engine: a mean counted it 31 times),
        and the evaluations due (:func:`eval_due`) at its mean evaluation."""
        self.play_seconds.append(timings["round"] - timings.get("eval", 0.0))
        if timings.get("eval"):
            self.eval_seconds.append(timings["eval"])
        config = self.run.config
        left = config.rounds - round_ - 1
        elapsed = f"; run {duration(time.perf_counter() - self.started)}"
        if left <= 0:
            return elapsed
        evals = sum(eval_due(config, u) for u in range(round_ + 2, config.rounds + 1))
        to_go = median(self.play_seconds) * left + (
            mean(self.eval_seconds) * evals if self.eval_seconds else 0.0)
        return f"{elapsed}, ETA {duration(to_go)}"

    def finish(self) -> dict[str, Any]:
        """Print the learning curve over every committed round; return the run's summary."""
        curve = learning_curve(self.run)
        table = Table(title=f"learning curve of {self.run.name}")
        for column in ("checkpoint", "env", "opponent", "games", "win rate [95% CI]",
                       "random in its seats", "draws", "invalid moves"):
            table.add_column(column)
        for update, row in curve:
            table.add_row(str(update), shown(env_cell(row)), shown(row["opponent"]),
                          str(row["games"]),
                          eval_cell(row), baseline_cell(row), str(row["draws"]),
                          _pct(row["invalid_move_rate"]))
        if curve:
            self.console.print(table)
        measured = exploitability_curve(self.run)
        if measured:
            table = Table(title=f"exploitability of {self.run.name} (what a best response "
                          "wins, summed over the seats: 0 is unexploitable)")
            for column in ("checkpoint", "env", "policy", "mask", "free", "free: illegal",
                           "random policy"):
                table.add_column(column)
            for update, env_id, policy, by_mode in measured:
                mask, free = by_mode.get("mask"), by_mode.get("free")
                some = mask or free
                assert some is not None
                table.add_row(str(update), shown(env_id), shown(policy),
                              nash_conv_cell(mask) if mask else "-",
                              nash_conv_cell(free) if free else "-",
                              _pct(free["illegal"]) if free else "-",
                              f"{some['random_nash_conv']:.3f} {some['unit']}")
            self.console.print(table)
        paths = self.run.paths
        where = paths.location
        self.console.print(
            f"run data: {where}  (query it: ub sql {where} \"SELECT ...\"; "
            f"resume or extend: {paths.resume_command} --rounds N)  "
            f"[dim]{time.perf_counter() - self.started:.0f} s[/dim]")
        last = paths.committed_rounds()
        return {"run": self.run.name, "root": str(paths.root), "store": paths.store,
                "rounds": len(last), "evals": [{"update": u, **row} for u, row in curve]}


def round_summary_markdown(run: Run, round_: int, m: dict[str, Any]) -> str:
    """A short markdown summary of a round (for the Prefect UI)."""
    t = m["timings"]
    invalid = m["invalid_moves"] / m["model_decisions"] if m["model_decisions"] else 0.0
    lines = [f"# {run.name}: {round_label(round_)} of {run.config.rounds}", "",
             f"- {m['games']} games, {m['model_decisions']} model decisions, invalid moves "
             f"{_pct(invalid)}",
             f"- learner: loss {m['learner'].get('loss', 0.0):+.4f}, grad norm "
             f"{m['learner'].get('grad_norm', 0.0):.3f}, {m['learner'].get('tokens', 0)} tokens",
             f"- time: {t['round']:.1f} s (rollout {t['rollout']:.1f}, eval {t['eval']:.1f}, "
             f"learner {t['learner']:.1f}, other {t['other']:.1f})"]
    for update, rows in sorted(m["evals"].items(), key=lambda kv: int(kv[0])):
        for row in rows:
            lines.append(f"- eval checkpoint {update} vs {row['opponent']} on {env_cell(row)}: "
                         f"win {eval_cell(row)}")
        lines += [f"- eval checkpoint {update} {text}"
                  for text in exploitability_lines(m.get("exploitability", {}).get(update, []))]
    where = run.paths.location
    lines += ["", f"Data: `{where}`; query it with `ub sql {where}`."]
    return "\n".join(lines)


def exploitability_curve(run: Run) -> list[tuple[int, str, str, dict[str, dict[str, Any]]]]:
    """Every exploitability measurement of the run's evaluations, in checkpoint order:
    ``(update, env, policy, {legal-move mode: row})``."""
    out: dict[tuple[int, str, str], dict[str, dict[str, Any]]] = {}
    for round_ in run.paths.committed_rounds():
        manifest = read_json(run.paths.manifest(round_))
        for update, rows in manifest.get("exploitability", {}).items():
            for row in rows:
                key = (int(update), row["env_id"], row["policy"])
                out.setdefault(key, {})[row["legal_moves"]] = row
    return [(*key, out[key]) for key in sorted(out)]


def learning_curve(run: Run) -> list[tuple[int, dict[str, Any]]]:
    """Every evaluation of the run, in checkpoint order: ``(update, row)``."""
    out: list[tuple[int, dict[str, Any]]] = []
    for round_ in run.paths.committed_rounds():
        manifest = read_json(run.paths.manifest(round_))
        for update, rows in sorted(manifest.get("evals", {}).items(), key=lambda kv: int(kv[0])):
            out.extend((int(update), row) for row in rows)
    return out
