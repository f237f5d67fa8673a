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

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ub.errors import UbError, settings_from_mapping

if TYPE_CHECKING:
    from ub.learner.entry import LearnerSource

DEFAULT_WHERE = ("g.outcome = 'decisive' AND s.seat = g.winner AND s.format_ok "
                 "AND NOT s.invalid_move")


@dataclass(frozen=True)
class SftConfig:
    """What to imitate and how long.

    :param where: a DuckDB boolean expression over ``s`` (the ``steps`` row of a decision) and
        ``g`` (its game's ``games`` row); model decisions only. Default: the winners' legal,
        well-formatted moves in decisive games.
    :param epochs: passes over the selected decisions.
    :param batch_size: decisions per optimizer step.
    :param max_train_len: keep the first ``max_train_len`` tokens of prompt + completion
        (``None``: all).
    :param seed: shuffles the decisions each epoch.
    """

    where: str = DEFAULT_WHERE
    epochs: int = 1
    batch_size: int = 64
    max_train_len: int | None = None
    seed: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SftConfig:
        return settings_from_mapping(cls, data, "sft")

    def validate(self) -> None:
        if not isinstance(self.where, str) or not self.where.strip():
            raise UbError("sft.where must be a non-empty SQL condition")
        for key in ("epochs", "batch_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UbError(f"sft.{key} must be a positive integer, got {value!r}")
        if self.max_train_len is not None and (not isinstance(self.max_train_len, int)
                                               or self.max_train_len < 2):
            raise UbError(f"sft.max_train_len must be an integer >= 2 or null, got "
                          f"{self.max_train_len!r}")


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
    from ub.batch import collate
    from ub.learner import Learner
    from ub.learner.batching import TrainBatch

    out = Path(out_checkpoint)
    if out.exists() and not overwrite:
        raise UbError(f"{out} already exists: pick another --out or pass --overwrite")
    learner_config = dataclasses.replace(learner_config, algorithm="sft", algorithm_params={})
    learner_config.validate()
    rows = select_decisions(Path(root), config)
    tensors = collate(rows, 0, config.max_train_len)
    everything = TrainBatch(input_ids=tensors.input_ids, completion_mask=tensors.completion_mask,
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
