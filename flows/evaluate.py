"""Evaluate a run's checkpoint against its fixed eval opponents, as a Prefect flow.

The scheduled evaluation deployment runs this on the latest checkpoint of a named run. The eval
shard of a checkpoint is written once (``eval/*/round=UPDATE``), so evaluating a checkpoint again
returns the stored result.
"""

from __future__ import annotations

import logging

from prefect import flow
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel

from ub.errors import UbError
from ub.evaluation import EvalRow
from ub.flows.flow_runs import crash_dead_holders_flow_run, lock_owner
from ub.flows.prefect_logs import ub_logs_to_prefect
from ub.learner.checkpoint import latest_checkpoint
from ub.run.folder.layout import RunPaths, checkpoint_name
from ub.run.folder.lock import RunLock
from ub.run.folder.logs import run_logs
from ub.run.folder.store import fetch_checkpoint, sync
from ub.run.folder.urls import DEFAULT_RUNS_ROOT
from ub.run.steps.rounds import Run
from ub.tasks import evaluate
from ub.tasks.track import artifact_key

log = logging.getLogger("ub.flow")


class CheckpointEvaluation(BaseModel):
    """The result of ``evaluate-run``: one row per (env, opponent), as in the round manifest."""

    run_name: str
    checkpoint: int
    actor: str
    rows: list[EvalRow]
    reused: bool
    """True when the checkpoint had been evaluated already and its stored games were read."""

    def lines(self) -> list[str]:
        """One readable line per row (what the flow logs)."""
        out = []
        for row in self.rows:
            baseline = ("" if row.baseline_win_rate is None
                        else f"; random in its seats {row.baseline_win_rate:.1%}")
            out.append(f"{self.actor} vs {row.opponent} on {row.env_id}: win {row.win_rate:.1%} "
                       f"[{row.win_low:.1%}, {row.win_high:.1%}] over {row.games} games, "
                       f"invalid moves {row.invalid_move_rate:.1%}{baseline}")
        return out


@flow(name="evaluate-run", flow_run_name="{run_name}: evaluate", validate_parameters=True)
def evaluate_run(run_name: str, root: str = DEFAULT_RUNS_ROOT, checkpoint: int | None = None
                 ) -> CheckpointEvaluation:
    """Evaluate a checkpoint of a run against the run's fixed eval opponents.

    Args:
        run_name: The run's name: its folder under ``root``.
        root: The runs folder, or an fsspec URL of a run store (``s3://bucket/runs``).
        checkpoint: The checkpoint's update number. Empty: the run's latest checkpoint.

    Returns:
        The evaluation: win/draw/loss with 95% Wilson bounds per (env, opponent).
    """
    paths = RunPaths.of(root, run_name)
    with (RunLock(paths.lock, owner=lock_owner()) as lock, run_logs(paths.logs),
          ub_logs_to_prefect()):
        crash_dead_holders_flow_run(lock.recovered_from)
        sync(paths)  # a run in a store: this machine's copy catches up
        # In this process even for a run trained on Ray: its workers live only while it trains.
        run = Run.open(paths, ray_address="local")
        if checkpoint is None:
            latest = latest_checkpoint(paths.root / "checkpoints")
            if latest is None:
                raise UbError(f"run {run_name} has no checkpoint yet")
            checkpoint = int(latest.name.split("-")[-1])
        else:
            fetch_checkpoint(paths, paths.checkpoint(checkpoint))
        if not paths.checkpoint(checkpoint).exists():
            raise UbError(f"run {run_name} has no checkpoint {checkpoint}")
        result = evaluate(run, checkpoint)
        evaluation = CheckpointEvaluation(
            run_name=run_name, checkpoint=checkpoint, actor=checkpoint_name(checkpoint),
            rows=[EvalRow(**row) for row in result["rows"]], reused=result["reused"])
        for line in evaluation.lines():
            log.info("%s", line)
    create_table_artifact(
        key=artifact_key(run, "evaluation"), table=[row.to_dict() for row in evaluation.rows],
        description=f"{run_name}: evaluation of {evaluation.actor}")
    return evaluation
