"""Arms x seeds of one config, as a Prefect flow (``ub sweep``): a sweep's runs, one after
another, each a ``selfplay`` subflow in the folder ``root``.

Run ``ARM-sSEED`` is the config with the arm's settings and ``seed=SEED``. The runs go seed
by seed (every arm of seed 0, then of seed 1, ...), so a sweep stopped part way has paired
runs to compare (``ub compare ROOT``). Starting the sweep again continues it: each run resumes
after its last committed round, and a finished run is left as it is; a run whose arm's settings
changed since is refused, finished or not.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from ub.flows.selfplay import selfplay
from ub.flows.sweep_plan import check_recorded_settings, sweep_runs
from ub.run.folder.layout import RunPaths
from ub.run.folder.urls import DEFAULT_RUNS_ROOT


def _flow_run_name() -> str:
    """A sweep's flow run in Prefect's UI: its folder and its arms (``sweeps/free: mask, free``)."""
    parameters = flow_run.parameters
    root = str(parameters.get("root", DEFAULT_RUNS_ROOT)).rstrip("/")
    return f"{root}: {', '.join(parameters.get('arms', {}))}"


@flow(name="sweep", flow_run_name=_flow_run_name, validate_parameters=True)
def sweep(config: str, arms: dict[str, list[str]], seeds: list[int],
          root: str = DEFAULT_RUNS_ROOT, rounds: int | None = None,
          quiet: bool = False) -> list[dict[str, Any]]:
    """Train every arm of ``config`` on every seed.

    Args:
        config: A preset name (``tiny-cpu``) or a YAML path, the runs' common config.
        arms: Each arm's name and its ``key.sub=value`` settings over ``config`` (an arm
            without settings is the config itself).
        seeds: The seeds each arm runs with (``seed=S``; an arm sets none). At most
            :data:`~ub.flows.sweep_plan.MAX_SWEEP_RUNS` runs (arms x seeds) in all.
        root: The folder of the sweep's runs (or an fsspec URL).
        rounds: Each run's rounds. Empty: the config's.
        quiet: No progress lines on stdout.

    Returns:
        Each run's summary (``selfplay``'s), in the order they ran.
    """
    runs = sweep_runs(config, arms, seeds)
    check_recorded_settings(runs, root)  # (every run, before the first one trains)
    done = []
    for run in runs:
        if _finished(RunPaths.of(root, run.name), rounds or run.config.rounds):
            continue
        done.append(selfplay(run_name=run.name, config=config, root=root, rounds=rounds,
                             overrides=list(run.overrides), quiet=quiet))
    return done


def _finished(paths: RunPaths, rounds: int) -> bool:
    """Whether a run of the sweep committed its ``rounds`` already (it is left alone; its
    settings are its arm's: :func:`~ub.flows.sweep_plan.check_recorded_settings`)."""
    return paths.config.exists() and len(paths.committed_rounds()) >= rounds
