"""A run's directory: every path is a function of (run root, round, shard).

::

    runs/NAME/
      ub-run.json                     the run directory's format version (and the ub that made it)
      config.yaml                     the resolved config (training settings are frozen)
      run.lock                        held (flock) by the process driving the run
      steps/round-NNNNNN/shard-NNNN.parquet, games/...   training games (round=NNNNNN
                                      in run format 1, see :mod:`ub.data.shards`)
      eval/steps/..., eval/games/...  evaluation games (round = the checkpoint's update)
      checkpoints/ckpt-NNNNNN/        LoRA adapter + optimizer/RNG state; ckpt-000000 = start
      state/final-rewards-NNNNNN.json the final-reward transforms' state after round N
      ratings/round-NNNNNN.json       rating snapshot after round N
      benchmarks/ckpt-NNNNNN/TASK.parquet        reasoning benchmark scores of a checkpoint
                                      (one file per task: scored again, it is replaced)
      benchmarks/ckpt-NNNNNN/TASK.samples.jsonl  the harness's per-example samples beside them
      exploitability/ckpt-NNNNNN/ENV.parquet     a checkpoint's exact best responses in a game
                                      (measured again, it is replaced)
      rounds/round-NNNNNN.json        round manifest: written last, the round's commit point
      logs/                           one log file per component

A runs root may also be an fsspec URL (``s3://bucket/runs``): the run then works in a local
copy of this layout and publishes it to the URL as it commits (:mod:`ub.run.folder.store`).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ub.benchmarks import check_task_name
from ub.data.atomic import write_atomic
from ub.errors import UbError
from ub.run.folder.urls import DEFAULT_RUNS_ROOT, is_url, working_copy

RUN_FORMAT = 2
"""The layout version of a run directory; bump it when a change would confuse an older ub.

1: shard folders ``round=NNNNNN`` (hive partitions, which plain DuckDB reads as VARCHAR).
2: shard folders ``round-NNNNNN``. Format 1 runs are still read, resumed and repaired; their
new rounds keep format 1's folders (a run never mixes layouts)."""

RUN_FORMATS = {1: "shard folders round=NNNNNN (hive: plain DuckDB reads round as text)",
               2: "shard folders round-NNNNNN"}

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_name(name: str) -> str:
    """Run names are one path component: no separators, no ``..``, nothing hidden."""
    if not RUN_NAME.fullmatch(name or "") or ".." in name:  # (match allows a final "\n")
        raise UbError(f"invalid run name {name!r}: use letters, digits, '.', '_' and '-' "
                      "(starting with a letter or digit), at most 128 characters")
    return name


def is_run(root: Path) -> bool:
    """A training run directory (as opposed to a bare data folder of ``ub play``)."""
    return (Path(root) / "config.yaml").exists() or (Path(root) / "rounds").is_dir()


def no_such_run(root: str | Path, name: str, then: str = "") -> UbError:
    """"no run NAME under ROOT", then ``then`` (more of what was looked for, what to do), the
    nearest name and the runs ROOT holds."""
    import difflib

    folder = Path(root)
    held = sorted(p.name for p in folder.iterdir() if is_run(p)) if folder.is_dir() else []
    near = difflib.get_close_matches(name, held, n=1)
    holds = (f"{folder} holds {', '.join(held[:12])}"
             + (f" and {len(held) - 12} more" if len(held) > 12 else "") if held else
             f"{folder} holds no run" if folder.is_dir() else f"{folder} does not exist")
    return UbError(f"no run {name!r} under {root}{then}; "
                   + (f"did you mean {near[0]!r}? " if near else "") + holds)


def check_run_format(root: Path) -> int:
    """Refuse a run directory written in a newer format than this ub reads, before anything in
    it is read or written. Returns the run's format; a run without the marker predates it
    (format 1)."""
    marker = Path(root) / "ub-run.json"
    if not marker.exists():
        return 1
    try:
        data = json.loads(marker.read_text())
        found = int(data["format"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UbError(f"{marker} is unreadable ({exc}); it should hold "
                      f'{{"format": {RUN_FORMAT}}}') from None
    if found > RUN_FORMAT:
        import ub

        raise UbError(f"run {Path(root).name} at {root} is in run format {found} (written by "
                      f"ub {data.get('ub_version', '?')}); this ub ({ub.__version__}) reads "
                      f"formats up to {RUN_FORMAT}: upgrade ub to use it")
    return found


def data_format(root: Path) -> int:
    """The run format the run's shards are laid out in: 1 if any data root of it has format
    1's folders (then new rounds are written that way too), else the current one."""
    from ub.data.shards import uses_legacy_layout

    paths = RunPaths(Path(root))
    roots = (paths.train_data, paths.eval_data)
    return 1 if any(uses_legacy_layout(r) for r in roots) else RUN_FORMAT


def mark_run_format(root: Path) -> None:
    """Record the run format of a run directory that has no marker: the current one for a new
    run, 1 for a run from before markers (its shards are in format 1's folders, and its new
    rounds follow them). An existing marker is kept as it is."""
    marker = Path(root) / "ub-run.json"
    if not marker.exists():
        import ub

        write_json_atomic(marker, {"format": data_format(root), "ub_version": ub.__version__})


def round_label(round_: int) -> str:
    """Round ``round_`` as every line ub prints counts it: from 1 (``round 1`` is
    ``rounds/round-000000.json``; the files count from 0, as checkpoints do)."""
    return f"round {round_ + 1}"


def checkpoint_name(update: int) -> str:
    """The folder name of checkpoint ``update``: its actor name (:mod:`ub.actors.names`)."""
    from ub.actors.names import checkpoint_actor

    return checkpoint_actor(update)


@dataclass(frozen=True)
class RunPaths:
    """Where everything of one run lives."""

    root: Path
    store: str | None = None
    """The run's durable copy (an fsspec URL, see :mod:`ub.run.folder.store`) when the runs
    root is a URL; ``root`` is then this machine's working copy of it."""

    @classmethod
    def of(cls, runs_root: str | Path, name: str) -> RunPaths:
        if is_url(runs_root):
            url = f"{str(runs_root).rstrip('/')}/{check_run_name(name)}"
            return cls(working_copy(url), url)
        return cls((Path(runs_root).expanduser() / check_run_name(name)).absolute())

    @property
    def location(self) -> str:
        """Where the run's data is for a user: its store URL, or its directory."""
        return self.store or str(self.root)

    def key(self, path: Path) -> str:
        """``path`` (inside the run) relative to the run root, as a store key."""
        return Path(path).relative_to(self.root).as_posix()

    @property
    def name(self) -> str:
        return self.root.name

    def command(self, verb: str) -> str:
        """``ub VERB NAME`` for this run, as it works from any folder: with ``--root`` unless
        the run is under the working directory's default runs root, where the name alone
        finds it (quoted for a shell)."""
        if self.store:
            root = self.store.rpartition("/")[0]
        elif self.root.parent == Path(DEFAULT_RUNS_ROOT).absolute():
            return f"ub {verb} {shlex.quote(self.name)}"
        else:
            root = str(self.root.parent)
        return f"ub {verb} {shlex.quote(self.name)} --root {shlex.quote(root)}"

    @property
    def resume_command(self) -> str:
        """The command that continues this run (:meth:`command`)."""
        return self.command("train --resume")

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def lock(self) -> Path:
        return self.root / "run.lock"

    @property
    def train_data(self) -> Path:
        """The training games' data root, holding ``steps/`` and ``games/``: the run root
        itself (the evaluation games' is :attr:`eval_data`)."""
        return self.root

    @property
    def eval_data(self) -> Path:
        return self.root / "eval"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def checkpoint(self, update: int) -> Path:
        return self.root / "checkpoints" / checkpoint_name(update)

    def final_rewards_state(self, round_: int) -> Path:
        return self.root / "state" / f"final-rewards-{round_:06d}.json"

    def ratings(self, round_: int) -> Path:
        return self.root / "ratings" / f"round-{round_:06d}.json"

    def manifest(self, round_: int) -> Path:
        return self.root / "rounds" / f"round-{round_:06d}.json"

    def metrics(self, round_: int) -> Path:
        return self.root / "metrics" / f"round-{round_:06d}.parquet"

    @property
    def benchmarks(self) -> Path:
        return self.root / "benchmarks"

    def benchmark_scores(self, update: int, task: str) -> Path:
        """Checkpoint ``update``'s rows for benchmark ``task``: written last, the commit."""
        return self.benchmarks / checkpoint_name(update) / f"{check_task_name(task)}.parquet"

    def benchmark_samples(self, update: int, task: str) -> Path:
        """The harness's per-example samples behind :meth:`benchmark_scores`."""
        return (self.benchmarks / checkpoint_name(update)
                / f"{check_task_name(task)}.samples.jsonl")

    @property
    def exploitability(self) -> Path:
        return self.root / "exploitability"

    def exploitability_rows(self, update: int, env_id: str) -> Path:
        """Checkpoint ``update``'s exploitability rows in ``env_id`` (one per way of playing)."""
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", env_id):
            raise UbError(f"not an env id to name a file by: {env_id!r}")
        return self.exploitability / checkpoint_name(update) / f"{env_id}.parquet"

    def committed_rounds(self) -> list[int]:
        folder = self.root / "rounds"
        if not folder.is_dir():
            return []
        found = (re.fullmatch(r"round-(\d{6,})\.json", p.name) for p in folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def next_round(self) -> int:
        """The first round not yet committed (rounds commit in order)."""
        rounds = self.committed_rounds()
        if rounds != list(range(len(rounds))):
            raise UbError(f"run {self.root}: round manifests {rounds} are not 0..N-1; the run "
                          "directory was edited by hand (run `ub doctor`)")
        return len(rounds)


ORPHAN = re.compile(r"^\..+\.(tmp|old)-\d+-[0-9a-f]{8}$")


def find_orphans(root: Path) -> list[Path]:
    """The hidden temporary files and folders of unfinished writes under ``root``, outside
    ``quarantine/`` (what ``ub doctor --repair`` set aside is kept as it is)."""
    return [path for path in sorted(root.rglob(".*")) if ORPHAN.match(path.name)
            and "quarantine" not in path.relative_to(root).parts]


def remove_orphans(root: Path) -> list[Path]:
    """Delete the hidden temporary files and folders that killed writers left under ``root``.

    Call only while holding the run's lock: then no live writer owns any of them.
    """
    import shutil

    removed = []
    for path in find_orphans(root):
        if path.exists():  # (not inside an orphan folder removed just before)
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def write_json_atomic(path: Path, data: Any) -> Path:
    """Write JSON so the file appears whole or not at all (temp name, fsync, rename)."""
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    return write_atomic(path, lambda handle: handle.write(text.encode()))


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UbError(f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UbError(f"{path} is corrupt ({exc}); run `ub doctor` on the run") from None
