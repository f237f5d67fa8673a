"""A folder of runs as one set of tables: ``ub sql runs/`` queries a sweep's runs together.

Every table of a run (the shards' ``steps``, ``games``, ``eval_steps``, ``eval_games`` and the
record views of :mod:`ub.run.folder.views`) is the union of every run's, read-only as one
run's are. The record views gain a first column ``run``, the run's folder name; the shards
have theirs already (the name the run was trained under: the same, unless a folder was
renamed). One more view, ``runs``, has a row per run: its seed, its rounds (committed and
planned), its envs, and ``settings``, the settings in which the runs differ (dotted keys to
their values as YAML writes them), so a sweep's arms can be grouped without a table of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from ub.data.schema import TABLES
from ub.data.shards import committed_shards, shard_path
from ub.run.folder.layout import RunPaths, is_run
from ub.run.folder.views import RunViews

RUNS_SCHEMA = pa.schema([
    ("run", pa.string()), ("seed", pa.int64()), ("rounds", pa.int64()),
    ("rounds_planned", pa.int64()), ("envs", pa.list_(pa.string())),
    ("settings", pa.map_(pa.string(), pa.string())),
])
"""The ``runs`` view: one row per run of the folder."""
NOT_SETTINGS = ("seed",)
"""Keys the ``runs`` view shows as columns of their own, not in ``settings``."""


def runs_under(folder: Path) -> list[Path]:
    """The run folders directly under ``folder``, by name."""
    folder = Path(folder)
    return sorted(p for p in folder.iterdir() if p.is_dir() and is_run(p)) if folder.is_dir() \
        else []


def is_runs_root(folder: Path) -> bool:
    """A folder of runs: no run and no data folder itself, and at least one run inside."""
    folder = Path(folder)
    return (not is_run(folder) and not (folder / "games").is_dir()
            and bool(runs_under(folder)))


def sweep_tables(folder: Path) -> tuple[dict[str, pa.Table | ds.Dataset], list[str]]:
    """Every table of the runs under ``folder`` as one, and the warnings of the files skipped
    (each naming its file, as one run's views give them)."""
    from ub.data.sql import table_dataset

    runs = runs_under(folder)
    tables: dict[str, pa.Table | ds.Dataset] = {}
    for table in TABLES:
        for prefix, data in (("", lambda r: r), ("eval_", lambda r: r / "eval")):
            files = [shard_path(data(run), table, sid) for run in runs
                     for sid in committed_shards(data(run))]
            tables[f"{prefix}{table}"] = table_dataset(Path(folder), table, files)
    warnings: list[str] = []
    by_view: dict[str, list[pa.Table]] = {}
    for run in runs:
        views = RunViews(run)
        for name, view in views.tables().items():
            by_view.setdefault(name, []).append(
                view.add_column(0, "run", pa.array([run.name] * view.num_rows, pa.string())))
        warnings += views.warnings
    for name, parts in by_view.items():
        tables[name] = pa.concat_tables(parts, promote_options="permissive")
    tables["runs"] = runs_table(runs)
    return tables, warnings


def runs_table(runs: list[Path]) -> pa.Table:
    """The ``runs`` view of ``runs`` (:data:`RUNS_SCHEMA`), from each run's ``config.yaml``
    (the whole config, as the run resolved it) as it is written: a run whose config does not
    read has NULLs there."""
    import yaml

    from ub.settings import load_yaml

    flat: list[dict[str, str]] = []
    rows: list[dict[str, Any]] = []
    for run in runs:
        paths = RunPaths(run.absolute())
        try:
            config = load_yaml(paths.config.read_text(encoding="utf-8"))
        except (OSError, ValueError, yaml.YAMLError):
            config = None
        config = config if isinstance(config, dict) else {}
        envs = config.get("envs")
        flat.append(flat_settings(config))
        rows.append({"run": run.name, "seed": _whole(config.get("seed")),
                     "rounds": len(paths.committed_rounds()),
                     "rounds_planned": _whole(config.get("rounds")),
                     "envs": [e.get("env_id") for e in envs if isinstance(e, dict)]
                     if isinstance(envs, list) else None})
    keys = sorted({k for f in flat for k in f})
    differ = [k for k in keys if len({f.get(k) for f in flat}) > 1 and k not in NOT_SETTINGS]
    for row, settings in zip(rows, flat, strict=True):
        row["settings"] = [(k, settings.get(k, "")) for k in differ]
    return pa.Table.from_pylist(rows, schema=RUNS_SCHEMA)


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def flat_settings(value: Any, prefix: str = "") -> dict[str, str]:
    """A config as dotted keys to YAML-flow values (a list, of mappings too, as one value)."""
    import yaml

    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(flat_settings(item, f"{prefix}{key}."))
        return out
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return {prefix.rstrip("."): text.removesuffix("...").strip()}
