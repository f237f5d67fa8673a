"""One update of the learner, top to bottom: :func:`update`.

For each epoch, for each minibatch (one optimizer step): for each micro-batch, the policy
scores every completion token ``t`` with the logits at ``t - 1``
(``log_softmax(logits / temperature)`` in float32, the distribution the token was sampled
from), the algorithm turns those tokens into the micro-batch's share of the loss (a token sum
over the constant ``B * L``, so micro-batch gradients add up to exactly the minibatch's),
and it is back-propagated; then the gradient norm is clipped and AdamW steps at the
schedule's learning rate. An update of several steps stops early once the policy moved
``target_kl`` from where it started.

What wraps it is handed in: ``budget`` (how many tokens a micro-batch may hold:
:class:`ub.learner.memory.MicroBatchBudget`), ``ranks`` (data-parallel learners' share of
the micro-batches and the summed gradients: :class:`ub.distributed.Ranks`) and ``value`` (a
learned value baseline: :class:`ub.learner.value.ValueBaseline`). The retry at half the
micro-batch after running out of memory, and the rollback of a failed update, are
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
from ub.learner.algorithms import Algorithm, TokenBatch
from ub.learner.batching import plan_micro_batches
from ub.learner.config import LearnerConfig
from ub.learner.policy import Policy

if TYPE_CHECKING:
    from ub.batch import Batch
    from ub.learner.token_masks import TokenMasks
    from ub.learner.value import ValueBaseline

log = logging.getLogger("ub.learner.learner")


class NonFiniteError(UbError):
    """The loss or the gradient of an update is NaN or infinite (nothing was changed)."""


def update(policy: Policy, optimizer: torch.optim.Optimizer | None, algorithm: Algorithm,
           batch: Batch, config: LearnerConfig, *, rng: random.Random, first_step: int,
           micro_batch_tokens: Callable[[], int | None], ranks: Ranks,
           value: ValueBaseline | None = None) -> dict[str, Any]:
    """One update on ``batch``: ``config.epochs`` passes of ``config.minibatches`` optimizer
    steps (the schedule's step numbers start at ``first_step``). Returns the update's metrics
    (see :meth:`ub.learner.Learner.update`). ``rng`` (the learner's saved stream) shuffles
    the minibatches. ``optimizer=None`` is a diagnostic: the first step's gradients are left
    in the parameters' ``.grad``, nothing steps.

    :raises NonFiniteError: a NaN or infinite loss or gradient norm (the caller rolls back).
    """
    params = list(policy.params.values())
    # Everything with a gradient: what data-parallel ranks sum (a value head's too).
    trained_params = params + ([] if value is None else list(value.params().values()))
    steps = config.steps_per_update
    batch = scored_at_start(policy, batch, algorithm, config, value, ranks,
                            micro_batch_tokens(),
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
            tally = Tally(torch.zeros((), device=policy.device))
            for group in ranks.share(groups):
                mb_rows = [trained[i] for i in group]
                mb = step_batch.select(mb_rows)
                input_ids = mb.input_ids.to(policy.device)
                scored = mb.completion_mask[:, 1:].to(policy.device) > 0
                masks = policy.token_masks(mb, scored)  # (the legal-move mask's, if any)
                scores = policy.score(input_ids, scored, with_states=value is not None,
                                      masks=masks)
                tokens = token_batch(mb, mb_rows, scores.logprobs, scored, normalizer)
                loss, stats = algorithm.loss(tokens)
                assert scores.entropy is not None  # asked for by default
                if config.entropy_coef:
                    loss = loss - config.entropy_coef * scores.entropy.sum() / normalizer
                if config.kl_coef:
                    kl = kl_to_base(policy, input_ids, scored, scores.logprobs, masks)
                    loss = loss + config.kl_coef * kl.sum() / normalizer
                    stats = {**stats, "kl_to_base": kl.detach().sum()}
                    del kl
                if value is not None:
                    assert scores.states is not None and mb.returns is not None
                    value_loss, row_stats = value.loss(
                        scores.states, mb.returns.to(policy.device), len(step_batch))
                    loss = loss + value_loss
                    tally.add_rows(row_stats, len(mb_rows))
                    del value_loss
                loss.backward()  # a NaN loss only spoils the gradients, dropped below
                fault_point("learn.mid-update")
                tally.add(loss, mb, tokens, scores.entropy, stats)
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
            if optimizer is None:
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
            for param_group in optimizer.param_groups:
                param_group["lr"] = learning_rate
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if value is not None:
                value.step()
            per_step.append({**metrics, "grad_norm": grad_norm, "learning_rate": learning_rate,
                             "grad_clipped": max_norm is not None and grad_norm > max_norm})
        if stopped_kl is not None:
            break
    metrics = combine_steps(per_step)
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
    # A KL penalty or an entropy bonus trains every row: a zero advantage still has a
    # divergence to pay or an entropy to keep.
    if not (algorithm.needs_zero_advantage_rows or config.kl_coef or config.entropy_coef):
        has_tokens &= batch.advantages != 0
    return torch.nonzero(has_tokens).flatten().tolist()


def token_batch(mb: Batch, mb_rows: list[int], logprobs: torch.Tensor, scored: torch.Tensor,
                normalizer: float) -> TokenBatch:
    """The completion tokens of micro-batch ``mb`` (rows ``mb_rows`` of the step's batch),
    flattened, as the algorithm sees them."""
    device = logprobs.device
    row_ids = torch.tensor(mb_rows, device=device)[:, None].expand_as(scored)
    return TokenBatch(
        logprobs=logprobs,
        behaviour_logprobs=mb.behaviour_logprobs[:, 1:].to(device)[scored].float(),
        advantages=mb.advantages.to(device)[:, None].expand_as(scored)[scored].float(),
        rows=row_ids[scored],
        normalizer=normalizer,
        old_logprobs=None if mb.old_logprobs is None
        else mb.old_logprobs[:, 1:].to(device)[scored].float(),
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
                    value: ValueBaseline | None, ranks: Ranks, budget: int | None, *,
                    old_logprobs: bool) -> Batch:
    """``batch`` with what the update measures against the weights it starts from:
    ``old_logprobs`` (an update of several steps measures its later steps' trust region and
    importance weights against them; one step reads them from its own forward pass) and,
    with a value baseline, ``values``. No gradient, no dropout; on data-parallel ranks each
    scores a share of the rows and they exchange them: the rows the steps train, or with a
    value baseline every row with a completion (``prepare`` gives a return of 0 an advantage
    of ``-V``)."""
    if not old_logprobs and value is None:
        return batch
    rows = rows_with_gradient(batch, algorithm, config) if value is None else \
        torch.nonzero(batch.completion_mask[:, 1:].sum(1) > 0).flatten().tolist()
    mine = ranks.share(rows)
    parts: list[tuple[list[int], torch.Tensor, torch.Tensor | None]] = []
    if mine:
        part = batch.select(mine)
        # A no-grad pass holds far less than a training micro-batch: that many tokens fit.
        per_pass = max(1, (budget or part.input_ids.numel()) // int(part.lengths.max()))
        logprobs, values = policy.score_batch(
            part, micro_batch_size=per_pass, value_head=None if value is None else value.head)
        parts.append((mine, logprobs, values))
    logprob_table = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    value_table = torch.zeros(len(batch), dtype=torch.float32)
    for part_rows, part_logprobs, part_values in (
            p for rank_parts in ranks.gather(parts) for p in rank_parts):
        logprob_table[part_rows, :part_logprobs.shape[1]] = part_logprobs
        if part_values is not None:
            value_table[part_rows] = part_values
    return dataclasses.replace(batch, old_logprobs=logprob_table if old_logprobs else None,
                               values=value_table if value is not None else None)


@dataclass
class Tally:
    """A step's statistics over its micro-batches. They stay on the device until the end: one
    host sync per step, not per micro-batch (which matters on a GPU)."""

    diff_max: torch.Tensor
    losses: list[torch.Tensor] = field(default_factory=list)
    totals: dict[str, torch.Tensor] = field(default_factory=dict)
    row_totals: dict[str, torch.Tensor] = field(default_factory=dict)
    rows: int = 0
    tokens: int = 0
    padded: int = 0

    def add(self, loss: torch.Tensor, mb: Batch, tokens: TokenBatch, entropy: torch.Tensor,
            stats: dict[str, torch.Tensor]) -> None:
        """One micro-batch's figures: token sums, divided by the token count at the end."""
        self.losses.append(loss.detach())
        self.tokens += int(mb.lengths.sum())
        self.padded += int(mb.input_ids.numel())
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
            }
            for key, value in sums.items():
                _add_statistic(self.totals, key, value.detach().double())
            self.diff_max = torch.maximum(
                self.diff_max, (tokens.logprobs.detach() - tokens.behaviour_logprobs).abs().max())

    def add_rows(self, stats: dict[str, torch.Tensor], rows: int) -> None:
        """Per-row sums (a value head's), divided by the rows at the end."""
        self.rows += rows
        for key, value in stats.items():
            _add_statistic(self.row_totals, key, value.detach().double())

    def merged(self, ranks: Ranks) -> Tally:
        """The step's figures over every rank's micro-batches (in rank order)."""
        parts = ranks.gather((
            torch.stack(self.losses).cpu().tolist() if self.losses else [],
            {k: float(v) for k, v in self.totals.items()},
            {k: float(v) for k, v in self.row_totals.items()},
            float(self.diff_max), self.rows, self.tokens, self.padded))
        out = Tally(torch.tensor(max(part[3] for part in parts)))
        for losses, sums, row_sums, _, rows, tokens, padded in parts:
            out.losses += [torch.tensor(x) for x in losses]
            for key, value in sums.items():
                _add_statistic(out.totals, key, torch.tensor(value, dtype=torch.float64))
            for key, value in row_sums.items():
                _add_statistic(out.row_totals, key, torch.tensor(value, dtype=torch.float64))
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
        out.update({k: v if _is_max(k) else v / completion_tokens if completion_tokens
                    else 0.0 for k, v in sums.items()})
        out.update({k.removesuffix("_row"): float(v) / self.rows
                    for k, v in self.row_totals.items() if self.rows})
        out.update(logprob_abs_diff_max=float(self.diff_max),
                   completion_tokens=completion_tokens, tokens=self.tokens,
                   padded_tokens=self.padded,
                   padding_fraction=1.0 - self.tokens / self.padded if self.padded else 0.0,
                   **counts)
        return out


def combine_steps(per_step: list[dict[str, Any]]) -> dict[str, Any]:
    """One update's metrics from its steps': the step's own with one step; else float means,
    int sums, ``grad_norm_max`` and ``grad_clipped`` if any step was clipped.

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
        elif isinstance(first, float) and _is_max(key):
            out[key] = max(values)
        elif isinstance(first, int):
            out[key] = sum(values)
        elif isinstance(first, float):
            out[key] = sum(values) / len(values)
        else:
            out[key] = first
    out["grad_norm_max"] = max(m["grad_norm"] for m in per_step)
    return out


def _is_max(key: str) -> bool:
    """An algorithm's statistic that is a maximum over tokens (and micro-batches, ranks and
    steps), not a sum to be divided by the token count."""
    return key.endswith("_max")


def _add_statistic(totals: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    """Fold ``value`` into ``totals[key]``: the larger for a maximum, else the sum."""
    known = totals.get(key)
    totals[key] = value if known is None else (
        torch.maximum(known, value) if _is_max(key) else known + value)
