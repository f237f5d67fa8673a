"""The learner: a LoRA policy-gradient update on the stored token ids, one checkpoint per update.

    learner = Learner(LearnerConfig(base_model="runs/x/base"))   # loads the base model once
    learner.start("runs/x/checkpoints/update-000003")              # or None: a cold start
    metrics = learner.update(batch)                                # one update
    learner.save("runs/x/checkpoints/update-000004", metrics)

A :class:`Learner` is made of plain parts: the :class:`~ub.learner.policy.Policy` (the base
model with its adapter, and how it scores tokens), the algorithm (built once, and again only
when its settings change) with the modules it declares it trains besides the adapter, the
:class:`~ub.learner.optimizers.Optimizers` that step them all, a
:class:`~ub.learner.memory.MicroBatchBudget`, and the training state a checkpoint holds
(update index, :class:`~ub.learner.streams.RngStreams`). The update itself is one function,
:func:`ub.learner.update.update`; :meth:`Learner.update` wraps it: rows too long for memory
are refused before it, an out-of-memory error retries it at half the micro-batch, and any
failure (a non-finite loss or gradient included) leaves the learner as it was.

The base model stays loaded across updates (a process keeps its learner in a
:class:`ub.run.processes.worker.Worker`); each :meth:`Learner.start` only swaps the small LoRA and
optimizer state. The entry points that write checkpoints are :mod:`ub.learner.entry`.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ub.distributed import Ranks
from ub.errors import UbError
from ub.learner.algorithms import Algorithm, Trained, make_algorithm
from ub.learner.base_identity import check_compatible
from ub.learner.checkpoint import CheckpointState, read_adapter, read_checkpoint
from ub.learner.checkpoint_writer import write_checkpoint
from ub.learner.config import LearnerConfig
from ub.learner.memory import MicroBatchBudget
from ub.learner.optimizers import Optimizers, Snapshot
from ub.learner.policy import Policy
from ub.learner.precision import adapter_compute_name
from ub.learner.streams import RngStreams
from ub.learner.update import NonFiniteError, update
from ub.model.lora import LoraSettings

if TYPE_CHECKING:
    from ub.batch import Batch

log = logging.getLogger("ub.learner.learner")


class Learner:
    """A PEFT LoRA policy on a base model loaded once, with its AdamW state and RNG streams.

    :param config: see :class:`LearnerConfig`. The model fields (``base_model``, ``dtype``,
        ``attn_implementation``, ``device``, LoRA rank/alpha/targets) are fixed for the life of
        the learner; the others can change between updates with :meth:`configure`.

    After construction the learner is at a cold start (``config.init_adapter`` or a fresh
    adapter); :meth:`start` moves it to a checkpoint.
    """

    def __init__(self, config: LearnerConfig) -> None:
        self.policy = Policy(config)
        self.budget = MicroBatchBudget(self.policy.measure_memory)
        self.config = config
        self.algorithm: Algorithm = make_algorithm(config.algorithm, config.algorithm_params)
        self.optimizers: Optimizers  # (start)
        self.streams = RngStreams(config.seed, self.policy.device)
        self.update_index = 0
        self.source: str | None = None  # the checkpoint or adapter the state came from
        self.last_metrics: dict[str, Any] = {}
        self.budget.configure(config.micro_batch_tokens, config.gradient_checkpointing,
                              config.device_share, _probe_settings(config))
        self.start(None)  # (makes the optimizers, and the algorithm's modules)

    @property
    def optimizer(self) -> torch.optim.AdamW:
        """The adapter's AdamW."""
        return self.optimizers.adapter

    def same_model(self, config: LearnerConfig) -> bool:
        """True if ``config`` runs on this learner's loaded model (see :meth:`configure`)."""
        return self.policy.same_model(config)

    def configure(self, config: LearnerConfig) -> None:
        """Apply a new config that keeps the model (algorithm, optimizer settings, batching,
        dropout, ...). The adapter's weights and AdamW state are kept; the algorithm is built
        again only if its name or parameters changed, and then its modules start again
        (:meth:`start` loads a checkpoint's)."""
        self.policy.configure(config)
        old, self.config = self.config, config
        if (config.algorithm, config.algorithm_params) != (old.algorithm,
                                                           old.algorithm_params):
            self.algorithm = make_algorithm(config.algorithm, config.algorithm_params)
            self.optimizers.set_modules(self._built_modules())
        self.budget.configure(config.micro_batch_tokens, config.gradient_checkpointing,
                              config.device_share, _probe_settings(config))
        self.optimizers.configure(_adam(config))

    def _built_modules(self) -> dict[str, Trained]:
        """The algorithm's modules at their start, drawn from torch streams of the seed."""
        with self.streams.seeded(self.config.seed):
            return self.algorithm.build(self.policy)

    # -- the update ---------------------------------------------------------------------------

    def update(self, batch: Batch) -> dict[str, Any]:
        """One update on ``batch``: ``minibatches * epochs`` optimizer steps (one by default)
        by :func:`ub.learner.update.update`, then one checkpoint's worth.

        :returns: the update's metrics (JSON-able): ``loss``, ``grad_norm`` (before clipping),
            token means (``logprob_mean``, ``entropy_mean``, ``approx_kl``, ...), maxima, the
            algorithm's statistics (their names in ``algorithm_statistics``), counts and
            timings. With several steps, float figures are means over the steps (maxima their
            maximum, plus ``grad_norm_max``) and counts are sums.
        :raises UbError: empty batch; a column the algorithm reads missing; a row longer than
            the learner's memory holds in one micro-batch (before any pass);
            :class:`NonFiniteError` for a NaN/inf loss or gradient, in which case nothing
            changed (weights, optimizers, RNG streams, update index), even if earlier steps
            of the update had been taken.
        """
        started = time.perf_counter()
        device = self.policy.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _check(batch, self.algorithm, self.config.algorithm)
        # What an update changes, to put back if it fails: the adapter's weights and AdamW
        # state only where a step can precede the failure (several steps).
        saved = (self.optimizers.snapshot(self.config.steps_per_update > 1),
                 self.streams.python.getstate())
        try:
            while True:
                try:
                    metrics, new_rng = self._run(batch, step=True)
                    break
                except torch.OutOfMemoryError as e:
                    message = " ".join(str(e).split())[:200]
                # (outside the except block: the error's frames, and the tensors they hold, are
                # gone) The same gradient at half the micro-batch, up to float summation order:
                # the loss's normaliser is the batch's.
                self._restore(saved)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                self.budget.halve(int(batch.lengths.max()), len(batch),
                                  self.update_index + 1, message, Ranks.current().world)
        except NonFiniteError as e:
            self._restore(saved)
            raise NonFiniteError(_non_finite(str(e), batch, self.update_index + 1,
                                             self.source)) from None
        except BaseException:
            self._restore(saved)
            raise
        finally:
            self.optimizers.zero_grad()
        self.streams.torch = new_rng
        self.update_index += 1
        seconds = time.perf_counter() - started
        metrics.update(
            micro_batch_tokens=self.budget.tokens(), update=self.update_index,
            algorithm=self.config.algorithm, seconds=seconds,
            tokens_per_second=metrics["tokens"] / seconds if seconds > 0 else 0.0,
            kernels=self.policy.kernels, liger_kernels=list(self.policy.liger_kernels),
            adapter_compute=adapter_compute_name(self.policy.adapter_compute),
            attention_kernel=self.policy.attention_kernel,
            pad_to_multiple=self.policy.pad_to_multiple, peak_rss_mb=_peak_rss_mb(),
            **_peak_device_memory(device))
        self.last_metrics = metrics
        return metrics

    def accumulate_gradients(self, batch: Batch) -> dict[str, Any]:
        """Zero the gradients, then forward and backward the whole batch (its first step's
        rows), micro-batch by micro-batch: afterwards each LoRA parameter's ``.grad`` is the
        full-batch gradient. No optimizer step, and the learner's RNG streams do not advance
        (a diagnostic: see :meth:`lora_gradients`). Returns the loss and token statistics.

        :raises UbError: as :meth:`update` (:class:`NonFiniteError`: the gradients zeroed).
        """
        _check(batch, self.algorithm, self.config.algorithm)
        py_state = self.streams.python.getstate()
        try:
            return self._run(batch, step=False)[0]
        except NonFiniteError as e:
            raise NonFiniteError(_non_finite(str(e), batch, self.update_index + 1,
                                             self.source)) from None
        finally:
            self.streams.python.setstate(py_state)

    def micro_batch_tokens(self) -> int | None:
        """The micro-batch token budget updates use (:class:`MicroBatchBudget`)."""
        return self.budget.tokens()

    def _run(self, batch: Batch, step: bool) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """:func:`~ub.learner.update.update` on the learner's streams, and where it left them."""
        with self.streams.own():
            _refuse_rows_too_long(self.budget, batch, self.config, self.update_index + 1)
            metrics = update(self.policy, self.optimizers, self.algorithm, batch, self.config,
                             rng=self.streams.python,
                             first_step=self.update_index * self.config.steps_per_update,
                             micro_batch_tokens=self.budget.tokens, ranks=Ranks.current(),
                             step=step)
            return metrics, self.streams.capture()

    def _restore(self, saved: tuple[Snapshot, Any]) -> None:
        self.optimizers.restore(saved[0])
        self.streams.python.setstate(saved[1])

    # -- reading the policy -------------------------------------------------------------------

    def token_logprobs(self, batch: Batch, micro_batch_size: int = 16) -> torch.Tensor:
        """(B, T) logprobs of each completion token under the current policy (0 elsewhere),
        aligned with ``batch.behaviour_logprobs``; no gradient, no state change."""
        return self.policy.score_batch(batch, micro_batch_size)[0]

    def measure(self, batch: Batch, micro_batch_size: int = 16) -> dict[str, torch.Tensor]:
        """The (B,) columns the algorithm adds (``Algorithm.adds``, e.g. a2c's ``values``) of
        ``batch``'s rows under the current weights; no gradient, no state change."""
        if not self.algorithm.adds:
            return {}
        return self.policy.score_batch(batch, micro_batch_size, self.algorithm.measure)[1]

    def lora_gradients(self) -> dict[str, torch.Tensor]:
        """Copies of the current ``.grad`` of each LoRA parameter (for tests and debugging)."""
        return {name: p.grad.detach().clone() for name, p in self.policy.params.items()
                if p.grad is not None}

    def lora_state(self) -> dict[str, torch.Tensor]:
        """Copies of the LoRA weights, by parameter name."""
        return self.policy.adapter_weights()

    # -- the training state: start and save ---------------------------------------------------

    def start(self, checkpoint: str | Path | None = None) -> None:
        """Load the state to train from.

        :param checkpoint: a ub checkpoint folder (adapter, the algorithm's modules, optimizer
            and RNG state, update index: training continues exactly); ``None``: a cold start
            from ``config.init_adapter`` or, without one, a fresh adapter, with new optimizers
            and modules and RNG streams seeded by ``config.seed``.
        :raises UbError: a checkpoint of another base model or LoRA shape, or of an algorithm
            that trained other modules; a missing or damaged file (named).
        """
        config = self.config
        if checkpoint is None:
            if config.init_adapter is not None:
                adapter_config, weights = read_adapter(config.init_adapter)
                where = f"init adapter {config.init_adapter}"
                check_compatible(where, self.policy.base_identity, _lora_of(adapter_config),
                                 self.policy.base_identity, config.lora)
                self.policy.load_adapter(weights, where)
            else:
                self.policy.fresh_adapter(config.seed)
            self.optimizers = Optimizers(self.policy.params, _adam(config),
                                         self._built_modules())
            self.streams.seed(config.seed)
            self.update_index, self.source, self.last_metrics = 0, config.init_adapter, {}
            return
        where = f"checkpoint {checkpoint}"
        state = read_checkpoint(checkpoint)
        check_compatible(where, state.base_model, state.lora, self.policy.base_identity,
                         config.lora)
        if state.base_model.get("path") != self.policy.base_identity["path"]:
            log.warning("%s was trained on %s, same config as %s: loading it", where,
                        state.base_model.get("path"), self.policy.base_identity["path"])
        self.policy.load_adapter(read_adapter(checkpoint)[1], where)
        self.optimizers = Optimizers(self.policy.params, _adam(config), self._built_modules())
        self.optimizers.load_modules(state.modules, where, state.learner_config.get("algorithm"))
        self.optimizers.load_state_tensors(state.optimizer, where)
        self.streams.load(state.rng, state.python_rng, where)
        self.update_index, self.source, self.last_metrics = state.update, str(checkpoint), \
            state.metrics

    def save(self, out_dir: str | Path, metrics: Mapping[str, Any] | None = None, *,
             overwrite: bool = False) -> Path:
        """Write the current state as a checkpoint folder (atomically); return its path.

        :param metrics: stored as ``metrics.json`` (default: the last update's metrics).
        :param overwrite: replace an existing folder (otherwise it is an error).
        """
        state = CheckpointState(
            update=self.update_index,
            base_model=self.policy.base_identity,
            lora=self.config.lora,
            optimizer=self.optimizers.state_tensors(),
            # (lr: the configured rate the schedule scales, as the record always said)
            optimizer_settings={"name": "adamw", "lr": self.config.learning_rate,
                                **_adam(self.config)},
            rng=self.streams.torch,
            python_rng=self.streams.python_json(),
            # The base model by its portable name, not this machine's path to it: a run's
            # checkpoints are the same bytes wherever it runs or resumes.
            learner_config={**self.config.to_dict(),
                            "base_model": self.policy.base_identity["path"]},
            metrics=dict(self.last_metrics if metrics is None else metrics),
            modules=self.optimizers.module_tensors(),
        )

        def write_adapter(folder: Path) -> None:
            self.policy.model.save_pretrained(str(folder), safe_serialization=True)

        return write_checkpoint(out_dir, state, write_adapter, overwrite=overwrite)


def _check(batch: Batch, algorithm: Algorithm, name: str) -> None:
    """Refuse a batch that is empty, inconsistent, or without a column ``algorithm`` reads."""
    batch.validate()
    for column in algorithm.reads:
        if getattr(batch, column) is None:
            raise UbError(f"algorithm {name!r} reads the batch's {column}, and this batch has "
                          f"none: assemble it from shards (ub.batch), or give the Batch its "
                          f"{column}")


def _refuse_rows_too_long(budget: MicroBatchBudget, batch: Batch, config: LearnerConfig,
                          update: int) -> None:
    """Refuse, before update ``update`` starts, a row longer than the budget holds."""
    trained = batch.completion_mask[:, 1:].sum(1) > 0
    if not bool(trained.any()):
        return
    advice = "" if config.gradient_checkpointing else ", or learner.gradient_checkpointing: true"
    if config.device_share is not None:
        advice += ", or lower engine.gpu_memory_utilization"
    budget.refuse_rows_too_long(int(batch.lengths[trained].max()), update, advice)


def _non_finite(what: str, batch: Batch, update: int, source: str | None) -> str:
    """What a non-finite update ``update`` says, and where to look."""
    hint = ("the batch has NaN/inf advantages: check the reward transforms"
            if not bool(torch.isfinite(batch.advantages).all()) else
            "lower learning_rate or max_grad_norm, or check the batch's advantages")
    return (f"update {update}: {what}; the update was stopped before changing anything "
            f"(nothing written, the last good state is {source or 'the cold start'}): {hint}")


def _adam(config: LearnerConfig) -> dict[str, Any]:
    """The adapter's AdamW settings besides its learning rate, which each step takes from the
    schedule (:meth:`Optimizers.step`): none is set here to be overwritten there."""
    return {"betas": tuple(config.betas), "eps": config.adam_eps,
            "weight_decay": config.weight_decay}


def _probe_settings(config: LearnerConfig) -> tuple[str, str]:
    """The settings besides the budget's own that ``micro_batch_tokens: auto``'s probe
    measures with (a change measures again)."""
    return config.adapter_compute, config.attention_kernel


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_device_memory(device: torch.device) -> dict[str, float]:
    """The GPU's peak allocated memory since the last reset (the update resets it)."""
    if device.type != "cuda":
        return {}
    return {"peak_gpu_gib": torch.cuda.max_memory_allocated(device) / 2**30}


def _lora_of(adapter_config: Mapping[str, Any]) -> LoraSettings:
    """The LoRA settings a PEFT adapter_config.json describes.

    Not validated: they describe a file to compare with the learner's settings
    (:func:`~ub.learner.base_identity.check_compatible` names what differs), and PEFT writes
    what the section would refuse (no targets, a regex)."""
    targets = adapter_config.get("target_modules") or []
    if isinstance(targets, str):  # PEFT allows a regex string; compare it verbatim
        targets = [targets]
    return LoraSettings.model_construct(rank=int(adapter_config.get("r", 8)),
                                        alpha=adapter_config.get("lora_alpha", 8),
                                        dropout=float(adapter_config.get("lora_dropout", 0.0)),
                                        target_modules=list(targets))


__all__ = ["Learner", "NonFiniteError"]
