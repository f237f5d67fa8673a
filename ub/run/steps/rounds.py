"""The steps of one self-play round, as plain functions over a run directory; this module holds
what they all share: the :class:`Run` they take, the run's config on start and resume, and the
round manifest that commits a round.

The Prefect tasks in ``tasks/`` are thin wrappers of the steps; ``ub`` itself imports no Prefect.
Every step is idempotent: its output path is a function of (run, round, shard), an existing
committed output is returned instead of redone, and every seed derives from (run seed, round,
game, turn). So a run killed at any moment and started again redoes only unfinished work and
produces what an uninterrupted run would have.

Round ``r`` (synchronous mode), and the module of each step::

    plan      the pool picks each game's env and seats           (pure, from ratings r-1)
              -> ub.run.steps.plan
    rollout   games played by checkpoint r  -> steps/games shards (one per rollout task)
              -> ub.run.steps.play
    learn     batch of round r's decisions  -> checkpoint r+1     (+ final-reward state r)
              -> ub.run.steps.learn
    evaluate  checkpoint r+1 vs fixed opponents, if due -> eval shard
              -> ub.run.steps.evaluate
    rate      ratings r-1 + round r's games + its eval games -> ratings r
              -> ub.run.steps.rate
    commit    round manifest r (written last: the commit point)
              -> here (:func:`commit_round`)

The run's base model (resolved, checked, recorded) is :mod:`ub.run.config.base_model`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ub.errors import UbError
from ub.faults import fault_point
from ub.run.config.base_model import check_recorded_base, record_base_model, resolve_base_model
from ub.run.config.load import TrainConfig, read_text, validate_config
from ub.run.folder.layout import (
    RunPaths,
    check_run_format,
    mark_run_format,
    no_such_run,
    read_json,
    write_json_atomic,
)
from ub.run.folder.store import publish
from ub.settings import load_yaml

if TYPE_CHECKING:
    from ub.learner.config import LearnerConfig


@dataclass(frozen=True)
class Run:
    """What every step needs: where the run lives, its config and the resolved base model."""

    paths: RunPaths
    config: TrainConfig
    base_model: str

    @classmethod
    def of(cls, paths: RunPaths, config: TrainConfig) -> Run:
        """The run at ``paths`` with ``config``, its base model resolved from it."""
        return cls(paths, config, resolve_base_model(config))

    @classmethod
    def open(cls, paths: RunPaths, *, ray_address: str | None = None) -> Run:
        """An existing run as it stored itself (its own ``config.yaml``; ``ray_address``: where
        this process runs its work, which a run may change)."""
        return cls.of(paths, resolve_run_config(paths, None, ray_address=ray_address)[0])

    @property
    def name(self) -> str:
        return self.paths.name

    @functools.cached_property
    def learner_config(self) -> LearnerConfig:
        """What this process's learner runs with (:meth:`TrainConfig.learner_config` on
        :meth:`model_folder`), validated once a process."""
        return self.config.learner_config(self.model_folder())

    def __getstate__(self) -> dict[str, Any]:
        # A Ray worker gets the run without this process's learner config: its model folder
        # may differ.
        return {k: v for k, v in self.__dict__.items() if k != "learner_config"}

    def model_folder(self) -> str:
        """The base model as the folder this process's engine and learner load: a hub model
        fetched into this machine's Hugging Face cache on first use in the process (on a Ray
        worker too), :func:`ub.model.hub.local_model`. ``base_model`` stays what the data and
        checkpoints record."""
        from ub.model.hub import local_model

        return local_model(self.base_model)


# --------------------------------------------------------------------------------------------
# Starting and resuming (the base model's checks: ub.run.config.base_model)
# --------------------------------------------------------------------------------------------


def _first_difference(old: Any, new: Any, where: str = "") -> str | None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_difference(old.get(key), new.get(key), f"{where}.{key}" if where
                                      else str(key))
            if found:
                return found
        return None
    return None if old == new else f"{where} ({old!r} in the run, {new!r} now)"


def open_run(paths: RunPaths, config: TrainConfig | None, *, rounds: int | None = None,
             add_rounds: int | None = None, ray_address: str | None = None) -> TrainConfig:
    """:func:`resolve_run_config`, and the result stored (:func:`save_run_config`)."""
    chosen, changed = resolve_run_config(paths, config, rounds=rounds, add_rounds=add_rounds,
                                         ray_address=ray_address)
    return save_run_config(paths, chosen, changed)


def save_run_config(paths: RunPaths, config: TrainConfig, changed: bool) -> TrainConfig:
    """A resolved config stored as the run's ``config.yaml`` where it ``changed`` (a new run,
    more rounds), and its base model recorded: a run's first writes."""
    if changed:
        _write_config(paths, config)
    record_base_model(paths, config)
    return config


def resolve_run_config(paths: RunPaths, config: TrainConfig | None, *,
                       rounds: int | None = None, add_rounds: int | None = None,
                       ray_address: str | None = None) -> tuple[TrainConfig, bool]:
    """The run's config and whether it differs from the stored one (nothing is written).

    A new run takes ``config``; an existing run keeps its own.

    Resuming with a config is allowed when the training settings match (``rounds`` and
    ``eval`` may change: more rounds extend a finished run); anything else is refused, since
    the run's data would mix two setups. ``rounds`` sets the total, ``add_rounds`` adds to the
    committed count. ``ray_address`` sets ``cluster.address`` (``"local"``: none).
    """
    check_run_format(paths.root)
    stored = None
    if paths.config.exists():
        try:
            data = load_yaml(read_text(paths.config, "run config"))
        except yaml.YAMLError as exc:
            raise UbError(f"{paths.config} is corrupt ({exc})".replace("\n", " ")) from None
        stored = validate_config(data, str(paths.config))
        if config is not None:
            diff = _first_difference(stored.training_settings(), config.training_settings())
            if diff:
                raise UbError(
                    f"run {paths.name} at {paths.root} was started with another config: {diff}. "
                    f"Resume it as it is with `{paths.resume_command}` (optionally "
                    "--rounds N), or start a new run with another --run NAME")
    elif config is None:
        if paths.store:
            raise UbError(f"no run {paths.name} under {paths.store.rpartition('/')[0]}: start "
                          f"it with `ub train CONFIG --run {paths.name}`")
        raise no_such_run(paths.root.parent, paths.name,
                          f" (start it with `ub train CONFIG --run {paths.name}`)")
    chosen = config if config is not None else stored
    assert chosen is not None
    if stored is not None:
        check_recorded_base(paths, chosen)  # before anything is built, loaded or written
    if add_rounds is not None:
        rounds = len(paths.committed_rounds()) + add_rounds
    if rounds is not None:
        if rounds < 1:
            raise UbError(f"--rounds must be >= 1, got {rounds}")
        chosen = chosen.model_copy(update={"rounds": rounds})
    if ray_address is not None:
        address = None if ray_address == "local" else ray_address
        chosen = chosen.model_copy(
            update={"cluster": chosen.cluster.model_copy(update={"address": address})})
    return chosen, chosen != stored


def _write_config(paths: RunPaths, config: TrainConfig) -> None:
    text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    paths.root.mkdir(parents=True, exist_ok=True)
    mark_run_format(paths.root)
    tmp = paths.config.with_name(".config.yaml.tmp")
    tmp.write_text(text)
    tmp.replace(paths.config)


# --------------------------------------------------------------------------------------------
# The round manifest
# --------------------------------------------------------------------------------------------


def commit_round(run: Run, round_: int, manifest: dict[str, Any]) -> Path:
    """Write round ``round_``'s manifest: from now on the round is done."""
    fault_point("round.before-commit")
    path = write_json_atomic(run.paths.manifest(round_), {"round": round_, **manifest})
    publish(run.paths, path)  # last: in the store too, the manifest commits the round
    return path


def read_manifest(run: Run, round_: int) -> dict[str, Any]:
    return read_json(run.paths.manifest(round_))
