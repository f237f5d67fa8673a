"""One update of the learner, top to bottom: :func:`update`.

For each epoch, for each minibatch (one optimizer step): for each micro-batch, the policy
scores every completion token ``t`` with the logits at ``t - 1``
(``log_softmax(logits / temperature)`` in float32, the distribution the token was sampled
from), the algorithm turns those tokens into the micro-batch's share of the loss (a token sum
over the constant ``B * L``, so micro-batch gradients add up to exactly the minibatch's),
and it is back-propagated; then the gradient norm is clipped and AdamW steps at the
schedule's learning rate. An update of several steps stops early once the policy moved
``target_kl`` from where it started.

What wraps it is handed in: ``optimizers`` (the adapter's AdamW and one per module the
algorithm trains besides it: :class:`ub.learner.optimizers.Optimizers`), ``budget`` (how many
tokens a micro-batch may hold: :class:`ub.learner.memory.MicroBatchBudget`) and ``ranks``
(data-parallel learners' share of the micro-batches and the summed gradients:
:class:`ub.distributed.Ranks`). Of the algorithm it knows only what it declares
(:class:`ub.learner.algorithms.Algorithm`): the columns it adds at the start, whether its loss
reads the decision states, how its statistics reduce. The retry at half the micro-batch after
running out of memory, and the rollback of a failed update, are
:meth:`ub.learner.Learner.update`'s, around this function.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ub.distributed import Ranks
from ub.errors import UbError
from ub.faults import fault_point
from ub.learner.algorithms import Algorithm, Reduction, TokenBatch
from ub.learner.batching import plan_micro_batches
from ub.learner.config import LearnerConfig
from ub.learner.policy import Policy, Scores

if TYPE_CHECKING:
    from ub.batch import Batch
    from ub.learner.optimizers import Optimizers
    from ub.learner.token_masks import TokenMasks

log = logging.getLogger("ub.learner.learner")


class NonFiniteError(UbError):
    """The loss or the gradient of an update is NaN or infinite (nothing was changed)."""


def update(policy: Policy, optimizers: Optimizers, algorithm: Algorithm, batch: Batch,
           config: LearnerConfig, *, rng: random.Random, first_step: int,
           micro_batch_tokens: Callable[[], int | None], ranks: Ranks,
           step: bool = True) -> dict[str, Any]:
    """One update on ``batch``: ``config.epochs`` passes of ``config.minibatches`` optimizer
    steps (the schedule's step numbers start at ``first_step``). Returns the update's metrics
    (see :meth:`ub.learner.Learner.update`). ``rng`` (the learner's saved stream) shuffles
    the minibatches. ``step=False`` is a diagnostic: the first step's gradients are left in
    the parameters' ``.grad``, nothing steps.

    :raises NonFiniteError: a NaN or infinite loss or gradient norm (the caller rolls back).
    """
    params = list(policy.params.values())
    trained_params = optimizers.parameters()  # what data-parallel ranks sum (modules' too)
    steps = config.steps_per_update
    batch = scored_at_start(policy, batch, algorithm, config, ranks, micro_batch_tokens(),
                            old_logprobs=steps > 1 and algorithm.needs_old_logprobs)
    # A shallow copy: prepare() may replace tensors without touching the caller's batch.
    batch = algorithm.prepare(dataclasses.replace(batch), rng)
    per_step: list[dict[str, Any]] = []
    stopped_kl: float | None = None
    n, m = len(batch), config.minibatches
    for _epoch in range(config.epochs):
        order = list(range(n))
        if m > 1:
            rng.shuffle(order)  # the saved stream: a resumed run cuts the same minibatches
        for k in range(m):
            rows = sorted(order[k * n // m:(k + 1) * n // m])
            if not rows:
                continue
            step_batch = batch if m == 1 else batch.select(rows)
            # Dr. GRPO: a constant normalizer over the step's rows, so micro-batch losses add
            # up to the step's loss whatever the grouping.
            normalizer = float(len(step_batch) * config.length_normalizer)
            trained = rows_with_gradient(step_batch, algorithm, config)
            lengths = step_batch.lengths.tolist()
            groups = plan_micro_batches([lengths[r] for r in trained], micro_batch_tokens(),
                                        config.micro_batch_size, policy.pad_to_multiple)
            policy.model.train()
            for p in trained_params:
                p.grad = None
            tally = Tally(torch.zeros((), device=policy.device), algorithm.reduction)
            for group in ranks.share(groups):
                mb_rows = [trained[i] for i in group]
                mb = step_batch.select(mb_rows)
                input_ids = mb.input_ids.to(policy.device)
                scored = mb.completion_mask[:, 1:].to(policy.device) > 0
                masks = policy.token_masks(mb, scored)  # (the legal-move mask's, if any)
                scores = policy.score(input_ids, scored, with_states=algorithm.reads_states,
                                      masks=masks)
                tokens = token_batch(mb, mb_rows, scores, scored, normalizer, len(step_batch))
                loss, stats = algorithm.loss(tokens)
                own: dict[str, torch.Tensor] = {}
                assert scores.entropy is not None  # asked for by default
                if config.entropy_coef:
                    loss = loss - config.entropy_coef * scores.entropy.sum() / normalizer
                if scores.legal_logmass is not None:
                    if config.legal_mass_coef:
                        loss = loss - (config.legal_mass_coef * scores.legal_logmass.sum()
                                       / normalizer)
                    # (over every scored token: 1 where all were allowed)
                    own["legal_mass"] = scores.legal_logmass.detach().exp().sum()
                if config.kl_coef:
                    kl = kl_to_base(policy, input_ids, scored, scores.logprobs, masks)
                    loss = loss + config.kl_coef * kl.sum() / normalizer
                    own["kl_to_base"] = kl.detach().sum()
                    del kl
                loss.backward()  # a NaN loss only spoils the gradients, dropped below
                fault_point("learn.mid-update")
                tally.add(loss, mb, tokens, scores.entropy, stats, own)
                # This micro-batch's graph (the output layer keeps its inputs for backward)
                # goes before the next forward, not after it: the peak is one micro-batch's.
                del loss, scores, tokens, masks
            if ranks.world > 1:  # every rank gets every rank's figures (and checks the losses)
                tally = tally.merged(ranks)
            tally.refuse_non_finite(trained_params, len(groups))
            for p in trained_params:  # rows all skipped: a zero gradient, still a step
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            ranks.sum_gradients(trained_params)
            metrics = tally.metrics(rows=len(step_batch), rows_trained=len(trained),
                                    micro_batches=len(groups), normalizer=normalizer)
            if not step:
                return metrics
            if per_step and config.target_kl is not None \
                    and metrics.get("approx_kl", 0.0) > config.target_kl:
                stopped_kl = float(metrics["approx_kl"])  # the first step always goes
                log.info("learner: update stops after %d of %d optimizer steps: approx_kl "
                         "%.4f > target_kl %g", len(per_step), steps, stopped_kl,
                         config.target_kl)
                break
            max_norm = config.max_grad_norm
            grad_norm = float(torch.nn.utils.clip_grad_norm_(
                params, max_norm if max_norm is not None else math.inf))
            if not math.isfinite(grad_norm):
                raise NonFiniteError(f"the gradient norm is {grad_norm}")
            learning_rate = scheduled_learning_rate(config, first_step + len(per_step))
            optimizers.step(learning_rate)
            per_step.append({**metrics, "grad_norm": grad_norm, "learning_rate": learning_rate,
                             "grad_clipped": max_norm is not None and grad_norm > max_norm})
        if stopped_kl is not None:
            break
    metrics = combine_steps(per_step, algorithm.reduction)
    metrics.update(optimizer_steps=len(per_step), early_stopped=stopped_kl is not None,
                   **({} if stopped_kl is None else {"stopped_at_kl": stopped_kl}))
    return metrics


# --------------------------------------------------------------------------------------------
# The parts of an update
# --------------------------------------------------------------------------------------------


def rows_with_gradient(batch: Batch, algorithm: Algorithm, config: LearnerConfig) -> list[int]:
    """The rows a step trains: those with completion tokens and, for a loss linear in the
    advantage, a nonzero advantage (the others carry no gradient)."""
    has_tokens = batch.completion_mask[:, 1:].sum(1) > 0
    # A KL penalty, an entropy bonus or the legal-mass term trains every row: a zero
    # advantage still has a divergence to pay, an entropy or a legal mass to keep.
    if not (algorithm.needs_zero_advantage_rows or config.kl_coef or config.entropy_coef
            or config.legal_mass_coef):
        has_tokens &= batch.advantages != 0
    return torch.nonzero(has_tokens).flatten().tolist()


def token_batch(mb: Batch, mb_rows: list[int], scores: Scores, scored: torch.Tensor,
                normalizer: float, batch_rows: int) -> TokenBatch:
    """The completion tokens of micro-batch ``mb`` (rows ``mb_rows`` of the step's batch of
    ``batch_rows`` rows), flattened, with the rows and their decision states, as the algorithm
    sees them."""
    device = scores.logprobs.device
    row_ids = torch.tensor(mb_rows, device=device)[:, None].expand_as(scored)
    old = mb.measured.get("old_logprobs")
    return TokenBatch(
        logprobs=scores.logprobs,
        behaviour_logprobs=mb.behaviour_logprobs[:, 1:].to(device)[scored].float(),
        advantages=mb.advantages.to(device)[:, None].expand_as(scored)[scored].float(),
        rows=row_ids[scored],
        normalizer=normalizer,
        old_logprobs=None if old is None else old[:, 1:].to(device)[scored].float(),
        batch=mb,
        states=scores.states,
        batch_rows=batch_rows,
    )


def kl_to_base(policy: Policy, input_ids: torch.Tensor, scored: torch.Tensor,
               logprobs: torch.Tensor, masks: TokenMasks | None = None) -> torch.Tensor:
    """Per scored token, GRPO's k3 term ``exp(d) - d - 1`` with ``d = logp_base - logp``
    (the base model: the adapter switched off). Its mean estimates KL(current || base) on
    on-policy tokens; as a loss its gradient is, in expectation, that of KL(base ||
    current), which charges the policy for dropping what the base model plays."""
    with torch.no_grad(), policy.model.disable_adapter():
        base_logprobs = policy.score(input_ids, scored, with_entropy=False,
                                     masks=masks).logprobs
    d = base_logprobs - logprobs
    return torch.exp(d) - d - 1


def scheduled_learning_rate(config: LearnerConfig, step: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based, since the cold start): a linear
    warm-up over ``warmup_steps``, then a linear fall to ``final_lr_fraction`` of the rate
    at ``decay_steps``."""
    warmup, decay = config.warmup_steps, config.decay_steps
    scale = min(1.0, (step + 1) / warmup) if warmup else 1.0
    if decay and step >= warmup:
        done = min(1.0, (step - warmup) / (decay - warmup))
        scale = 1.0 - (1.0 - config.final_lr_fraction) * done
    return config.learning_rate * scale


def scored_at_start(policy: Policy, batch: Batch, algorithm: Algorithm, config: LearnerConfig,
                    ranks: Ranks, budget: int | None, *, old_logprobs: bool) -> Batch:
    """``batch`` with what the update measures against the weights it starts from, in
    ``measured``: ``old_logprobs`` (an update of several steps measures its later steps' trust
    region and importance weights against them; one step reads them from its own forward
    pass) and the columns the algorithm adds (:meth:`Algorithm.measure` of the rows' decision
    states). No gradient, no dropout; on data-parallel ranks each scores a share of the rows
    and they exchange them: the rows the steps train, or with columns to add every row with a
    completion (``prepare`` may give a row of advantage 0 another)."""
    adds = algorithm.adds
    if not old_logprobs and not adds:
        return batch
    rows = torch.nonzero(batch.completion_mask[:, 1:].sum(1) > 0).flatten().tolist() if adds \
        else rows_with_gradient(batch, algorithm, config)
    mine = ranks.share(rows)
    parts: list[tuple[list[int], torch.Tensor, dict[str, torch.Tensor]]] = []
    if mine:
        part = batch.select(mine)
        # A no-grad pass holds far less than a training micro-batch: that many tokens fit.
        per_pass = max(1, (budget or part.input_ids.numel()) // int(part.lengths.max()))
        logprobs, columns = policy.score_batch(part, micro_batch_size=per_pass,
                                               measure=algorithm.measure if adds else None)
        parts.append((mine, logprobs, columns))
    logprob_table = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    tables = {name: torch.zeros(len(batch), dtype=torch.float32) for name in adds}
    for part_rows, part_logprobs, part_columns in (
            p for rank_parts in ranks.gather(parts) for p in rank_parts):
        logprob_table[part_rows, :part_logprobs.shape[1]] = part_logprobs
        if set(part_columns) != set(adds):
            raise UbError(f"algorithm {algorithm.name or type(algorithm).__name__}'s measure() "
                          f"gave {sorted(part_columns)}; it declares adds {list(adds)}")
        for name, values in part_columns.items():
            tables[name][part_rows] = values
    measured = {**batch.measured, **tables}
    if old_logprobs:
        measured["old_logprobs"] = logprob_table
    return dataclasses.replace(batch, measured=measured)


LEARNER_FIGURES = frozenset({
    # this update's
    "loss", "logprob_mean", "behaviour_logprob_mean", "entropy_mean", "approx_kl", "legal_mass",
    "kl_to_base", "completion_tokens", "logprob_abs_diff_max", "tokens", "padded_tokens",
    "padding_fraction", "rows", "rows_trained", "micro_batches", "normalizer", "grad_norm",
    "grad_norm_max", "learning_rate", "grad_clipped", "optimizer_steps", "early_stopped",
    "stopped_at_kl", "algorithm_statistics",
    # the Learner's, the learn step's and a round's (the learner view's batch columns too)
    "micro_batch_tokens", "update", "algorithm", "seconds", "tokens_per_second", "kernels",
    "liger_kernels", "adapter_compute", "attention_kernel", "pad_to_multiple", "peak_rss_mb",
    "peak_gpu_gib", "from_checkpoint", "batch", "reused", "assemble_seconds", "round",
    "batch_size", "batch_tokens", "truncated", "reward_mean", "advantage_std"})
"""The learner's own figures of an update, and the names beside them in a round's record: an
algorithm's statistic may not take one (it would stand for two things)."""


@dataclass
class Tally:
    """A step's statistics over its micro-batches. They stay on the device until the end: one
    host sync per step, not per micro-batch (which matters on a GPU). ``reduce`` says how an
    algorithm's statistic is reduced (:meth:`Algorithm.reduction`)."""

    diff_max: torch.Tensor
    reduce: Callable[[str], Reduction]
    losses: list[torch.Tensor] = field(default_factory=list)
    totals: dict[str, torch.Tensor] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)  # the algorithm's statistics' names
    rows: int = 0
    tokens: int = 0
    padded: int = 0

    def add(self, loss: torch.Tensor, mb: Batch, tokens: TokenBatch, entropy: torch.Tensor,
            stats: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> None:
        """One micro-batch's figures: the algorithm's ``stats`` and the learner's ``own``
        (token sums, divided by the token count at the end; row sums by the rows)."""
        clash = sorted(stats.keys() & LEARNER_FIGURES)
        if clash:
            raise UbError(f"the algorithm reports a statistic named {clash[0]!r}, a figure of "
                          "the learner's own: give it another name")
        self.losses.append(loss.detach())
        self.rows += len(mb)
        self.tokens += int(mb.lengths.sum())
        self.padded += int(mb.input_ids.numel())
        self.reported.update(stats)
        with torch.no_grad():
            # k3 estimate of KL(start || current), start the policy the update began from (the
            # learner's scores where it made them first, else the sampler's): unbiased, >= 0;
            # target_kl reads it.
            moved = tokens.logprobs - (tokens.behaviour_logprobs if tokens.old_logprobs is None
                                       else tokens.old_logprobs)
            sums = {
                "logprob_mean": tokens.logprobs.detach().sum(),
                "behaviour_logprob_mean": tokens.behaviour_logprobs.sum(),
                "entropy_mean": entropy.sum(),
                "approx_kl": (moved.exp() - 1 - moved).sum(),
                "completion_tokens": torch.tensor(tokens.logprobs.numel(),
                                                  device=tokens.logprobs.device),
                **stats,
                **own,
            }
            for key, value in sums.items():
                self._add(key, value.detach().double())
            self.diff_max = torch.maximum(
                self.diff_max, (tokens.logprobs.detach() - tokens.behaviour_logprobs).abs().max())

    def _reduction(self, key: str) -> Reduction:
        """How figure ``key`` is reduced: as the algorithm says for its own statistics."""
        if key in self.reported:
            return self.reduce(key)
        return "max" if key.endswith("_max") else "token"

    def _add(self, key: str, value: torch.Tensor) -> None:
        """Fold ``value`` into ``totals[key]``: the larger for a maximum, else the sum."""
        known = self.totals.get(key)
        self.totals[key] = value if known is None else (
            torch.maximum(known, value) if self._reduction(key) == "max" else known + value)

    def merged(self, ranks: Ranks) -> Tally:
        """The step's figures over every rank's micro-batches (in rank order)."""
        parts = ranks.gather((
            torch.stack(self.losses).cpu().tolist() if self.losses else [],
            {k: float(v) for k, v in self.totals.items()}, sorted(self.reported),
            float(self.diff_max), self.rows, self.tokens, self.padded))
        out = Tally(torch.tensor(max(part[3] for part in parts)), self.reduce)
        for losses, sums, reported, _, rows, tokens, padded in parts:
            out.losses += [torch.tensor(x) for x in losses]
            out.reported.update(reported)
            for key, value in sums.items():
                out._add(key, torch.tensor(value, dtype=torch.float64))
            out.rows, out.tokens, out.padded = out.rows + rows, out.tokens + tokens, \
                out.padded + padded
        return out

    def refuse_non_finite(self, params: list[torch.nn.Parameter], micro_batches: int) -> None:
        """Raise :class:`NonFiniteError` (the gradients dropped) for a NaN/inf loss."""
        if not self.losses:
            return
        per_micro_batch = torch.stack(self.losses).cpu()
        bad = torch.nonzero(~torch.isfinite(per_micro_batch)).flatten().tolist()
        if bad:
            for p in params:
                p.grad = None
            raise NonFiniteError(f"the loss is {per_micro_batch[bad[0]].item()} in "
                                 f"micro-batch {bad[0] + 1} of {micro_batches}")

    def metrics(self, **counts: Any) -> dict[str, Any]:
        sums = {k: float(v) for k, v in self.totals.items()}
        completion_tokens = int(sums.pop("completion_tokens", 0))
        out: dict[str, Any] = {
            "loss": float(torch.stack(self.losses).cpu().sum()) if self.losses else 0.0}
        for key, value in sums.items():
            reduction = self._reduction(key)
            per = self.rows if reduction == "row" else completion_tokens
            out[key] = value if reduction == "max" else value / per if per else 0.0
        out.update(logprob_abs_diff_max=float(self.diff_max),
                   completion_tokens=completion_tokens, tokens=self.tokens,
                   padded_tokens=self.padded,
                   padding_fraction=1.0 - self.tokens / self.padded if self.padded else 0.0,
                   algorithm_statistics=sorted(self.reported), **counts)
        return out


def combine_steps(per_step: list[dict[str, Any]], reduce: Callable[[str], Reduction]
                  ) -> dict[str, Any]:
    """One update's metrics from its steps': the step's own with one step; else float means,
    int sums, maxima of the statistics ``reduce`` calls maxima, ``grad_norm_max``,
    ``grad_clipped`` if any step was clipped, and every statistic any step reported.

    A step whose rows were all skipped (every advantage zero) has no token means: a figure is
    combined over the steps that report it.
    """
    if len(per_step) == 1:
        return dict(per_step[0])
    out: dict[str, Any] = {}
    keys = dict.fromkeys(key for m in per_step for key in m)  # first-seen order, for the JSON
    for key in keys:
        values = [m[key] for m in per_step if key in m]
        first = values[0]
        if isinstance(first, bool):
            out[key] = any(values)
        elif isinstance(first, float) and reduce(key) == "max":
            out[key] = max(values)
        elif isinstance(first, int):
            out[key] = sum(values)
        elif isinstance(first, float):
            out[key] = sum(values) / len(values)
        elif isinstance(first, list):
            out[key] = sorted({name for names in values for name in names})
        else:
            out[key] = first
    out["grad_norm_max"] = max(m["grad_norm"] for m in per_step)
    return out
