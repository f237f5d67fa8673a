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

from ub.learner.algorithms.base import Algorithm, TokenBatch, register_algorithm

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
