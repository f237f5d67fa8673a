"""Training batches from a data root, assembled by DuckDB, delivered as torch tensors.

:func:`assemble_batch` does, in order:

1. **plan**: the committed shards whose round is in the window ``[first_round, last_round]``
   (explicit file lists, so DuckDB never lists or opens other rounds); every file's schema is
   checked (:func:`ub.data.shards.check_shard_schema`).
2. **final stage** (Python, :mod:`ub.rewards`): the games from the reward state's watermark (or
   from the first round, with no state) through ``last_round`` are folded into the final
   transform chain in canonical order; the window's per-(game, seat) rewards become an Arrow
   table that DuckDB joins.
3. **select** (one DuckDB query, :func:`batch_sql`): the learner's decisions in the window, their
   final rewards, step shaping, the optional zero-reward drop, a seeded sample of
   ``batch_size`` rows and the sampling normalization on those rows. It reads scalar columns
   only.
4. **fetch** (one DuckDB query): the token lists of the sampled rows only, file by file.
5. **collate** (:func:`collate`): Arrow list offsets to padded numpy arrays to torch tensors.

Everything is a pure function of the data, the config and the reward state: the same inputs
give the same batch, row for row, in the same order.

The modules: :mod:`~ub.batch.config` (what goes into a batch), :mod:`~ub.batch.plan` (which files,
the final stage), :mod:`~ub.batch.sql` (the two queries), :mod:`~ub.batch.collate` (Arrow to
tensors) and :mod:`~ub.batch.assemble` (all of it, timed, with stats).
"""

from ub.batch.assemble import Batch, BatchStats, Selection, assemble_batch, select_rows
from ub.batch.collate import Collated, collate
from ub.batch.config import BatchConfig
from ub.batch.plan import GAME_COLUMNS, final_stage
from ub.batch.sql import DECISION_COLUMNS, TOKEN_COLUMNS, ZERO_EPS, batch_sql, explain

__all__ = ["DECISION_COLUMNS", "GAME_COLUMNS", "TOKEN_COLUMNS", "ZERO_EPS", "Batch", "BatchConfig",
           "BatchStats", "Collated", "Selection", "assemble_batch", "batch_sql", "collate",
           "explain", "final_stage", "select_rows"]
