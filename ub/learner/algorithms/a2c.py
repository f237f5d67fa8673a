"""``a2c``, in one file: REINFORCE on the return less a learned value, the value head it trains
beside the adapter, and GAE.

The head reads the state a decision was made in (the policy's last hidden state at the end of
the prompt, which the learner hands an algorithm that sets ``reads_states``) and estimates the
return of that decision. A head on the policy's own features, not a second model: the
learner's forward pass already computes them, so the estimate costs one matrix-vector product
per row (UnstableBaselines' A2C builds its critic as a second LoRA adapter, which doubles every
forward pass). The head trains on those features detached, by its own AdamW at its own step
size, so the value loss shapes the adapter only as far as ``value_coef`` asks (0: not at all;
the critic is then a probe of what the policy already separates).

Where credit goes: a2c reads the batch's ``returns`` (each decision's reward after the final and
step stages; the batch's sampling stage, which makes advantages, is refused for it) and trains
on ``return - value``: the position's expected return is subtracted from each decision, so a
move is credited for doing better than the policy usually does from that position; with
``gae_lambda < 1``, on the seats whose every decision of the game is in the batch, the
advantage is GAE over the seat's decisions (:func:`gae`), which trades the return's variance
for the value's bias.

What it owns, declared (:class:`ub.learner.algorithms.base.Algorithm`): the head
(``value_head``: a checkpoint's ``value_head.safetensors``, its AdamW state in
``optimizer.safetensors`` under ``value_head.*`` names; vLLM and PEFT read the adapter's files
only), the column it adds at the update's start (``values``) and its per-row statistics
(``value_mse``, ``value_mean``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import Field

from ub.errors import UbError
from ub.learner.algorithms.base import (
    PolicyView,
    Reduction,
    TokenBatch,
    Trained,
    register_algorithm,
)
from ub.learner.algorithms.policy_gradient import Reinforce, ReinforceParams

if TYPE_CHECKING:
    from ub.batch import Batch


class ValueHead(torch.nn.Module):
    """``value(state) = w . state + b`` in float32, starting at 0 everywhere (so the first
    update's advantages are the returns themselves)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, 1, dtype=torch.float32)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.zero_()

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """(b,) values of (b, hidden) states; the gradient reaches the head only."""
        return self.linear(states.detach().float()).squeeze(-1)

    def shared(self, states: torch.Tensor) -> torch.Tensor:
        """(b,) the same values with the gradient reaching the states only (the adapter)."""
        return torch.nn.functional.linear(states.float(), self.linear.weight.detach(),
                                          self.linear.bias.detach()).squeeze(-1)


class A2CParams(ReinforceParams):
    """The parameters of ``a2c`` (``tis_cap`` as ``reinforce``'s)."""

    value_coef: float = Field(0.0, ge=0, description="Weight of the value loss in the "
                              "adapter's gradient (0: the head learns on the policy's "
                              "features, which the value loss leaves alone).")
    value_learning_rate: float = Field(1e-3, gt=0, description="The value head's AdamW step "
                                       "size.")
    gae_lambda: float = Field(1.0, ge=0, le=1, description="GAE's lambda; 1: the return less "
                              "the value.")
    gamma: float = Field(1.0, gt=0, le=1, description="The discount between a seat's "
                         "decisions, for GAE (the batch's discount; 1 without one).")
    normalize: bool = Field(False, description="Standardize the advantages over the batch.")
    invalid_move_cap: float | None = Field(None, lt=0, description="An invalid move's "
                                           "advantage after all of the above is at most this, "
                                           "read from the batch's invalid_move column; null: "
                                           "no cap.")


@register_algorithm
class A2C(Reinforce):
    """Advantage actor-critic: REINFORCE on ``return - value``, with the value head trained
    towards the return by mean squared error.

    ``prepare`` sets the advantage ``A = G - V(s)`` (``V`` at the update's start) or, with
    ``gae_lambda < 1``, GAE over each seat's decisions where the batch holds all of them
    (``seat_moves_after`` counts down to 0; other seats keep ``G - V``), with the per-decision
    reward ``r_t = G_t - gamma * G_{t+1}`` (the last decision's: its return). ``gamma`` must
    then be the batch's ``discount`` (1 without one).

    Its parameters: :class:`A2CParams`.
    """

    name = "a2c"
    Params = A2CParams
    reads = ("returns",)
    adds = ("values",)
    reads_states = True
    statistics: ClassVar[Mapping[str, Reduction]] = {"value_mse": "row", "value_mean": "row"}

    def __init__(self, params: A2CParams | None = None) -> None:
        """:param params: its parameters, validated; ``None``: the defaults."""
        params = A2CParams() if params is None else params
        super().__init__(params)
        self.params: A2CParams = params
        self.value_coef = params.value_coef
        self.value_learning_rate = params.value_learning_rate
        self.gae_lambda = params.gae_lambda
        self.gamma = params.gamma
        self.normalize = params.normalize
        self.invalid_move_cap = params.invalid_move_cap
        self.head: ValueHead | None = None  # (build)

    def build(self, policy: PolicyView) -> dict[str, Trained]:
        self.head = ValueHead(policy.hidden_size).to(policy.device)
        return {"value_head": Trained(self.head, learning_rate=self.value_learning_rate)}

    def _head(self) -> ValueHead:
        if self.head is None:
            raise UbError("a2c's value head is built by the learner (Algorithm.build)")
        return self.head

    def measure(self, states: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"values": self._head()(states)}

    def prepare(self, batch: Batch, rng: random.Random) -> Batch:
        returns, values = batch.returns, batch.measured.get("values")
        assert returns is not None and values is not None  # (the learner checks reads, adds)
        returns = returns.float()
        advantages = returns - values
        if self.gae_lambda < 1 and batch.rows is not None:
            advantages = self._gae(batch, returns, values, advantages)
        if self.normalize and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        if self.invalid_move_cap is not None:
            if batch.rows is None or "invalid_move" not in batch.rows.column_names:
                raise UbError("a2c's invalid_move_cap reads the batch's invalid_move column, "
                              "and this batch has none: give its rows that column, or set "
                              "invalid_move_cap to null")
            invalid = torch.tensor(batch.rows.column("invalid_move").to_pylist())
            advantages = torch.where(invalid, advantages.clamp(max=self.invalid_move_cap),
                                     advantages)
        return dataclasses.replace(batch, advantages=advantages)

    def loss(self, tokens: TokenBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """REINFORCE's loss plus the head's mean squared error to the returns over the step's
        rows (and ``value_coef`` times the same error through the adapter); the statistics
        ``value_mse`` and ``value_mean`` are sums over the micro-batch's rows."""
        loss, stats = super().loss(tokens)
        assert tokens.batch is not None and tokens.batch.returns is not None
        assert tokens.states is not None
        head = self._head()
        returns = tokens.batch.returns.to(tokens.states.device).float()
        values = head(tokens.states)
        error = (values - returns) ** 2
        value_loss = error.sum() / tokens.batch_rows
        if self.value_coef:
            value_loss = value_loss + self.value_coef * (
                (head.shared(tokens.states) - returns) ** 2).sum() / tokens.batch_rows
        stats.update(value_mse=error.detach().sum(), value_mean=values.detach().sum())
        return loss + value_loss, stats

    def _gae(self, batch: Batch, returns: torch.Tensor, values: torch.Tensor,
             advantages: torch.Tensor) -> torch.Tensor:
        assert batch.rows is not None
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
            estimates = gae(rewards, [float(values[i]) for i in rows], self.gamma,
                            self.gae_lambda)
            out[rows] = torch.tensor(estimates, dtype=out.dtype)
        return out


def gae(rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float
        ) -> list[float]:
    """Generalized advantage estimates of one seat's decisions in a game, in order.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` (``V`` after the last decision is 0: the game is
    over) and ``A_t = delta_t + gamma * lam * A_{t+1}``. ``lam = 1`` gives the discounted
    return less the value; ``lam = 0`` the one-step TD error.
    """
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards but {len(values)} values")
    out = [0.0] * len(rewards)
    following = 0.0  # A_{t+1}
    next_value = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        delta = rewards[t] + gamma * next_value - values[t]
        following = delta + gamma * lam * following
        out[t] = following
        next_value = values[t]
    return out
