"""``ub doctor RUN [--repair]``: check a run directory's integrity, quarantine what is broken.

A run is trustworthy when every committed round (a manifest in ``rounds/``) is whole: its shards
exist, read, carry a schema this ub reads (any version up to its own: a run resumed by a newer
ub mixes them, and the doctor names the rounds of each) and hold the games and decisions the
manifest counts; the checkpoint it played and the one it produced load; its rating snapshot,
reward state and metrics read. :func:`examine` lists every problem as a :class:`Finding`; a
finding that breaks round r breaks every later round too (each round learns from the ones
before), so the repair (:func:`repair`) moves round r onwards, and whatever else cannot be
trusted, into ``RUN/quarantine/STAMP/`` (nothing is deleted) and leaves the run at round r.
Resuming then replays the quarantined rounds, and since a run is a deterministic function of
its seed, it produces them again as they were. Derived files (metrics) are rewritten in place
instead.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from ub.components import import_problem, own_components
from ub.data.schema import SCHEMA_VERSION, TABLES
from ub.data.shards import ShardId, check_shard_schema, committed_shards, round_ranges, shard_path
from ub.errors import UbError
from ub.run.folder.layout import (
    ORPHAN,
    RUN_FORMAT,
    RUN_FORMATS,
    RunPaths,
    check_run_format,
    find_orphans,
    is_run,
    round_label,
)
from ub.run.folder.views import METRICS_SCHEMA, _numbered


@dataclass(frozen=True)
class Finding:
    """One problem: the file, what is wrong with it, and the first round it breaks (``None``:
    no round, e.g. a leftover temporary file)."""

    path: Path
    problem: str
    breaks_round: int | None = None
    derived: bool = False
    """Rewritten from the run's data by a repair rather than quarantined."""
    alone: bool = False
    """Quarantined by itself (no round depends on it: a leftover, an ad-hoc eval shard)."""

    def line(self, root: Path) -> str:
        where = self.path.relative_to(root) if self.path.is_relative_to(root) else self.path
        scope = (" (rewritten by --repair)" if self.derived else
                 " (quarantined by --repair)" if self.alone else
                 f" ({round_label(self.breaks_round)} onwards)" if self.breaks_round is not None
                 else "")
        return f"{where}: {self.problem}{scope}"


@dataclass
class Examination:
    root: Path
    rounds: list[int]
    findings: list[Finding]
    run_format: int = RUN_FORMAT
    """The run directory's format (:data:`ub.run.folder.layout.RUN_FORMATS`)."""
    schema_versions: dict[int, list[int]] = field(default_factory=dict)
    """The committed rounds whose shards are of each data schema version (``ub.data.schema``)."""
    notes: list[str] = field(default_factory=list)
    """What could not be checked in this process, and how to check it (not damage)."""

    @property
    def format_line(self) -> str:
        """Which formats the run is in, for a user: the run directory's, then (on a second
        line) the data schema versions of its committed rounds' shards. Old formats are read
        as they are."""
        note = "" if self.run_format == RUN_FORMAT else " (an older format, read as it is)"
        line = f"run format {self.run_format}: {RUN_FORMATS[self.run_format]}{note}"
        if not self.schema_versions:
            return line
        versions = "; ".join(f"v{v}: round{'s' * (len(rounds) > 1)} "
                             f"{round_ranges([r + 1 for r in rounds])}"
                             for v, rounds in sorted(self.schema_versions.items()))
        older = [f"v{v}" for v in sorted(self.schema_versions) if v != SCHEMA_VERSION]
        note = (f" ({', '.join(older)} older, read in the current column names)"
                if older else "")
        return f"{line}\ndata schema {versions}{note}"

    @property
    def first_broken_round(self) -> int | None:
        return min((f.breaks_round for f in self.findings
                    if f.breaks_round is not None and not f.derived), default=None)


def _files(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


def _check_json(path: Path, round_: int, what: str) -> Iterator[Finding]:
    if not path.exists():
        yield Finding(path, f"missing ({what})", round_)
        return
    try:
        json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        yield Finding(path, f"unreadable {what}: {exc}", round_)


def _check_ratings(path: Path, round_: int) -> list[Finding]:
    """A rating snapshot as a resume reads it (the pool's own reader)."""
    from ub.pool.ratings import RatingTable

    found = list(_check_json(path, round_, "rating snapshot"))
    if not found:
        try:
            RatingTable.from_snapshot(json.loads(path.read_text()))
        except UbError as exc:
            found.append(Finding(path, str(exc), round_))
    return found


def _check_shard(path: Path, table: str, round_: int | None, *, alone: bool = False
                 ) -> tuple[int | None, int | None, list[Finding]]:
    """Rows and schema version of a shard file, or the findings that make it untrustworthy."""
    if not path.exists():
        return None, None, [Finding(path, f"missing {table} shard of a committed round", round_)]
    try:
        version = check_shard_schema(path, table)
        rows = pq.read_table(path).num_rows  # every page decoded: damage anywhere shows
    except UbError as exc:
        problem = str(exc).replace(f"{path} ", "").replace(str(path), "it")
        problem = problem.split("; run `ub doctor`")[0].split(" (move it out")[0]
        return None, None, [Finding(path, problem, round_, alone=alone)]
    except (OSError, pa.ArrowException) as exc:
        return None, None, [Finding(path, f"unreadable Parquet ({exc})", round_, alone=alone)]
    return rows, version, []


def _check_eval_shards(paths: RunPaths, committed: int) -> list[Finding]:
    """Every eval shard ``ub sql`` reads. Shard 0 of checkpoint u is the run's own evaluation,
    made by round u - 1 (round 0 also evaluates checkpoint 0) and rated with it: damage breaks
    that round. Other shards are ad-hoc ``ub eval`` games and an eval shard of a round not yet
    committed is work a resume reuses: those are quarantined by themselves."""
    findings: list[Finding] = []
    for sid in committed_shards(paths.eval_data):
        owner = max(sid.round - 1, 0)
        ours = sid.shard == 0 and owner < committed
        for table in TABLES:
            findings += _check_shard(shard_path(paths.eval_data, table, sid), table,
                                     owner if ours else None, alone=not ours)[2]
    return findings


def _check_metrics(paths: RunPaths, committed: int) -> list[Finding]:
    """Every metrics file the run's views read (``metrics`` in ``ub sql``, the dashboard):
    rewritten from the run's data for a committed round, quarantined otherwise."""
    findings = []
    for round_, path in _numbered(paths.root / "metrics", ".parquet"):  # (what views read)
        try:
            pq.read_table(path).select(METRICS_SCHEMA.names).cast(METRICS_SCHEMA)
        except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
            ours = round_ < committed
            findings.append(Finding(path, f"unreadable metrics ({exc})", round_ if ours
                                    else None, derived=ours, alone=not ours))
    return findings


def _check_round(paths: RunPaths, round_: int, versions: dict[int, list[int]]
                 ) -> list[Finding]:
    """The findings of committed round ``round_``; adds it to ``versions`` under the schema
    version of each of its shard files."""
    manifest_path = paths.manifest(round_)
    try:
        manifest = json.loads(manifest_path.read_text())
        # (games/round-R/shard-S.parquet, round=R in run format 1; older manifests have
        # absolute paths)
        listed = [paths.root / "games" / Path(s).parent.name / Path(s).name
                  for s in manifest["shards"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [Finding(manifest_path, f"unreadable round manifest: {exc}", round_)]
    findings: list[Finding] = []
    counted = {"games": 0, "steps": 0}
    for games_file in listed:
        steps_file = paths.root / "steps" / games_file.relative_to(paths.root / "games")
        for table, file in (("games", games_file), ("steps", steps_file)):
            rows, version, problems = _check_shard(file, table, round_)
            findings += problems
            counted[table] += rows or 0
            if version is not None and round_ not in versions.setdefault(version, []):
                versions[version].append(round_)
    if not findings:
        for table, key in (("games", "games"), ("steps", "decisions")):
            if key in manifest and counted[table] != manifest[key]:
                findings.append(Finding(manifest_path, f"counts {manifest[key]} {key} but its "
                                        f"shards hold {counted[table]}", round_))
    folder = shard_path(paths.train_data, "games", ShardId(round_, 0)).parent
    for extra in sorted(set(_files(folder, "shard-*.parquet")) - set(listed)):
        findings.append(Finding(extra, "shard of a committed round that its manifest does not "
                                "list (training would read it)", round_))
    findings += _check_ratings(paths.ratings(round_), round_)
    findings += _check_json(paths.final_rewards_state(round_), round_, "final-reward state")
    return findings


def _check_checkpoint(paths: RunPaths, update: int, breaks_round: int) -> list[Finding]:
    from ub.learner.checkpoint import read_adapter, read_checkpoint

    folder = paths.checkpoint(update)
    try:
        read_checkpoint(folder)
        read_adapter(folder)
    except UbError as exc:
        return [Finding(folder, str(exc).replace(f"checkpoint {folder}", "checkpoint")
                        .replace(str(folder), "checkpoint"), breaks_round)]
    return []


def examine(root: Path, *, live: bool = False) -> Examination:
    """Every integrity problem of the run at ``root`` (read-only). ``live``: a process is
    driving the run, so its temporary files are work in progress, not leftovers."""
    root = Path(root).absolute()  # (findings, moves and commands alike: any working folder)
    if not is_run(root):
        raise UbError(f"{root} is not a ub run (no config.yaml or rounds/)")
    run_format = check_run_format(root)
    paths = RunPaths(root)
    findings: list[Finding] = []
    notes: list[str] = []
    try:
        from ub.run.config.load import read_text, validate_config
        from ub.settings import load_yaml

        data = load_yaml(read_text(paths.config, "run config"))
        missing = [(setting, path, problem) for setting, path in own_components(data)
                   if (problem := import_problem(path)) is not None]
        if missing:  # this shell's PYTHONPATH, not the run, lacks something
            notes += [f"config.yaml's {setting} is {path!r}, which this shell cannot import "
                      f"({problem}): put the folder that holds {path.partition(':')[0]} on "
                      f"PYTHONPATH (PYTHONPATH=DIR ub doctor ...) to check the config as "
                      f"well; the run's data was checked without it"
                      for setting, path, problem in missing]
        else:
            validate_config(data, str(paths.config))
    except (yaml.YAMLError, UbError) as exc:
        findings.append(Finding(paths.config, f"bad run config: {exc}"))
    rounds = paths.committed_rounds()
    for expected, round_ in enumerate(rounds):
        if round_ != expected:
            findings.append(Finding(paths.manifest(round_), f"{round_label(expected)} "
                                    f"(round-{expected:06d}.json) is missing before it",
                                    expected))
            break
    versions: dict[int, list[int]] = {}
    for round_ in rounds:
        findings += _check_round(paths, round_, versions)
    findings += _check_eval_shards(paths, len(rounds))
    findings += _check_metrics(paths, len(rounds))
    # Round r plays checkpoint r and makes r + 1: a broken checkpoint u breaks round u - 1.
    # (Before round 0 commits, checkpoint 0 may not be made yet: the resume makes it.)
    for update in range(len(rounds) + 1 if rounds or paths.checkpoint(0).exists() else 0):
        findings += _check_checkpoint(paths, update, max(update - 1, 0))
    if not live:
        findings += [Finding(orphan, "temporary file left by an interrupted write")
                     for orphan in find_orphans(root)]
    if paths.lock.is_symlink():  # (see RunLock.acquire: nothing takes a lock through a link)
        findings.append(Finding(paths.lock, "a symbolic link: ub takes a run's lock only in a "
                                "file of its own (remove the link)"))
    return Examination(root, rounds, findings, run_format, versions, notes)


def repair(exam: Examination) -> list[tuple[Path, Path]]:
    """Quarantine what cannot be trusted, rewrite derived files; returns the moves made.

    Call only while holding the run's lock.
    """
    root = exam.root
    paths = RunPaths(root)
    quarantine = root / "quarantine" / time.strftime("%Y%m%dT%H%M%S")
    moved: list[tuple[Path, Path]] = []

    def move(path: Path) -> None:
        if not path.exists() and not path.is_symlink():
            return
        target = quarantine / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
        moved.append((path, target))

    for finding in exam.findings:
        if finding.alone or (finding.breaks_round is None and ORPHAN.match(finding.path.name)):
            move(finding.path)
    first = exam.first_broken_round
    if first is not None:
        # Manifests first: the moment the newest is gone the run no longer claims the round.
        for round_ in sorted((r for r in exam.rounds if r >= first), reverse=True):
            move(paths.manifest(round_))
        for path, owner in _round_files(paths):
            if owner >= first:
                move(path)
        broken = {f.path for f in exam.findings}
        for update in range(len(exam.rounds) + 3):  # (a round in progress may have made one)
            folder = paths.checkpoint(update)
            if update > first or folder in broken:
                move(folder)
    for finding in exam.findings:
        # (a derived finding always names the round that rewrites it)
        if (finding.derived and finding.breaks_round is not None
                and (first is None or finding.breaks_round < first)):
            _rewrite_metrics(paths, finding.breaks_round)
    return moved


def _round_files(paths: RunPaths) -> list[tuple[Path, int]]:
    """Every per-round file and shard folder of the run with the round that made it, named by
    the layout's own path functions (so a change of folder naming carries over)."""
    shard_rounds = [sid.round for root in (paths.train_data, paths.eval_data)
                    for sid in committed_shards(root)]
    last = max([*shard_rounds, *paths.committed_rounds(), 0]) + 2
    found: list[tuple[Path, int]] = []
    for number in range(last + 1):
        for table in TABLES:
            found.append((shard_path(paths.train_data, table, ShardId(number, 0)).parent, number))
            # Eval shards are numbered by checkpoint update, and round r evaluates the
            # checkpoint r + 1 it made (round 0 also checkpoint 0).
            found.append((shard_path(paths.eval_data, table, ShardId(number, 0)).parent,
                          max(number - 1, 0)))
        found += [(paths.ratings(number), number), (paths.final_rewards_state(number), number),
                  (paths.metrics(number), number)]
    return found


def _rewrite_metrics(paths: RunPaths, round_: int) -> None:
    from ub.run.steps.rounds import Run, read_manifest, resolve_run_config
    from ub.run.steps.tracking import round_metrics, write_metrics

    run = Run(paths, resolve_run_config(paths, None)[0], "doctor")
    manifest = read_manifest(run, round_)
    write_metrics(run, round_, round_metrics(run, round_, manifest, manifest["leaderboard"]))
