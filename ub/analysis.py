"""ub from Python: a run, a folder of runs, a data folder or a run in a store, opened for analysis
as ``ub sql`` opens it (the same names and paths, the same views, read-only).

```python
import ub.analysis

with ub.analysis.open("demo") as runs:                  # a run's name under ./runs, or a folder
    runs.sql("SELECT * FROM evals").df()                 # a DuckDB relation: .df(), .pl(), .arrow()
    runs.config.learner.learning_rate                    # a run's config, as it resolved it
    runs.checkpoints                                     # its checkpoints, [0, 1, ...]
    policy = runs.policy(32)                             # checkpoint 32 as the sampler plays it
    policy.move_probabilities("Nim-v0-train", observation, ["0 1", "1 1"])
```

``ub sql`` is built on :func:`open` (its views, its warnings, its read-only rule); docs/sql.md
has a worked analysis. What a run's config or policy needs (the config's schema and the model:
torch) is imported where they are asked for, so that ``ub sql`` opens data without it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from ub.data.schema import TABLES
from ub.data.sql import connect_tables, data_tables, read_only_relation
from ub.errors import UbError
from ub.run.folder.layout import RunPaths, is_run, no_such_run
from ub.run.folder.sweep import is_runs_root, sweep_tables
from ub.run.folder.urls import DEFAULT_RUNS_ROOT, is_url
from ub.run.folder.views import RunViews

if TYPE_CHECKING:
    from ub.run.config.load import TrainConfig

Kind = Literal["run", "runs", "data", "store"]


@dataclass
class Opened:
    """What :func:`open` opened: its views (``tables``, each a read-only DuckDB view on
    :attr:`connection`), what was skipped on the way (``warnings``, each naming its file), and
    for a run (or a run in a store) its folder.

    :param location: what was opened: a folder, or a store's URL.
    :param kind: ``run``, ``runs`` (a folder of runs: every view the union of the runs', with a
        ``run`` column, and the ``runs`` view), ``data`` (a folder ``ub play --out`` wrote) or
        ``store`` (a run read in place in its store).
    """

    location: Path | str
    kind: Kind
    tables: dict[str, pa.Table | ds.Dataset]
    warnings: list[str]
    run: RunPaths | None = None
    _connection: duckdb.DuckDBPyConnection | None = field(default=None, repr=False)

    @property
    def views(self) -> list[str]:
        """The names of the views a query can read."""
        return sorted(self.tables)

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with a view per table, external access off (made on
        first use; :meth:`close` closes it). Writes to it change nothing on disk; :meth:`sql`
        refuses them as ``ub sql`` does."""
        if self._connection is None:
            self._connection = connect_tables(self.tables)
        return self._connection

    def sql(self, query: str) -> duckdb.DuckDBPyRelation:
        """``query``'s result (the last statement's), computed as it is read: ``.df()``,
        ``.pl()``, ``.arrow()``, ``.fetchall()``. A statement that would write is refused with
        a :class:`~ub.errors.UbError`, as ``ub sql`` refuses it."""
        return read_only_relation(self.connection, query)

    def close(self) -> None:
        """Close the connection (its private temporary folder goes with it)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- a run's own ---------------------------------------------------------------------------

    @property
    def config(self) -> TrainConfig:
        """The run's config as it resolved it (``RUN/config.yaml``)."""
        from ub.run.steps.rounds import resolve_run_config

        return resolve_run_config(self._run_paths("config"), None)[0]

    @property
    def checkpoints(self) -> list[int]:
        """The run's checkpoints, by update (0: the start)."""
        if self.kind not in ("run", "store"):
            raise UbError(f"{self.location} is a {_KIND_NAMES[self.kind]}, not a run: its "
                          "checkpoints belong to each run (open one of them)")
        return sorted(int(u) for u in self.tables["checkpoints"].column("update").to_pylist())

    def policy(self, checkpoint: int, *, greedy: bool = False, mask: bool | None = None,
               temperature: float | None = None, device: str = "cpu") -> MovePolicy:
        """Checkpoint ``checkpoint`` of the run as a policy over moves: sampled at the run's
        sampling temperature (or ``temperature``), or ``greedy``; under the legal-move mask or
        free (``None``: as the run trains each env, its ``legal_moves``). Loads the
        checkpoint's adapter on the run's base model (transformers + PEFT)."""
        from ub.exploitability import load_policy_model
        from ub.run.folder.store import fetch_checkpoint
        from ub.run.steps.play import rollout_sampling
        from ub.run.steps.rounds import Run

        paths = self._run_paths("policy")
        if checkpoint not in self.checkpoints:
            raise UbError(f"run {paths.name} has no checkpoint {checkpoint}: it has "
                          f"{', '.join(map(str, self.checkpoints)) or 'none'}")
        run = Run.open(paths)
        config = run.config
        folder = paths.checkpoint(checkpoint)
        fetch_checkpoint(paths, folder)
        model, tokenizer = load_policy_model(str(folder), run.model_folder(), device)
        sampling = rollout_sampling(config, evaluation=False)
        t = sampling.temperature if temperature is None else temperature
        return MovePolicy(config, model, tokenizer, greedy, mask, t or 1.0,
                          tuple(sampling.stop), sampling.max_tokens)

    def _run_paths(self, what: str) -> RunPaths:
        if self.kind == "store":
            raise UbError(f"{self.location} is read in place in its store, and its {what} is "
                          "this machine's copy's: open the run's folder (`ub train --resume` "
                          "or `ub eval` makes the copy)")
        if self.run is None:
            raise UbError(f"{self.location} is a {_KIND_NAMES[self.kind]}, not a run: its "
                          f"{what} belongs to each run (open one of them)")
        return self.run


_KIND_NAMES = {"runs": "folder of runs", "data": "data folder", "run": "run",
               "store": "run in a store"}


@dataclass
class MovePolicy:
    """A checkpoint as the sampler plays it: the probability of each legal move at a
    position (:class:`ub.exploitability.ModelPolicy`, which the exploitability measure walks)."""

    config: TrainConfig
    model: Any
    tokenizer: Any
    greedy: bool
    mask: bool | None  # None: as the run trains the env
    temperature: float
    stop: tuple[str, ...]
    max_tokens: int

    def move_probabilities(self, env_id: str, observation: str,
                           legal_moves: Sequence[str]) -> dict[str | None, float]:
        """Each of ``legal_moves``' probability at ``observation`` (the text the seat sees, as
        the ``steps`` view's ``observation`` holds it) in env ``env_id``, played with the run's
        prompt template; what free play puts off every legal move is under ``None``."""
        from ub.exploitability import ModelPolicy, PlayMode
        from ub.games.game_tree import TreeDecision
        from ub.games.templates import get_template
        from ub.run.config.load import game_specs

        [spec] = game_specs(self.config, [env_id])
        mask = spec.legal_moves == "mask" if self.mask is None else self.mask
        policy = ModelPolicy(self.model, self.tokenizer, get_template(spec.template),
                             PlayMode(self.greedy, mask, self.temperature), stop=self.stop,
                             max_tokens=self.max_tokens, extractor=spec.extractor)
        [answer] = policy.distributions([TreeDecision(None, 0, observation, tuple(legal_moves))])
        probabilities: dict[str | None, float] = {move: p for move, p in answer.probs.items()}
        if answer.illegal:
            probabilities[None] = answer.illegal
        return probabilities


def open(run: str | Path, root: str | None = None) -> Opened:
    """Open ``run`` as ``ub sql RUN [--root ROOT]`` does: a run's name under ``root`` (default
    ``./runs``), a run's folder, a folder of runs, a data folder of ``ub play --out``, or a
    run's store URL (``s3://bucket/runs/NAME``, read in place)."""
    given = str(run) if root is None else f"{root.rstrip('/')}/{run}"
    if is_url(given):
        return _open_store(given)
    folder = Path(given)
    named = Path(DEFAULT_RUNS_ROOT) / str(run)
    if not folder.exists() and root is None and len(folder.parts) == 1 and is_run(named):
        folder = named  # a run's name, under the default runs root
    if not folder.exists():
        if len(Path(run).parts) == 1:
            raise no_such_run(root or DEFAULT_RUNS_ROOT, str(run),
                              "" if root else f" (and no folder {run} here)")
        raise UbError(f"{folder} does not exist: give a run (its name or folder), a folder "
                      "of runs, or the folder `ub play --out` wrote")
    if is_runs_root(folder):
        tables, warnings = sweep_tables(folder)
        return Opened(folder, "runs", dict(tables), warnings)
    if is_run(folder):  # (its shards too, read as its views read it: no link followed)
        views = RunViews(folder)
        return Opened(folder, "run", {**views.shard_tables(), **views.tables()}, views.warnings,
                      RunPaths(folder))
    return Opened(folder, "data", {**data_tables(folder)}, [])


def _open_store(url: str) -> Opened:
    """A run in a store: the shards read in place, the run's tables built from its records
    (fetched to a temporary folder; they are small)."""
    from ub.run.folder.store import RunStore

    store = RunStore(url.rstrip("/"))
    if not store.files("games") and not store.files("rounds"):
        raise UbError(f"{url} holds no ub data (no games/ or rounds/): give the URL of a run "
                      "(the runs root followed by the run name)")
    tables: dict[str, pa.Table | ds.Dataset] = {}
    for table in TABLES:
        tables[table] = store.shard_dataset(table)
        tables[f"eval_{table}"] = store.shard_dataset(table, "eval")
    with tempfile.TemporaryDirectory(prefix="ub-sql-") as records:
        store.pull_records(Path(records))
        views = RunViews(Path(records))
        tables.update(views.tables())
    return Opened(url, "store", tables, views.warnings)

