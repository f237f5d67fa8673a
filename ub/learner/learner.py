"""The learner: a LoRA policy-gradient update on the stored token ids, one checkpoint per update.

    learner = Learner(LearnerConfig(base_model="runs/x/base"))   # loads the base model once
    learner.start("runs/x/checkpoints/update-000003")              # or None: a cold start
    metrics = learner.update(batch)                                # one update
    learner.save("runs/x/checkpoints/update-000004", metrics)

A :class:`Learner` is made of plain parts: the :class:`~ub.learner.policy.Policy` (the base
model with its adapter, and how it scores tokens), AdamW, the algorithm (built once, and again
only when its settings change), a :class:`~ub.learner.memory.MicroBatchBudget`, a
:class:`~ub.learner.value.ValueBaseline` for an algorithm that wants one, and the training
state a checkpoint holds (update index, RNG streams). The update itself is one function,
:func:`ub.learner.update.update`; :meth:`Learner.update` wraps it: rows too long for memory
are refused before it, an out-of-memory error retries it at half the micro-batch, and any
failure (a non-finite loss or gradient included) leaves the learner as it was.

The base model stays loaded across updates (a process keeps its learner in a
:class:`ub.run.processes.worker.Worker`); each :meth:`Learner.start` only swaps the small LoRA and
optimizer state. The entry points that write checkpoints are :mod:`ub.learner.entry`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import random
import resource
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ub.distributed import Ranks
from ub.errors import UbError
from ub.learner.algorithms import Algorithm, make_algorithm
from ub.learner.base_identity import check_compatible
from ub.learner.checkpoint import VALUE_HEAD_FILE, CheckpointState, read_adapter, read_checkpoint
from ub.learner.checkpoint_writer import write_checkpoint
from ub.learner.config import LearnerConfig
from ub.learner.memory import MicroBatchBudget
from ub.learner.policy import ADAPTER_NAME, Policy
from ub.learner.precision import adapter_compute_name
from ub.learner.update import NonFiniteError, update
from ub.learner.value import ValueBaseline
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
        self.value: ValueBaseline | None = None
        self.optimizer: torch.optim.AdamW | None = None
        self.update_index = 0
        self.source: str | None = None  # the checkpoint or adapter the state came from
        self.last_metrics: dict[str, Any] = {}
        self._torch_rng: dict[str, torch.Tensor] = {}
        self.py_rng = random.Random(config.seed)
        self.budget.configure(config.micro_batch_tokens, config.gradient_checkpointing,
                              config.device_share, _probe_settings(config))
        self.start(None)  # (makes the optimizer, and a value head where the algorithm wants one)

    # -- configuration -----------------------------------------------------------------------

    def same_model(self, config: LearnerConfig) -> bool:
        """True if ``config`` runs on this learner's loaded model (see :meth:`configure`)."""
        return self.policy.same_model(config)

    def configure(self, config: LearnerConfig) -> None:
        """Apply a new config that keeps the model (algorithm, optimizer settings, batching,
        dropout, ...). The optimizer state and the adapter weights are kept; the algorithm is
        built again only if its name or parameters changed."""
        self.policy.configure(config)
        old, self.config = self.config, config
        if (config.algorithm, config.algorithm_params) != (old.algorithm,
                                                           old.algorithm_params):
            self.algorithm = make_algorithm(config.algorithm, config.algorithm_params)
        if self.algorithm.needs_values != (self.value is not None):
            self.value = self._new_value_baseline()
        elif self.value is not None:  # the head is kept; its settings follow the algorithm's
            self.value.configure(*self._value_settings())
        self.budget.configure(config.micro_batch_tokens, config.gradient_checkpointing,
                              config.device_share, _probe_settings(config))
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group.update(self._optimizer_settings())

    def _new_value_baseline(self) -> ValueBaseline | None:
        if not self.algorithm.needs_values:
            return None
        return ValueBaseline(self.policy.hidden_size, self.policy.device,
                             *self._value_settings())

    def _value_settings(self) -> tuple[float, float]:
        """The value head's learning rate and ``value_coef``: the algorithm's attributes of
        those names (an algorithm of one's own without them: 1e-3 and 0)."""
        return (float(getattr(self.algorithm, "value_learning_rate", 1e-3)),
                float(getattr(self.algorithm, "value_coef", 0.0)))

    def _optimizer_settings(self) -> dict[str, Any]:
        c = self.config
        return {"lr": c.learning_rate, "betas": tuple(c.betas), "eps": c.adam_eps,
                "weight_decay": c.weight_decay}

    def _new_optimizer(self) -> torch.optim.AdamW:
        return torch.optim.AdamW(list(self.policy.params.values()), **self._optimizer_settings())

    # -- the update ---------------------------------------------------------------------------

    def update(self, batch: Batch) -> dict[str, Any]:
        """One update on ``batch``: ``minibatches * epochs`` optimizer steps (one by default)
        by :func:`ub.learner.update.update`, then one checkpoint's worth.

        :returns: the update's metrics (JSON-able): ``loss``, ``grad_norm`` (before clipping),
            token means (``logprob_mean``, ``behaviour_logprob_mean``, ``entropy_mean`` and the
            algorithm's, e.g. PPO's ``ratio_mean``, ``clip_fraction``, ``approx_kl``, and the
            truncated importance weights' ``tis_ratio_mean``, ``tis_capped_fraction``),
            maxima (``tis_ratio_max``, ``logprob_abs_diff_max``), a value head's ``value_mse``
            and ``value_mean`` (row means), counts and timings. With several steps, float
            figures are means over the steps (maxima their maximum, plus ``grad_norm_max``)
            and counts are sums.
        :raises UbError: empty batch; a row longer than the learner's memory holds in one
            micro-batch (before any pass); :class:`NonFiniteError` for a NaN/inf loss or gradient,
            in which case nothing changed (weights, optimizer, RNG streams, update index), even
            if earlier steps of the update had been taken.
        """
        assert self.optimizer is not None
        started = time.perf_counter()
        device = self.policy.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        batch.validate()
        saved = self._snapshot()
        try:
            while True:
                try:
                    with self._own_rng():
                        self._refuse_rows_too_long(batch)
                        metrics = update(
                            self.policy, self.optimizer, self.algorithm, batch, self.config,
                            rng=self.py_rng,
                            first_step=self.update_index * self.config.steps_per_update,
                            micro_batch_tokens=self.budget.tokens, ranks=Ranks.current(),
                            value=self.value)
                        new_rng = self._capture_rng()
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
            raise NonFiniteError(self._non_finite_message(str(e), batch)) from None
        except BaseException:
            self._restore(saved)
            raise
        finally:
            self.optimizer.zero_grad(set_to_none=True)
        self._torch_rng = new_rng
        self.update_index += 1
        seconds = time.perf_counter() - started
        metrics.update(
            micro_batch_tokens=self.budget.tokens(),
            update=self.update_index,
            algorithm=self.config.algorithm,
            seconds=seconds,
            tokens_per_second=metrics["tokens"] / seconds if seconds > 0 else 0.0,
            kernels=self.policy.kernels,
            liger_kernels=list(self.policy.liger_kernels),
            adapter_compute=adapter_compute_name(self.policy.adapter_compute),
            attention_kernel=self.policy.attention_kernel,
            pad_to_multiple=self.policy.pad_to_multiple,
            peak_rss_mb=_peak_rss_mb(),
            **_peak_device_memory(device),
        )
        self.last_metrics = metrics
        return metrics

    def accumulate_gradients(self, batch: Batch) -> dict[str, Any]:
        """Zero the gradients, then forward and backward the whole batch (its first step's
        rows), micro-batch by micro-batch: afterwards each LoRA parameter's ``.grad`` is the
        full-batch gradient. No optimizer step, and the learner's RNG streams do not advance
        (a diagnostic: see :meth:`lora_gradients`). Returns the loss and token statistics.

        :raises UbError: an empty batch, a row longer than the learner's memory holds, or a
            non-finite loss (:class:`NonFiniteError`; the gradients are then zeroed).
        """
        batch.validate()
        py_state = self.py_rng.getstate()
        try:
            with self._own_rng():
                self._refuse_rows_too_long(batch)
                return update(self.policy, None, self.algorithm, batch, self.config,
                              rng=self.py_rng,
                              first_step=self.update_index * self.config.steps_per_update,
                              micro_batch_tokens=self.budget.tokens, ranks=Ranks.current(),
                              value=self.value)
        except NonFiniteError as e:
            raise NonFiniteError(self._non_finite_message(str(e), batch)) from None
        finally:
            self.py_rng.setstate(py_state)

    def micro_batch_tokens(self) -> int | None:
        """The micro-batch token budget updates use (:class:`MicroBatchBudget`)."""
        return self.budget.tokens()

    def _refuse_rows_too_long(self, batch: Batch) -> None:
        trained = batch.completion_mask[:, 1:].sum(1) > 0
        if not bool(trained.any()):
            return
        advice = "" if self.config.gradient_checkpointing else \
            ", or learner.gradient_checkpointing: true"
        if self.config.device_share is not None:
            advice += ", or lower engine.gpu_memory_utilization"
        self.budget.refuse_rows_too_long(int(batch.lengths[trained].max()),
                                         self.update_index + 1, advice)

    def _non_finite_message(self, what: str, batch: Batch) -> str:
        hint = ("the batch has NaN/inf advantages: check the reward transforms"
                if not bool(torch.isfinite(batch.advantages).all()) else
                "lower learning_rate or max_grad_norm, or check the batch's advantages")
        return (f"update {self.update_index + 1}: {what}; the update was stopped before "
                f"changing anything (nothing written, the last good state is "
                f"{self.source or 'the cold start'}): {hint}")

    def _snapshot(self) -> tuple[Any, ...]:
        """What an update changes, to put back if it fails. The weights and optimizer state
        only where a step can precede the failure (several steps, or a value head's step):
        one step fails before it changes them, and a copy of a large adapter's AdamW state
        costs memory on the GPU."""
        assert self.optimizer is not None
        weights = (self.lora_state(), copy.deepcopy(self.optimizer.state_dict())) \
            if self.config.steps_per_update > 1 else None
        value = None if self.value is None else (
            self.value.weights(), copy.deepcopy(self.value.optimizer.state_dict()))
        return weights, value, self.py_rng.getstate()

    def _restore(self, saved: tuple[Any, ...]) -> None:
        weights, value, py_state = saved
        assert self.optimizer is not None
        if weights is not None:
            with torch.no_grad():
                for name, tensor in weights[0].items():
                    self.policy.params[name].copy_(tensor)
            self.optimizer.load_state_dict(weights[1])
        self.optimizer.zero_grad(set_to_none=True)
        if self.value is not None and value is not None:
            self.value.load_weights(value[0], "the update's snapshot")
            self.value.optimizer.load_state_dict(value[1])
            self.value.optimizer.zero_grad(set_to_none=True)
        self.py_rng.setstate(py_state)

    # -- reading the policy -------------------------------------------------------------------

    def token_logprobs(self, batch: Batch, micro_batch_size: int = 16) -> torch.Tensor:
        """(B, T) logprobs of each completion token under the current policy (0 elsewhere),
        aligned with ``batch.behaviour_logprobs``; no gradient, no state change."""
        return self.policy.score_batch(batch, micro_batch_size)[0]

    def values(self, batch: Batch, micro_batch_size: int = 16) -> torch.Tensor:
        """(B,) the value head's estimates of the rows' returns (a value baseline only)."""
        if self.value is None:
            raise UbError(f"algorithm {self.config.algorithm!r} has no value head")
        values = self.policy.score_batch(batch, micro_batch_size, self.value.head)[1]
        assert values is not None
        return values

    def lora_gradients(self) -> dict[str, torch.Tensor]:
        """Copies of the current ``.grad`` of each LoRA parameter (for tests and debugging)."""
        return {name: p.grad.detach().clone() for name, p in self.policy.params.items()
                if p.grad is not None}

    def lora_state(self) -> dict[str, torch.Tensor]:
        """Copies of the LoRA weights, by parameter name."""
        return {name: p.detach().clone() for name, p in self.policy.params.items()}

    # -- the training state: start and save ---------------------------------------------------

    def start(self, checkpoint: str | Path | None = None) -> None:
        """Load the state to train from.

        :param checkpoint: a ub checkpoint folder (adapter, optimizer and RNG state, update
            index: training continues exactly); ``None``: a cold start from
            ``config.init_adapter`` or, without one, a fresh adapter, with a new optimizer and
            RNG streams seeded by ``config.seed``.
        :raises UbError: a checkpoint of another base model or LoRA shape, a missing or
            damaged file (named).
        """
        if checkpoint is None:
            self._cold_start()
            return
        where = f"checkpoint {checkpoint}"
        state = read_checkpoint(checkpoint)
        check_compatible(where, state.base_model, state.lora, self.policy.base_identity,
                         self.config.lora)
        if state.base_model.get("path") != self.policy.base_identity["path"]:
            log.warning("%s was trained on %s, same config as %s: loading it", where,
                        state.base_model.get("path"), self.policy.base_identity["path"])
        _, weights = read_adapter(checkpoint)
        self._load_adapter_weights(weights, where)
        self.optimizer = self._new_optimizer()
        self.value = self._new_value_baseline()
        if self.value is not None:
            if not state.value_head:
                raise UbError(f"{where} has no value head ({VALUE_HEAD_FILE}): it was trained "
                              f"by {state.learner_config.get('algorithm')!r}, not an algorithm "
                              "with a value baseline; start a2c from its adapter instead "
                              "(learner.init_adapter)")
            self.value.load_weights(state.value_head, where)
        self._load_optimizer_state(state.optimizer, where)
        self._torch_rng = {k: v.clone() for k, v in state.rng.items()}
        self.py_rng = _python_rng(state.python_rng, where)
        self.update_index = state.update
        self.source = str(checkpoint)
        self.last_metrics = state.metrics

    def _cold_start(self) -> None:
        config = self.config
        if config.init_adapter is not None:
            adapter_config, weights = read_adapter(config.init_adapter)
            where = f"init adapter {config.init_adapter}"
            check_compatible(where, self.policy.base_identity, _lora_of(adapter_config),
                             self.policy.base_identity, config.lora)
            self._load_adapter_weights(weights, where)
        else:
            # PEFT's default LoRA initialisation (A ~ kaiming uniform, B = 0), from our seed.
            generator = torch.Generator().manual_seed(config.seed)
            with torch.no_grad():
                for name, p in self.policy.params.items():
                    if ".lora_A." in name:
                        w = torch.empty(p.shape, dtype=torch.float32)
                        torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
                        p.copy_(w)
                    else:
                        p.zero_()
        self.optimizer = self._new_optimizer()
        self.value = self._new_value_baseline()
        self._torch_rng = {"torch_cpu": torch.Generator().manual_seed(config.seed).get_state()}
        if self.policy.device.type == "cuda":
            with torch.random.fork_rng(devices=self.policy.rng_devices()), torch.cuda.device(
                    self.policy.device):
                torch.cuda.manual_seed(config.seed)
                self._torch_rng["torch_cuda"] = torch.cuda.get_rng_state(self.policy.device)
        self.py_rng = random.Random(config.seed)
        self.update_index = 0
        self.source = config.init_adapter
        self.last_metrics = {}

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
            optimizer=self._optimizer_tensors(),
            optimizer_settings={"name": "adamw", **self._optimizer_settings()},
            rng=self._torch_rng,
            python_rng=_python_rng_json(self.py_rng),
            # The base model by its portable name, not this machine's path to it: a run's
            # checkpoints are the same bytes wherever it runs or resumes.
            learner_config={**self.config.to_dict(),
                            "base_model": self.policy.base_identity["path"]},
            metrics=dict(self.last_metrics if metrics is None else metrics),
            value_head={} if self.value is None else self.value.weights(),
        )

        def write_adapter(folder: Path) -> None:
            self.policy.model.save_pretrained(str(folder), safe_serialization=True)

        return write_checkpoint(out_dir, state, write_adapter, overwrite=overwrite)

    def _load_adapter_weights(self, weights: Mapping[str, torch.Tensor], where: str) -> None:
        """Copy PEFT-format adapter tensors into the LoRA parameters, checking names/shapes."""
        expected = {_file_key(name): name for name in self.policy.params}
        missing = sorted(set(expected) - set(weights))
        extra = sorted(set(weights) - set(expected))
        if missing or extra:
            example = (missing or extra)[0]
            raise UbError(f"{where} does not fit the learner's LoRA modules ({len(missing)} "
                          f"missing, {len(extra)} unexpected tensors, e.g. {example}): it was "
                          "trained with other target modules or on another model")
        for key, name in expected.items():
            if tuple(weights[key].shape) != tuple(self.policy.params[name].shape):
                raise UbError(f"{where}: {key} has shape {tuple(weights[key].shape)}, the "
                              f"learner expects {tuple(self.policy.params[name].shape)}: it was "
                              "trained on another base model or LoRA rank")
        with torch.no_grad():
            for key, name in expected.items():
                self.policy.params[name].copy_(weights[key])

    def _trained_params(self) -> Iterator[tuple[str, torch.nn.Parameter, torch.optim.AdamW]]:
        """Every trained parameter by its saved name, with the optimizer that steps it."""
        assert self.optimizer is not None
        for name, p in self.policy.params.items():
            yield name, p, self.optimizer
        if self.value is not None:
            for name, p in self.value.params().items():
                yield name, p, self.value.optimizer

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        for name, p, optimizer in self._trained_params():
            state = optimizer.state.get(p, {})
            for key in ("step", "exp_avg", "exp_avg_sq"):
                if key in state:
                    tensors[f"{key}/{name}"] = state[key]
        return tensors

    def _load_optimizer_state(self, tensors: Mapping[str, torch.Tensor], where: str) -> None:
        names = set()
        for name, p, optimizer in self._trained_params():
            names.add(name)
            keys = [f"{k}/{name}" for k in ("step", "exp_avg", "exp_avg_sq")]
            present = [k in tensors for k in keys]
            if not any(present):
                continue  # no update yet: AdamW initialises the state at its first step
            if not all(present):
                raise UbError(f"{where}: optimizer.safetensors has a partial state for {name}: "
                              "the checkpoint is damaged")
            step, exp_avg, exp_avg_sq = (tensors[k] for k in keys)
            if exp_avg.shape != p.shape:
                raise UbError(f"{where}: optimizer state of {name} has shape "
                              f"{tuple(exp_avg.shape)}, the parameter {tuple(p.shape)}")
            # AdamW keeps a float32 CPU step tensor (non-capturable) and moments like the param.
            optimizer.state[p] = {
                "step": step.clone(),
                "exp_avg": exp_avg.to(p.device, p.dtype).clone(),
                "exp_avg_sq": exp_avg_sq.to(p.device, p.dtype).clone(),
            }
        unknown = {k.split("/", 1)[1] for k in tensors} - names
        if unknown:
            raise UbError(f"{where}: optimizer.safetensors has state for unknown parameters "
                          f"(e.g. {sorted(unknown)[0]})")

    # -- RNG streams ------------------------------------------------------------------------

    def _capture_rng(self) -> dict[str, torch.Tensor]:
        states = {"torch_cpu": torch.get_rng_state()}
        if self.policy.device.type == "cuda":
            states["torch_cuda"] = torch.cuda.get_rng_state(self.policy.device)
        return states

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Run the block on the learner's torch RNG streams, leaving the process's untouched."""
        with torch.random.fork_rng(devices=self.policy.rng_devices()):
            self._set_rng(self._torch_rng)
            yield

    def _set_rng(self, states: Mapping[str, torch.Tensor]) -> None:
        """Put the process's torch RNG streams at ``states`` (as :meth:`_capture_rng` took)."""
        torch.set_rng_state(states["torch_cpu"])
        if "torch_cuda" in states and self.policy.device.type == "cuda":
            torch.cuda.set_rng_state(states["torch_cuda"], self.policy.device)




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


def _file_key(param_name: str) -> str:
    """A LoRA parameter name as PEFT saves it (without the adapter name)."""
    return param_name.replace(f".{ADAPTER_NAME}.", ".")


def _python_rng_json(rng: random.Random) -> list[Any]:
    version, internal, gauss_next = rng.getstate()
    return [version, list(internal), gauss_next]


def _python_rng(state: list[Any], where: str) -> random.Random:
    rng = random.Random()
    try:
        version, internal, gauss_next = state
        rng.setstate((version, tuple(internal), gauss_next))
    except (TypeError, ValueError) as e:
        raise UbError(f"{where}: the python_rng state in ub_checkpoint.json is damaged") from e
    return rng


__all__ = ["Learner", "NonFiniteError"]
