"""Warm start by supervised fine-tuning on decisions selected with SQL (``ub sft``).

The seeds started RL from a "game-tuned LoRA"; here that adapter is made from data: a DuckDB
``WHERE`` clause over the shards picks decisions (by default the winners' legal, well-formatted
moves), and the learner raises their likelihood with the ``sft`` loss (the mean negative
log-likelihood of the completion tokens). It trains on the stored token ids, exactly as the
model saw and wrote them. The output is an ordinary ub checkpoint: vLLM loads it as a LoRA
adapter, ``ub learn --from`` continues from it, and a training config starts from it with
``learner.init_adapter``.

Only model decisions carry token ids, so only they can be selected (scripted players' moves
have text but no tokens of this model).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field, field_validator

from ub.errors import UbError
from ub.settings import Section

if TYPE_CHECKING:
    from ub.learner.entry import LearnerSource

DEFAULT_WHERE = ("g.outcome = 'decisive' AND s.seat = g.winner AND s.format_ok "
                 "AND NOT s.invalid_move")


class SftConfig(Section):
    """What to imitate and how long (the ``sft:`` section of ``ub sft --config``).

    ``where`` selects model decisions only: scripted players' moves have no tokens of this
    model. The decisions are shuffled by ``seed`` each epoch.
    """

    where: str = Field(DEFAULT_WHERE, description="A DuckDB boolean expression over s (the "
                       "steps row of a decision) and g (its game's games row). Default: the "
                       "winners' legal, well-formatted moves in decisive games.")
    epochs: int = Field(1, ge=1, description="Passes over the selected decisions.")
    batch_size: int = Field(64, ge=1, description="Decisions per optimizer step.")
    max_train_len: int | None = Field(None, ge=2, description="Keep the first N tokens of "
                                      "prompt + completion; null: all.")
    seed: int = Field(0, description="Shuffles the decisions each epoch.")

    key = "sft"

    @field_validator("where")
    @classmethod
    def _a_condition(cls, where: str) -> str:
        if not where.strip():
            raise ValueError("must be a non-empty SQL condition")
        return where


def selection_sql(config: SftConfig) -> str:
    """The query that picks the decisions (inspect it with ``ub sql``)."""
    return (
        "SELECT s.game_id, s.turn, s.prompt_token_ids, s.completion_token_ids, "
        "s.completion_logprobs\n"
        "FROM steps s JOIN games g USING (game_id)\n"
        f"WHERE s.actor_kind = 'model' AND ({config.where})\n"
        "ORDER BY s.game_id, s.turn"
    )


def select_decisions(root: Path, config: SftConfig):
    """The selected decisions as an Arrow table (token columns included)."""
    from ub.data.sql import query

    rows = query(Path(root), selection_sql(config))
    if rows.num_rows == 0:
        raise UbError(f"the SFT selection under {root} is empty: no model decision matches "
                      f"WHERE {config.where!r} (check it with `ub sql {root} \"SELECT ...\"`)")
    return rows


def train_sft(root: str | Path, config: SftConfig, learner_config: Any,
              out_checkpoint: str | Path, *, overwrite: bool = False,
              worker: LearnerSource | None = None) -> dict[str, Any]:
    """Fine-tune a fresh adapter (or ``learner_config.init_adapter``) on the selected
    decisions and write it as checkpoint ``out_checkpoint``. Returns the metrics. The learner
    comes from ``worker`` (``None``: one loaded for this call)."""
    from ub.batch import Batch, collate
    from ub.learner import Learner

    out = Path(out_checkpoint)
    if out.exists() and not overwrite:
        raise UbError(f"{out} already exists: pick another --out or pass --overwrite")
    if overwrite:
        from ub.learner.checkpoint_writer import check_replaceable

        check_replaceable(out)
    learner_config = learner_config.replace(algorithm="sft", algorithm_params={})
    rows = select_decisions(Path(root), config)
    tensors = collate(rows, 0, config.max_train_len)
    everything = Batch(input_ids=tensors.input_ids, completion_mask=tensors.completion_mask,
                       behaviour_logprobs=tensors.behaviour_logprobs,
                       advantages=torch.ones(rows.num_rows), lengths=tensors.lengths)
    everything.validate()
    learner = Learner(learner_config) if worker is None else worker.learner(learner_config)
    learner.start(None)
    rng = random.Random(config.seed)
    order = list(range(rows.num_rows))
    history = []
    for epoch in range(config.epochs):
        rng.shuffle(order)
        for start in range(0, len(order), config.batch_size):
            metrics = learner.update(everything.select(order[start:start + config.batch_size]))
            history.append({"epoch": epoch, "loss": metrics["loss"],
                            "nll": metrics.get("nll", 0.0)})
    summary = {**history[-1], "decisions": rows.num_rows, "steps": len(history),
               "where": config.where, "data": str(Path(root).absolute()),
               "truncated": tensors.truncated, "history": history}
    learner.save(out, summary, overwrite=overwrite)
    return summary
