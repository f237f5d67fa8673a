"""Parquet shards on disk: paths, atomic writes, and which shards are committed.

Layout under a data root::

    steps/round-000003/shard-0001.parquet     one row per decision
    games/round-000003/shard-0001.parquet     one row per game

The round folder is deliberately not a hive partition (``round=000003``, the layout of run
format 1): plain DuckDB would turn the ``round`` column into VARCHAR '000003', and plain
pyarrow and pandas refuse to merge the folder's dictionary type with the file's int32. With
``round-NNNNNN`` every reader takes ``round`` from the file (int32), with no options, and the
zero padding keeps a plain sort of the folder names in round order. Data roots written in the
old layout are still read, and keep being written in it (one layout per data root).

A shard's ``steps`` file is written first and its ``games`` file last: the games file is the
shard's commit marker. Every file goes to a temporary name in the same folder, is flushed and
fsync'ed, then renamed into place, so a reader never sees a partial file and a killed writer
leaves nothing that looks finished (only ``.*.tmp-*`` litter, which the next writer ignores).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import ub
from ub.data.atomic import write_atomic
from ub.data.schema import OLDEST_SCHEMA_VERSION, SCHEMA_VERSION, TABLES, column_names
from ub.errors import UbError
from ub.faults import fault_point

_SHARD_FILE = re.compile(r"^shard-(\d{4,})\.parquet$")
_ROUND_DIR = re.compile(r"^round[-=](\d{6,})$")
ROUND_FOLDER = "round-{:06d}"
"""A round's shard folder (run format 2)."""
LEGACY_ROUND_FOLDER = "round={:06d}"
"""A round's shard folder in run format 1: a hive partition, which plain readers mistype."""


@dataclass(frozen=True, order=True)
class ShardId:
    """Where a shard lives: its round and its index within the round."""

    round: int
    shard: int


def shard_path(root: Path, table: str, sid: ShardId) -> Path:
    """The path of ``table``'s file for shard ``sid``: a pure function of (root, round, shard)."""
    return round_dir(root, table, sid.round) / f"shard-{sid.shard:04d}.parquet"


def round_dir(root: Path, table: str, round_: int) -> Path:
    """``table``'s folder of round ``round_``: ``round-NNNNNN``, or ``round=NNNNNN`` in a data
    root written in the old layout (:func:`uses_legacy_layout`)."""
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}")
    new = Path(root) / table / ROUND_FOLDER.format(round_)
    if new.exists():
        return new
    legacy = Path(root) / table / LEGACY_ROUND_FOLDER.format(round_)
    return legacy if legacy.exists() or uses_legacy_layout(root) else new


def round_dir_names(round_: int) -> tuple[str, str]:
    """Both names round ``round_``'s folder may have (for fetching from a run's store, where
    the local copy cannot tell yet)."""
    return ROUND_FOLDER.format(round_), LEGACY_ROUND_FOLDER.format(round_)


def uses_legacy_layout(root: Path) -> bool:
    """Whether the data under ``root`` is in run format 1's ``round=NNNNNN`` folders; new
    rounds of such a root are written the same way, so a root never mixes the two layouts
    (plain DuckDB's hive detection breaks on a mix). A run's evaluation root (``RUN/eval``)
    follows the run's training data, so a format 1 run's first eval shard is format 1 too."""
    roots = [Path(root)] + ([Path(root).parent] if Path(root).name == "eval" else [])
    for base in roots:
        for table in TABLES:
            folder = base / table
            if folder.is_dir() and any(p.name.startswith("round=") for p in folder.iterdir()):
                return True
    return False


def write_parquet_atomic(
    table: pa.Table, path: Path, metadata: dict[str, Any] | None = None
) -> Path:
    """Write ``table`` to ``path`` (zstd) so that the file appears whole or not at all.

    ``metadata`` is stored JSON-encoded in the Parquet key-value metadata under ``ub.*`` keys.
    """
    kv = dict(table.schema.metadata or {})
    for key, value in (metadata or {}).items():
        kv[f"ub.{key}".encode()] = json.dumps(value, sort_keys=True, default=str).encode()
    table = table.replace_schema_metadata(kv)
    return write_atomic(Path(path), lambda handle: pq.write_table(table, handle,
                                                                  compression="zstd"))


def provenance(run: str, table: str, sid: ShardId, extra: dict[str, Any] | None = None) -> dict:
    """The metadata every shard carries: what wrote it, when, for which run, round and shard."""
    return {
        "schema_version": SCHEMA_VERSION,
        "table": table,
        "ub_version": ub.__version__,
        "run": run,
        "round": sid.round,
        "shard": sid.shard,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        **(extra or {}),
    }


def write_shard(
    root: Path,
    sid: ShardId,
    run: str,
    steps: pa.Table,
    games: pa.Table,
    extra_metadata: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Commit one shard: steps first, then games (the commit marker). Returns both paths."""
    steps_path = write_parquet_atomic(
        steps.cast(TABLES["steps"]), shard_path(root, "steps", sid),
        provenance(run, "steps", sid, extra_metadata),
    )
    fault_point("shard.between-files")
    games_path = write_parquet_atomic(
        games.cast(TABLES["games"]), shard_path(root, "games", sid),
        provenance(run, "games", sid, extra_metadata),
    )
    return steps_path, games_path


def is_committed(root: Path, sid: ShardId) -> bool:
    """A shard is committed when both files exist (games is written last)."""
    return shard_path(root, "games", sid).exists() and shard_path(root, "steps", sid).exists()


def committed_shards(root: Path, links: list[Path] | None = None) -> list[ShardId]:
    """Every committed shard under ``root``, sorted by (round, shard).

    ``links`` is for a reader of data that may be someone else's (the read-only commands over
    runs: docs/security.md): given, no link below ``root`` is followed, not even to list a
    folder; a shard with one on its path is left out, and the link added to ``links``. Without
    it links are followed as ``open`` follows them (a run being trained is its owner's, whose
    config runs code anyway)."""
    root = Path(root)

    def linked(path: Path) -> bool:
        if links is None:
            return False
        link = link_below(root, path)
        if link is not None and link not in links:
            links.append(link)
        return link is not None

    found = []
    games_root = root / "games"
    # (a linked steps/ holds no shard's steps: checked first, it is never listed)
    if linked(games_root) or linked(root / "steps") or not games_root.is_dir():
        return []
    for folder in games_root.iterdir():
        round_match = _ROUND_DIR.match(folder.name)
        if not round_match or linked(folder) or not folder.is_dir():
            continue
        for file in folder.iterdir():
            shard_match = _SHARD_FILE.match(file.name)
            if shard_match and not linked(file):
                sid = ShardId(int(round_match.group(1)), int(shard_match.group(1)))
                steps = shard_path(root, "steps", sid)
                if not linked(steps) and steps.exists():
                    found.append(sid)
    return sorted(found)


def link_below(root: Path, path: Path) -> Path | None:
    """The first link on the way down from ``root`` to ``path`` (``path`` itself included),
    or ``None``. ``root`` and the folders above it are not looked at: the path a command is
    given is its user's choice (``runs -> /data/runs``)."""
    step = Path(root)
    for part in Path(path).relative_to(step).parts:
        step = step / part
        if step.is_symlink():
            return step
    return None


def round_ranges(rounds: Sequence[int]) -> str:
    """Sorted round numbers for a person: ``0-3, 5, 7-8``."""
    out: list[str] = []
    start: int | None = None
    prev: int | None = None
    for v in [*rounds, None]:
        if start is None:
            start = prev = v
        elif v is not None and prev is not None and v == prev + 1:
            prev = v
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = v
    return ", ".join(out)


def next_free_shard(root: Path, round_: int, start: int = 0) -> ShardId:
    """The lowest shard index of ``round_``, from ``start``, with no committed or half-written
    files."""
    index = start
    while (
        shard_path(root, "games", ShardId(round_, index)).exists()
        or shard_path(root, "steps", ShardId(round_, index)).exists()
    ):
        index += 1
    return ShardId(round_, index)


def read_metadata(path: Path) -> dict[str, Any]:
    """The ``ub.*`` metadata of a shard file, decoded."""
    try:
        raw = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid) as exc:
        raise UbError(f"{path} is not a readable Parquet file ({exc}); "
                      "run `ub doctor` on the run to quarantine it") from None
    out = {}
    for key, value in raw.items():
        if not key.startswith(b"ub."):
            continue  # (Arrow's and pandas' own, in any bytes)
        try:
            out[key.decode()[3:]] = json.loads(value)
        except ValueError:  # (UnicodeDecodeError too)
            raise UbError(f"{path} has damaged ub metadata (its {key[:40]!r} is "
                          f"{value[:40]!r}, not JSON text); run `ub doctor` on the run to "
                          "quarantine it") from None
    return out


def check_shard_schema(path: Path, table: str) -> int:
    """Refuse a shard of an unknown schema version or with missing columns, naming the file;
    returns its schema version (every version from :data:`OLDEST_SCHEMA_VERSION` on is read,
    in the current column names: see :mod:`ub.data.schema`)."""
    meta = read_metadata(path)
    version = meta.get("schema_version")
    if version is None:
        raise UbError(f"{path} has no ub schema version: it was not written by ub (move it "
                      "out of the data folder; in a run, `ub doctor RUN --repair` does)")
    if not isinstance(version, int) or isinstance(version, bool):
        raise UbError(f"{path} has the schema version {json.dumps(version)[:40]}, not a "
                      "number: its ub metadata is damaged (move it out of the data folder; "
                      "in a run, `ub doctor RUN --repair` does)")
    if meta.get("table", table) != table:
        raise UbError(f"{path} is a {meta['table']!r} shard in the place of a {table!r} one: "
                      "move it out of the data folder")
    if version > SCHEMA_VERSION:
        raise UbError(
            f"{path} has schema version {version}, newer than this ub's {SCHEMA_VERSION}: "
            "upgrade ub to read it"
        )
    if version < OLDEST_SCHEMA_VERSION:
        raise UbError(f"{path} has schema version {version}, older than any this ub reads "
                      f"({OLDEST_SCHEMA_VERSION} to {SCHEMA_VERSION})")
    columns = set(pq.read_schema(path).names)
    missing = [name for name in column_names(table, version) if name not in columns]
    if missing:
        raise UbError(f"{path} is missing columns {', '.join(missing)} of table {table!r}")
    return int(version)
