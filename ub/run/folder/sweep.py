"""A folder of runs as one set of tables: ``ub sql runs/`` queries a sweep's runs together.

Every table of a run (the shards' ``steps``, ``games``, ``eval_steps``, ``eval_games`` and the
record views of :mod:`ub.run.folder.views`) is the union of every run's, read-only as one
run's are. The record views gain a first column ``run``, the run's folder name; the shards
have theirs already (the name the run was trained under: the same, unless a folder was
renamed). One more view, ``runs``, has a row per run: its seed, its rounds (committed and
planned), its envs, and ``settings``, the settings in which the runs differ (dotted keys to
their values as YAML writes them), so a sweep's arms can be grouped without a table of them.

Whoever can write a shared sweep folder chooses what is in it: a run that is a link, or whose
name holds a newline, is none of the folder's runs (:func:`runs_under`), and each run is read
as :class:`RunViews` reads one, following no link inside it; each is skipped with a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from ub.data.schema import TABLES
from ub.run.folder.layout import is_run
from ub.run.folder.views import RunViews, shown_path, skipped_link

RUNS_SCHEMA = pa.schema([
    ("run", pa.string()), ("arm", pa.string()), ("seed", pa.int64()), ("rounds", pa.int64()),
    ("rounds_planned", pa.int64()), ("envs", pa.list_(pa.string())),
    ("settings", pa.map_(pa.string(), pa.string())),
])
"""The ``runs`` view: one row per run of the folder."""
NOT_SETTINGS = ("seed",)
"""Keys the ``runs`` view shows as columns of their own, not in ``settings``."""


def runs_under(folder: Path, skipped: list[str] | None = None) -> list[Path]:
    """The run folders directly under ``folder``, by name. Two are none of them, each named
    by a line in ``skipped``: a link to a run (perhaps someone else's, put there by whoever
    can write the folder), and a folder whose name holds a character that is not printable
    (no run ub makes is named so; a newline in a name drew a row of ``ub sql``'s table)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    runs = []
    for path in sorted(folder.iterdir()):
        if not (path.is_dir() and is_run(path)):
            continue
        problem = _not_taken(path)
        if problem is None:
            runs.append(path)
        elif skipped is not None:
            skipped.append(problem)
    return runs


def _not_taken(run: Path) -> str | None:
    """Why the run folder ``run`` is none of its folder's runs (:func:`runs_under`), or
    ``None``."""
    if run.is_symlink():
        return skipped_link(run)
    if not run.name.isprintable():
        return (f"skipped {shown_path(run)}: its name holds a character that is not printable "
                "(a newline, a control character), as no run's name does")
    return None


def is_runs_root(folder: Path) -> bool:
    """A folder of runs: no run and no data folder itself, and at least one run inside (or
    one that :func:`runs_under` skips, so that the commands say why it is left out)."""
    folder = Path(folder)
    skipped: list[str] = []
    return (not is_run(folder) and not (folder / "games").is_dir()
            and bool(runs_under(folder, skipped) or skipped))


def sweep_tables(folder: Path) -> tuple[dict[str, pa.Table | ds.Dataset], list[str]]:
    """Every table of the runs under ``folder`` as one, and the warnings of what was skipped
    (each naming its run folder or file, as one run's views give them)."""
    from ub.data.sql import table_dataset

    warnings: list[str] = []
    runs = [RunViews(run) for run in runs_under(folder, warnings)]
    tables: dict[str, pa.Table | ds.Dataset] = {}
    for table in TABLES:
        for prefix, evaluation in (("", False), ("eval_", True)):
            files = [file for run in runs for file in run.shard_files(table, evaluation)]
            tables[f"{prefix}{table}"] = table_dataset(Path(folder), table, files)
    by_view: dict[str, list[pa.Table]] = {}
    for run in runs:
        for name, view in run.tables().items():
            by_view.setdefault(name, []).append(view.add_column(
                0, "run", pa.array([run.root.name] * view.num_rows, pa.string())))
    for name, parts in by_view.items():
        tables[name] = pa.concat_tables(parts, promote_options="permissive")
    tables["runs"] = runs_table(runs)
    return tables, warnings + [warning for run in runs for warning in run.warnings]


def runs_table(runs: list[RunViews]) -> pa.Table:
    """The ``runs`` view of ``runs`` (:data:`RUNS_SCHEMA`), from each run's ``config.yaml``
    (the whole config, as the run resolved it) as it is written. A run whose config does not
    read, or is not as ub writes it (:meth:`RunViews.config`, which warns), has NULLs there,
    and takes no part in which settings differ: one such run made every setting differ."""
    flat: list[dict[str, str] | None] = []
    rows: list[dict[str, Any]] = []
    for run in runs:
        config = run.config()
        flat.append(None if config is None else flat_settings(config))
        known = config or {}
        rows.append({"run": run.root.name, "arm": sweep_arm(run.root.name, known.get("seed")),
                     "seed": known.get("seed"),
                     "rounds": len(run.committed_rounds()),
                     "rounds_planned": known.get("rounds"),
                     "envs": [env["env_id"] for env in known["envs"]] if "envs" in known
                     else None})
    readable = [settings for settings in flat if settings is not None]
    keys = sorted({k for settings in readable for k in settings})
    differ = [k for k in keys if len({f.get(k) for f in readable}) > 1 and k not in NOT_SETTINGS]
    for row, settings in zip(rows, flat, strict=True):
        row["settings"] = (None if settings is None
                           else [(k, settings.get(k, "")) for k in differ])
    return pa.Table.from_pylist(rows, schema=RUNS_SCHEMA)


def sweep_arm(run: str, seed: int | None) -> str | None:
    """The arm a sweep trained run ``run`` for: ``ub sweep`` names its runs ``ARM-sSEED``, so
    ``ARM`` where the name ends in the run's own seed; ``None`` for any other name."""
    arm, dash_s, number = run.rpartition("-s")
    if not (arm and dash_s and number.isdigit()) or seed is None or int(number) != seed:
        return None
    return arm


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
