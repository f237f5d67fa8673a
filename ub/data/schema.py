"""The Parquet schemas of a run's data: ``steps`` (one row per decision) and ``games`` (one row per
game). Users write SQL against these column names, so they change only with a new
``SCHEMA_VERSION`` (and a note in ``docs/data.md``).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

STEPS_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("game_id", pa.string(), nullable=False),
        pa.field("env_id", pa.string(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("seat", pa.int32(), nullable=False),
        pa.field("role", pa.string()),
        pa.field("actor", pa.string(), nullable=False),
        pa.field("actor_kind", pa.string(), nullable=False),
        pa.field("checkpoint", pa.string()),
        pa.field("template", pa.string()),
        pa.field("observation", pa.string()),
        pa.field("prompt", pa.string()),
        pa.field("completion", pa.string()),
        pa.field("prompt_token_ids", pa.list_(pa.int32())),
        pa.field("completion_token_ids", pa.list_(pa.int32())),
        pa.field("completion_logprobs", pa.list_(pa.float32())),
        pa.field("num_prompt_tokens", pa.int32()),
        pa.field("num_completion_tokens", pa.int32()),
        pa.field("action", pa.string()),
        pa.field("format_ok", pa.bool_(), nullable=False),
        pa.field("invalid_move", pa.bool_(), nullable=False),
        pa.field("step_reward", pa.float32(), nullable=False),
        pa.field("final_reward", pa.float32()),
        pa.field("finish_reason", pa.string()),
        pa.field("sampling_seed", pa.int64()),
        pa.field("gen_seconds", pa.float32()),
        pa.field("env_seconds", pa.float32()),
    ]
)

GAMES_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("game_id", pa.string(), nullable=False),
        pa.field("game_index", pa.int32(), nullable=False),
        pa.field("env_id", pa.string(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("num_players", pa.int32(), nullable=False),
        pa.field("actors", pa.list_(pa.string()), nullable=False),
        pa.field("roles", pa.list_(pa.string())),
        pa.field("rewards", pa.list_(pa.float32())),
        pa.field("results", pa.list_(pa.string())),
        pa.field("invalid_moves", pa.list_(pa.bool_())),
        pa.field("outcome", pa.string(), nullable=False),
        pa.field("winner", pa.int32()),
        pa.field("num_turns", pa.int32(), nullable=False),
        pa.field("reason", pa.string()),
        pa.field("error", pa.string()),
        pa.field("seconds", pa.float32()),
    ]
)

TABLES: dict[str, pa.Schema] = {"steps": STEPS_SCHEMA, "games": GAMES_SCHEMA}

# Outcomes: ``decisive`` (one seat scored strictly best), ``draw`` (all seats equal),
# ``error`` (the env raised or the game hit ub's turn limit; rewards are null).
OUTCOMES = ("decisive", "draw", "error")
# Per-seat results in ``games.results``: relative to the other seats in multi-player games, and
# by the sign of the reward in single-player games.
RESULTS = ("win", "draw", "loss")
