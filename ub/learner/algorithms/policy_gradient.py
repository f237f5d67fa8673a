"""The policy-gradient losses ub ships: ``reinforce``, ``ppo`` and ``sft`` (``a2c``, REINFORCE
less a learned value, is :mod:`ub.learner.algorithms.a2c`).

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

import torch
from pydantic import Field

from ub.learner.algorithms.base import (
    Algorithm,
    AlgorithmParams,
    TokenBatch,
    register_algorithm,
)

DEFAULT_TIS_CAP = 2.0
"""The default cap of the truncated importance weight (the value of Yao et al.'s experiments):
a token's weight never exceeds 2, and a ratio of ~1 (sampler and learner agree) is untouched."""


class ReinforceParams(AlgorithmParams):
    """The parameters of ``reinforce`` (and of the algorithms built on it: ``a2c``)."""

    # (>= 1: a cap below 1 would also shrink the tokens sampler and learner agree on)
    tis_cap: float | None = Field(DEFAULT_TIS_CAP, ge=1, description="The cap of each token's "
                                  "truncated importance weight min(exp(logp_old - "
                                  "logp_behaviour), tis_cap); null: weights of 1 (no "
                                  "correction).")


class PPOParams(ReinforceParams):
    """The parameters of ``ppo``."""

    clip_eps: float = Field(0.2, gt=0, lt=1, description="The clip range's lower side, "
                            "eps_low (the ratio is clipped to [1 - eps_low, 1 + eps_high]), and "
                            "its upper side unless clip_eps_high is given.")
    clip_eps_high: float | None = Field(None, gt=0, description="The clip range's upper side, "
                                        "eps_high (> clip_eps is DAPO's \"clip higher\": "
                                        "unlikely tokens with a positive advantage grow "
                                        "faster); null: clip_eps.")


class SftParams(AlgorithmParams):
    """``sft`` has no parameters."""


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


# --------------------------------------------------------------------------------------------
# REINFORCE with the Dr. GRPO normalizer
# --------------------------------------------------------------------------------------------


@register_algorithm
class Reinforce(Algorithm):
    """Policy gradient: raise the logprob of tokens of positive-advantage completions.

    ``loss = -sum_{b,t} w_{b,t} * A_b * logp_{b,t} * mask_{b,t} / (B * L)``, with ``w`` the
    truncated importance weight ``min(exp(logp_old - logp_behaviour), tis_cap)`` (detached).

    Its parameters: :class:`ReinforceParams`.
    """

    name = "reinforce"
    Params = ReinforceParams

    def __init__(self, params: ReinforceParams | None = None) -> None:
        """:param params: its parameters, validated; ``None``: the defaults."""
        self.params = ReinforceParams() if params is None else params
        self.tis_cap = self.params.tis_cap
        self.needs_old_logprobs = self.tis_cap is not None

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

    Its parameters (``clip_eps`` is ``eps_low``, ``clip_eps_high`` ``eps_high``):
    :class:`PPOParams`.
    """

    name = "ppo"
    Params = PPOParams

    def __init__(self, params: PPOParams | None = None) -> None:
        """:param params: its parameters, validated; ``None``: the defaults."""
        self.params = PPOParams() if params is None else params
        self.clip_low = self.params.clip_eps
        self.clip_high = (self.params.clip_eps if self.params.clip_eps_high is None
                          else self.params.clip_eps_high)
        self.tis_cap = self.params.tis_cap
        self.needs_old_logprobs = self.tis_cap is not None

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
    Params = SftParams
    needs_zero_advantage_rows = True

    def __init__(self, params: SftParams | None = None) -> None:
        """:param params: its parameters (none), validated; ``None``: the defaults."""
        self.params = SftParams() if params is None else params

    def loss(self, tokens: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        nll = -tokens.logprobs.sum()
        return nll / tokens.normalizer, {"nll": nll.detach()}
