"""A run directory as tables, for ``ub sql RUN``, the dashboard and the report.

Besides ``steps`` and ``games`` (the training shards), a run has:

- ``eval_steps``, ``eval_games``: the evaluation shards;
- ``evals``: one row per (checkpoint, env, opponent) evaluation, with Wilson intervals;
- ``ratings``: one row per (round, pool member): TrueSkill mu, sigma, record after the round;
- ``checkpoints``: one row per checkpoint (update, path, what it was trained from);
- ``learner``: one row per round: the update's loss, gradient norm, tokens, batch figures, and
  every statistic the run's algorithm reported (a column each, whatever the algorithm);
- ``rounds``: one row per committed round: counts and the time breakdown;
- ``benchmarks``: one row per (checkpoint, task, metric) of the reasoning benchmarks
  (``benchmarks/ckpt-NNNNNN/TASK.parquet``, :mod:`ub.run.steps.benchmarks`);
- ``exploitability``: one row per (checkpoint, env, way of playing) of a checkpoint's exact
  best responses (``exploitability/ckpt-NNNNNN/ENV.parquet``, :mod:`ub.run.steps.exploitability`);
- ``metrics``: the per-round tracked metrics (``metrics/round-NNNNNN.parquet``), long format
  ``(round, metric, value)``.

Every table is built from the committed files only. A file that cannot be read is skipped
with a warning naming it (the tables are still usable); missing parts give empty tables.

:class:`RunViews` is how the read-only commands (``ub sql``, ``ub report``, ``ub compare``,
``ub dashboard``) read a run: its tables, its shards, its ``config.yaml`` and its logs. It
follows no link inside the run (a link there is someone's way to a file of the reader's, which
the command would show): each one met, a folder or a file, is skipped with a warning naming it,
and what it leads to is never opened or listed. The run's own folder is the caller's choice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import yaml

from ub.data.schema import TABLES
from ub.data.shards import ShardId, committed_shards, link_below, shard_path
from ub.run.folder.layout import check_run_format
from ub.settings import load_yaml

EVALS_SCHEMA = pa.schema([
    ("update", pa.int64()), ("round", pa.int64()), ("actor", pa.string()),
    ("env_id", pa.string()), ("opponent", pa.string()), ("games", pa.int64()),
    ("wins", pa.int64()), ("draws", pa.int64()), ("losses", pa.int64()), ("errors", pa.int64()),
    ("win_rate", pa.float64()), ("win_low", pa.float64()), ("win_high", pa.float64()),
    ("invalid_move_rate", pa.float64()), ("format_rate", pa.float64()),
    ("legal_moves", pa.string()),  # the legal-move mode played under (NULL: not recorded)
    # The random player's win rate in the same seats of the same games (NULL: not measured,
    # against a model or hosted opponent): the bar the checkpoint clears or not.
    ("baseline_win_rate", pa.float64()), ("baseline_low", pa.float64()),
    ("baseline_high", pa.float64()),
])
EXPLOITABILITY_SCHEMA = pa.schema([
    ("update", pa.int64()), ("env_id", pa.string()),
    ("policy", pa.string()),  # greedy (as evaluated at temperature 0) or sampled
    ("legal_moves", pa.string()),  # mask or free
    ("temperature", pa.float64()), ("unit", pa.string()),  # game (+1 a win) or chips
    ("nash_conv", pa.float64()),  # best response in seat 0 + in seat 1 (0: an equilibrium)
    ("nash_conv_low", pa.float64()), ("nash_conv_high", pa.float64()),  # equal when exact
    ("exact", pa.bool_()), ("cut", pa.float64()),
    ("best_response_seat0", pa.float64()), ("best_response_seat1", pa.float64()),
    ("illegal", pa.float64()),  # P(an illegal move) against the best response, mean of seats
    ("random_nash_conv", pa.float64()),  # the uniformly random policy's, the bar
    ("decisions", pa.int64()), ("line_seat0", pa.string()), ("line_seat1", pa.string()),
    ("seconds", pa.float64()), ("measured_at", pa.string()),
])
"""The ``exploitability`` view (:mod:`ub.exploitability`, docs/exploitability.md)."""
RATINGS_SCHEMA = pa.schema([
    ("round", pa.int64()), ("name", pa.string()), ("kind", pa.string()),
    ("parent", pa.string()), ("mu", pa.float64()), ("sigma", pa.float64()),
    ("conservative", pa.float64()), ("games", pa.int64()), ("rated_games", pa.int64()),
    ("wins", pa.int64()), ("draws", pa.int64()), ("losses", pa.int64()),
])
CHECKPOINTS_SCHEMA = pa.schema([
    ("update", pa.int64()), ("name", pa.string()), ("path", pa.string()),
    ("from_checkpoint", pa.string()), ("loss", pa.float64()), ("grad_norm", pa.float64()),
])
# The learner's own figures of an update (whatever the algorithm), which a round's manifest
# keeps (ub.run.steps.manifest) and the learner view shows with these types; beside them, the
# manifest keeps each statistic the algorithm reported (the update's algorithm_statistics) and
# the view shows a column for each one the run's manifests hold (LEARNER_NOT_SHOWN aside).
LEARNER_METRICS = pa.schema([
    ("update", pa.int64()), ("loss", pa.float64()),
    ("grad_norm", pa.float64()), ("entropy_mean", pa.float64()),
    ("logprob_mean", pa.float64()), ("logprob_abs_diff_max", pa.float64()),
    ("approx_kl", pa.float64()), ("kl_to_base", pa.float64()),
    # under the legal-move mask: the whole softmax's mass on the allowed tokens, per token
    ("legal_mass", pa.float64()),
    ("optimizer_steps", pa.int64()),
    ("early_stopped", pa.bool_()), ("learning_rate", pa.float64()),
    ("tokens", pa.int64()), ("tokens_per_second", pa.float64()),
    ("seconds", pa.float64()), ("micro_batch_tokens", pa.int64()), ("kernels", pa.string()),
    ("liger_kernels", pa.list_(pa.string())), ("peak_gpu_gib", pa.float64()),
])
LEARNER_NOT_SHOWN = frozenset({"reused", "assemble_seconds"})
"""What a manifest's ``learner`` holds besides figures of the update (the ``rounds`` view has
the round's times)."""
LEARNER_SCHEMA = pa.schema([
    ("round", pa.int64()), *LEARNER_METRICS,
    ("batch_size", pa.int64()), ("batch_tokens", pa.int64()),
    ("truncated", pa.int64()), ("reward_mean", pa.float64()), ("advantage_std", pa.float64()),
])
ROUNDS_SCHEMA = pa.schema([
    ("round", pa.int64()), ("games", pa.int64()), ("copies", pa.int64()),
    ("decisions", pa.int64()), ("model_decisions", pa.int64()), ("invalid_moves", pa.int64()),
    ("generated_tokens", pa.int64()), ("round_seconds", pa.float64()),
    ("rollout_seconds", pa.float64()), ("eval_seconds", pa.float64()),
    ("learner_seconds", pa.float64()), ("other_seconds", pa.float64()),
])
METRICS_SCHEMA = pa.schema([("round", pa.int64()), ("metric", pa.string()),
                            ("value", pa.float64())])

BENCHMARKS_SCHEMA = pa.schema([
    ("checkpoint", pa.int64()), ("benchmark", pa.string()), ("task", pa.string()),
    ("metric", pa.string()), ("filter", pa.string()), ("value", pa.float64()),
    ("stderr", pa.float64()), ("n", pa.int64()), ("limit", pa.int64()),
    ("prompt_format", pa.string()), ("harness_version", pa.string()),
    ("task_hash", pa.string()), ("seconds", pa.float64()), ("scored_at", pa.string()),
])
"""The ``benchmarks`` view, and each file's columns: ``benchmark`` is the task or group asked
for (the file's name), ``task`` the harness task a row measures (a group's tasks and the group
itself), ``n`` its examples, ``task_hash`` a hash of its config as the harness ran it."""

_NUMBERED = re.compile(r"-(\d{6,})\.(json|parquet)$")


def _numbered(folder: Path, suffix: str) -> list[tuple[int, Path]]:
    """The numbered files (``round-NNNNNN.json``) of ``folder``, by number, links followed
    (``ub doctor``'s; the views list a run's folders with :meth:`RunViews.files`)."""
    return _by_number(folder.glob(f"*{suffix}")) if folder.is_dir() else []


def _by_number(paths: Iterable[Path]) -> list[tuple[int, Path]]:
    """Each of ``paths`` that is numbered (not an unfinished write's hidden name), by number."""
    found = []
    for path in paths:
        m = _NUMBERED.search(path.name)
        if m and not path.name.startswith("."):
            found.append((int(m.group(1)), path))
    return sorted(found)


def shown_path(path: Path) -> str:
    """``path`` for a line of text: as it is, or quoted and escaped as Python writes it where
    it holds a character that is not printable (a newline, ESC: a name someone else chose)."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def skipped_link(link: Path) -> str:
    """The warning for a link met inside a run or a folder of runs, which is not followed."""
    return (f"skipped {shown_path(link)}: a link, which ub does not follow inside a run or a "
            "folder of runs (docs/security.md)")


def config_problem(config: Any) -> str | None:
    """What makes ``config`` (a ``config.yaml`` as read) no run config: not a mapping, or a
    field the views read (``seed``, ``rounds``, ``envs``) there with a type ub never writes it
    in (one missing is only NULL in the views); ``None``: nothing. Only types are checked:
    nothing the config names is imported (docs/security.md)."""
    if not isinstance(config, dict):
        return f"not a mapping of settings but {_brief(config)}"
    for key in ("seed", "rounds"):
        if key in config and _whole(config[key]) is None:
            return f"its {key} is {_brief(config[key])}, not a whole number"
    envs = config.get("envs", [])
    if not isinstance(envs, list) or not all(
            isinstance(env, dict) and isinstance(env.get("env_id"), str) for env in envs):
        return f"its envs are {_brief(envs)}, not a list of envs with an env_id each"
    return None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _brief(value: Any) -> str:
    """``value`` as JSON (control characters escaped), cut to a line's part."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:59] + "…"


class RunViews:
    """Builds the run's tables; ``warnings`` lists the files that were skipped.

    ``cache`` (a dict the caller keeps) holds parsed files by path, size and modification
    time, so building the tables again, as the live dashboard does every refresh, parses only
    the files that are new or changed.
    """

    def __init__(self, root: Path, cache: dict[Path, tuple[Any, Any]] | None = None) -> None:
        self.root = Path(root)
        self.warnings: list[str] = []
        self._cache = {} if cache is None else cache
        if self._inside(self.root / "ub-run.json"):
            check_run_format(self.root)

    def _warn(self, warning: str) -> None:
        if warning not in self.warnings:  # (several views read the same file)
            self.warnings.append(warning)

    def _inside(self, path: Path) -> bool:
        """Whether ``path`` is reached from the run's folder through no link (a link on the
        way is warned about, and not followed)."""
        link = link_below(self.root, path)
        if link is not None:
            self._warn(skipped_link(link))
        return link is None

    def files(self, folder: Path, pattern: str) -> list[Path]:
        """The entries of the run's ``folder`` whose names match ``pattern``, by name; a link
        among them, or on the way to ``folder``, is left out (with a warning) and not listed."""
        if not self._inside(folder) or not folder.is_dir():
            return []
        return [path for path in sorted(folder.glob(pattern)) if self._inside(path)]

    def _numbered(self, folder: Path, suffix: str) -> list[tuple[int, Path]]:
        return _by_number(self.files(folder, f"*{suffix}"))

    def config(self) -> dict[str, Any] | None:
        """The run's ``config.yaml`` (the whole config, as the run resolved it), or ``None``
        with a warning naming the file and what is wrong with it: it does not read, or it is
        not as ub writes it (:func:`config_problem`)."""
        return self._read(self.root / "config.yaml", _read_config)

    def committed_rounds(self) -> list[int]:
        """The rounds whose manifests are there (``rounds/round-NNNNNN.json``)."""
        return [round_ for round_, _ in self._numbered(self.root / "rounds", ".json")]

    def committed_shards(self, evaluation: bool = False) -> list[ShardId]:
        """The run's committed training (or evaluation) shards, those with no link on their
        path (each link met is warned about)."""
        data = self.root / "eval" if evaluation else self.root
        if not self._inside(data):
            return []
        links: list[Path] = []
        shards = committed_shards(data, links)
        for link in links:
            self._warn(skipped_link(link))
        return shards

    def shard_files(self, table: str, evaluation: bool = False) -> list[Path]:
        """``table``'s files of :meth:`committed_shards`."""
        data = self.root / "eval" if evaluation else self.root
        return [shard_path(data, table, sid) for sid in self.committed_shards(evaluation)]

    def shard_tables(self) -> dict[str, ds.Dataset]:
        """The shard views: ``steps``, ``games``, ``eval_steps``, ``eval_games``."""
        from ub.data.sql import table_dataset  # (DuckDB: only where a command needs it)

        return {f"{prefix}{table}": table_dataset(self.root, table,
                                                  self.shard_files(table, evaluation))
                for prefix, evaluation in (("", False), ("eval_", True)) for table in TABLES}

    def _load(self, path: Path, parse: Callable[[Path], Any]) -> Any:
        stat = path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        hit = self._cache.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = parse(path)
        self._cache[path] = (key, value)
        return value

    def _read(self, path: Path, parse: Callable[[Path], Any]) -> Any | None:
        """``parse(path)`` (cached), or ``None`` with a warning naming the file (a link on its
        way: never opened)."""
        if not self._inside(path):
            return None
        try:
            return self._load(path, parse)
        except (OSError, ValueError, KeyError, AttributeError, pa.ArrowException) as exc:
            self._warn(f"skipped {path}: {exc}")
            return None

    def _json(self, path: Path) -> Any | None:
        return self._read(path, lambda p: json.loads(p.read_text()))

    def _fitted(self, path: Path, schema: pa.Schema,
                rows: Callable[..., list[dict[str, Any]]], *args: Any) -> pa.Table | None:
        """One file's ``rows(*args)`` as ``schema``, or ``None`` with a warning naming the
        file: a field missing or of another type (``"games": "many"``) is a damaged or crafted
        file, and the other files' rows still make the table."""
        try:
            return pa.Table.from_pylist(rows(*args), schema=schema)
        except (KeyError, TypeError, ValueError, AttributeError, pa.ArrowException) as exc:
            self._warn(f"skipped {path}: not as ub writes it ({type(exc).__name__}: {exc})")
            return None

    @staticmethod
    def _joined(tables: list[pa.Table | None], schema: pa.Schema) -> pa.Table:
        present = [t for t in tables if t is not None]
        return pa.concat_tables(present) if present else schema.empty_table()

    def _manifests(self) -> list[tuple[int, Path, dict]]:
        out = []
        for round_, path in self._numbered(self.root / "rounds", ".json"):
            # No view needs the leaderboard copy (ratings/ has it): don't keep it.
            data = self._read(path, lambda p: {k: v for k, v in json.loads(
                p.read_text()).items() if k != "leaderboard"})
            if isinstance(data, dict):
                out.append((round_, path, data))
        return out

    def last_ratings(self) -> dict[str, Any]:
        """The newest rating snapshot (``members``, ``matches``); ``{}`` before the first."""
        snapshots = self._numbered(self.root / "ratings", ".json")
        data = self._json(snapshots[-1][1]) if snapshots else None
        return data if isinstance(data, dict) else {}

    def evals(self) -> pa.Table:
        def rows(round_: int, m: dict) -> list[dict[str, Any]]:
            return [{**{f.name: r.get(f.name) for f in EVALS_SCHEMA}, "update": int(update),
                     "round": round_}
                    for update, results in m.get("evals", {}).items() for r in results]

        return self._joined([self._fitted(path, EVALS_SCHEMA, rows, round_, m)
                             for round_, path, m in self._manifests()], EVALS_SCHEMA)

    def ratings(self) -> pa.Table:
        def rows(round_: int, data: dict) -> list[dict[str, Any]]:
            return [{**{f.name: m.get(f.name) for f in RATINGS_SCHEMA}, "round": round_,
                     "conservative": m["mu"] - 3 * m["sigma"]} for m in data["members"]]

        snapshots = [(round_, path, self._json(path))
                     for round_, path in self._numbered(self.root / "ratings", ".json")]
        return self._joined([self._fitted(path, RATINGS_SCHEMA, rows, round_, data)
                             for round_, path, data in snapshots if data is not None],
                            RATINGS_SCHEMA)

    def checkpoints(self) -> pa.Table:
        rows = []
        for path in self.files(self.root / "checkpoints", "ckpt-*"):
            if not (path / "ub_checkpoint.json").exists():
                continue  # unfinished (or not a checkpoint)
            metrics = self._json(path / "metrics.json") or {}
            rows.append(self._fitted(path / "metrics.json", CHECKPOINTS_SCHEMA, lambda p, m: [{
                "update": int(p.name.rsplit("-", 1)[1]), "name": p.name, "path": str(p),
                "from_checkpoint": m.get("from_checkpoint"), "loss": m.get("loss"),
                "grad_norm": m.get("grad_norm")}], path, metrics))
        return self._joined(rows, CHECKPOINTS_SCHEMA)

    def learner(self) -> pa.Table:
        """One row per round: the learner's own figures (:data:`LEARNER_METRICS`), then a
        column for each statistic the manifests hold (an algorithm's, typed from its
        values), then the batch's figures."""
        rows: list[tuple[Path, dict[str, Any]]] = []
        reported: dict[str, None] = {}  # (first-seen order)
        for round_, path, m in self._manifests():
            learner, batch = m.get("learner", {}), m.get("batch", {})
            if not isinstance(learner, dict) or not isinstance(batch, dict):
                self._warn(f"skipped {path}: not as ub writes it (its learner and batch are "
                           "no mappings)")
                continue
            rows.append((path, {**learner, "round": round_, "batch_size": batch.get("size"),
                                "batch_tokens": batch.get("total_tokens"),
                                "truncated": batch.get("truncated"),
                                "reward_mean": batch.get("reward_mean"),
                                "advantage_std": batch.get("advantage_std")}))
            for key in learner:
                if key not in LEARNER_SCHEMA.names and key not in LEARNER_NOT_SHOWN:
                    reported.setdefault(key, None)
        extra = [pa.field(key, _column_type([r.get(key) for _, r in rows])) for key in reported]
        fixed = len(LEARNER_METRICS) + 1  # (round, then the learner's own figures)
        schema = pa.schema([*LEARNER_SCHEMA][:fixed] + extra + [*LEARNER_SCHEMA][fixed:])
        def cells(row: dict[str, Any]) -> list[dict[str, Any]]:
            return [{f.name: _cell(row.get(f.name), f.type) for f in schema}]

        return self._joined([self._fitted(path, schema, cells, row) for path, row in rows],
                            schema)

    def rounds(self) -> pa.Table:
        def rows(round_: int, m: dict) -> list[dict[str, Any]]:
            t = m.get("timings", {})
            return [{**{f.name: m.get(f.name) for f in ROUNDS_SCHEMA}, "round": round_,
                     "round_seconds": t.get("round"), "rollout_seconds": t.get("rollout"),
                     "eval_seconds": t.get("eval"), "learner_seconds": t.get("learner"),
                     "other_seconds": t.get("other")}]

        return self._joined([self._fitted(path, ROUNDS_SCHEMA, rows, round_, m)
                             for round_, path, m in self._manifests()], ROUNDS_SCHEMA)

    def metrics(self) -> pa.Table:
        tables = []
        for _, path in self._numbered(self.root / "metrics", ".parquet"):
            table = self._read(path, lambda p: pq.read_table(p).select(
                METRICS_SCHEMA.names).cast(METRICS_SCHEMA))
            if table is not None:
                tables.append(table)
        return pa.concat_tables(tables) if tables else METRICS_SCHEMA.empty_table()

    def benchmarks(self) -> pa.Table:
        return self._per_checkpoint(self.root / "benchmarks", BENCHMARKS_SCHEMA)

    def exploitability(self) -> pa.Table:
        return self._per_checkpoint(self.root / "exploitability", EXPLOITABILITY_SCHEMA)

    def _per_checkpoint(self, folder: Path, schema: pa.Schema) -> pa.Table:
        """The rows of ``folder/ckpt-NNNNNN/*.parquet`` as ``schema`` (benchmarks,
        exploitability)."""
        files = [path for checkpoint in self.files(folder, "ckpt-*")
                 for path in self.files(checkpoint, "*.parquet")
                 if not path.name.startswith(".")]  # (an unfinished write)
        tables = [t for path in files
                  for t in [self._read(path, lambda p: pq.read_table(p).select(
                      schema.names).cast(schema))] if t is not None]
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def tables(self) -> dict[str, pa.Table]:
        """Every run table by view name (the shard views come from :mod:`ub.data.sql`)."""
        builders: dict[str, Callable[[], pa.Table]] = {
            "evals": self.evals, "ratings": self.ratings, "checkpoints": self.checkpoints,
            "learner": self.learner, "rounds": self.rounds, "metrics": self.metrics,
            "benchmarks": self.benchmarks, "exploitability": self.exploitability,
        }
        return {name: build() for name, build in builders.items()}


def _read_config(path: Path) -> dict[str, Any]:
    """A run's ``config.yaml``, or a :class:`ValueError` of one line saying what is wrong
    (YAML's own message quotes the lines around a problem)."""
    try:
        config = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"not YAML ({getattr(exc, 'problem', None) or 'unreadable'}{where})"
                         ) from None
    problem = config_problem(config)
    if problem is not None:
        raise ValueError(problem)
    return config


def _column_type(values: list[Any]) -> pa.DataType:
    """The Arrow type of a reported statistic's values (``None``: absent that round):
    booleans, integers, numbers (integers among floats: float), text, lists of text; anything
    else is shown as its JSON text."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.bool_()
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.int64()
    if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return pa.float64()
    if present and all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                       for v in present):
        return pa.list_(pa.string())
    return pa.string()


def _cell(value: Any, type_: pa.DataType) -> Any:
    """``value`` as a column of ``type_`` holds it (a statistic of mixed types: its JSON)."""
    if value is None or not pa.types.is_string(type_) or isinstance(value, str):
        return value
    return json.dumps(value)
