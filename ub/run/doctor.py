"""``ub doctor RUN [--repair]``: check a run directory's integrity, quarantine what is broken.

A run is trustworthy when every committed round (a manifest in ``rounds/``) is whole: its shards
exist, read, carry this ub's schema and hold the games and decisions the manifest counts; the
checkpoint it played and the one it produced load; its rating snapshot, reward state and metrics
read. :func:`examine` lists every problem as a :class:`Finding`; a finding that breaks round r
breaks every later round too (each round learns from the ones before), so the repair
(:func:`repair`) moves round r onwards, and whatever else cannot be trusted, into
``RUN/quarantine/STAMP/`` (nothing is deleted) and leaves the run at round r. Resuming then
replays the quarantined rounds, and since a run is a deterministic function of its seed, it
produces them again as they were. Derived files (metrics) are rewritten in place instead.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ub.data.shards import check_shard_schema
from ub.errors import UbError
from ub.run.layout import ORPHAN, RunPaths, check_run_format, find_orphans
from ub.run.views import is_run


@dataclass(frozen=True)
class Finding:
    """One problem: the file, what is wrong with it, and the first round it breaks (``None``:
    no round, e.g. a leftover temporary file)."""

    path: Path
    problem: str
    breaks_round: int | None = None
    derived: bool = False
    """Rewritten from the run's data by a repair rather than quarantined."""

    def line(self, root: Path) -> str:
        where = self.path.relative_to(root) if self.path.is_relative_to(root) else self.path
        scope = (" (rewritten by --repair)" if self.derived else
                 f" (round {self.breaks_round} onwards)" if self.breaks_round is not None else "")
        return f"{where}: {self.problem}{scope}"


@dataclass
class Examination:
    root: Path
    rounds: list[int]
    findings: list[Finding]

    @property
    def first_broken_round(self) -> int | None:
        return min((f.breaks_round for f in self.findings
                    if f.breaks_round is not None and not f.derived), default=None)


def _files(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.glob(pattern)) if folder.is_dir() else []


def _round_of(path: Path) -> int | None:
    m = re.search(r"(?:round=|round-|final-rewards-)(\d{6,})", str(path))
    return int(m.group(1)) if m else None


def _check_json(path: Path, round_: int, what: str) -> Iterator[Finding]:
    if not path.exists():
        yield Finding(path, f"missing ({what})", round_)
        return
    try:
        json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        yield Finding(path, f"unreadable {what}: {exc}", round_)


def _check_shard(path: Path, table: str, round_: int) -> tuple[int | None, list[Finding]]:
    """Rows of a shard file, or the findings that make it untrustworthy."""
    if not path.exists():
        return None, [Finding(path, f"missing {table} shard of a committed round", round_)]
    try:
        check_shard_schema(path, table)
        rows = pq.read_table(path).num_rows  # every page decoded: damage anywhere shows
    except UbError as exc:
        problem = str(exc).replace(f"{path} ", "").replace(str(path), "it")
        return None, [Finding(path, problem.split("; run `ub doctor`")[0], round_)]
    except (OSError, pa.ArrowException) as exc:
        return None, [Finding(path, f"unreadable Parquet ({exc})", round_)]
    return rows, []


def _check_round(paths: RunPaths, round_: int) -> list[Finding]:
    manifest_path = paths.manifest(round_)
    try:
        manifest = json.loads(manifest_path.read_text())
        # (games/round=R/shard-S.parquet; older manifests have absolute paths)
        listed = [paths.root / "games" / Path(s).parent.name / Path(s).name
                  for s in manifest["shards"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [Finding(manifest_path, f"unreadable round manifest: {exc}", round_)]
    findings: list[Finding] = []
    counted = {"games": 0, "steps": 0}
    for games_file in listed:
        steps_file = paths.root / "steps" / games_file.relative_to(paths.root / "games")
        for table, file in (("games", games_file), ("steps", steps_file)):
            rows, problems = _check_shard(file, table, round_)
            findings += problems
            counted[table] += rows or 0
    if not findings:
        for table, key in (("games", "games"), ("steps", "decisions")):
            if key in manifest and counted[table] != manifest[key]:
                findings.append(Finding(manifest_path, f"counts {manifest[key]} {key} but its "
                                        f"shards hold {counted[table]}", round_))
    folder = paths.root / "games" / f"round={round_:06d}"
    for extra in sorted(set(_files(folder, "shard-*.parquet")) - set(listed)):
        findings.append(Finding(extra, "shard of a committed round that its manifest does not "
                                "list (training would read it)", round_))
    findings += _check_json(paths.ratings(round_), round_, "rating snapshot")
    findings += _check_json(paths.final_rewards_state(round_), round_, "final-reward state")
    metrics = paths.root / "metrics" / f"round-{round_:06d}.parquet"
    if metrics.exists():
        try:
            pq.read_table(metrics)
        except (OSError, pa.ArrowException) as exc:
            findings.append(Finding(metrics, f"unreadable metrics ({exc})", round_, derived=True))
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
    root = Path(root)
    if not is_run(root):
        raise UbError(f"{root} is not a ub run (no config.yaml or rounds/)")
    check_run_format(root)
    paths = RunPaths(root.absolute())
    findings: list[Finding] = []
    try:
        from ub.run.config import load_yaml, validate_config

        validate_config(load_yaml(paths.config.read_text()), str(paths.config))
    except (OSError, ValueError, UbError) as exc:
        findings.append(Finding(paths.config, f"bad run config: {exc}"))
    rounds = paths.committed_rounds()
    for expected, round_ in enumerate(rounds):
        if round_ != expected:
            findings.append(Finding(paths.manifest(round_), f"round {expected} is missing "
                                    "before it", expected))
            break
    for round_ in rounds:
        findings += _check_round(paths, round_)
    # Round r plays checkpoint r and makes r + 1: a broken checkpoint u breaks round u - 1.
    for update in range(len(rounds) + 1):
        findings += _check_checkpoint(paths, update, max(update - 1, 0))
    if not live:
        findings += [Finding(orphan, "temporary file left by an interrupted write")
                     for orphan in find_orphans(root)]
    return Examination(root, rounds, findings)


def repair(exam: Examination) -> list[tuple[Path, Path]]:
    """Quarantine what cannot be trusted, rewrite derived files; returns the moves made.

    Call only while holding the run's lock.
    """
    root = exam.root
    paths = RunPaths(root.absolute())
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
        if finding.breaks_round is None and ORPHAN.match(finding.path.name):
            move(finding.path)
    first = exam.first_broken_round
    if first is not None:
        # Manifests first: the moment the newest is gone the run no longer claims the round.
        for round_ in sorted((r for r in exam.rounds if r >= first), reverse=True):
            move(paths.manifest(round_))
        for pattern in ("steps/round=*", "games/round=*", "eval/steps/round=*",
                        "eval/games/round=*", "ratings/round-*", "state/final-rewards-*",
                        "metrics/round-*"):
            for path in sorted(root.glob(pattern)):
                number = _round_of(path.relative_to(root))
                if number is None:
                    continue
                # Eval shards are numbered by checkpoint update, and round r evaluates the
                # checkpoint r + 1 it made (round 0 also checkpoint 0).
                owner = max(number - 1, 0) if pattern.startswith("eval/") else number
                if owner >= first:
                    move(path)
        for folder in _files(root / "checkpoints", "ckpt-*"):
            update = int(folder.name.rsplit("-", 1)[1])
            if update > first or any(f.path == folder for f in exam.findings):
                move(folder)
    for finding in exam.findings:
        if finding.derived and (first is None or finding.breaks_round < first):
            _rewrite_metrics(paths, finding.breaks_round)
    return moved


def _rewrite_metrics(paths: RunPaths, round_: int) -> None:
    from ub.run.rounds import Run, read_manifest, resolve_run_config
    from ub.run.tracking import round_metrics, write_metrics

    run = Run(paths, resolve_run_config(paths, None)[0], "doctor")
    manifest = read_manifest(run, round_)
    write_metrics(run, round_, round_metrics(run, round_, manifest, manifest["leaderboard"]))
