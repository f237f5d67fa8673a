"""The runs of a sweep (:mod:`ub.flows.sweep`), planned and checked without Prefect: ``ub sweep``
refuses a bad arm in a second, before Prefect starts (and imports)."""

from __future__ import annotations

from dataclasses import dataclass

from ub.run.config.load import load_config
from ub.run.folder.layout import check_run_name


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its name, its arm's settings and its seed."""

    name: str
    arm: str
    seed: int
    overrides: tuple[str, ...]


def sweep_runs(config: str, arms: dict[str, list[str]], seeds: list[int]) -> list[SweepRun]:
    """Every run of the sweep, seed by seed, each config checked (a bad setting in the last arm
    is refused before the first run starts)."""
    runs = []
    for seed in seeds:
        for arm, settings in arms.items():
            overrides = (*settings, f"seed={seed}")
            name = check_run_name(f"{arm}-s{seed}")
            load_config(config, list(overrides))  # (a one-line UbError naming the setting)
            runs.append(SweepRun(name, arm, seed, overrides))
    return runs
