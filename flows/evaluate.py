"""Evaluate a run's checkpoint against its fixed eval opponents, as a Prefect flow.

The scheduled evaluation deployment runs this on the latest checkpoint of a named run. The eval
shard of a checkpoint is written once (``eval/*/round=UPDATE``), so evaluating a checkpoint again
returns the stored result.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks import evaluate
from ub.errors import UbError
from ub.learner.checkpoint import latest_checkpoint
from ub.run.layout import RunPaths
from ub.run.lock import RunLock
from ub.run.rounds import Run, resolve_base_model, resolve_run_config
from ub.run.store import fetch_checkpoint, sync


@flow(name="evaluate-run")
def evaluate_run(run_name: str, root: str = "runs", checkpoint: int | None = None
                 ) -> list[dict[str, Any]]:
    """Evaluate checkpoint ``checkpoint`` (default: the latest) of run ``run_name``."""
    paths = RunPaths.of(root, run_name)
    with RunLock(paths.lock):
        sync(paths)  # a run in a store: this machine's copy catches up
        # In this process even for a run trained on Ray: its workers live only while it trains.
        config = resolve_run_config(paths, None, ray_address="local")[0]
        run = Run(paths, config, resolve_base_model(config))
        if checkpoint is None:
            latest = latest_checkpoint(paths.root / "checkpoints")
            if latest is None:
                raise UbError(f"run {run_name} has no checkpoint yet")
            checkpoint = int(latest.name.split("-")[-1])
        else:
            fetch_checkpoint(paths, paths.checkpoint(checkpoint))
        if not paths.checkpoint(checkpoint).exists():
            raise UbError(f"run {run_name} has no checkpoint {checkpoint}")
        rows = evaluate(run, checkpoint)["rows"]
    for row in rows:
        print(f"ckpt {checkpoint} vs {row['opponent']} on {row['env_id']}: win "
              f"{row['win_rate']:.1%} [{row['win_low']:.1%}, {row['win_high']:.1%}] over "
              f"{row['games']} games")
    return rows
