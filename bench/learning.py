"""Does it learn? An arm of a config over seeds, judged against the right baseline, beyond what
``ub compare`` prints.

Not a test. ``.venv/bin/python bench/learning.py [--seeds 0-9] [--config tiny-cpu]
[--set key=value ...] [--label NAME] [--root DIR] [--games 400] [--evals ENV:OPP,...]``

The arm trains as ``ub sweep CONFIG --arm LABEL KEY=VALUE ... --seeds SEEDS --root ROOT`` (a
subprocess, as a user runs it: resumable, runs ``ROOT/LABEL-sSEED``), then ``ub eval`` plays
its first and last checkpoints in the pairs of ``--evals`` the runs did not evaluate
themselves (by default ``expert`` on TicTacToe and ``random`` on KuhnPoker, a game the run did
not train on). ``--existing RUN,...`` skips training and grades runs already in ``--root``
(e.g. ``runs/demo`` after ``make demo``). Every evaluation plays the same seeds for every
checkpoint (paired), seats balanced, greedy.

The arms' means, intervals and paired differences are ``ub compare ROOT``'s, printed at the
end (every arm of ROOT: call this once per arm with the same ``--root``). This script prints
what ub does not measure: per run, env, opponent and seat the win/draw rates with 95% Wilson
intervals, the share of games lost by an invalid move, how far from the best response to the
random player, how the first and last checkpoints played TicTacToe move by move (optimal
moves, lines completed and stopped when they could be, lines completed at the cell it could
complete most often and elsewhere), each env's highest invalid-move rate of the last 8 rounds,
and the wall time of each part (rollout, learner, evaluation, other). The details go to
``ROOT/learning-LABEL.json``, to which each call adds its runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

UB = str(Path(sys.executable).with_name("ub"))
TICTACTOE, NIM, KUHN = "TicTacToe-v0-train", "Nim-v0-train", "KuhnPoker-v0-train"
# (env, opponent) pairs evaluated at the first and the last checkpoint.
EVALS = [(TICTACTOE, "random"), (TICTACTOE, "expert"), (NIM, "random"), (KUHN, "random")]


def run(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def seat_rows(root: Path, run_name: str, update: int, env: str, opponent: str) -> list[dict]:
    """Win/draw/loss/invalid-loss counts per seat of checkpoint ``update`` from its eval games."""
    import duckdb

    from ub.actors.names import checkpoint_actor
    from ub.data.shards import ShardId, shard_path
    from ub.run.folder.layout import RunPaths

    actor = checkpoint_actor(update)
    folder = shard_path(RunPaths.of(root, run_name).eval_data, "games", ShardId(update, 0)).parent
    files = [str(p) for p in sorted(folder.glob("*.parquet"))]
    sql = f"""
        WITH g AS (
            SELECT list_position(actors, '{actor}') - 1 AS seat, results, invalid_moves,
                   actors
            FROM read_parquet({files}, hive_partitioning = false)
            WHERE env_id = '{env}' AND list_contains(actors, '{opponent}')
              AND list_contains(actors, '{actor}') AND outcome != 'error')
        SELECT seat, count(*) AS games,
               count(*) FILTER (WHERE results[seat + 1] = 'win') AS wins,
               count(*) FILTER (WHERE results[seat + 1] = 'draw') AS draws,
               count(*) FILTER (WHERE coalesce(invalid_moves[seat + 1], false)) AS invalid_losses
        FROM g GROUP BY seat ORDER BY seat"""
    return duckdb.sql(sql).to_arrow_table().to_pylist()


def tictactoe_tactics(root: Path, run_name: str, update: int) -> dict[str, float]:
    """How checkpoint ``update`` played TicTacToe against the random player, move by move: the
    share of its moves the minimax expert would also make (``optimal``), of the positions with
    a line to complete where it completed one (``took_win``), and of those with none but an
    opponent's line to stop where it stopped one (``blocked``), and of those with neither and the
    centre free where it took the centre (``centre``: the third skill the rule-based players
    of ``bench/tictactoe_bounds.py`` use). ``took_win_top`` and
    ``took_win_rest`` split ``took_win`` by the completing cell: the one it could complete most
    often (``top_cell``; a policy that learned one opening's line, not lines, is high there
    and low elsewhere) and every other."""
    from collections import Counter

    import duckdb

    from ub.actors.names import checkpoint_actor
    from ub.data.shards import ShardId, shard_path
    from ub.games.builtin.tictactoe import (
        completing_cells,
        opponent_mark,
        tictactoe_board,
        tictactoe_move_values,
    )
    from ub.run.folder.layout import RunPaths

    actor = checkpoint_actor(update)
    eval_data = RunPaths.of(root, run_name).eval_data
    steps, games = (shard_path(eval_data, kind, ShardId(update, 0)).parent
                    for kind in ("steps", "games"))
    rows = duckdb.sql(f"""
        SELECT s.observation, s.action FROM read_parquet('{steps}/*.parquet') AS s
        JOIN read_parquet('{games}/*.parquet') AS g USING (game_id)
        WHERE s.actor = '{actor}' AND s.env_id = '{TICTACTOE}'
          AND list_contains(g.actors, 'random')""").fetchall()
    counts = dict.fromkeys(("moves", "optimal", "win_there", "took_win", "threat", "blocked",
                            "centre_free", "centre"), 0)
    chances, taken = Counter[int](), Counter[int]()  # by the lowest completing cell
    for observation, action in rows:
        cells, me = tictactoe_board(observation)
        move = int(action.strip("[]")) if action and action.strip("[]").isdigit() else -1
        values = tictactoe_move_values(cells, me)
        wins, threats = completing_cells(cells, me), completing_cells(cells, opponent_mark(me))
        counts["moves"] += 1
        counts["optimal"] += values.get(move) == max(values.values())
        counts["win_there"] += bool(wins)
        counts["took_win"] += move in wins
        if wins:
            chances[min(wins)] += 1
            taken[min(wins)] += move in wins
        counts["threat"] += bool(threats) and not wins
        counts["blocked"] += bool(threats) and not wins and move in threats
        quiet = not wins and not threats and cells[4] == "."
        counts["centre_free"] += quiet
        counts["centre"] += quiet and move == 4
    top = chances.most_common(1)[0][0] if chances else -1
    rest = counts["win_there"] - chances[top]
    return {"moves": counts["moves"], "optimal": counts["optimal"] / max(1, counts["moves"]),
            "took_win": counts["took_win"] / max(1, counts["win_there"]),
            "blocked": counts["blocked"] / max(1, counts["threat"]),
            "centre": counts["centre"] / max(1, counts["centre_free"]),
            "top_cell": top, "top_cell_share": chances[top] / max(1, counts["win_there"]),
            "took_win_top": taken[top] / max(1, chances[top]),
            "took_win_rest": (counts["took_win"] - taken[top]) / max(1, rest)}


def best_against_random(env: str, seat: str) -> float | None:
    """The most any policy wins against the random player on ``env`` in ``seat`` (``all``:
    seats balanced), exactly (bench/tictactoe_bounds.py, bench/nim_bounds.py); None for a game
    without a bound here."""
    from nim_bounds import win_probability
    from tictactoe_bounds import best_win_probability

    exact = {TICTACTOE: lambda s: best_win_probability("." * 9, 0, s),
             NIM: lambda s: win_probability((3, 4, 5), 0, s, "best")}.get(env)
    if exact is None:
        return None
    seats = (0, 1) if seat == "all" else (int(seat.split()[1]),)
    return sum(exact(s) for s in seats) / len(seats)


def late_invalid_rates(root: Path, run_name: str, rounds: int = 8) -> dict[str, float]:
    """Each env's highest invalid-move rate of the model's decisions in the run's last
    ``rounds`` rounds (the collapse bound of issue 42 and 49: 5%)."""
    import duckdb

    steps = root / run_name / "steps"
    rows = duckdb.sql(f"""
        WITH last AS (SELECT round, env_id, avg(invalid_move::INT) AS rate
                      FROM read_parquet('{steps}/*/*.parquet', hive_partitioning = false)
                      WHERE actor_kind = 'model' GROUP BY round, env_id)
        SELECT env_id, max(rate) FROM last
        WHERE round > (SELECT max(round) FROM last) - {rounds} GROUP BY env_id""").fetchall()
    return {env: round(rate, 4) for env, rate in rows}


def summary_table(results: list[dict]) -> str:
    """A markdown table, one row per seed: each game's last checkpoint vs random [95% CI], the
    random player in its seats, whether the intervals are apart, how far from the best
    response, and the highest invalid-move rate of the last 8 rounds. (The arm's mean and its
    interval, and its paired difference from another arm: ``ub compare``.)"""
    def row_of(res: dict, env: str, update: int) -> dict | None:
        return next((r for r in res["rows"] if r["env"] == env and r["opponent"] == "random"
                     and r["seat"] == "all" and r["checkpoint"] == update), None)

    games = [(env, name) for env, name in ((TICTACTOE, "TicTacToe"), (NIM, "Nim"))
             if row_of(results[0], env, 0) is not None]
    head = "| seed | " + " | ".join(f"{n}: ckpt 0 -> last [95% CI] | random in its seats | "
                                    "above random | to best" for _, n in games) + \
        " | invalid moves, last 8 rounds (max) |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for res in results:
        cells = []
        for env, _ in games:
            first, final = row_of(res, env, 0), row_of(res, env, res["rounds"])
            assert first is not None and final is not None
            low, high = final["random_baseline_ci"]
            to_best = "" if final["best"] is None else f"{final['best'] - final['win']:.1%}"
            cells.append(f"{first['win']:.1%} -> {final['win']:.1%} [{final['win_low']:.1%}, "
                         f"{final['win_high']:.1%}] | {final['random_baseline']:.1%} "
                         f"[{low:.1%}, {high:.1%}] | "
                         f"{'yes' if final['win_low'] > high else '**no**'} | {to_best}")
        worst = max(res["late_invalid"].values(), default=0.0)
        lines.append(f"| {res['seed']} | " + " | ".join(cells) + f" | {worst:.1%} |")
    return "\n".join(lines)


def baseline(config: dict, env: str, opponent: str, games: int) -> tuple[int, int]:
    """The random player's (wins, decided games) in the evaluated seats, same seeds."""
    from ub.actors.spec import parse_actor
    from ub.evaluation import eval_assignments, random_baseline
    from ub.games.specs import GameSpec
    from ub.seeding import derive_seed

    stand_in = parse_actor("random")
    actor = type(stand_in)("ckpt-000000", "model")  # only its name and seats matter
    assignments = eval_assignments(actor, [parse_actor(opponent)], [GameSpec(env)], games,
                                   derive_seed(config["seed"], "eval"))
    return random_baseline(assignments, actor.name, config["seed"])[(env, opponent)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="ub sweep's seeds: 0-9 or 0,3,7")
    parser.add_argument("--config", default="tiny-cpu")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--label", default="demo")
    parser.add_argument("--games", type=int, default=400, help="games per evaluation")
    parser.add_argument("--root", help="runs folder (default: a temporary one)")
    parser.add_argument("--existing", help="comma-separated runs in --root to evaluate as they "
                        "are (no training)")
    parser.add_argument("--evals", default=",".join(f"{e}:{o}" for e, o in EVALS),
                        help="comma-separated ENV:OPPONENT pairs to report (those the run "
                        "does not evaluate itself are played with ub eval)")
    args = parser.parse_args()

    from ub.evaluation import wilson_interval
    from ub.run.folder.layout import RunPaths, read_json

    evals = [tuple(pair.split(":", 1)) for pair in args.evals.split(",")]
    root = Path(args.root or tempfile.mkdtemp(prefix="ub-bench-learning-"))
    env = {**os.environ, "UB_LOG_CONSOLE": "0"}
    os.environ.update(env)
    results = []
    train_s = 0.0
    if args.existing:
        names = args.existing.split(",")
    else:
        from ub.flows.sweep_command import seed_list

        seeds = seed_list(args.seeds)
        train_s = run([UB, "sweep", args.config, "--arm", args.label, *args.overrides,
                       "--seeds", args.seeds, "--root", str(root), "--quiet"])
        names = [f"{args.label}-s{seed}" for seed in seeds]
    for name in names:
        paths = RunPaths.of(root, name)
        import yaml

        config = yaml.safe_load(paths.config.read_text())
        seed = config["seed"]
        manifests = [read_json(paths.manifest(r)) for r in paths.committed_rounds()]
        last = len(manifests)
        timings = {k: round(sum(m["timings"].get(k, 0.0) for m in manifests), 1)
                   for k in ("rollout", "learner", "eval", "other", "round")}
        eval_s = 0.0
        own = {(e if isinstance(e, str) else e["env_id"], o)
               for e in config["eval"]["envs"] for o in config["eval"]["opponents"]}
        for env_id, opponent in evals:
            for update in (0, last):
                if (env_id, opponent) in own:
                    continue  # the run's own evaluation
                eval_s += run([UB, "eval", name, "--root", str(root), "--checkpoint",
                               str(update), "--opponents", opponent, "--envs", env_id,
                               "--games", str(args.games)])
        rows = []
        for env_id, opponent in evals:
            if (env_id, opponent) in own:  # in the seats and seeds the run evaluated
                recorded = next(row for m in manifests for rows_ in m["evals"].values()
                                for row in rows_
                                if (row["env_id"], row["opponent"]) == (env_id, opponent))
                random_rate = recorded["baseline_win_rate"]
                random_ci = (recorded["baseline_low"], recorded["baseline_high"])
            else:
                wins_b, decided_b = baseline(config, env_id, opponent, args.games)
                random_rate = wins_b / max(1, decided_b)
                random_ci = wilson_interval(wins_b, decided_b)
            for update in (0, last):
                per_seat = seat_rows(root, name, update, env_id, opponent)
                total = {k: sum(r[k] for r in per_seat)
                         for k in ("games", "wins", "draws", "invalid_losses")}
                for seat_label, r in [("all", total), *((f"seat {r['seat']}", r)
                                                        for r in per_seat)]:
                    low, high = wilson_interval(r["wins"], r["games"])
                    rows.append({
                        "seed": seed, "env": env_id, "opponent": opponent, "checkpoint": update,
                        "seat": seat_label, "games": r["games"],
                        "win": r["wins"] / max(1, r["games"]), "win_low": low, "win_high": high,
                        "draw": r["draws"] / max(1, r["games"]),
                        "invalid_loss": r["invalid_losses"] / max(1, r["games"]),
                        "random_baseline": random_rate,
                        "random_baseline_ci": random_ci,
                        "best": (best_against_random(env_id, seat_label)
                                 if opponent == "random" else None),
                    })
        tactics = ({update: tictactoe_tactics(root, name, update) for update in (0, last)}
                   if (TICTACTOE, "random") in evals else {})
        results.append({"seed": seed, "run": name, "rounds": last, "tactics": tactics,
                        "late_invalid": late_invalid_rates(root, name),
                        "extra_eval_wall_seconds": round(eval_s, 1),
                        "timings": timings, "rows": rows})
        print(f"\n{name} (seed {seed}): rounds {timings['round']:.0f} s (rollout "
              f"{timings['rollout']:.0f}, learner {timings['learner']:.0f}, eval "
              f"{timings['eval']:.0f}, other {timings['other']:.0f}); extra evaluations "
              f"{eval_s:.0f} s")
        print(f"{'env':<20} {'opponent':<8} {'ckpt':>4} {'seat':<7} {'games':>5}  "
              f"{'win [95% CI]':<22} {'draw':>6} {'inv.loss':>8}  random in its seats   "
              "best response")
        for r in rows:
            b_low, b_high = r["random_baseline_ci"]
            best = "" if r["best"] is None else f"{r['best']:5.1%}"
            print(f"{r['env']:<20} {r['opponent']:<8} {r['checkpoint']:>4} {r['seat']:<7} "
                  f"{r['games']:>5}  {r['win']:6.1%} [{r['win_low']:5.1%}, {r['win_high']:5.1%}]"
                  f" {r['draw']:6.1%} {r['invalid_loss']:8.1%}  {r['random_baseline']:5.1%} "
                  f"[{b_low:5.1%}, {b_high:5.1%}]  {best}")
        print(f"highest invalid-move rate of the last 8 rounds: {results[-1]['late_invalid']}")
        for update, t in tactics.items():
            print(f"TicTacToe vs random, checkpoint {update}: {t['optimal']:.0%} of {t['moves']} "
                  f"moves optimal; completed its own line {t['took_win']:.0%} of the times it "
                  f"could ({t['took_win_top']:.0%} at cell {t['top_cell']}, "
                  f"{t['top_cell_share']:.0%} of the chances; {t['took_win_rest']:.0%} "
                  f"elsewhere), stopped the opponent's {t['blocked']:.0%}, took the free "
                  f"centre otherwise {t['centre']:.0%}")
    out = root / f"learning-{args.label}.json"
    if out.exists():  # seeds run one call at a time add up: a run measured again is replaced
        ours = {r["run"] for r in results}
        results = sorted([r for r in json.loads(out.read_text()) if r["run"] not in ours]
                         + results, key=lambda r: (r["seed"], r["run"]))
    out.write_text(json.dumps(results, indent=1))
    print("\n" + summary_table(results) + "\n")
    if train_s:
        print(f"ub sweep: {train_s:.0f} s of wall time")
    # The arms over their seeds, from the runs' own data: every arm trained into ROOT so far.
    subprocess.run([UB, "compare", str(root)], check=True)
    print(json.dumps({"label": args.label, "config": args.config, "overrides": args.overrides,
                      "summary": [{
                          "seed": r["seed"],
                          **{f"{row['env']}/{row['opponent']}/ckpt{row['checkpoint']}":
                             round(row["win"], 3) for row in r["rows"] if row["seat"] == "all"}}
                          for r in results], "details": str(out)}))


if __name__ == "__main__":
    main()
