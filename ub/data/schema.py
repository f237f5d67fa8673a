"""The Parquet schemas of a run's data: ``steps`` (one row per decision) and ``games`` (one row per
game). Users write SQL against these column names, so they change only with a new
``SCHEMA_VERSION`` (and a note in ``docs/data.md``, "Format history").

Every shard file carries the version it was written with (``ub.schema_version`` in its Parquet
metadata), and ub reads every version up to its own in the current column names
(:func:`ub.data.sql.current_names_sql`), so a run resumed by a newer ub may mix versions:

- version 1: ``steps.env_reward`` was called ``final_reward``;
- version 2: ``steps.final_reward`` renamed ``env_reward`` (the raw env reward of the seat; in
  a training batch, ``final_reward`` is the reward after the final-stage transforms);
- version 3: ``steps.position`` added (the position a decision was taken in,
  :mod:`ub.games.positions`); older shards read it as NULL;
- version 4: ``steps.legal_moves`` (the mover's legal moves, :mod:`ub.games.legal`) and
  ``steps.legal_moves_mode`` (``mask`` or ``free``: whether the model's sampling was held to
  them, ``envs[].legal_moves``) added; older shards read them as NULL;
- version 5: ``steps.branch_group``, ``games.parent_game_id`` and ``games.branch_turn`` added
  (dynamic branching, :mod:`ub.branching`); older shards read them as NULL (no copies).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 5
OLDEST_SCHEMA_VERSION = 1
"""The oldest schema version this ub still reads."""

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
        pa.field("env_reward", pa.float32()),  # "final_reward" in version 1
        pa.field("finish_reason", pa.string()),
        pa.field("sampling_seed", pa.int64()),
        pa.field("gen_seconds", pa.float32()),
        pa.field("env_seconds", pa.float32()),
        # Added in version 3, so last: a reader of older shards appends it as NULL.
        pa.field("position", pa.string()),
        # Added in version 4 (the same way).
        pa.field("legal_moves", pa.list_(pa.string())),
        pa.field("legal_moves_mode", pa.string()),
        # Added in version 5: the branch point a decision belongs to (ub.branching), or NULL.
        pa.field("branch_group", pa.string()),
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
        # Added in version 5: a copy's parent game and the turn it was copied at (NULL: the
        # game is no copy; ub.branching).
        pa.field("parent_game_id", pa.string()),
        pa.field("branch_turn", pa.int32()),
    ]
)

TABLES: dict[str, pa.Schema] = {"steps": STEPS_SCHEMA, "games": GAMES_SCHEMA}

RENAMED: dict[str, dict[str, tuple[str, int]]] = {
    "steps": {"final_reward": ("env_reward", 2)},
}
"""The columns renamed since version 1, by table: former name -> (current name, the version that
renamed it)."""

ADDED: dict[str, dict[str, int]] = {
    "steps": {"position": 3, "legal_moves": 4, "legal_moves_mode": 4, "branch_group": 5},
    "games": {"parent_game_id": 5, "branch_turn": 5},
}
"""The columns added since version 1, by table: name -> the version that added it. They come
last in their table's schema, and a reader shows them as NULL in older shards."""


def int_column_range(table: str, column: str) -> tuple[int, int]:
    """The smallest and largest value ``table``'s integer ``column`` holds (a list column: its
    items'), so that a setting that ends up in it is refused before any game is played."""
    kind = TABLES[table].field(column).type
    if pa.types.is_list(kind):
        kind = kind.value_type
    if not pa.types.is_integer(kind):
        raise ValueError(f"{table}.{column} is not an integer column ({kind})")
    bits = kind.bit_width
    if pa.types.is_signed_integer(kind):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


READING_TABLE = b"ub.reading_table"
"""The schema metadata key of a :func:`reading_schema`: the table it reads."""


def column_names(table: str, version: int = SCHEMA_VERSION) -> list[str]:
    """``table``'s columns as a shard of schema ``version`` names them (in schema order)."""
    former = {new: old for old, (new, since) in RENAMED.get(table, {}).items()
              if version < since}
    added = ADDED.get(table, {})
    return [former.get(name, name) for name in TABLES[table].names
            if added.get(name, OLDEST_SCHEMA_VERSION) <= version]


def reading_schema(table: str) -> pa.Schema:
    """``table``'s schema plus the former names of its renamed columns (at the end): one Arrow
    dataset over shards of any versions reads each file's column under its own name, and the
    other name as NULL. Its metadata (:data:`READING_TABLE`) marks it for
    :func:`ub.data.sql.connect_tables`, which exposes it in the current names."""
    schema = TABLES[table]
    for old, (new, _) in RENAMED.get(table, {}).items():
        schema = schema.append(schema.field(new).with_name(old))
    return schema.with_metadata({READING_TABLE: table.encode()})

# Outcomes: ``decisive`` (one seat scored strictly best), ``draw`` (all seats equal),
# ``error`` (the env raised or the game hit ub's turn limit; rewards are null).
OUTCOMES = ("decisive", "draw", "error")
# Per-seat results in ``games.results``: relative to the other seats in multi-player games, and
# by the sign of the reward in single-player games.
RESULTS = ("win", "draw", "loss")
