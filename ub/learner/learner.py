"""The learner: a LoRA policy-gradient update on the stored token ids, one checkpoint per update.

    learner = Learner(LearnerConfig(base_model="runs/x/base"))   # loads the base model once
    learner.start("runs/x/checkpoints/update-000003")              # or None: a cold start
    metrics = learner.update(batch)                                # one optimizer step
    learner.save("runs/x/checkpoints/update-000004", metrics)

or, in one call that also assembles the batch and reuses a committed output,
:func:`learn_step`. What one update does, in order:

1. ``algorithm.prepare`` sees the whole batch (it may transform advantages).
2. Rows without completion tokens, and (for losses linear in the advantage) rows whose advantage
   is 0, are left out: they carry no gradient.
3. The rest is cut into micro-batches of similar length (:func:`plan_micro_batches`); each is
   trimmed to its longest row.
4. Per micro-batch: the model scores every completion token ``t`` with the logits at ``t - 1``
   (``log_softmax(logits / temperature)`` in float32, the distribution the token was sampled
   from); the algorithm's loss (a token sum over the constant ``B * L``) is back-propagated,
   so gradients accumulate to exactly the full-batch gradient.
5. The global gradient norm is clipped and AdamW steps. A non-finite loss or gradient stops the
   update with :class:`UbError` before any weight changes.

The base model stays loaded across updates (:func:`get_learner` keeps one per process); each
:meth:`Learner.start` only swaps the small LoRA and optimizer state.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import logging
import math
import random
import resource
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ub.errors import UbError
from ub.faults import fault_point
from ub.learner.algorithms import Algorithm, TokenBatch, make_algorithm
from ub.learner.batching import TrainBatch, plan_micro_batches
from ub.learner.checkpoint import (
    CheckpointState,
    check_compatible,
    is_checkpoint,
    model_identity,
    read_adapter,
    read_checkpoint,
    read_metrics,
    write_checkpoint,
)
from ub.learner.config import LearnerConfig
from ub.learner.distributed import barrier, gather, rank_and_world, sum_gradients
from ub.model.lora import LoraSettings

log = logging.getLogger(__name__)

ADAPTER_NAME = "default"  # PEFT's name for the single adapter
# Model types whose causal-LM forward is exactly ``lm_head(decoder(x))``: for them only the
# completion positions go through the output layer (prompt logits are never needed, and the
# output layer is a large share of a small model's compute and of any model's memory). Others
# (e.g. with logit soft-capping or scaling) run their own full forward.
PLAIN_LM_HEAD_MODELS = frozenset({"qwen2", "qwen3", "llama", "mistral", "qwen2_moe",
                                  "qwen3_moe", "phi3", "olmo2"})


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        gpu_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if gpu_bf16 else torch.float32
    return getattr(torch, name)


def resolve_attention(name: str, device: torch.device, dtype: torch.dtype) -> str:
    if name != "auto":
        return name
    # FlashAttention-2 runs on a GPU in 16-bit dtypes only.
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


class NonFiniteError(UbError):
    """The loss or the gradient of an update is NaN or infinite (nothing was changed)."""


class Learner:
    """A PEFT LoRA policy on a base model loaded once, with its AdamW state and RNG streams.

    :param config: see :class:`LearnerConfig`. The model fields (``base_model``, ``dtype``,
        ``attn_implementation``, ``device``, LoRA rank/alpha/targets) are fixed for the life of
        the learner; the others can change between updates with :meth:`configure`.

    After construction the learner is at a cold start (``config.init_adapter`` or a fresh
    adapter); :meth:`start` moves it to a checkpoint.
    """

    def __init__(self, config: LearnerConfig) -> None:
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM

        config.validate()
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.attn_implementation = resolve_attention(config.attn_implementation, self.device,
                                                     self.dtype)
        if config.num_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        self.base_identity = model_identity(config.base_model)

        started = time.perf_counter()
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a per-load bar in every round's log is noise
        try:
            base = AutoModelForCausalLM.from_pretrained(
                config.base_model, dtype=self.dtype, attn_implementation=self.attn_implementation)
        except (OSError, ValueError) as e:
            raise UbError(f"cannot load base model {config.base_model}: "
                          f"{' '.join(str(e).split())[:300]}") from e
        base.to(self.device)
        base.config.use_cache = False  # training: no KV cache
        base.requires_grad_(False)
        # PEFT draws its own initial A from the global RNG: fork it so that loading a learner
        # does not move the caller's random streams (the fresh weights are re-drawn in start()).
        with torch.random.fork_rng(devices=[]):
            self.model = get_peft_model(base, config.lora.peft_config())
        self.causal_lm = self.model.get_base_model()
        self.params: dict[str, torch.nn.Parameter] = {
            name: p for name, p in self.model.named_parameters() if p.requires_grad}
        if not self.params:
            raise UbError(f"LoRA targets {list(config.lora.target_modules)} match no module of "
                          f"{config.base_model}: set lora.target_modules")
        for p in self.params.values():  # adapters train in float32 whatever the base dtype
            p.data = p.data.float()
        self._plain_head = getattr(self.causal_lm.config, "model_type", "") in \
            PLAIN_LM_HEAD_MODELS and hasattr(self.causal_lm, "model")
        self.load_seconds = time.perf_counter() - started

        self.algorithm: Algorithm = make_algorithm(config.algorithm, config.algorithm_params)
        self.optimizer: torch.optim.AdamW | None = None
        self.update_index = 0
        self.source: str | None = None  # the checkpoint or adapter the state came from
        self.last_metrics: dict[str, Any] = {}
        self._torch_rng: dict[str, torch.Tensor] = {}
        self.py_rng = random.Random(config.seed)
        self._apply_settings()
        self.start(None)

    # -- configuration -----------------------------------------------------------------------

    def same_model(self, config: LearnerConfig) -> bool:
        """True if ``config`` runs on this learner's loaded model (see :meth:`configure`)."""
        mine, theirs = self.config, config
        return (mine.base_model == theirs.base_model and mine.dtype == theirs.dtype
                and mine.attn_implementation == theirs.attn_implementation
                and mine.device == theirs.device
                and _lora_shape(mine.lora) == _lora_shape(theirs.lora))

    def configure(self, config: LearnerConfig) -> None:
        """Apply a new config that keeps the model (algorithm, optimizer settings, batching,
        dropout, ...). The optimizer state and the adapter weights are kept."""
        config.validate()
        if not self.same_model(config):
            raise UbError("the new learner config changes the model (base model, dtype, "
                          "attention, device or LoRA shape): create a new Learner")
        self.config = config
        self.algorithm = make_algorithm(config.algorithm, config.algorithm_params)
        self._apply_settings()

    def _apply_settings(self) -> None:
        config = self.config
        # LoRA dropout, in place (PEFT makes nn.Identity for p = 0, nn.Dropout otherwise).
        p = config.lora.dropout
        for module in self.model.modules():
            dropouts = getattr(module, "lora_dropout", None)
            if isinstance(dropouts, torch.nn.ModuleDict) and ADAPTER_NAME in dropouts:
                dropouts[ADAPTER_NAME] = torch.nn.Dropout(p) if p > 0 else torch.nn.Identity()
        self.model.peft_config[ADAPTER_NAME].lora_dropout = p  # saved in adapter_config.json
        if config.gradient_checkpointing:
            # Non-reentrant checkpointing needs no input that requires grad (the embeddings
            # are frozen) and works with the decoder called directly.
            self.causal_lm.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        elif self.causal_lm.is_gradient_checkpointing:
            self.causal_lm.gradient_checkpointing_disable()
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group.update(self._optimizer_settings())

    def _optimizer_settings(self) -> dict[str, Any]:
        c = self.config
        return {"lr": c.learning_rate, "betas": tuple(c.betas), "eps": c.adam_eps,
                "weight_decay": c.weight_decay}

    def _new_optimizer(self) -> torch.optim.AdamW:
        return torch.optim.AdamW(list(self.params.values()), **self._optimizer_settings())

    # -- state: start / save -----------------------------------------------------------------

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
        check_compatible(where, state.base_model, state.lora, self.base_identity,
                         self.config.lora)
        if state.base_model.get("path") != self.base_identity["path"]:
            log.warning("%s was trained on %s, same config as %s: loading it", where,
                        state.base_model.get("path"), self.base_identity["path"])
        _, weights = read_adapter(checkpoint)
        self._load_adapter_weights(weights, where)
        self.optimizer = self._new_optimizer()
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
            check_compatible(where, self.base_identity, _lora_of(adapter_config),
                             self.base_identity, config.lora)
            self._load_adapter_weights(weights, where)
        else:
            # PEFT's default LoRA initialisation (A ~ kaiming uniform, B = 0), from our seed.
            generator = torch.Generator().manual_seed(config.seed)
            with torch.no_grad():
                for name, p in self.params.items():
                    if ".lora_A." in name:
                        w = torch.empty(p.shape, dtype=torch.float32)
                        torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
                        p.copy_(w)
                    else:
                        p.zero_()
        self.optimizer = self._new_optimizer()
        self._torch_rng = {"torch_cpu": torch.Generator().manual_seed(config.seed).get_state()}
        if self.device.type == "cuda":
            with torch.random.fork_rng(devices=self._rng_devices()), torch.cuda.device(
                    self.device):
                torch.cuda.manual_seed(config.seed)
                self._torch_rng["torch_cuda"] = torch.cuda.get_rng_state(self.device)
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
            base_model=self.base_identity,
            lora=self.config.lora,
            optimizer=self._optimizer_tensors(),
            optimizer_settings={"name": "adamw", **self._optimizer_settings()},
            rng=self._torch_rng,
            python_rng=_python_rng_json(self.py_rng),
            # The base model by its portable name, not this machine's path to it: a run's
            # checkpoints are the same bytes wherever it runs or resumes.
            learner_config={**self.config.to_dict(), "base_model": self.base_identity["path"]},
            metrics=dict(self.last_metrics if metrics is None else metrics),
        )

        def write_adapter(folder: Path) -> None:
            self.model.save_pretrained(str(folder), safe_serialization=True)

        return write_checkpoint(out_dir, state, write_adapter, overwrite=overwrite)

    def _load_adapter_weights(self, weights: Mapping[str, torch.Tensor], where: str) -> None:
        """Copy PEFT-format adapter tensors into the LoRA parameters, checking names/shapes."""
        expected = {_file_key(name): name for name in self.params}
        missing = sorted(set(expected) - set(weights))
        extra = sorted(set(weights) - set(expected))
        if missing or extra:
            example = (missing or extra)[0]
            raise UbError(f"{where} does not fit the learner's LoRA modules ({len(missing)} "
                          f"missing, {len(extra)} unexpected tensors, e.g. {example}): it was "
                          "trained with other target modules or on another model")
        for key, name in expected.items():
            if tuple(weights[key].shape) != tuple(self.params[name].shape):
                raise UbError(f"{where}: {key} has shape {tuple(weights[key].shape)}, the "
                              f"learner expects {tuple(self.params[name].shape)}: it was "
                              "trained on another base model or LoRA rank")
        with torch.no_grad():
            for key, name in expected.items():
                self.params[name].copy_(weights[key])

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        assert self.optimizer is not None
        for name, p in self.params.items():
            state = self.optimizer.state.get(p, {})
            for key in ("step", "exp_avg", "exp_avg_sq"):
                if key in state:
                    tensors[f"{key}/{name}"] = state[key]
        return tensors

    def _load_optimizer_state(self, tensors: Mapping[str, torch.Tensor], where: str) -> None:
        assert self.optimizer is not None
        for name, p in self.params.items():
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
            self.optimizer.state[p] = {
                "step": step.clone(),
                "exp_avg": exp_avg.to(p.device, p.dtype).clone(),
                "exp_avg_sq": exp_avg_sq.to(p.device, p.dtype).clone(),
            }
        unknown = {k.split("/", 1)[1] for k in tensors} - set(self.params)
        if unknown:
            raise UbError(f"{where}: optimizer.safetensors has state for unknown parameters "
                          f"(e.g. {sorted(unknown)[0]})")

    # -- RNG streams ------------------------------------------------------------------------

    def _rng_devices(self) -> list[int]:
        return [self.device.index or 0] if self.device.type == "cuda" else []

    def _capture_rng(self) -> dict[str, torch.Tensor]:
        states = {"torch_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            states["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        return states

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Run the block on the learner's torch RNG streams, leaving the process's untouched."""
        with torch.random.fork_rng(devices=self._rng_devices()):
            torch.set_rng_state(self._torch_rng["torch_cpu"])
            if "torch_cuda" in self._torch_rng and self.device.type == "cuda":
                torch.cuda.set_rng_state(self._torch_rng["torch_cuda"], self.device)
            yield

    # -- scoring ------------------------------------------------------------------------------

    def _score(self, input_ids: torch.Tensor, scored: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprob and entropy of each scored token, flattened in row-major order.

        :param input_ids: (b, L) right-padded ids on the model's device.
        :param scored: (b, L - 1) bool: position ``j`` scores token ``input_ids[:, j + 1]``
            with the logits at ``j``.
        """
        inputs = input_ids[:, :-1]
        # No attention mask: rows are right-padded and attention is causal, so a real token
        # never sees padding; without a mask, attention takes its fast causal path.
        if self._plain_head:
            hidden = self.causal_lm.model(input_ids=inputs, use_cache=False).last_hidden_state
            logits = self.causal_lm.lm_head(hidden[scored])
        else:
            logits = self.model(input_ids=inputs, use_cache=False).logits[scored]
        logits = logits.float()
        if self.config.temperature != 1.0:
            logits = logits / self.config.temperature
        logprobs = torch.log_softmax(logits, dim=-1)
        targets = input_ids[:, 1:][scored]
        token_logprobs = logprobs.gather(-1, targets[:, None]).squeeze(-1)
        with torch.no_grad():  # in chunks: (tokens x vocab) temporaries are large for big vocabs
            entropy = torch.cat([-(chunk.exp() * chunk).sum(-1)
                                 for chunk in logprobs.detach().split(1024)]) \
                if len(logprobs) else logprobs.new_zeros(0)
        return token_logprobs, entropy

    @torch.no_grad()
    def token_logprobs(self, batch: Any, micro_batch_size: int = 16) -> torch.Tensor:
        """(B, T) logprobs of each completion token under the current policy (0 elsewhere),
        aligned with ``batch.behaviour_logprobs``; no gradient, no state change."""
        batch = TrainBatch.from_batch(batch)
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(batch), micro_batch_size):
                rows = list(range(start, min(start + micro_batch_size, len(batch))))
                mb = batch.select(rows)
                scored = mb.completion_mask[:, 1:].bool()
                if not scored.any():
                    continue
                logp, _ = self._score(mb.input_ids.to(self.device), scored.to(self.device))
                width = mb.input_ids.shape[1]
                block = torch.zeros(len(rows), width - 1)
                block[scored] = logp.float().cpu()
                out[start:start + len(rows), 1:width] = block
        finally:
            self.model.train(was_training)
        return out

    # -- the update -------------------------------------------------------------------------

    def accumulate_gradients(self, batch: Any) -> dict[str, Any]:
        """Zero the gradients, then forward and backward the whole batch, micro-batch by
        micro-batch: afterwards each LoRA parameter's ``.grad`` is the full-batch gradient.
        No optimizer step, and the learner's RNG streams do not advance (a diagnostic: see
        :meth:`lora_gradients`). Returns the loss and token statistics.

        :raises UbError: an empty batch, or a non-finite loss (:class:`NonFiniteError`; the
            gradients are then zeroed).
        """
        py_state = self.py_rng.getstate()
        try:
            with self._own_rng():
                return self._accumulate(batch)
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

        has_tokens = batch.completion_mask[:, 1:].sum(1) > 0
        if not self.algorithm.needs_zero_advantage_rows:
            has_tokens &= batch.advantages != 0
        rows = torch.nonzero(has_tokens).flatten().tolist()
        lengths = batch.lengths.tolist()
        groups = plan_micro_batches([lengths[r] for r in rows], config.micro_batch_tokens,
                                    config.micro_batch_size)

        self.model.train()
        for p in self.params.values():
            p.grad = None
        # Statistics stay on the device until the end: one host sync per update, not per
        # micro-batch (which matters on a GPU).
        losses: list[torch.Tensor] = []
        totals: dict[str, torch.Tensor] = {}
        diff_max = torch.zeros((), device=self.device)
        tokens = padded = 0
        # Data-parallel (ub.learner.distributed): this rank's share of the micro-batches.
        rank, world = rank_and_world()
        for group in groups[rank::world]:
            batch_rows = [rows[i] for i in group]
            mb = batch.select(batch_rows)
            input_ids = mb.input_ids.to(self.device)
            scored = mb.completion_mask[:, 1:].to(self.device) > 0
            logprobs, entropy = self._score(input_ids, scored)
            row_ids = torch.tensor(batch_rows, device=self.device)[:, None].expand_as(scored)
            token_batch = TokenBatch(
                logprobs=logprobs,
                behaviour_logprobs=mb.behaviour_logprobs[:, 1:].to(self.device)[scored].float(),
                advantages=mb.advantages.to(self.device)[:, None].expand_as(scored)[scored]
                .float(),
                rows=row_ids[scored],
                normalizer=normalizer,
            )
            loss, stats = self.algorithm.loss(token_batch)
            # A NaN loss only spoils the gradients, which are dropped below before any step.
            loss.backward()
            fault_point("learn.mid-update")

            # Bookkeeping: token sums, divided by the token count at the end.
            losses.append(loss.detach())
            tokens += int(mb.lengths.sum())
            padded += int(mb.input_ids.numel())
            with torch.no_grad():
                sums = {
                    "logprob_mean": logprobs.detach().sum(),
                    "behaviour_logprob_mean": token_batch.behaviour_logprobs.sum(),
                    "entropy_mean": entropy.sum(),
                    "completion_tokens": scored.sum(),
                    **stats,
                }
                for key, value in sums.items():
                    totals[key] = totals.get(key, 0.0) + value.detach().double()
                diff_max = torch.maximum(
                    diff_max, (logprobs.detach() - token_batch.behaviour_logprobs).abs().max())

        if world > 1:  # every rank gets every rank's figures (and checks the same losses)
            losses, totals, diff_max, tokens, padded = _merge_ranks(
                losses, totals, diff_max, tokens, padded)
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
        metrics.update({k: v / completion_tokens if completion_tokens else 0.0
                        for k, v in sums_host.items()})
        diff_max = float(diff_max)
        metrics.update(
            logprob_abs_diff_max=diff_max,
            rows=rows_total,
            rows_trained=len(rows),
            completion_tokens=completion_tokens,
            tokens=tokens,
            padded_tokens=padded,
            padding_fraction=1.0 - tokens / padded if padded else 0.0,
            micro_batches=len(groups),
            normalizer=normalizer,
        )
        return metrics

    def update(self, batch: Any) -> dict[str, Any]:
        """One update on ``batch`` (a :class:`ub.batch.Batch` or :class:`TrainBatch`):
        ``minibatches * epochs`` optimizer steps (one by default), then one checkpoint's worth.

        :returns: the update's metrics (JSON-able): ``loss``, ``grad_norm`` (before clipping),
            token means (``logprob_mean``, ``behaviour_logprob_mean``, ``entropy_mean`` and the
            algorithm's, e.g. PPO's ``ratio_mean``, ``clip_fraction``, ``approx_kl``), counts
            and timings. With several steps, float figures are means over the steps (plus
            ``grad_norm_max``) and counts are sums.
        :raises UbError: empty batch; :class:`NonFiniteError` for a NaN/inf loss or gradient,
            in which case nothing changed (weights, optimizer, RNG streams, update index), even
            if earlier steps of the update had been taken.
        """
        assert self.optimizer is not None
        started = time.perf_counter()
        py_state = self.py_rng.getstate()
        steps = self.config.minibatches * self.config.epochs
        # Several steps: keep what the first one changes, so a failed later step undoes all.
        saved = (self.lora_state(), copy.deepcopy(self.optimizer.state_dict())) \
            if steps > 1 else None
        try:
            with self._own_rng():
                full = TrainBatch.from_batch(batch)
                first = self.update_index * steps  # optimizer steps taken since the cold start
                per_step = [self._step(full if rows is None else full.select(rows), first + k)
                            for k, rows in enumerate(self._minibatch_rows(len(full)))]
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
            seconds=seconds,
            tokens_per_second=metrics["tokens"] / seconds if seconds > 0 else 0.0,
            peak_rss_mb=_peak_rss_mb(),
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
        warmup = self.config.warmup_steps
        scale = min(1.0, (step + 1) / warmup) if warmup else 1.0
        return self.config.learning_rate * scale

    def _step(self, batch: TrainBatch, step: int) -> dict[str, Any]:
        """Gradients of ``batch``, clipped, and optimizer step number ``step``."""
        metrics = self._accumulate(batch)
        max_norm = self.config.max_grad_norm
        grad_norm = float(torch.nn.utils.clip_grad_norm_(
            list(self.params.values()), max_norm if max_norm is not None else math.inf))
        if not math.isfinite(grad_norm):
            raise NonFiniteError(self._non_finite_message(
                f"the gradient norm is {grad_norm}", batch))
        learning_rate = self._learning_rate(step)
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
            merged[key] = merged.get(key, 0.0) + torch.tensor(value, dtype=torch.float64)
    return ([torch.tensor(x) for part in parts for x in part[0]], merged,
            torch.tensor(max(part[2] for part in parts)), sum(part[3] for part in parts),
            sum(part[4] for part in parts))


def _lora_shape(lora: LoraSettings) -> tuple[Any, ...]:
    return lora.rank, lora.alpha, tuple(sorted(lora.target_modules))


def _lora_of(adapter_config: Mapping[str, Any]) -> LoraSettings:
    """The LoRA settings a PEFT adapter_config.json describes."""
    targets = adapter_config.get("target_modules") or ()
    if isinstance(targets, str):  # PEFT allows a regex string; compare it verbatim
        targets = (targets,)
    return LoraSettings(rank=int(adapter_config.get("r", 8)),
                        alpha=adapter_config.get("lora_alpha", 8),
                        dropout=float(adapter_config.get("lora_dropout", 0.0)),
                        target_modules=tuple(targets))


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


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------------------------
# One learner per process, and the entry points the CLI and the flows call
# --------------------------------------------------------------------------------------------

_LEARNER: Learner | None = None


def get_learner(config: LearnerConfig) -> Learner:
    """The process's learner: the base model is loaded on first use and kept while the model
    fields of ``config`` stay the same (other fields are applied with :meth:`Learner.configure`).
    """
    global _LEARNER
    if _LEARNER is not None and _LEARNER.same_model(config):
        _LEARNER.configure(config)
        return _LEARNER
    if _LEARNER is not None:
        _LEARNER = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    _LEARNER = Learner(config)
    return _LEARNER


def release_learner() -> None:
    """Drop the process's learner and free its memory."""
    global _LEARNER
    _LEARNER = None
    gc.collect()


def _committed(out: Path, from_checkpoint: str | Path | None) -> dict[str, Any] | None:
    """The metrics of a finished checkpoint at ``out`` trained from ``from_checkpoint``;
    ``None`` if there is nothing at ``out``."""
    if not out.exists():
        return None
    if not is_checkpoint(out):
        raise UbError(f"{out} exists and is not a finished ub checkpoint: remove it or pick "
                      "another output path")
    metrics = read_metrics(out)
    if "from_checkpoint" in metrics and metrics["from_checkpoint"] != _path_str(from_checkpoint):
        raise UbError(f"checkpoint {out} already exists and was trained from "
                      f"{metrics['from_checkpoint']}, not {_path_str(from_checkpoint)}: pick "
                      "another output path, or pass overwrite=True to replace it")
    return {**metrics, "reused": True}


def _path_str(path: str | Path | None) -> str | None:
    return None if path is None else str(Path(path).expanduser().absolute())


def learn_on_batch(batch: Any, learner_config: LearnerConfig,
                   from_checkpoint: str | Path | None, out_checkpoint: str | Path, *,
                   overwrite: bool = False) -> dict[str, Any]:
    """One update on ``batch`` from ``from_checkpoint`` (``None``: cold start), written to
    ``out_checkpoint``. An existing finished ``out_checkpoint`` is returned as is (its metrics
    with ``"reused": True``) unless ``overwrite``. Returns the update's metrics.
    """
    out = Path(out_checkpoint)
    if not overwrite and (done := _committed(out, from_checkpoint)) is not None:
        return done
    learner = get_learner(learner_config)
    learner.start(from_checkpoint)
    return _update_and_save(learner, batch, from_checkpoint, out, overwrite)


def _update_and_save(learner: Learner, batch: Any, from_checkpoint: str | Path | None,
                     out: Path, overwrite: bool) -> dict[str, Any]:
    metrics = learner.update(batch)
    metrics["from_checkpoint"] = _path_str(from_checkpoint)
    if hasattr(batch, "stats"):
        metrics["batch"] = batch.stats.to_dict()
    if rank_and_world()[0] == 0:  # data-parallel ranks hold the same state: one writes it
        learner.save(out, metrics, overwrite=overwrite)
    barrier()  # no rank goes on (e.g. to start from ``out``) before it is written
    return metrics


def learn_step(root: str | Path, batch_config: Any, learner_config: LearnerConfig,
               from_checkpoint: str | Path | None, out_checkpoint: str | Path, *,
               final_rewards_state: Mapping[str, Any] | None = None,
               overwrite: bool = False) -> dict[str, Any]:
    """Assemble a batch from the shards under ``root`` and do one update (see
    :func:`learn_on_batch`); the entry point of ``ub learn`` and the learner task.

    :param root: the data root (``steps/`` and ``games/``).
    :param batch_config: a :class:`ub.batch.BatchConfig`.
    :param learner_config: a :class:`LearnerConfig`.
    :param from_checkpoint: the checkpoint to continue from; ``None``: a cold start.
    :param out_checkpoint: the checkpoint folder to write (atomically).
    :param final_rewards_state: passed to :func:`ub.batch.assemble_batch`.
    :param overwrite: redo and replace an existing ``out_checkpoint`` (default: return it).
    :returns: the update's metrics, with the batch's stats under ``"batch"``.
    """
    from ub.batch import assemble_batch

    out = Path(out_checkpoint)
    if not overwrite and (done := _committed(out, from_checkpoint)) is not None:
        return done
    learner = get_learner(learner_config)
    learner.start(from_checkpoint)  # a bad checkpoint fails before the batch is assembled
    batch = assemble_batch(Path(root), batch_config, final_rewards_state)
    return _update_and_save(learner, batch, from_checkpoint, out, overwrite)


def write_initial_checkpoint(learner_config: LearnerConfig, out_checkpoint: str | Path, *,
                             overwrite: bool = False) -> Path:
    """Write the cold-start state (update 0: ``init_adapter`` or a fresh adapter) as a
    checkpoint, e.g. for round 0's rollouts. An existing finished one is kept."""
    out = Path(out_checkpoint)
    if not overwrite and _committed(out, None) is not None:
        return out
    learner = get_learner(learner_config)
    learner.start(None)
    return learner.save(out, {"update": 0, "from_checkpoint": None,
                              "init_adapter": _path_str(learner_config.init_adapter)},
                        overwrite=overwrite)


__all__ = [
    "Learner",
    "NonFiniteError",
    "get_learner",
    "learn_on_batch",
    "learn_step",
    "release_learner",
    "write_initial_checkpoint",
]
