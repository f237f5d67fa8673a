"""The learner: a LoRA policy-gradient update on the stored token ids, one checkpoint per update.

    learner = Learner(LearnerConfig(base_model="runs/x/base"))   # loads the base model once
    learner.start("runs/x/checkpoints/update-000003")              # or None: a cold start
    metrics = learner.update(batch)                                # one optimizer step
    learner.save("runs/x/checkpoints/update-000004", metrics)

or, in one call that also assembles the batch and reuses a committed output,
:func:`ub.learner.entry.learn_step`. What one update does, in order:

1. ``algorithm.prepare`` sees the whole batch (it may transform advantages).
2. Rows without completion tokens, and (for losses linear in the advantage) rows whose advantage
   is 0, are left out: they carry no gradient.
3. The rest is cut into micro-batches of similar length (:func:`plan_micro_batches`); each is
   trimmed to its longest row. A row is never split: with ``micro_batch_tokens: auto`` one
   longer than the learner's memory holds is refused before the update (a one-line
   :class:`UbError` naming ``batch.max_train_len``).
4. Per micro-batch: the model scores every completion token ``t`` with the logits at ``t - 1``
   (``log_softmax(logits / temperature)`` in float32, the distribution the token was sampled
   from); the algorithm's loss (a token sum over the constant ``B * L``) is back-propagated,
   so gradients accumulate to exactly the full-batch gradient.
5. The global gradient norm is clipped and AdamW steps. A non-finite loss or gradient stops the
   update with :class:`UbError` before any weight changes.

The base model stays loaded across updates (a process keeps its learner in a
:class:`ub.run.worker.Worker`); each :meth:`Learner.start` only swaps the small LoRA and
optimizer state.

The class is built in layers, one file each: :class:`~ub.learner.model.LearnerModel` (the model
and its settings), :class:`~ub.learner.state.LearnerState` (start and save), and here the update
itself. The entry points that write checkpoints are :mod:`ub.learner.entry`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ub.distributed import gather, rank_and_world, sum_gradients
from ub.errors import UbError
from ub.faults import fault_point
from ub.learner.algorithms import TokenBatch
from ub.learner.batching import TrainBatch, plan_micro_batches
from ub.learner.config import LearnerConfig
from ub.learner.model import (
    ADAPTER_NAME,
    PLAIN_LM_HEAD_MODELS,
    resolve_attention,
    resolve_device,
    resolve_dtype,
)
from ub.learner.state import LearnerState

log = logging.getLogger("ub.learner.learner")


@dataclass
class _Tally:
    """An update's statistics over its micro-batches. They stay on the device until the end:
    one host sync per update, not per micro-batch (which matters on a GPU)."""

    diff_max: torch.Tensor
    losses: list[torch.Tensor] = field(default_factory=list)
    totals: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: int = 0
    padded: int = 0


class NonFiniteError(UbError):
    """The loss or the gradient of an update is NaN or infinite (nothing was changed)."""


class Learner(LearnerState):
    """A PEFT LoRA policy on a base model loaded once, with its AdamW state and RNG streams.

    :param config: see :class:`LearnerConfig`. The model fields (``base_model``, ``dtype``,
        ``attn_implementation``, ``device``, LoRA rank/alpha/targets) are fixed for the life of
        the learner; the others can change between updates with :meth:`configure`.

    After construction the learner is at a cold start (``config.init_adapter`` or a fresh
    adapter); :meth:`start` moves it to a checkpoint.
    """

    def __init__(self, config: LearnerConfig) -> None:
        super().__init__(config)
        self.start(None)

    # -- the update -------------------------------------------------------------------------

    def accumulate_gradients(self, batch: Any) -> dict[str, Any]:
        """Zero the gradients, then forward and backward the whole batch, micro-batch by
        micro-batch: afterwards each LoRA parameter's ``.grad`` is the full-batch gradient.
        No optimizer step, and the learner's RNG streams do not advance (a diagnostic: see
        :meth:`lora_gradients`). Returns the loss and token statistics.

        :raises UbError: an empty batch, a row longer than the learner's memory holds, or a
            non-finite loss (:class:`NonFiniteError`; the gradients are then zeroed).
        """
        py_state = self.py_rng.getstate()
        try:
            with self._own_rng():
                self._refuse_rows_too_long(TrainBatch.from_batch(batch))
                return self._accumulate_fitting(batch)
        finally:
            self.py_rng.setstate(py_state)

    def _accumulate(self, batch: Any) -> dict[str, Any]:
        config = self.config
        batch = TrainBatch.from_batch(batch)
        batch.validate()
        # A shallow copy: prepare() may replace tensors without touching the caller's batch.
        batch = self.algorithm.prepare(dataclasses.replace(batch), self.py_rng)
        rows_total = len(batch)
        # Dr. GRPO: a constant normalizer over the FULL batch, so micro-batch losses add up to
        # the batch loss whatever the grouping.
        normalizer = float(rows_total * config.length_normalizer)

        rows = self._rows_to_train(batch)
        lengths = batch.lengths.tolist()
        groups = plan_micro_batches([lengths[r] for r in rows], self.micro_batch_tokens(),
                                    config.micro_batch_size)

        self.model.train()
        for p in self.params.values():
            p.grad = None
        tally = _Tally(diff_max=torch.zeros((), device=self.device))
        # Data-parallel (ub.distributed): this rank's share of the micro-batches.
        rank, world = rank_and_world()
        for group in groups[rank::world]:
            self._backward(batch, [rows[i] for i in group], normalizer, tally)

        if world > 1:  # every rank gets every rank's figures (and checks the same losses)
            losses, totals, diff_max, tokens, padded = _merge_ranks(
                tally.losses, tally.totals, tally.diff_max, tally.tokens, tally.padded)
            tally = _Tally(diff_max, losses, totals, tokens, padded)
        losses, totals, tokens, padded = tally.losses, tally.totals, tally.tokens, tally.padded
        if losses:
            per_micro_batch = torch.stack(losses).cpu()
            bad = torch.nonzero(~torch.isfinite(per_micro_batch)).flatten().tolist()
            if bad:
                for p in self.params.values():
                    p.grad = None
                raise NonFiniteError(self._non_finite_message(
                    f"the loss is {per_micro_batch[bad[0]].item()} in micro-batch {bad[0] + 1} "
                    f"of {len(groups)}", batch))
        for p in self.params.values():  # rows all skipped: a zero gradient, still a step
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if world > 1:
            sum_gradients(list(self.params.values()))
        sums_host = {k: float(v) for k, v in totals.items()}
        completion_tokens = int(sums_host.pop("completion_tokens", 0))
        metrics: dict[str, Any] = {"loss": float(per_micro_batch.sum()) if losses else 0.0}
        metrics.update({k: v if _is_max(k) else v / completion_tokens if completion_tokens
                        else 0.0 for k, v in sums_host.items()})
        metrics.update(
            logprob_abs_diff_max=float(tally.diff_max),
            rows=rows_total,
            rows_trained=len(rows),
            completion_tokens=completion_tokens,
            tokens=tokens,
            padded_tokens=padded,
            padding_fraction=1.0 - tokens / padded if padded else 0.0,
            micro_batches=len(groups),
            micro_batch_tokens=self._micro_batch_tokens,
            normalizer=normalizer,
        )
        return metrics

    def _rows_to_train(self, batch: TrainBatch) -> list[int]:
        """The rows an update trains: those with completion tokens and, for a loss linear in
        the advantage, a nonzero advantage (the others carry no gradient)."""
        has_tokens = batch.completion_mask[:, 1:].sum(1) > 0
        # A KL penalty or an entropy bonus trains every row: a zero advantage still has a
        # divergence to pay or an entropy to keep.
        if not (self.algorithm.needs_zero_advantage_rows or self.config.kl_coef
                or self.config.entropy_coef):
            has_tokens &= batch.advantages != 0
        return torch.nonzero(has_tokens).flatten().tolist()

    def _with_old_logprobs(self, batch: TrainBatch) -> TrainBatch:
        """``batch`` with ``old_logprobs``: the learner's logprob of each completion token at
        the weights the update starts from. An update of several optimizer steps measures its
        later steps' trust region and importance weights against them (its first step, and a
        one-step update, read them from their own forward pass). No gradient, no dropout; on
        data-parallel ranks each scores a share of the rows and they exchange them."""
        rank, world = rank_and_world()
        rows = self._rows_to_train(batch)
        old = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        mine = rows[rank::world]
        parts: list[tuple[list[int], torch.Tensor]] = []
        if mine:
            part = batch.select(mine)
            # A no-grad pass holds far less than a training micro-batch: that many tokens fit.
            budget = self.micro_batch_tokens() or part.input_ids.numel()
            per_pass = max(1, budget // int(part.lengths.max()))
            parts.append((mine, self.token_logprobs(part, micro_batch_size=per_pass)))
        if world > 1:
            parts = [p for rank_parts in gather(parts) for p in rank_parts]
        for part_rows, values in parts:
            old[part_rows, :values.shape[1]] = values
        return dataclasses.replace(batch, old_logprobs=old)

    def _accumulate_fitting(self, batch: Any) -> dict[str, Any]:
        """:meth:`_accumulate`; after an out-of-memory error, again at half the micro-batch
        (the same gradient up to float summation order: the loss's normaliser is the batch's),
        until it fits or a micro-batch holds one row. The smaller size stays for later
        updates."""
        while True:
            torch_rng, py_rng = self._capture_rng(), self.py_rng.getstate()
            try:
                return self._accumulate(batch)
            except torch.OutOfMemoryError as e:
                message = " ".join(str(e).split())[:200]
            # (outside the except block: the error's frames, and the tensors they hold, are gone)
            for p in self.params.values():
                p.grad = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self._set_rng(torch_rng)
            self.py_rng.setstate(py_rng)
            self._halve_micro_batch(TrainBatch.from_batch(batch), message)

    def _halve_micro_batch(self, batch: TrainBatch, message: str) -> None:
        longest = int(batch.lengths.max())
        old = self._micro_batch_tokens
        if old is None:  # no limit: the whole batch was one micro-batch
            old = longest * len(batch)
        new = old // 2
        advice = ("set learner.gradient_checkpointing: true, lower engine.gpu_memory_utilization "
                  "or shorten sampling.max_tokens")
        if rank_and_world()[1] > 1:  # every rank must cut the batch the same way
            raise UbError(f"update {self.update_index + 1}: out of memory at "
                          f"micro_batch_tokens={old} on a data-parallel rank ({message}): set "
                          f"learner.micro_batch_tokens below {old}, or {advice}")
        if old <= longest:
            raise UbError(f"update {self.update_index + 1}: out of memory with one row per "
                          f"micro-batch (the longest has {longest} tokens; {message}): {advice}")
        log.warning("learner: out of memory at micro_batch_tokens=%d in update %d; retrying "
                    "it at %d", old, self.update_index + 1, new)
        self._micro_batch_tokens, self._micro_batch_sized = new, True

    def micro_batch_tokens(self) -> int | None:
        """The micro-batch token budget updates use: ``learner.micro_batch_tokens``, with
        ``auto`` sized from the memory the learner has (:mod:`ub.learner.memory`, measured once
        while the settings it depends on stay the same), and halved after an out-of-memory
        error."""
        if not self._micro_batch_sized:
            fit = self._memory_fit = self._measure_memory()
            self._micro_batch_tokens = fit.micro_batch_tokens
            self._micro_batch_sized = True
            log.info("learner: micro_batch_tokens auto -> %d (%.1f GiB for activations at "
                     "%.2f MiB/token; rows up to %d tokens)", self._micro_batch_tokens,
                     fit.budget_bytes / 2**30, fit.bytes_per_token / 2**20, fit.longest_row)
        return self._micro_batch_tokens

    def _refuse_rows_too_long(self, batch: TrainBatch) -> None:
        """A row is never split across micro-batches, so one whose activations alone do not fit
        the memory ``auto`` measured would run out of memory inside the update (on a GPU
        beside a sleeping engine, after the engine's memory went to it): refused before any
        pass, with the setting that bounds it. A given ``micro_batch_tokens`` is trusted: a
        longer row gets a micro-batch of its own."""
        batch.validate()
        self.micro_batch_tokens()
        fit = self._memory_fit
        trained = batch.completion_mask[:, 1:].sum(1) > 0
        if fit is None or not bool(trained.any()):
            return
        longest = int(batch.lengths[trained].max())
        if longest <= fit.longest_row:
            return
        advice = "" if self.config.gradient_checkpointing else \
            ", or learner.gradient_checkpointing: true"
        if self.config.device_share is not None:
            advice += ", or lower engine.gpu_memory_utilization"
        raise UbError(
            f"update {self.update_index + 1}: a row of {longest:,} tokens does not fit the "
            f"learner's memory in one micro-batch ({fit.budget_bytes / 2**30:.1f} GiB for "
            f"activations at {fit.bytes_per_token / 2**20:.2f} MiB/token hold rows of up to "
            f"{fit.longest_row:,} tokens): set batch.max_train_len (ub learn: "
            f"--max-train-len) to at most {fit.longest_row:,}{advice}")

    def _backward(self, batch: TrainBatch, batch_rows: list[int], normalizer: float,
                  tally: _Tally) -> None:
        """Forward and backward the micro-batch of rows ``batch_rows`` (the gradients add up
        in the parameters' ``.grad``); its statistics go to ``tally``."""
        mb = batch.select(batch_rows)
        input_ids = mb.input_ids.to(self.device)
        scored = mb.completion_mask[:, 1:].to(self.device) > 0
        logprobs, entropy = self._score(input_ids, scored)
        assert entropy is not None  # asked for by default
        row_ids = torch.tensor(batch_rows, device=self.device)[:, None].expand_as(scored)
        token_batch = TokenBatch(
            logprobs=logprobs,
            behaviour_logprobs=mb.behaviour_logprobs[:, 1:].to(self.device)[scored].float(),
            advantages=mb.advantages.to(self.device)[:, None].expand_as(scored)[scored].float(),
            rows=row_ids[scored],
            normalizer=normalizer,
            old_logprobs=None if mb.old_logprobs is None
            else mb.old_logprobs[:, 1:].to(self.device)[scored].float(),
        )
        loss, stats = self.algorithm.loss(token_batch)
        if self.config.entropy_coef:
            loss = loss - self.config.entropy_coef * entropy.sum() / normalizer
        if self.config.kl_coef:
            kl = self._kl_to_base(input_ids, scored, logprobs)
            loss = loss + self.config.kl_coef * kl.sum() / normalizer
            stats = {**stats, "kl_to_base": kl.detach().sum()}
        # A NaN loss only spoils the gradients, which are dropped before any step.
        loss.backward()
        fault_point("learn.mid-update")

        # Bookkeeping: token sums, divided by the token count at the end.
        tally.losses.append(loss.detach())
        tally.tokens += int(mb.lengths.sum())
        tally.padded += int(mb.input_ids.numel())
        with torch.no_grad():
            # k3 estimate of KL(start || current), start the policy the update began from (the
            # learner's scores where it made them first, else the sampler's): unbiased, >= 0;
            # target_kl reads it.
            moved = logprobs - (token_batch.behaviour_logprobs if token_batch.old_logprobs is None
                                else token_batch.old_logprobs)
            sums = {
                "logprob_mean": logprobs.detach().sum(),
                "behaviour_logprob_mean": token_batch.behaviour_logprobs.sum(),
                "entropy_mean": entropy.sum(),
                "approx_kl": (moved.exp() - 1 - moved).sum(),
                "completion_tokens": scored.sum(),
                **stats,
            }
            for key, value in sums.items():
                _add_statistic(tally.totals, key, value.detach().double())
            tally.diff_max = torch.maximum(
                tally.diff_max, (logprobs.detach() - token_batch.behaviour_logprobs).abs().max())

    def _kl_to_base(self, input_ids: torch.Tensor, scored: torch.Tensor,
                    logprobs: torch.Tensor) -> torch.Tensor:
        """Per scored token, GRPO's k3 term ``exp(d) - d - 1`` with ``d = logp_base - logp``
        (the base model: the adapter switched off). Its mean estimates KL(current || base) on
        on-policy tokens; as a loss its gradient is, in expectation, that of KL(base ||
        current), which charges the policy for dropping what the base model plays."""
        with torch.no_grad(), self.model.disable_adapter():
            base_logprobs, _ = self._score(input_ids, scored, with_entropy=False)
        d = base_logprobs - logprobs
        return torch.exp(d) - d - 1

    def update(self, batch: Any) -> dict[str, Any]:
        """One update on ``batch`` (a :class:`ub.batch.Batch` or :class:`TrainBatch`):
        ``minibatches * epochs`` optimizer steps (one by default), then one checkpoint's worth.

        :returns: the update's metrics (JSON-able): ``loss``, ``grad_norm`` (before clipping),
            token means (``logprob_mean``, ``behaviour_logprob_mean``, ``entropy_mean`` and the
            algorithm's, e.g. PPO's ``ratio_mean``, ``clip_fraction``, ``approx_kl``, and the
            truncated importance weights' ``tis_ratio_mean``, ``tis_capped_fraction``),
            maxima (``tis_ratio_max``, ``logprob_abs_diff_max``), counts and timings. With
            several steps, float figures are means over the steps (maxima their maximum, plus
            ``grad_norm_max``) and counts are sums.
        :raises UbError: empty batch; a row longer than the learner's memory holds in one
            micro-batch (before any pass); :class:`NonFiniteError` for a NaN/inf loss or gradient,
            in which case nothing changed (weights, optimizer, RNG streams, update index), even
            if earlier steps of the update had been taken.
        """
        assert self.optimizer is not None
        started = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        py_state = self.py_rng.getstate()
        steps = self.config.minibatches * self.config.epochs
        # Several steps: keep what the first one changes, so a failed later step undoes all.
        saved = (self.lora_state(), copy.deepcopy(self.optimizer.state_dict())) \
            if steps > 1 else None
        try:
            with self._own_rng():
                full = TrainBatch.from_batch(batch)
                self._refuse_rows_too_long(full)
                if steps > 1 and self.algorithm.needs_old_logprobs:
                    full = self._with_old_logprobs(full)
                first = self.update_index * steps  # optimizer steps taken since the cold start
                per_step, stopped_kl = [], None
                for k, rows in enumerate(self._minibatch_rows(len(full))):
                    step_batch = full if rows is None else full.select(rows)
                    metrics = self._accumulate_fitting(step_batch)
                    stopped_kl = self._past_target_kl(k, metrics)
                    if stopped_kl is not None:
                        break
                    per_step.append(self._step(metrics, step_batch, first + k))
                new_rng = self._capture_rng()
        except BaseException:
            self.py_rng.setstate(py_state)  # a failed update consumes no randomness
            if saved is not None:
                with torch.no_grad():
                    for name, value in saved[0].items():
                        self.params[name].copy_(value)
                self.optimizer.load_state_dict(saved[1])
            raise
        finally:
            self.optimizer.zero_grad(set_to_none=True)
        self._torch_rng = new_rng
        self.update_index += 1
        seconds = time.perf_counter() - started
        metrics = _combine_steps(per_step)
        metrics.update(
            update=self.update_index,
            algorithm=self.config.algorithm,
            optimizer_steps=len(per_step),
            early_stopped=stopped_kl is not None,
            **({} if stopped_kl is None else {"stopped_at_kl": stopped_kl}),
            seconds=seconds,
            tokens_per_second=metrics["tokens"] / seconds if seconds > 0 else 0.0,
            kernels=self.kernels,
            liger_kernels=list(self.liger_kernels),
            peak_rss_mb=_peak_rss_mb(),
            **_peak_device_memory(self.device),
        )
        self.last_metrics = metrics
        return metrics

    def _minibatch_rows(self, n: int) -> Iterator[list[int] | None]:
        """Each step's rows: ``None`` (the whole batch) or a sorted minibatch, epoch by epoch."""
        m = self.config.minibatches
        for _ in range(self.config.epochs):
            if m == 1:
                yield None
                continue
            order = list(range(n))
            self.py_rng.shuffle(order)  # the saved RNG: a resumed run cuts the same minibatches
            for k in range(m):
                rows = sorted(order[k * n // m:(k + 1) * n // m])
                if rows:
                    yield rows

    def _learning_rate(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based, since the cold start)."""
        warmup, decay = self.config.warmup_steps, self.config.decay_steps
        scale = min(1.0, (step + 1) / warmup) if warmup else 1.0
        if decay and step >= warmup:
            done = min(1.0, (step - warmup) / (decay - warmup))
            scale = 1.0 - (1.0 - self.config.final_lr_fraction) * done
        return self.config.learning_rate * scale

    def _past_target_kl(self, k: int, metrics: dict[str, Any]) -> float | None:
        """The ``approx_kl`` of the update's step ``k`` (0-based) if it passes
        ``target_kl``: the update stops before taking that step. The first step always goes
        (its policy is the one the update started from)."""
        target, kl = self.config.target_kl, metrics.get("approx_kl")
        if k == 0 or target is None or kl is None or kl <= target:
            return None
        log.info("learner: update %d stops after %d of %d optimizer steps: approx_kl %.4f > "
                 "target_kl %g", self.update_index + 1, k,
                 self.config.minibatches * self.config.epochs, kl, target)
        return float(kl)

    def _step(self, metrics: dict[str, Any], batch: TrainBatch, step: int) -> dict[str, Any]:
        """Clip the gradients :meth:`_accumulate_fitting` left for ``batch`` (``metrics``) and
        take optimizer step number ``step``."""
        max_norm = self.config.max_grad_norm
        grad_norm = float(torch.nn.utils.clip_grad_norm_(
            list(self.params.values()), max_norm if max_norm is not None else math.inf))
        if not math.isfinite(grad_norm):
            raise NonFiniteError(self._non_finite_message(
                f"the gradient norm is {grad_norm}", batch))
        learning_rate = self._learning_rate(step)
        assert self.optimizer is not None
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics.update(grad_norm=grad_norm, learning_rate=learning_rate,
                       grad_clipped=max_norm is not None and grad_norm > max_norm)
        return metrics

    def _non_finite_message(self, what: str, batch: TrainBatch) -> str:
        hint = ("the batch has NaN/inf advantages: check the reward transforms"
                if not bool(torch.isfinite(batch.advantages).all()) else
                "lower learning_rate or max_grad_norm, or check the batch's advantages")
        return (f"update {self.update_index + 1}: {what}; the update was stopped before "
                f"changing anything (nothing written, the last good state is "
                f"{self.source or 'the cold start'}): {hint}")

    def lora_gradients(self) -> dict[str, torch.Tensor]:
        """Copies of the current ``.grad`` of each LoRA parameter (for tests and debugging)."""
        return {name: p.grad.detach().clone() for name, p in self.params.items()
                if p.grad is not None}

    def lora_state(self) -> dict[str, torch.Tensor]:
        """Copies of the LoRA weights, by parameter name."""
        return {name: p.detach().clone() for name, p in self.params.items()}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _combine_steps(per_step: list[dict[str, Any]]) -> dict[str, Any]:
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
        value = values[0]
        if isinstance(value, bool):
            out[key] = any(values)
        elif isinstance(value, float) and _is_max(key):
            out[key] = max(values)
        elif isinstance(value, int):
            out[key] = sum(values)
        elif isinstance(value, float):
            out[key] = sum(values) / len(values)
        else:
            out[key] = value
    out["grad_norm_max"] = max(m["grad_norm"] for m in per_step)
    return out


def _merge_ranks(losses: list[torch.Tensor], totals: dict[str, torch.Tensor],
                 diff_max: torch.Tensor, tokens: int, padded: int) -> tuple[Any, ...]:
    """The update's statistics over all ranks' micro-batches (in rank order)."""
    parts = gather((torch.stack(losses).cpu().tolist() if losses else [],
                    {k: float(v) for k, v in totals.items()}, float(diff_max), tokens, padded))
    merged: dict[str, torch.Tensor] = {}
    for _, sums, _, _, _ in parts:
        for key, value in sums.items():
            _add_statistic(merged, key, torch.tensor(value, dtype=torch.float64))
    return ([torch.tensor(x) for part in parts for x in part[0]], merged,
            torch.tensor(max(part[2] for part in parts)), sum(part[3] for part in parts),
            sum(part[4] for part in parts))



def _is_max(key: str) -> bool:
    """An algorithm's statistic that is a maximum over tokens (and micro-batches, ranks and
    steps), not a sum to be divided by the token count."""
    return key.endswith("_max")


def _add_statistic(totals: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    """Fold ``value`` into ``totals[key]``: the larger for a maximum, else the sum."""
    known = totals.get(key)
    totals[key] = value if known is None else (
        torch.maximum(known, value) if _is_max(key) else known + value)


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_device_memory(device: torch.device) -> dict[str, float]:
    """The GPU's peak allocated memory since the last reset (the update resets it)."""
    if device.type != "cuda":
        return {}
    return {"peak_gpu_gib": torch.cuda.max_memory_allocated(device) / 2**30}


__all__ = [
    "ADAPTER_NAME",
    "PLAIN_LM_HEAD_MODELS",
    "Learner",
    "NonFiniteError",
    "resolve_attention",
    "resolve_device",
    "resolve_dtype",
]
