"""The policy the learner trains: a base model loaded once with a PEFT LoRA adapter on it, the
settings that can change without reloading it (LoRA dropout, gradient checkpointing), and how
it scores completion tokens (and, for an algorithm that reads them, the state each decision was
made in), and its adapter's weights (a fresh adapter, or one read from a file).

:class:`Policy` is one part of :class:`ub.learner.Learner`, which adds the optimizer, the
algorithm and the training state; the update itself is :func:`ub.learner.update.update`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch

from ub.errors import UbError
from ub.games.move_mask import MoveConstraint, template_constraint
from ub.games.templates import get_template
from ub.learner.base_identity import model_identity
from ub.learner.batching import pad_right, resolve_pad_to_multiple
from ub.learner.config import LearnerConfig
from ub.learner.kernels import (
    apply_kernels,
    attention_kernel,
    resolve_attention_kernel,
    resolve_kernels,
)
from ub.learner.memory import MemoryFit, activation_bytes_per_token, device_budget, saved_bytes
from ub.learner.output_layer import chunked_token_scores, is_plain_linear
from ub.learner.packing import pack_rows, resolve_pack_prefixes, unpack
from ub.learner.precision import resolve_adapter_compute, set_adapter_compute
from ub.learner.token_masks import TokenMasks, token_masks
from ub.model.lora import LoraSettings

if TYPE_CHECKING:
    from ub.batch import Batch

ADAPTER_NAME = "default"  # PEFT's name for the single adapter
# Model types whose causal-LM forward is exactly ``lm_head(decoder(x))``: for them only the
# completion positions go through the output layer, in chunks (prompt logits are never needed,
# and the output layer is a large share of a small model's compute and of any model's memory).
# Others (e.g. with logit soft-capping or scaling) run their own full forward.
PROBE_TOKENS = 512  # the activation probe of micro_batch_tokens: auto (linear in tokens)
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


_Score = TypeVar("_Score", bound=Callable[..., Any])


def _in_learner_shapes(score: _Score) -> _Score:
    """:meth:`Policy.score` on its input padded to the width ``pad_to_multiple`` asks, under
    the SDPA kernel ``attention_kernel`` asks (the scores do not depend on the padding: rows
    are right-padded, attention is causal and the padding is never scored)."""

    @functools.wraps(score)
    def shaped(self: Policy, input_ids: torch.Tensor, scored: torch.Tensor, *args: Any,
               **kwargs: Any) -> Any:
        input_ids, scored = pad_right(input_ids, scored, self.pad_to_multiple)
        with attention_kernel(self.attention_kernel):
            return score(self, input_ids, scored, *args, **kwargs)

    return cast(_Score, shaped)


class Policy:
    """A PEFT LoRA model on a base model loaded once, with the learner's settings applied.

    :param config: see :class:`LearnerConfig`. The model fields (``base_model``, ``dtype``,
        ``attn_implementation``, ``device``, LoRA rank/alpha/targets) are fixed for the life of
        the policy; the others can change between updates with :meth:`configure`.
    """

    def __init__(self, config: LearnerConfig) -> None:
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM

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
        self.kernels = resolve_kernels(config.kernels, self.device,
                                       getattr(base.config, "model_type", ""))
        self.liger_kernels = apply_kernels(self.kernels, base)  # (before PEFT, below)
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
        # (how they compute, and the shapes scoring takes: configure(), below)
        self.adapter_compute = torch.float32
        self.attention_kernel = "torch"
        self.pad_to_multiple = 1
        self.pack_prefixes = False
        # The output layer runs in chunks (ub.learner.output_layer) where the causal LM is
        # exactly lm_head(decoder(x)) and lm_head a plain Linear.
        self._chunked_head = getattr(self.causal_lm.config, "model_type", "") in \
            PLAIN_LM_HEAD_MODELS and hasattr(self.causal_lm, "model") \
            and is_plain_linear(getattr(self.causal_lm, "lm_head", None))
        self.hidden_size = int(self.causal_lm.config.hidden_size)
        # The legal-move mask's constraints, by (template, legal moves), built by the model's
        # tokenizer (loaded with the first masked batch).
        self._tokenizer: Any = None
        self._constraints: dict[tuple[str, tuple[str, ...]], MoveConstraint] = {}
        self.load_seconds = time.perf_counter() - started
        self.configure(config)

    # -- configuration -----------------------------------------------------------------------

    def same_model(self, config: LearnerConfig) -> bool:
        """True if ``config`` runs on this learner's loaded model (see :meth:`configure`)."""
        mine, theirs = self.config, config
        return (mine.base_model == theirs.base_model and mine.dtype == theirs.dtype
                and mine.attn_implementation == theirs.attn_implementation
                and mine.device == theirs.device and mine.kernels == theirs.kernels
                and _lora_shape(mine.lora) == _lora_shape(theirs.lora))

    def configure(self, config: LearnerConfig) -> None:
        """Apply a config that keeps the model (dropout, gradient checkpointing, scoring
        temperature, ...); the adapter weights are kept."""
        if not self.same_model(config):
            raise UbError("the new learner config changes the model (base model, dtype, "
                          "attention, device, kernels or LoRA shape): create a new Learner")
        self.config = config
        # LoRA dropout, in place (PEFT makes nn.Identity for p = 0, nn.Dropout otherwise).
        p = config.lora.dropout
        for module in self.model.modules():
            dropouts = getattr(module, "lora_dropout", None)
            if isinstance(dropouts, torch.nn.ModuleDict) and ADAPTER_NAME in dropouts:
                dropouts[ADAPTER_NAME] = torch.nn.Dropout(p) if p > 0 else torch.nn.Identity()
        self.model.peft_config[ADAPTER_NAME].lora_dropout = p  # saved in adapter_config.json
        # The adapter's matmuls in the model's dtype or float32 (ub.learner.precision).
        self.adapter_compute = resolve_adapter_compute(config.adapter_compute, self.device,
                                                       self.dtype)
        set_adapter_compute(self.model, self.adapter_compute)
        self.attention_kernel = resolve_attention_kernel(config.attention_kernel, self.device)
        self.pad_to_multiple = resolve_pad_to_multiple(config.pad_to_multiple, self.device)
        # (a head ub does not run in chunks scores through the model's own forward, unpacked)
        self.pack_prefixes = self._chunked_head and resolve_pack_prefixes(
            config.pack_prefixes, self.device, self.attn_implementation)
        self._set_checkpointing(config.gradient_checkpointing)

    def _set_checkpointing(self, on: bool) -> None:
        if on:
            # Non-reentrant checkpointing needs no input that requires grad (the embeddings
            # are frozen) and works with the decoder called directly.
            # The recompute runs in backward, outside score(): under the same SDPA kernel
            # (a recompute must save what the forward saved).
            self.causal_lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
                "use_reentrant": False,
                "context_fn": lambda: (contextlib.nullcontext(),
                                       attention_kernel(self.attention_kernel))})
        elif self.causal_lm.is_gradient_checkpointing:
            self.causal_lm.gradient_checkpointing_disable()

    # -- scoring ------------------------------------------------------------------------------

    @_in_learner_shapes
    def score(self, input_ids: torch.Tensor, scored: torch.Tensor, *, with_entropy: bool = True,
              with_states: bool = False, masks: TokenMasks | None = None) -> Scores:
        """Logprob (and entropy) of each scored token, flattened in row-major order, and for
        ``with_states`` the state each row's decision was made in: the last hidden state at
        the position that scores the row's first completion token (the end of its prompt).

        :param input_ids: (b, L) right-padded ids on the model's device.
        :param scored: (b, L - 1) bool: position ``j`` scores token ``input_ids[:, j + 1]``
            with the logits at ``j``.
        :param with_entropy: False skips the entropy (a pass over the vocabulary).
        :param masks: the legal-move mask of the scored tokens sampled under one
            (:meth:`token_masks`): they are scored over the tokens allowed there.
        """
        inputs = input_ids[:, :-1]
        targets = input_ids[:, 1:][scored]
        # Rows as they are take no attention mask: they are right-padded and attention is
        # causal, so a real token never sees padding; without a mask, attention takes its fast
        # causal path. (Packed rows take their prefix tree's: _hidden_states.)
        if self._chunked_head:
            hidden = self._hidden_states(inputs, scored)
            logprobs, entropy, legal = chunked_token_scores(
                hidden[scored], self.causal_lm.lm_head, targets, self.config.temperature,
                with_entropy=with_entropy, masks=masks)
            return Scores(logprobs, entropy, _decision_states(hidden, scored)
                          if with_states else None, legal)
        # Another head (soft-capped or scaled logits, a LoRA on lm_head): the model's own
        # forward, with its (tokens x vocab) logits.
        out = self.model(input_ids=inputs, use_cache=False, output_hidden_states=with_states)
        states = _decision_states(out.hidden_states[-1], scored) if with_states else None
        logits = out.logits[scored].float()
        if self.config.temperature != 1.0:
            logits = logits / self.config.temperature
        allowed = None if masks is None else masks.allowed(0, len(logits), logits.shape[-1])
        legal = None
        if allowed is not None:
            whole = torch.logsumexp(logits, dim=-1)
            logits = logits.masked_fill(~allowed, float("-inf"))
            legal = torch.logsumexp(logits, dim=-1) - whole
        elif masks is not None:
            legal = torch.zeros(len(logits), device=logits.device)
        all_logprobs = torch.log_softmax(logits, dim=-1)
        token_logprobs = all_logprobs.gather(-1, targets[:, None]).squeeze(-1)
        if not with_entropy:
            return Scores(token_logprobs, None, states, legal)
        # With its gradient only for an entropy bonus: autograd would otherwise keep a
        # (tokens x vocab) tensor of probabilities for nothing.
        with torch.set_grad_enabled(torch.is_grad_enabled() and bool(self.config.entropy_coef)):
            p_logp = all_logprobs.exp() * all_logprobs
            if allowed is not None:  # (0 * -inf where masked)
                p_logp = p_logp.masked_fill(~allowed, 0.0)
            entropy = -p_logp.sum(-1)
        return Scores(token_logprobs, entropy, states, legal)

    def _hidden_states(self, inputs: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        """The transformer body's last hidden states (b, L - 1, H) at ``inputs``: the rows
        as they are, or with :attr:`pack_prefixes` their prefix tree (:mod:`ub.learner.packing`),
        each shared prefix computed once and its states gathered back into the rows' layout
        (the same up to float summation order; zeros after a row's last scored position)."""
        body = self.causal_lm.model
        if not self.pack_prefixes:
            return body(input_ids=inputs, use_cache=False).last_hidden_state
        # A position after a row's last scored one changes nothing scored (attention is
        # causal): it is not computed. Position 0 always is (a row's decision state where it
        # has no scored token, as unpacked).
        positions = torch.arange(1, scored.shape[1] + 1, device=scored.device)
        lengths = (scored * positions).amax(1).clamp(min=1).tolist()
        packed = pack_rows(inputs, lengths, multiple=self.pad_to_multiple)
        mask = packed.attention_mask
        if self.attn_implementation == "eager":  # (eager attention adds its mask to the scores)
            mask = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(
                ~mask, torch.finfo(self.dtype).min)
        hidden = body(input_ids=packed.input_ids, position_ids=packed.position_ids,
                      attention_mask=mask, use_cache=False).last_hidden_state
        return unpack(hidden, packed)

    def token_masks(self, batch: Batch, scored: torch.Tensor) -> TokenMasks | None:
        """The legal-move masks of ``batch``'s scored tokens (``None``: no row was sampled
        under the mask), each row's constraint built by the model's tokenizer as the engine
        built it."""
        if batch.masked_moves is None:
            return None
        vocab = int(self.causal_lm.get_output_embeddings().weight.shape[0])
        return token_masks(batch, scored, vocab, self._move_constraint, self.device)

    def _move_constraint(self, template: str, legal_moves: tuple[str, ...]) -> MoveConstraint:
        key = (template, legal_moves)
        found = self._constraints.get(key)
        if found is None:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.config.base_model)
            found = self._constraints[key] = template_constraint(
                get_template(template), legal_moves, self._tokenizer)
        return found

    def measure_memory(self) -> MemoryFit:
        """``micro_batch_tokens: auto``: a probe's activation bytes per token against the
        memory this learner has now (:mod:`ub.learner.memory`)."""
        config = self.causal_lm.config
        tokens = min(PROBE_TOKENS, getattr(config, "max_position_embeddings", PROBE_TOKENS) - 1)
        ids = torch.randint(1, config.vocab_size, (1, tokens + 1),
                            generator=torch.Generator().manual_seed(0)).to(self.device)
        scored = torch.ones(1, tokens, dtype=torch.bool, device=self.device)
        weights = [*self.model.parameters(), *self.model.buffers()]
        checkpointing = self.causal_lm.is_gradient_checkpointing
        with torch.random.fork_rng(devices=self.rng_devices()):  # (LoRA dropout draws)
            kept = saved_bytes(lambda: self.score(ids, scored), weights)
            if checkpointing:  # one layer's activations, as the recompute will hold them
                self._set_checkpointing(False)
                try:
                    everything = saved_bytes(lambda: self.score(ids, scored), weights)
                finally:
                    self._set_checkpointing(True)
            else:
                everything = kept
        per_token = activation_bytes_per_token(kept, everything // config.num_hidden_layers,
                                               tokens, checkpointing)
        lora_bytes = sum(p.numel() * p.element_size() for p in self.params.values())
        own = sum(t.numel() * t.element_size() for t in weights) + 3 * lora_bytes  # + Adam, grad
        budget, cap = device_budget(self.device, own, self.config.device_share)
        return MemoryFit(budget, per_token, cap)

    def rng_devices(self) -> list[int]:
        """The GPUs whose RNG streams the learner owns (none on the CPU)."""
        return [self.device.index or 0] if self.device.type == "cuda" else []

    @torch.no_grad()
    def score_batch(self, batch: Batch, micro_batch_size: int = 16,
                    measure: Callable[[torch.Tensor], Mapping[str, torch.Tensor]] | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(B, T) logprobs of each completion token under the current policy (0 elsewhere),
        aligned with ``batch.behaviour_logprobs``, and with ``measure`` the (B,) columns it
        makes of the rows' decision states (an algorithm's :meth:`measure`); no gradient, no
        state change."""
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        columns: dict[str, torch.Tensor] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(batch), micro_batch_size):
                rows = list(range(start, min(start + micro_batch_size, len(batch))))
                mb = batch.select(rows)
                scored = mb.completion_mask[:, 1:].bool()
                if not scored.any():
                    continue
                scores = self.score(mb.input_ids.to(self.device), scored.to(self.device),
                                    with_entropy=False, with_states=measure is not None,
                                    masks=self.token_masks(mb, scored))
                width = mb.input_ids.shape[1]
                block = torch.zeros(len(rows), width - 1)
                block[scored] = scores.logprobs.float().cpu()
                out[start:start + len(rows), 1:width] = block
                if measure is not None:
                    assert scores.states is not None
                    for name, values in measure(scores.states).items():
                        column = columns.setdefault(name, torch.zeros(len(batch)))
                        column[start:start + len(rows)] = values.float().cpu()
        finally:
            self.model.train(was_training)
        return out, columns

    # -- the adapter's weights ---------------------------------------------------------------

    def adapter_weights(self) -> dict[str, torch.Tensor]:
        """Copies of the LoRA weights, by parameter name."""
        return {name: p.detach().clone() for name, p in self.params.items()}

    def fresh_adapter(self, seed: int) -> None:
        """PEFT's default LoRA initialisation (A ~ kaiming uniform, B = 0), from ``seed``."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.params.items():
                if ".lora_A." in name:
                    w = torch.empty(p.shape, dtype=torch.float32)
                    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
                    p.copy_(w)
                else:
                    p.zero_()

    def load_adapter(self, weights: Mapping[str, torch.Tensor], where: str) -> None:
        """Copy PEFT-format adapter tensors into the LoRA parameters, checking names/shapes."""
        expected = {name.replace(f".{ADAPTER_NAME}.", "."): name for name in self.params}
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


@dataclass
class Scores:
    """What :meth:`Policy.score` returns: ``logprobs`` and ``entropy`` (N,) of the scored
    tokens (``entropy`` ``None`` unless asked for), ``states`` (b, hidden) of the rows, and
    with masks ``legal_logmass`` (N,): the log of the probability the whole vocabulary's
    softmax gives the tokens allowed at each (0 where all were)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    states: torch.Tensor | None
    legal_logmass: torch.Tensor | None = None


def _decision_states(hidden: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """Each row's hidden state at its first scored position (the prompt's last token)."""
    first = scored.int().argmax(1)  # (a row without a scored token gives position 0: unused)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]


def _lora_shape(lora: LoraSettings) -> tuple[Any, ...]:
    return lora.rank, lora.alpha, tuple(sorted(lora.target_modules))
