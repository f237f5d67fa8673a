"""Per-round metrics: computed from the round's data, stored as Parquet, mirrored to W&B.

``metrics/round-NNNNNN.parquet`` (long format: ``round, metric, value``) is the source of truth;
``ub sql RUN`` shows it as the ``metrics`` view. Metric names are paths:

- ``collection/ENV/...``: the learner's decisions (the weight when envs are averaged), reward,
  win/draw/loss rates of the learner's seats, game length (turns),
  response length (completion tokens), format success, invalid-move rate, ``entropy`` (the
  sampler's, in nats per completion token: the mean negative logprob of the sampled tokens,
  an unbiased estimate at temperature 1; near 0: every decision the same), action diversity
  (distinct actions per distinct observation, over observations seen more than once), seconds
  per game, per turn and per generated character;
- ``eval/ENV/OPPONENT/...``: win, draw and loss rates, Wilson bounds, invalid-move rate of the
  checkpoints evaluated in the round;
- ``exploitability/ENV/POLICY/MODE/...``: NashConv (and its bounds), each seat's best
  response, the illegal share and the random policy's NashConv of the checkpoints measured in
  the round (``eval.exploitability``);
- ``benchmarks/TASK/METRIC[/FILTER]``: the reasoning benchmarks of the checkpoints scored in
  the round (``eval.benchmarks``; the ``benchmarks`` view has their stderr and n);
- ``learner/...``, ``batch/...``: the update's figures, train sequence length and truncation;
- ``inference/...``: generated tokens/s, games/s;
- ``pool/MEMBER/...``: mu, sigma, conservative rating, games;
- ``time/...``: the round's time breakdown.

W&B (``tracking.wandb``): ``offline`` (default: files under ``RUN/wandb``, sync later with
``wandb sync``), ``online`` (opt in), ``disabled``. The environment variable ``WANDB_MODE``
overrides it (the tests set ``disabled``). The W&B run id is made once per run (the run name
plus a random suffix) and kept in ``RUN/ub-run.json``: a resumed run continues its curves, and
two machines' runs of the same name stay two W&B runs. Round metrics are plotted against
``round``, evaluation metrics (``eval/...``, ``exploitability/...``, ``benchmarks/...``) against
``checkpoint``, the
update they measure; the report's figures (``ub report``) as images under ``report/``, in the
last row a flow run logs.
"""

from __future__ import annotations

import math
import os
import secrets
from pathlib import Path
from typing import Any

import pyarrow as pa

from ub.data.atomic import write_atomic
from ub.data.shards import round_dir
from ub.run.folder.layout import RunPaths, mark_run_format, read_json, write_json_atomic
from ub.run.folder.store import fetch_round, publish
from ub.run.folder.sweep import sweep_arm
from ub.run.folder.views import METRICS_SCHEMA
from ub.run.steps.rounds import Run


def _collection(run: Run, round_: int) -> dict[str, float]:
    from ub.data.sql import query_tables, table_dataset

    # A driver without the workers' files fetches them first.
    fetch_round(run.paths, run.paths.train_data, "steps", round_)
    # (named after the fetch: round_dir picks the run format's folder that exists)
    steps, games = (round_dir(run.paths.train_data, t, round_) for t in ("steps", "games"))
    if not steps.is_dir() or not games.is_dir():
        return {}
    # The round's shards (not hidden temporary files), in the current column names.
    extra = {"s_round": table_dataset(steps, "steps", sorted(steps.glob("shard-*.parquet"))),
             "g_round": table_dataset(games, "games", sorted(games.glob("shard-*.parquet")))}
    per_env = query_tables(extra, """
        WITH model AS (
          SELECT s.*, g.outcome, g.winner, g.num_turns, g.seconds AS game_seconds
          FROM s_round s JOIN g_round g USING (game_id)
          WHERE s.actor_kind = 'model' AND g.parent_game_id IS NULL),  -- (not branch copies)
        seats AS (SELECT DISTINCT env_id, game_id, seat, env_reward, outcome, winner
                  FROM model),
        diversity AS (
          SELECT env_id, avg(n) AS actions_per_state FROM (
            SELECT env_id, observation, count(DISTINCT action) AS n, count(*) AS visits
            FROM model GROUP BY ALL) WHERE visits > 1 GROUP BY env_id)
        SELECT m.env_id, count(*) AS decisions,
               (SELECT avg(env_reward) FROM seats x WHERE x.env_id = m.env_id) AS reward,
               (SELECT avg((outcome = 'decisive' AND winner = seat)::INT) FROM seats x
                 WHERE x.env_id = m.env_id) AS win_rate,
               (SELECT avg((outcome = 'draw')::INT) FROM seats x
                 WHERE x.env_id = m.env_id) AS draw_rate,
               (SELECT avg((outcome = 'decisive' AND winner <> seat)::INT) FROM seats x
                 WHERE x.env_id = m.env_id) AS loss_rate,
               avg(m.num_turns) AS game_turns,
               avg(m.num_completion_tokens) AS response_tokens,
               avg(m.format_ok::INT) AS format_rate,
               avg(m.invalid_move::INT) AS invalid_move_rate,
               -sum(list_sum(m.completion_logprobs)) / greatest(sum(len(m.completion_logprobs)),
                                                              1) AS entropy,
               any_value(d.actions_per_state) AS actions_per_state,
               avg(m.game_seconds) AS seconds_per_game,
               avg(m.gen_seconds + m.env_seconds) AS seconds_per_turn,
               sum(m.gen_seconds) / greatest(sum(length(m.completion)), 1) AS seconds_per_char
        FROM model m LEFT JOIN diversity d USING (env_id)
        GROUP BY m.env_id ORDER BY m.env_id
    """).to_pylist()
    out = {}
    for row in per_env:
        env = row.pop("env_id")
        out.update({f"collection/{env}/{k}": v for k, v in row.items()})
    return out


def round_metrics(run: Run, round_: int, manifest: dict[str, Any],
                  leaderboard: list[dict[str, Any]]) -> dict[str, float]:
    """Every tracked figure of round ``round_`` (see the module docstring)."""
    metrics: dict[str, Any] = _collection(run, round_)
    for update, rows in manifest.get("evals", {}).items():
        for r in rows:
            base = f"eval/{r['env_id']}/{r['opponent']}"
            metrics.update({f"{base}/win_rate": r["win_rate"], f"{base}/win_low": r["win_low"],
                            f"{base}/win_high": r["win_high"],
                            f"{base}/draw_rate": r["draws"] / max(r["games"], 1),
                            f"{base}/loss_rate": r["losses"] / max(r["games"], 1),
                            f"{base}/invalid_move_rate": r["invalid_move_rate"],
                            f"{base}/checkpoint": int(update)})
    for update, rows in manifest.get("exploitability", {}).items():
        metrics.update(exploitability_figures(rows))
        metrics.update({f"exploitability/{r['env_id']}/checkpoint": int(update) for r in rows})
    for rows in manifest.get("benchmarks", {}).values():
        metrics.update(benchmark_figures(rows))
    metrics.update({f"learner/{k}": v for k, v in manifest.get("learner", {}).items()})
    batch = manifest.get("batch", {})
    metrics.update({f"batch/{k}": v for k, v in batch.items()})
    if batch.get("size"):
        metrics["batch/mean_sequence_tokens"] = batch.get("total_tokens", 0) / batch["size"]
    timings = manifest.get("timings", {})
    play = timings.get("rollout") or 0.0
    if play > 0:
        metrics["inference/generated_tokens_per_second"] = manifest["generated_tokens"] / play
        metrics["inference/games_per_second"] = manifest["games"] / play
    metrics.update({f"time/{k}": v for k, v in timings.items() if not isinstance(v, dict)})
    for member in leaderboard:
        base = f"pool/{member['name']}"
        metrics.update({f"{base}/mu": member["mu"], f"{base}/sigma": member["sigma"],
                        f"{base}/conservative": member["conservative"],
                        f"{base}/games": member["games"]})
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def benchmark_figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """A checkpoint's benchmark rows as ``benchmarks/TASK/METRIC[/FILTER]`` figures."""
    return {"/".join(["benchmarks", r["task"], r["metric"], *([r["filter"]] if r["filter"]
                                                               else [])]): r["value"]
            for r in rows}


def read_metrics(paths: RunPaths, round_: int) -> dict[str, float]:
    """Round ``round_``'s tracked metrics, ``{}`` where none were written."""
    import pyarrow.parquet as pq

    path = paths.metrics(round_)
    if not path.exists():
        return {}
    table = pq.read_table(path, columns=["metric", "value"]).to_pydict()
    return dict(zip(table["metric"], table["value"], strict=True))


def write_metrics(run: Run, round_: int, metrics: dict[str, float]) -> Path:
    import pyarrow.parquet as pq

    names = sorted(metrics)
    table = pa.table({"round": [round_] * len(names), "metric": names,
                      "value": [metrics[n] for n in names]}, schema=METRICS_SCHEMA)
    path = write_atomic(run.paths.metrics(round_),
                        lambda handle: pq.write_table(table, handle, compression="zstd"))
    publish(run.paths, path)
    return path


# --------------------------------------------------------------------------------------------
# W&B: one W&B run per ub run and process, under the id the run keeps in ub-run.json
# --------------------------------------------------------------------------------------------

_WANDB: dict[str, Any] = {}
_ROUND_AXES: dict[str, set[str]] = {}  # per W&B run: the metric groups plotted against round


def wandb_mode(run: Run) -> str:
    return os.environ.get("WANDB_MODE") or run.config.tracking.wandb


def wandb_run_id(paths: RunPaths) -> str:
    """The run's W&B id, made on first use and kept in ``ub-run.json`` (published with it).

    Not the run name: two machines each starting a run ``demo`` would write into one W&B run.
    Not the config either: the id must survive ``--rounds`` and other allowed changes.
    """
    marker = paths.root / "ub-run.json"
    mark_run_format(paths.root)  # (a run from before the marker gets it now)
    data = read_json(marker)
    if not isinstance(data.get("wandb_id"), str):
        # W&B ids may not hold :;,#?/' (run names cannot); keep them short and readable.
        data["wandb_id"] = f"{paths.name[:48]}-{secrets.token_hex(4)}"
        write_json_atomic(marker, data)
        publish(paths, marker)
    return data["wandb_id"]


def exploitability_figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """``exploitability/ENV/POLICY/MODE/...`` of a checkpoint's exploitability rows:
    NashConv (and its bounds), each seat's best response, the illegal share and the random
    policy's NashConv beside it."""
    out: dict[str, float] = {}
    for r in rows:
        base = f"exploitability/{r['env_id']}/{r['policy']}/{r['legal_moves']}"
        for key in ("nash_conv", "nash_conv_low", "nash_conv_high", "best_response_seat0",
                    "best_response_seat1", "illegal", "random_nash_conv"):
            out[f"{base}/{key}"] = float(r[key])
    return out


def wandb_rows(round_: int, metrics: dict[str, float],
               evals: dict[str, list[dict[str, Any]]],
               benchmarks: dict[str, list[dict[str, Any]]] | None = None,
               exploitability: dict[str, list[dict[str, Any]]] | None = None,
               ) -> list[tuple[int, dict[str, float]]]:
    """Round ``round_``'s W&B history rows as ``(step, row)``, in step order.

    The round's figures form one row with ``round``; each evaluated checkpoint its own row with
    ``checkpoint`` (round 0 evaluates checkpoints 0 and 1, which one row could not hold), its
    games' rates and its benchmark scores (``benchmarks``, as in the round manifest). The
    steps are a function of the round, so a round logged again after a crash lands on the same
    steps: checkpoint ``u`` at step ``2u``, round ``r`` at ``2r + 1``; the charts use ``round``
    and ``checkpoint`` as their x-axes, never W&B's step.
    """
    figures = {k: v for k, v in metrics.items()
               if not k.startswith(("eval/", "benchmarks/", "exploitability/"))}
    rows = [(2 * round_ + 1, {"round": round_, **figures})]
    scored, measured = benchmarks or {}, exploitability or {}
    for update in sorted(set(evals) | set(scored) | set(measured), key=int):
        results = evals.get(update, [])
        row: dict[str, float] = {"checkpoint": int(update),
                                 **benchmark_figures(scored.get(update, [])),
                                 **exploitability_figures(measured.get(update, []))}
        for r in results:
            base = f"eval/{r['env_id']}/{r['opponent']}"
            games = max(r["games"], 1)
            rates = {"win_rate": r["win_rate"], "win_low": r["win_low"],
                     "win_high": r["win_high"], "draw_rate": r["draws"] / games,
                     "loss_rate": r["losses"] / games,
                     "invalid_move_rate": r["invalid_move_rate"],
                     "baseline_win_rate": r.get("baseline_win_rate")}
            row.update({f"{base}/{k}": float(v) for k, v in rates.items()
                        if isinstance(v, int | float) and math.isfinite(v)})
        rows.append((2 * int(update), row))
    return sorted(rows, key=lambda step_row: step_row[0])


def log_wandb(run: Run, round_: int, metrics: dict[str, float],
              evals: dict[str, list[dict[str, Any]]] | None = None,
              benchmarks: dict[str, list[dict[str, Any]]] | None = None,
              exploitability: dict[str, list[dict[str, Any]]] | None = None) -> None:
    """Log round ``round_``'s metrics, its evaluations and benchmark scores (``{update:
    rows}``, as in the round manifest) to W&B (started on first use; see
    :func:`wandb_rows`)."""
    mode = wandb_mode(run)
    if mode == "disabled":
        return
    wb = _WANDB.get(run.name)
    if wb is None:
        # ub prints its own progress; W&B's banners and run summary would drown it.
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        # WANDB_MODE passes through as W&B reads it; wandb.init's annotation of mode omits
        # the legacy "dryrun" and "run" that its settings still accept.
        arm = sweep_arm(run.name, run.config.seed)  # (a sweep's arm: a group per sweep)
        wb = wandb.init(project=run.config.tracking.project, name=run.name,
                        group=None if arm is None else f"{run.paths.root.parent.name}/{arm}",
                        id=wandb_run_id(run.paths), dir=str(run.paths.root),
                        mode=mode,  # type: ignore[arg-type]
                        resume="allow", config=run.config.model_dump(mode="json"))
        # Every metric's x-axis: a round's figures against the round, an evaluation's against
        # the checkpoint it measured (checkpoint u is evaluated in round u - 1).
        wb.define_metric("round")
        wb.define_metric("checkpoint")
        wb.define_metric("eval/*", step_metric="checkpoint")
        wb.define_metric("benchmarks/*", step_metric="checkpoint")
        wb.define_metric("exploitability/*", step_metric="checkpoint")
        _WANDB[run.name] = wb
    axes = _ROUND_AXES.setdefault(run.name, set())
    for step, row in wandb_rows(round_, metrics, evals or {}, benchmarks, exploitability):
        # (W&B globs are prefixes: one per top-level group, as groups first appear)
        for group in ({k.split("/", 1)[0] for k in row if "/" in k} - axes
                      - {"eval", "benchmarks", "exploitability"}):
            wb.define_metric(f"{group}/*", step_metric="round")
            axes.add(group)
        wb.log(row, step=step)


def log_wandb_figures(run: Run, figures: dict[str, Path]) -> None:
    """Log the report's figures (``{name: PNG}``) to the W&B run this process logged rounds
    to, as images under ``report/NAME``; nothing when W&B is off or this process committed no
    round (a resume that had nothing to do)."""
    wb = _WANDB.get(run.name)
    if wb is None or not figures:
        return
    import wandb

    # Into the last row (W&B's steps are 2u and 2r + 1: there is none between rounds, and a
    # resumed run logs its next round at the next one); its media panel shows the newest.
    wb.log({f"report/{name}": wandb.Image(str(path), caption=name)
            for name, path in figures.items()})


def finish_wandb(run: Run) -> None:
    wb = _WANDB.pop(run.name, None)
    _ROUND_AXES.pop(run.name, None)
    if wb is not None:
        wb.finish()
