"""What several commands share: argument types, output-folder checks, ``--config`` sections, and
the run a command names."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from ub.errors import UbError


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def add_batch_options(parser: argparse.ArgumentParser, *, rounds: bool = True) -> None:
    """The batch settings ``ub batch``, ``ub learn`` and ``ub sft`` take over their
    ``--config``: ``--batch-size``, ``--rounds`` (unless ``rounds`` is false), ``--seed`` and
    ``--max-train-len``."""
    parser.add_argument("--batch-size", type=positive_int)
    if rounds:
        parser.add_argument("--rounds", help="window of rounds, A:B inclusive (A: or :B open)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-train-len", type=positive_int)


def add_learner_options(parser: argparse.ArgumentParser, *, records: str,
                        init_adapter_help: str) -> None:
    """The learner settings ``ub learn`` and ``ub sft`` take over their ``--config``:
    ``--learning-rate``, ``--base-model`` (by default the one ``records`` names) and
    ``--init-adapter``."""
    parser.add_argument("--learning-rate", type=non_negative_float)
    parser.add_argument("--base-model", help=f"base model directory (default: the one {records} "
                        "records, else the tiny model)")
    parser.add_argument("--init-adapter", help=init_adapter_help)


def add_checkpoint_io(parser: argparse.ArgumentParser) -> None:
    """What ``ub learn`` and ``ub sft`` read and write: ``--shards``, ``--out``,
    ``--overwrite``."""
    parser.add_argument("--shards", required=True, help="data folder with the decisions")
    parser.add_argument("--out", required=True, help="checkpoint folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def game_count(text: str) -> int:
    from ub.run.config import MAX_GAMES

    value = positive_int(text)
    if value > MAX_GAMES:
        raise argparse.ArgumentTypeError(f"at most {MAX_GAMES} games per call, got {value} "
                                         "(play more as several calls)")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):  # nan passes every comparison
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def check_can_create(folder: Path) -> None:
    """Fail before any work if ``folder`` could not be created and written, creating nothing
    (the folder appears only when its first file is written)."""
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        reason = "not a folder" if not existing.is_dir() else "permission denied"
        raise UbError(f"output folder {folder} is not writable ({existing}: {reason})")


def check_writable(folder: Path) -> None:
    """Fail before any work if ``folder`` cannot take our files."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".ub-write-check-"):
            pass
    except OSError as exc:
        raise UbError(f"output folder {folder} is not writable ({exc.strerror or exc})") from None


def yaml_section(path_text: str | None, section: str) -> dict:
    """The ``section:`` mapping of a YAML file (or the whole file if it has no such key)."""
    if not path_text:
        return {}
    import yaml

    from ub.run.config import load_yaml, read_text

    path = Path(path_text)
    try:
        loaded = load_yaml(read_text(path, "config")) or {}
    except yaml.YAMLError as exc:
        raise UbError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(loaded, dict):
        raise UbError(f"{path} must hold a mapping of settings")
    value = loaded.get(section, loaded)
    if not isinstance(value, dict):
        raise UbError(f"{path}: `{section}` must be a mapping of settings")
    return dict(value)


def run_dir(args: argparse.Namespace) -> Path:
    """A run given by name (under --root) or as a path."""
    from ub.run.layout import RunPaths, check_run_name
    from ub.run.urls import is_url

    candidate = Path(args.run)
    if candidate.is_dir():
        return candidate
    if is_url(args.root):  # a run in a store: this machine's working copy of it
        root = RunPaths.of(args.root, args.run).root
        if not root.is_dir():
            raise UbError(f"this machine has no copy of run {args.run!r} of {args.root}: "
                          f"`ub sql {args.root.rstrip('/')}/{args.run}` reads it in place")
        return root
    root = Path(args.root) / check_run_name(args.run)
    if not root.is_dir():
        raise UbError(f"no run {args.run!r} under {args.root} (and no folder {args.run})")
    return root


def catch_up(paths) -> None:
    """A run in a store (``--root s3://...``): bring this machine's copy up to date first."""
    if paths.store:
        from ub.run.lock import RunLock
        from ub.run.store import sync

        check_store(paths)  # (before the lock creates the working copy)
        with RunLock(paths.lock):
            sync(paths)


def check_store(paths) -> None:
    """A run in a store: its URL opens and lists (known scheme, package installed, endpoint
    reachable) before anything is written locally."""
    if paths.store:
        from ub.run.store import RunStore

        try:
            RunStore(paths.store).files("rounds")
        except OSError as exc:  # (some filesystems connect when they are opened)
            raise UbError(f"run store {paths.store} is unreachable ({exc}): check the URL, "
                          "the credentials and the network") from None
