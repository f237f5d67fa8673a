"""The batch's two DuckDB queries: phase 1 selects, shapes, samples and normalizes scalar
columns; phase 2 fetches the token lists of the sampled rows only."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from ub.batch.config import BatchConfig
from ub.batch.plan import Plan, make_plan, quote, run_sql
from ub.data.shards import ShardId
from ub.errors import UbError
from ub.rewards import step_reward_sql

# A reward whose magnitude is at or below this counts as zero for ``drop_zero_reward``.
ZERO_EPS = 1e-9
# The steps columns phase 1 reads (never the token lists, nor the texts).
DECISION_COLUMNS = ["round", "shard", "game_id", "turn", "seat", "env_id", "role", "actor",
                    "checkpoint", "format_ok", "invalid_move", "step_reward",
                    "num_prompt_tokens", "num_completion_tokens", "position", "branch_group"]
TOKEN_COLUMNS = ["prompt_token_ids", "completion_token_ids", "completion_logprobs"]
# What the learner needs to score a decision sampled under the legal-move mask under the same
# constraint (ub.games.move_mask): fetched with the tokens, kept apart from the batch's rows.
MOVE_COLUMNS = ["template", "legal_moves", "legal_moves_mode"]
# Columns phase 1 computes only when a sampling transform reads them (its ``needs``): the
# state a decision was taken in is the prompt the model saw, token for token.
ON_DEMAND_COLUMNS = {"state_key": "hash(prompt_token_ids)"}
# A decision's game within its run: the game id less the run name it begins with. The sample
# key hashes this, not the game id, so a run's batches depend on its seed, never its name.
def _less_run(column: str) -> str:
    return (f"CASE WHEN starts_with({column}, run || '-') THEN substr({column}, length(run) + 2) "
            f"ELSE {column} END")


GAME_KEY_SQL = _less_run("game_id")
# What a decision's sample key hashes besides the seed: its game and turn, or, for the
# decisions of a branch point (ub.branching), their group, so a point's moves are sampled
# together and the batch can compare them (each less the run name).
SAMPLE_KEY_SQL = (f"coalesce({_less_run('branch_group')} || '/branch', "
                  f"concat({GAME_KEY_SQL}, '/', turn))")
# How both phases read the steps files (``file_row_number`` matches phase 2's rows to phase 1's).
READ_OPTIONS = "file_row_number = true, hive_partitioning = false"


def source_sql(plan: Plan) -> str:
    """The window's steps shards, as an explicit file list (no globbing, no other rounds), in
    the current column names (shards of older schema versions included).

    Hive partitioning is off: ``round=NNNNNN`` in the path would shadow the ``round`` column.
    """
    return plan.steps_sql(plan.window, READ_OPTIONS)


def select_sql(plan: Plan, config: BatchConfig) -> str:
    filters = [f"round BETWEEN {plan.first_round} AND {plan.last_round}"]
    if config.actors is not None:
        filters.append(f"actor IN ({', '.join(quote(a) for a in config.actors)})")
    if config.checkpoints is not None:
        filters.append(f"checkpoint IN ({', '.join(quote(c) for c in config.checkpoints)})")
    transforms = config.transforms
    step = step_reward_sql(transforms.step, "final_reward + step_reward")
    drop = f"\n    WHERE abs(reward) > {ZERO_EPS!r}  -- drop_zero_reward" if (
        config.drop_zero_reward) else ""
    needed = sorted({c for t in transforms.sampling for c in t.needs})
    unknown = [c for c in needed if c not in ON_DEMAND_COLUMNS]
    if unknown:
        raise UbError(f"a sampling transform needs {', '.join(unknown)}; the batch query can "
                      f"compute {', '.join(ON_DEMAND_COLUMNS)} (ub.batch.sql.ON_DEMAND_COLUMNS)")
    extra = "".join(f",\n           {ON_DEMAND_COLUMNS[c]} AS {c}" for c in needed)
    layers, prev = [], "sampled"
    for k, t in enumerate(transforms.sampling, start=1):
        layers.append(f"sampling_{k} AS (  -- {t.config_name()} {t.params()}\n"
                      f"    SELECT * REPLACE ({t.sql('advantage')} AS advantage)\n"
                      f"    FROM {prev}\n)")
        prev = f"sampling_{k}"
    sampling = "".join(f",\n{layer}" for layer in layers)
    return f"""-- ub batch, phase 1: select, shape, sample and normalize (scalar columns only)
WITH decisions AS (  -- the learner's decisions in the window
    SELECT {', '.join(c if c != 'step_reward' else 'CAST(step_reward AS DOUBLE) AS step_reward'
                      for c in DECISION_COLUMNS)},
           file_row_number, {SAMPLE_KEY_SQL} AS sample_group{extra}
    FROM {source_sql(plan)}
    WHERE actor_kind = 'model'
      AND {(chr(10) + '      AND ').join(filters)}
),
game_floor AS (  -- each game's lowest final reward (invalid_move_penalty anchors to it)
    SELECT game_id, min(reward) AS game_min_final_reward
    FROM final_rewards
    GROUP BY game_id
),
joined AS (  -- final stage: the Arrow table `final_rewards`, one row per (game, seat);
             -- errored games have no row, so their decisions drop out here
    SELECT d.*, f.raw_reward, f.reward AS final_reward, g.game_min_final_reward,
           count(*) OVER (PARTITION BY game_id, seat ORDER BY turn ROWS BETWEEN 1 FOLLOWING
                          AND UNBOUNDED FOLLOWING) AS seat_moves_after  -- (discount uses it)
    FROM decisions AS d JOIN final_rewards AS f USING (game_id, seat)
         JOIN game_floor AS g USING (game_id)
),
shaped AS (  -- step stage
    SELECT *, {step} AS reward
    FROM joined
),
pool AS (  -- what can be sampled; sample_key is a pure function of (seed, sample_group)
    SELECT *, md5_number(concat({int(config.seed)}, '/', sample_group)) AS sample_key
    FROM shaped{drop}
),
sampled AS (  -- uniform sample without replacement
    SELECT *, reward AS advantage
    FROM pool
    ORDER BY sample_key, game_id, turn
    LIMIT {int(config.batch_size)}
){sampling}
SELECT * EXCLUDE (sample_key, sample_group{"".join(f", {c}" for c in needed)})
FROM {prev}
ORDER BY sample_key, game_id, turn"""


def fetch_sql(plan: Plan, rows: pa.Table) -> str:
    """Phase 2: the token lists (and the legal-move mask's columns) of the given (round,
    shard, file_row_number) rows only.

    One branch per shard file, each filtered by row number, so DuckDB decodes the lists of those
    rows only. (Joining the sampled rows in SQL instead was measured ~40% slower.)
    """
    by_file: dict[tuple[int, int], list[int]] = {}
    for r, s, n in zip(rows["round"].to_pylist(), rows["shard"].to_pylist(),
                       rows["file_row_number"].to_pylist(), strict=True):
        by_file.setdefault((r, s), []).append(n)
    parts = [
        f"SELECT round, shard, file_row_number, game_id, turn, "
        f"{', '.join(TOKEN_COLUMNS + MOVE_COLUMNS)}\n"
        f"FROM {plan.steps_sql([ShardId(r, s)], READ_OPTIONS)}\n"
        f"WHERE file_row_number IN ({', '.join(map(str, sorted(numbers)))})"
        for (r, s), numbers in sorted(by_file.items())
    ]
    return ("-- ub batch, phase 2: the token lists of the sampled rows only, file by file\n"
            + "\nUNION ALL\n".join(parts))


def attach_tokens(sampled: pa.Table, fetched: pa.Table, root: Path) -> pa.Table:
    """``sampled`` plus the token and move columns of ``fetched``, matched on (round, shard,
    row)."""
    where = {(r, s, n): i for i, (r, s, n) in enumerate(zip(
        fetched["round"].to_pylist(), fetched["shard"].to_pylist(),
        fetched["file_row_number"].to_pylist(), strict=True))}
    keys = zip(sampled["round"].to_pylist(), sampled["shard"].to_pylist(),
               sampled["file_row_number"].to_pylist(), strict=True)
    order = [where.get(k, -1) for k in keys]
    if -1 in order or len(order) != len(where):
        raise UbError(f"the sampled decisions changed between the two reads of {root}: was a "
                      "shard rewritten meanwhile? Retry the batch")
    fetched = fetched.take(pa.array(order))
    if not (fetched["game_id"].equals(sampled["game_id"])
            and fetched["turn"].equals(sampled["turn"])):
        raise UbError(f"the sampled decisions changed between the two reads of {root}: was a "
                      "shard rewritten meanwhile? Retry the batch")
    for name in TOKEN_COLUMNS + MOVE_COLUMNS:
        sampled = sampled.append_column(name, fetched[name])
    return sampled


def batch_sql(root: Path, config: BatchConfig) -> str:
    """The exact phase-1 query :func:`assemble_batch` runs for ``config`` on ``root``.

    It reads the Arrow table ``final_rewards`` (registered by the caller: see
    :func:`final_stage`), and returns the sampled rows without token lists.
    """
    return select_sql(make_plan(root, config), config)


def explain(root: Path, config: BatchConfig) -> str:
    """A readable account of what :func:`assemble_batch` will do: plan and both queries."""
    plan = make_plan(root, config)
    fetch_example = fetch_sql(plan, pa.table({
        "round": [plan.window[0].round], "shard": [plan.window[0].shard],
        "file_row_number": [0]}))
    return "\n".join([
        f"-- data root: {plan.root}",
        f"-- window: rounds [{plan.first_round}, {plan.last_round}], "
        f"{len(plan.window)} steps shards",
        f"-- final stage (Python, canonical order (round, game_index, game_id)): "
        f"{[t.spec() for t in config.transforms.final]}",
        "",
        select_sql(plan, config) + ";",
        "",
        "-- phase 2 is generated from phase 1's result (one branch per shard that holds a",
        "-- sampled row; rows are matched back on (round, shard, file_row_number)), e.g.:",
        fetch_example + ";",
    ])


def explain_empty(con: duckdb.DuckDBPyConnection, plan: Plan, config: BatchConfig,
                   sql: str) -> UbError:
    """Which filter emptied the batch: run the same CTEs with counts."""
    ctes = sql[sql.index("WITH "):sql.index("\nSELECT * EXCLUDE")]
    files = source_sql(plan)
    counts = run_sql(con, f"""{ctes}
SELECT (SELECT count(*) FROM {files} WHERE round BETWEEN {plan.first_round}
                                         AND {plan.last_round}) AS rows,
       (SELECT count(*) FROM {files} WHERE actor_kind = 'model' AND round BETWEEN
                                         {plan.first_round} AND {plan.last_round}) AS model,
       (SELECT count(*) FROM decisions) AS selected,
       (SELECT count(*) FROM joined) AS rewarded,
       (SELECT count(*) FROM pool) AS pool""").to_pylist()[0]
    where = f"rounds [{plan.first_round}, {plan.last_round}] of {plan.root}"
    if counts["model"] == 0:
        who = (f"{counts['rows']} decisions, all by scripted players" if counts["rows"]
               else "the shards hold no decisions at all")
        return UbError(f"no model decisions (actor_kind = 'model') in {where}: {who}; widen "
                       "the window or play rounds with the model")
    if counts["selected"] == 0:
        found = run_sql(con, f"SELECT DISTINCT actor, checkpoint FROM {files} WHERE actor_kind = "
                          f"'model' ORDER BY ALL LIMIT 10").to_pylist()
        have = ", ".join(f"{r['actor']} @ {r['checkpoint']}" for r in found)
        return UbError(f"no model decisions match actors={config.actors} "
                       f"checkpoints={config.checkpoints} in {where}; found (actor @ "
                       f"checkpoint): {have}")
    if counts["rewarded"] == 0:
        return UbError(f"all {counts['selected']} selected model decisions in {where} come from "
                       "errored games (no rewards); see `SELECT error FROM games` for why")
    return UbError(f"all {counts['rewarded']} selected model decisions in {where} have zero "
                   "reward after the final and step stages and drop_zero_reward dropped "
                   "them; set drop_zero_reward=false or change the reward transforms")
