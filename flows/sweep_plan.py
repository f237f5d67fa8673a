"""The runs of a sweep (:mod:`ub.flows.sweep`), planned and checked without Prefect: ``ub sweep``
refuses a bad arm, too many runs or a run that its arm no longer describes in a second, before
Prefect starts (and imports)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ub.errors import UbError
from ub.run.folder.layout import RunPaths, check_run_name

if TYPE_CHECKING:
    from ub.run.config.load import TrainConfig

MAX_SWEEP_RUNS = 1000
"""The most runs (arms x seeds) one sweep plans: far more than a sweep trains in weeks (a
tiny-cpu run takes minutes), and few enough to plan in seconds."""


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its name, its arm's settings, its seed and the config it trains."""

    name: str
    arm: str
    seed: int
    overrides: tuple[str, ...]
    config: TrainConfig


def too_many_runs(count: str) -> str:
    """Why a sweep of ``count`` runs or seeds is refused, and what to do."""
    return (f"{count}: a sweep plans at most {MAX_SWEEP_RUNS} runs (arms x seeds): give fewer, "
            "or start several sweeps into one --root")


def sweep_runs(config: str, arms: dict[str, list[str]], seeds: list[int]) -> list[SweepRun]:
    """Every run of the sweep, seed by seed (every arm of the first seed, then of the next: a
    sweep stopped part way has every arm on its first seeds), each arm's config checked (a bad
    setting in the last arm is refused before the first run starts)."""
    from ub.run.config.load import load_config  # (the config's schema imports torch)

    if not arms or not seeds:
        raise UbError("a sweep needs an arm and a seed at least: give --arm NAME and --seeds")
    if len(arms) * len(seeds) > MAX_SWEEP_RUNS:
        raise UbError(too_many_runs(f"{len(arms)} arms x {len(seeds)} seeds are "
                                    f"{len(arms) * len(seeds)} runs"))
    configs = {}
    for arm, settings in arms.items():
        seeded = [s for s in settings if s.partition("=")[0].strip() == "seed"]
        if seeded:
            raise UbError(f"--arm {arm}: {seeded[0]!r}: the sweep's --seeds gives each run its "
                          "seed: drop it from the arm")
        # The seed is the only difference between an arm's runs, and its check is a range (vLLM's
        # engine seeds): the config at the smallest and the largest seed checks every seed.
        for seed in sorted({min(seeds), max(seeds)}):
            configs[arm] = load_config(config, [*settings, f"seed={seed}"])  # (one UbError line)
    return [SweepRun(check_run_name(f"{arm}-s{seed}"), arm, seed, (*settings, f"seed={seed}"),
                     configs[arm].model_copy(update={"seed": seed}))
            for seed in seeds for arm, settings in arms.items()]


def check_recorded_settings(runs: list[SweepRun], root: str) -> None:
    """Refuse the sweep if a run of it exists under ``root`` with other training settings than
    its arm gives it now (an arm changed since, or another sweep's run of that name), finished or
    not: skipped it would keep them silently, resumed it would mix two setups. What may change
    on a resume (rounds, evaluation, how the work is executed) may change here too."""
    from ub.run.folder.sweep import flat_settings
    from ub.run.steps.rounds import resolve_run_config

    for run in runs:
        paths = RunPaths.of(root, run.name)
        if not paths.config.exists():
            continue
        recorded = flat_settings(resolve_run_config(paths, None)[0].training_settings())
        planned = flat_settings(run.config.training_settings())
        differ = "; ".join(f"{key} ({recorded.get(key, '-')} in the run, "
                           f"{planned.get(key, '-')} now)"
                           for key in sorted(recorded.keys() | planned.keys())
                           if recorded.get(key) != planned.get(key))
        if differ:
            raise UbError(f"run {run.name} under {root} was trained with other settings than "
                          f"arm {run.arm} gives it: {differ}. Give the arm a new name to train "
                          f"it afresh, or remove {paths.location} to train this run again")

