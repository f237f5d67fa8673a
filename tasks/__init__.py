"""Prefect tasks: thin wrappers over the steps of a round (:mod:`ub.run.steps.rounds` names their
modules), one module per step.

Each declares its retries and returns small things (paths, counts, metrics). Engines and the
learner's base model live in the process's worker
(:func:`ub.run.processes.worker.process_worker`, which the tasks hand to the steps; a Ray actor
has its own) and stay loaded across rounds. The tasks carry no tags on purpose: Prefect checks
tag concurrency limits with a server round trip per task run (~1 s each on a busy 2-core
machine, a fifth of a tiny-cpu round).
"""

from ub.tasks.benchmarks import benchmarks
from ub.tasks.commit import commit
from ub.tasks.evaluate import evaluate
from ub.tasks.learn import learn, start_checkpoint
from ub.tasks.plan import plan
from ub.tasks.rate import rate
from ub.tasks.report import report
from ub.tasks.rollout import rollout
from ub.tasks.track import track

__all__ = ["benchmarks", "commit", "evaluate", "learn", "plan", "rate", "report", "rollout",
           "start_checkpoint", "track"]
