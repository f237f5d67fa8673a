"""Scoring a run's checkpoints on reasoning benchmarks (:mod:`ub.benchmarks`) as run data.

Each (checkpoint, task) is two files under ``benchmarks/ckpt-NNNNNN/``: the harness's
per-example samples (``TASK.samples.jsonl``) and then the scores (``TASK.parquet``, one row per
task and metric: the ``benchmarks`` view), each written atomically. The scores file is the
commit: a (checkpoint, task) with its scores file is scored, so a resumed run never scores it
twice, and ``ub eval --tasks`` asked again replaces both files (never a second copy of the
rows). Checkpoint 0 is the run's start: the base model with the run's initial adapter (a
fresh LoRA, which changes nothing, or ``learner.init_adapter``'s warm start).

Everything that can be refused (a task name, a dataset that cannot be fetched, a chat format
without a chat template) is refused before the engine starts and before any file is written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from ub.benchmarks import (
    BenchmarksSection,
    benchmarks_due,
    chat_format,
    json_line,
    load_task,
    score_task,
)
from ub.data.atomic import write_atomic
from ub.data.shards import write_parquet_atomic
from ub.run.folder.store import fetch_checkpoint, publish
from ub.run.folder.views import BENCHMARKS_SCHEMA
from ub.run.steps.play import rollout_sampling, run_engine
from ub.run.steps.rounds import Run

if TYPE_CHECKING:
    from ub.run.processes.worker import Worker

log_eval = logging.getLogger("ub.eval")


def round_benchmarks_due(run: Run, update: int) -> bool:
    """Whether the run's ``eval.benchmarks`` score checkpoint ``update`` during training."""
    return benchmarks_due(run.config.eval.benchmarks, update, run.config.rounds)


def scored_rows(run: Run, update: int, task: str) -> list[dict[str, Any]] | None:
    """The committed rows of (checkpoint ``update``, ``task``), or ``None`` if not scored."""
    path = run.paths.benchmark_scores(update, task)
    if not path.exists():
        return None
    return pq.read_table(path).select(BENCHMARKS_SCHEMA.names).cast(
        BENCHMARKS_SCHEMA).to_pylist()


def _done(rows: list[dict[str, Any]] | None, limit: int | None) -> bool:
    """Rows that answer a request with ``limit``: scored on the same number of examples."""
    return bool(rows) and all(r["limit"] == limit for r in rows or [])


@dataclass(frozen=True)
class Prepared:
    """What scoring needs that is checked before the engine: the prompt format (``chat``)
    and each task loaded, its dataset read (:func:`ub.benchmarks.load_task`)."""

    chat: bool
    loaded: dict[str, dict[str, Any]]


def prepare_benchmarks(run: Run, section: BenchmarksSection,
                       tasks: Sequence[str] | None = None) -> Prepared:
    """Every refusal of scoring ``tasks`` (default: the section's) on ``run``: an unknown or
    non-generative task, a dataset that cannot be fetched, a chat format without a chat
    template. Nothing is written and no engine starts."""
    chat = chat_format(section.prompt_format, [e.template for e in run.config.envs],
                       _tokenizer(run))
    names = section.tasks if tasks is None else tasks
    return Prepared(chat, {task: load_task(task, section.include_path)
                           for task in dict.fromkeys(names)})


def score_checkpoints(run: Run, updates: Sequence[int], section: BenchmarksSection, *,
                      again: bool, worker: Worker,
                      prepared: Prepared | None = None) -> dict[str, Any]:
    """Score each checkpoint of ``updates`` on each task of ``section`` on ``worker``'s engine.

    ``again``: replace what is stored (``ub eval --tasks``); otherwise a (checkpoint, task)
    already scored with the same ``limit`` is kept (training, and its resume). ``prepared``:
    :func:`prepare_benchmarks`'s, if the caller made it. Returns ``{"rows": every row of
    these checkpoints and tasks, "scored": [(update, task)], "reused": [(update, task)],
    "seconds": scoring time, "generated_tokens": n}``.
    """
    paths = run.paths
    stored = {(u, t): scored_rows(run, u, t) for u in updates for t in section.tasks}
    pending = [key for key, rows in stored.items() if again or not _done(rows, section.limit)]
    result: dict[str, Any] = {"rows": [], "scored": [], "reused": [], "seconds": 0.0,
                              "generated_tokens": 0}
    if pending:
        if prepared is None:  # every refusal before the engine starts and a file is written
            prepared = prepare_benchmarks(run, section, [t for _, t in pending])
        for update in dict.fromkeys(u for u, _ in pending):
            fetch_checkpoint(paths, paths.checkpoint(update))
        engine = run_engine(worker, run, rollout_sampling(run.config, evaluation=True))
        first = set(prepared.loaded)
        for update, task in pending:
            # The harness's task objects hold their requests: a fresh load per checkpoint
            # (the dataset comes from the cache the first load filled).
            tasks = (prepared.loaded[task] if task in first
                     else load_task(task, section.include_path))
            first.discard(task)
            stored[(update, task)] = _score_one(run, engine, update, task, tasks, section,
                                                prepared.chat, result)
    for (update, task), rows in stored.items():
        if (update, task) not in result["scored"]:
            result["reused"].append((update, task))
        result["rows"].extend(rows or [])
    return result


def _score_one(run: Run, engine: Any, update: int, task: str, tasks: dict[str, Any],
               section: BenchmarksSection, chat: bool,
               result: dict[str, Any]) -> list[dict[str, Any]]:

    paths = run.paths
    adapter = str(paths.checkpoint(update))
    scored = score_task(engine, adapter, task, loaded=tasks, limit=section.limit, chat=chat)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows = [{**row, "checkpoint": update, "limit": section.limit,
             "prompt_format": "chat" if chat else "plain", "seconds": scored.seconds,
             "scored_at": stamp} for row in scored.rows]
    samples = paths.benchmark_samples(update, task)
    text = "".join(json_line(sample) + "\n" for sample in scored.samples)
    write_atomic(samples, lambda handle: handle.write(text.encode()))
    scores = write_parquet_atomic(pa.Table.from_pylist(rows, schema=BENCHMARKS_SCHEMA),
                                  paths.benchmark_scores(update, task),
                                  {"run": run.name, "checkpoint": update, "task": task})
    publish(paths, samples, scores)  # (the scores last: the commit, in the store too)
    if scored.truncated_prompts:
        log_eval.warning("%s on %s: %d prompt(s) cut from the left to fit "
                         "engine.max_model_len %d", task, paths.checkpoint(update).name,
                         scored.truncated_prompts, run.config.engine.max_model_len)
    for row in rows:
        log_eval.info("%s on %s: %s %s = %.4f%s (n %d) in %.1f s", row["task"],
                      paths.checkpoint(update).name, row["metric"], row["filter"] or "",
                      row["value"], "" if row["stderr"] is None else f" ± {row['stderr']:.4f}",
                      row["n"], scored.seconds)
    result["scored"].append((update, task))
    result["seconds"] += scored.seconds
    result["generated_tokens"] += scored.generated_tokens
    return rows


def _tokenizer(run: Run) -> Any:
    """The base model's tokenizer, read before the engine starts (its chat template decides
    the prompt format)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(run.model_folder())


def score_round_benchmarks(run: Run, update: int, *, worker: Worker) -> dict[str, Any]:
    """The round's step: checkpoint ``update`` on the run's ``eval.benchmarks`` (what is
    stored is kept: a resumed run never scores a checkpoint twice)."""
    return score_checkpoints(run, [update], run.config.eval.benchmarks, again=False,
                             worker=worker)
