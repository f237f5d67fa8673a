"""Policy-gradient losses, pluggable by name.

An algorithm is one small class: an optional :meth:`Algorithm.prepare` that sees the whole batch
once per update, and :meth:`Algorithm.loss`, which turns the completion tokens of one micro-batch
into that micro-batch's share of the batch loss. Register it with :func:`register_algorithm`
and select it by name in :class:`ub.learner.LearnerConfig` (``algorithm`` and
``algorithm_params``), or name it there by import path, ``package.module:Class``, without
registering it (:mod:`ub.components`). See ``docs/algorithms.md`` for the formulas and a worked
example.

The normalizer (Dr. GRPO): every loss is a *sum* over completion tokens divided by the constant
``B * L`` (``B`` the rows of the whole batch, ``L`` the configured ``length_normalizer``), never
by a sequence's own length or by the micro-batch size. Long and short completions then weigh
the same per token, and the micro-batch losses add up to the full-batch loss, so gradient
accumulation gives the full-batch gradient whatever the micro-batching.

Truncated importance sampling (``tis_cap`` of ``reinforce`` and ``ppo``): vLLM samples with its
own kernels (bf16 on a GPU), the learner scores with transformers, and the two disagree on a
token's probability. Each token's loss is weighted by ``min(exp(logp_old - logp_behaviour),
tis_cap)``, detached: the learner's probability at the weights the update started from over the
sampler's, capped so that one token the sampler found unlikely cannot dominate the update (Yao
et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"). Where
the two agree (the CPU: vLLM and the learner both float32, ratios within ~1e-6 of 1) the
weight is 1 and nothing changes.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ub.components import is_import_path, load_class, public_name
from ub.errors import UbError
from ub.learner.value import gae

if TYPE_CHECKING:
    from ub.batch import Batch


@dataclass
class TokenBatch:
    """The completion tokens of one micro-batch, flattened (``N`` tokens).

    :param logprobs: (N,) the learner's logprob of each token (``log_softmax(logits / T)``,
        float32, with gradient).
    :param behaviour_logprobs: (N,) the sampler's logprob of the same token.
    :param advantages: (N,) the advantage of the token's sequence.
    :param rows: (N,) the index of the token's sequence in the full batch.
    :param normalizer: ``B * L``: divide summed token terms by it (see the module docstring).
    :param old_logprobs: (N,) the learner's logprob of the token at the weights the update
        started from (no gradient); ``None``: ``logprobs`` are those (the update's first step).
    """

    logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    rows: torch.Tensor
    normalizer: float
    old_logprobs: torch.Tensor | None = None

    def old(self) -> torch.Tensor:
        """The learner's logprobs at the update's start, detached."""
        return self.logprobs.detach() if self.old_logprobs is None else self.old_logprobs


class Algorithm:
    """Base class of the learner's algorithms.

    Subclasses set :attr:`name`, take their parameters as keyword arguments of ``__init__``
    (with defaults; they come from ``LearnerConfig.algorithm_params``) and implement
    :meth:`loss`.
    """

    name: ClassVar[str] = ""
    # Rows whose advantage is exactly 0 get no gradient from a loss linear in the advantage;
    # the learner skips their forward pass unless this is True (e.g. a loss with a KL term).
    needs_zero_advantage_rows: ClassVar[bool] = False
    # True: an update of several optimizer steps scores the batch once more at its start, for
    # TokenBatch.old_logprobs (one step reads them from its own forward pass).
    needs_old_logprobs: bool = False
    # True: the learner keeps a value head (ub.learner.value), fills Batch.values before
    # prepare() and trains the head towards Batch.returns, which prepare() sets; the head's
    # step size and weight in the adapter's loss are the attributes value_learning_rate and
    # value_coef (default 1e-3 and 0).
    needs_values: ClassVar[bool] = False

    def prepare(self, batch: Batch, rng: random.Random) -> Batch:
        """Called once per update with the whole batch, before minibatches and micro-batches.

        Return the batch to train on (e.g. with transformed advantages). ``rng`` is the
        learner's Python RNG, saved in checkpoints: use it (not ``random``) for any
        randomness, so a resumed run repeats it.
        """
        return batch

    def loss(self, tokens: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the batch loss, and token statistics.

        :returns: ``(loss, stats)``: ``loss`` a scalar, a sum over the tokens divided by
            ``tokens.normalizer``; ``stats`` detached scalars, each a **sum over the tokens**
            (the learner adds them over micro-batches and reports ``sum / completion tokens``),
            except keys ending in ``_max``: a maximum over the tokens (reported as it is).
        """
        raise NotImplementedError


DEFAULT_TIS_CAP = 2.0
"""The default cap of the truncated importance weight (the value of Yao et al.'s experiments):
a token's weight never exceeds 2, and a ratio of ~1 (sampler and learner agree) is untouched."""


def check_tis_cap(cap: float | None) -> None:
    if cap is not None and not cap >= 1:
        raise ValueError(f"tis_cap must be >= 1 (a cap below 1 would also shrink the tokens "
                         f"sampler and learner agree on) or null (no correction), got {cap}")


def truncated_importance_weights(tokens: TokenBatch, cap: float | None
                                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per token, ``min(exp(logp_old - logp_behaviour), cap)`` (detached), and its statistics:
    ``tis_ratio_mean`` and ``tis_ratio_max`` of the uncapped ratio, ``tis_capped_fraction``.
    ``cap`` ``None``: weights of 1 and no statistics (no correction)."""
    if cap is None:
        return torch.ones_like(tokens.logprobs), {}
    with torch.no_grad():
        ratio = (tokens.old() - tokens.behaviour_logprobs).exp()
        capped = ratio > cap
        stats = {"tis_ratio_mean": ratio.sum(),
                 "tis_ratio_max": ratio.max() if ratio.numel() else ratio.new_zeros(()),
                 "tis_capped_fraction": capped.float().sum()}
        return ratio.clamp(max=cap), stats


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise UbError(f"algorithm class {cls.__name__} has no name")
    ALGORITHMS[cls.name] = cls
    return cls


def algorithm_names() -> list[str]:
    """The registered algorithms' names, sorted."""
    return sorted(ALGORITHMS)


def algorithm_parameters(name: str) -> dict[str, Any]:
    """The parameters of algorithm ``name`` (a registered name or an import path) and their
    defaults."""
    signature = inspect.signature(algorithm_class(name).__init__)
    return {p.name: p.default for p in list(signature.parameters.values())[1:]
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def make_algorithm(name: str, params: dict[str, Any] | None = None) -> Algorithm:
    """An instance of algorithm ``name`` with ``params``; unknown names or params are errors."""
    params = dict(params or {})
    known = algorithm_parameters(name)
    unknown = sorted(set(params) - set(known))
    if unknown:
        valid = ", ".join(known) or "none"
        raise UbError(f"algorithm {name!r} has no parameter(s) {', '.join(unknown)}; "
                      f"valid: {valid}")
    try:
        return algorithm_class(name)(**params)
    except (TypeError, ValueError) as e:
        raise UbError(f"algorithm {name!r}: {e}") from e


GUIDE = "docs/algorithms.md, \"Writing a new algorithm\""


def algorithm_class(name: str) -> type[Algorithm]:
    """The class of algorithm ``name``: a registered name, or ``package.module:Class``."""
    if is_import_path(name):
        return load_class(name, Algorithm, "algorithm", GUIDE)
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise UbError(f"unknown algorithm {name!r}; registered: {', '.join(algorithm_names())}; "
                      "or your own as package.module:Class, a subclass of "
                      f"{public_name(Algorithm)} ({GUIDE})") from None


# --------------------------------------------------------------------------------------------
# REINFORCE with the Dr. GRPO normalizer
# --------------------------------------------------------------------------------------------


@register_algorithm
class Reinforce(Algorithm):
    """Policy gradient: raise the logprob of tokens of positive-advantage completions.

    ``loss = -sum_{b,t} w_{b,t} * A_b * logp_{b,t} * mask_{b,t} / (B * L)``, with ``w`` the
    truncated importance weight ``min(exp(logp_old - logp_behaviour), tis_cap)`` (detached).

    :param tis_cap: the cap of ``w`` (>= 1); ``None``: ``w = 1``, no correction.
    """

    name = "reinforce"

    def __init__(self, tis_cap: float | None = DEFAULT_TIS_CAP) -> None:
        check_tis_cap(tis_cap)
        self.tis_cap = tis_cap
        self.needs_old_logprobs = tis_cap is not None

    def loss(self, tokens: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weights, stats = truncated_importance_weights(tokens, self.tis_cap)
        loss = -(weights * tokens.advantages * tokens.logprobs).sum() / tokens.normalizer
        return loss, stats


# --------------------------------------------------------------------------------------------
# PPO: clipped importance ratio against the behaviour (sampling) policy
# --------------------------------------------------------------------------------------------


@register_algorithm
class PPO(Algorithm):
    """PPO's clipped surrogate, per token, with the Dr. GRPO normalizer, and truncated
    importance sampling against the sampler (decoupled PPO).

    ``r = exp(logp - logp_old)`` (the trust region is around the learner at the update's
    start); ``w = min(exp(logp_old - logp_behaviour), tis_cap)`` (detached);
    ``loss = -sum w * min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A) * mask / (B * L)``.
    Without the correction (``tis_cap: null``) ``logp_old`` is the sampler's: ``r`` is the
    ratio to the behaviour policy and ``w = 1``, PPO as first written. With it, a token the
    sampler found much less likely than the learner does weighs at most ``tis_cap`` times its
    advantage: the unclipped branch of a negative advantage is bounded.

    :param clip_eps: ``eps_low``, and ``eps_high`` unless that is given.
    :param clip_eps_high: upper clip range (``> clip_eps`` is DAPO's "clip higher", which
        lets unlikely tokens with positive advantage grow faster); ``None``: ``clip_eps``.
    :param tis_cap: the cap of ``w`` (>= 1); ``None``: no correction.
    """

    name = "ppo"

    def __init__(self, clip_eps: float = 0.2, clip_eps_high: float | None = None,
                 tis_cap: float | None = DEFAULT_TIS_CAP) -> None:
        if not 0 < clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps}")
        if clip_eps_high is not None and not clip_eps_high > 0:
            raise ValueError(f"clip_eps_high must be > 0, got {clip_eps_high}")
        check_tis_cap(tis_cap)
        self.clip_low = clip_eps
        self.clip_high = clip_eps if clip_eps_high is None else clip_eps_high
        self.tis_cap = tis_cap
        self.needs_old_logprobs = tis_cap is not None

    def loss(self, tokens: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weights, stats = truncated_importance_weights(tokens, self.tis_cap)
        old = tokens.behaviour_logprobs if self.tis_cap is None else tokens.old()
        log_ratio = tokens.logprobs - old
        ratio = log_ratio.exp()
        unclipped = ratio * tokens.advantages
        clipped = ratio.clamp(1 - self.clip_low, 1 + self.clip_high) * tokens.advantages
        # The pessimistic bound: a token stops pushing once its ratio left the trust region in
        # the direction its advantage favours.
        loss = -(weights * torch.minimum(unclipped, clipped)).sum() / tokens.normalizer
        with torch.no_grad():
            outside = (ratio < 1 - self.clip_low) | (ratio > 1 + self.clip_high)
            stats.update({"ratio_mean": ratio.sum(), "clip_fraction": outside.float().sum()})
        return loss, stats


# --------------------------------------------------------------------------------------------
# SFT: imitate the selected completions (ub sft)
# --------------------------------------------------------------------------------------------


@register_algorithm
class Sft(Algorithm):
    """Supervised fine-tuning: maximize the likelihood of every completion token.

    ``loss = -sum_{b,t} logp_{b,t} * mask_{b,t} / (B * L)``; advantages are ignored.
    """

    name = "sft"
    needs_zero_advantage_rows = True

    def loss(self, tokens: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        nll = -tokens.logprobs.sum()
        return nll / tokens.normalizer, {"nll": nll.detach()}


# --------------------------------------------------------------------------------------------
# A2C: REINFORCE less a learned value (ub.learner.value)
# --------------------------------------------------------------------------------------------


@register_algorithm
class A2C(Reinforce):
    """Advantage actor-critic: REINFORCE on ``return - value``, with the value head trained
    towards the return by mean squared error (:class:`ub.learner.value.ValueBaseline`).

    The batch's ``advantages`` are read as the decisions' returns: give the batch no
    normalizing sampling transform (``normalize_per_env`` would hand the head a moving target).
    ``prepare`` sets the advantage ``A = G - V(s)`` (``V`` at the update's start) or, with
    ``gae_lambda < 1``, GAE over each seat's decisions where the batch holds all of them
    (``seat_moves_after`` counts down to 0; other seats keep ``G - V``), with the per-decision
    reward ``r_t = G_t - gamma * G_{t+1}`` (the last decision's: its return). ``gamma`` must
    then be the batch's ``discount`` (1 without one).

    :param value_coef: weight of the value loss in the adapter's gradient (0: the head learns
        on the policy's features, which the value loss leaves alone).
    :param value_learning_rate: the head's AdamW step size.
    :param gae_lambda: GAE's lambda in [0, 1]; 1: the return less the value.
    :param gamma: the discount between a seat's decisions, for GAE.
    :param normalize: standardize the advantages over the batch.
    :param invalid_move_advantage: an invalid move's advantage after all of the above is at
        most this (< 0; ``None``: no cap), read from the batch's ``invalid_move`` column. The
        batch's ``invalid_move_advantage`` transform caps the returns instead, before the
        value is subtracted and the batch standardized, which dilutes its push.
    :param tis_cap: as :class:`Reinforce`'s.
    """

    name = "a2c"
    needs_values = True

    def __init__(self, value_coef: float = 0.0, value_learning_rate: float = 1e-3,
                 gae_lambda: float = 1.0, gamma: float = 1.0, normalize: bool = False,
                 invalid_move_advantage: float | None = None,
                 tis_cap: float | None = DEFAULT_TIS_CAP) -> None:
        super().__init__(tis_cap)
        if not value_coef >= 0:
            raise ValueError(f"value_coef must be >= 0, got {value_coef}")
        if not value_learning_rate > 0:
            raise ValueError(f"value_learning_rate must be > 0, got {value_learning_rate}")
        if not 0 <= gae_lambda <= 1:
            raise ValueError(f"gae_lambda must be in [0, 1], got {gae_lambda}")
        if not 0 < gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        if invalid_move_advantage is not None and not invalid_move_advantage < 0:
            raise ValueError(f"invalid_move_advantage must be < 0 (or null), got "
                             f"{invalid_move_advantage}")
        self.value_coef = value_coef
        self.value_learning_rate = value_learning_rate
        self.gae_lambda = gae_lambda
        self.gamma = gamma
        self.normalize = normalize
        self.invalid_move_advantage = invalid_move_advantage

    def prepare(self, batch: Batch, rng: random.Random) -> Batch:
        assert batch.values is not None, "the learner fills Batch.values for a2c"
        returns = batch.advantages.float()
        advantages = returns - batch.values
        if self.gae_lambda < 1 and batch.rows is not None:
            advantages = self._gae(batch, returns, advantages)
        if self.normalize and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        if self.invalid_move_advantage is not None:
            if batch.rows is None or "invalid_move" not in batch.rows.column_names:
                raise UbError("a2c's invalid_move_advantage reads the batch's invalid_move "
                              "column, and this batch has none: give its rows that column, or "
                              "set invalid_move_advantage to null")
            invalid = torch.tensor(batch.rows.column("invalid_move").to_pylist())
            advantages = torch.where(invalid, advantages.clamp(max=self.invalid_move_advantage),
                                     advantages)
        return dataclasses.replace(batch, advantages=advantages, returns=returns)

    def _gae(self, batch: Batch, returns: torch.Tensor, advantages: torch.Tensor
             ) -> torch.Tensor:
        assert batch.rows is not None and batch.values is not None
        columns = batch.rows.select(["game_id", "seat", "turn", "seat_moves_after"]).to_pydict()
        seats: dict[tuple[Any, Any], list[int]] = {}
        for i, key in enumerate(zip(columns["game_id"], columns["seat"], strict=True)):
            seats.setdefault(key, []).append(i)
        out = advantages.clone()
        for rows in seats.values():
            rows.sort(key=lambda i: columns["turn"][i])
            if [columns["seat_moves_after"][i] for i in rows] != list(range(len(rows) - 1,
                                                                           -1, -1)):
                continue  # not the seat's whole game: G - V
            g = [float(returns[i]) for i in rows]
            rewards = [g[t] - self.gamma * g[t + 1] for t in range(len(g) - 1)] + [g[-1]]
            estimates = gae(rewards, [float(batch.values[i]) for i in rows], self.gamma,
                            self.gae_lambda)
            out[rows] = torch.tensor(estimates, dtype=out.dtype)
        return out
