"""A learned value baseline: a linear head on the policy's last hidden state, and GAE.

The head reads the state a decision was made in (the policy's last hidden state at the end of
the prompt, :meth:`ub.learner.policy.Policy.score`) and estimates the return of that decision.
A head on the policy's own features, not a second model: the learner's forward pass already
computes them, so the estimate costs one matrix-vector product per row (UnstableBaselines'
A2C builds its critic as a second LoRA adapter, which doubles every forward pass). The head
trains on those features detached, by its own AdamW at its own step size, so the value loss
shapes the adapter only as far as ``value_coef`` asks (0: not at all; the critic is then a
probe of what the policy already separates).

Where credit goes: an algorithm that uses the head (``a2c``, :mod:`ub.learner.algorithms`)
takes the batch's per-decision returns (the ``advantage`` column the batch query made, without
a normalizing sampling transform) and trains on ``return - value``: the position's expected
return is subtracted from each decision, so a move is credited for doing better than the
policy usually does from that position; with ``gae_lambda < 1``, on the seats whose every
decision of the game is in the batch, the advantage is GAE over the seat's decisions
(:func:`gae`), which trades the return's variance for the value's bias.

The head is saved in a checkpoint's folder as ``value_head.safetensors`` beside the adapter
(vLLM and PEFT read ``adapter_model.safetensors`` and ``adapter_config.json`` only), with its
optimizer state in ``optimizer.safetensors`` under ``value_head.*`` names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ub.errors import UbError
from ub.learner.checkpoint import VALUE_HEAD_FILE

PREFIX = "value_head."


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


class ValueBaseline:
    """The value head, its optimizer and its loss: one component the update hands the states
    of each micro-batch to.

    :param hidden_size: the policy's hidden size.
    :param device: the policy's device.
    :param learning_rate: the head's AdamW step size (constant).
    :param value_coef: weight of the value loss in the adapter's gradient (0: none).
    """

    def __init__(self, hidden_size: int, device: torch.device, learning_rate: float,
                 value_coef: float) -> None:
        self.head = ValueHead(hidden_size).to(device)
        self.learning_rate = learning_rate
        self.value_coef = value_coef
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=learning_rate,
                                           weight_decay=0.0)

    def configure(self, learning_rate: float, value_coef: float) -> None:
        """New settings for the kept head (its weights and AdamW state stay)."""
        self.learning_rate, self.value_coef = learning_rate, value_coef
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate

    def params(self) -> dict[str, torch.nn.Parameter]:
        """The head's parameters by their saved names (``value_head.linear.weight``, ...)."""
        return {PREFIX + name: p for name, p in self.head.named_parameters()}

    def loss(self, states: torch.Tensor, returns: torch.Tensor, batch_rows: int
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the value loss: the head's mean squared error to the
        returns over the step's ``batch_rows`` rows, plus ``value_coef`` times the same
        error through the adapter. Statistics are sums over the rows."""
        values = self.head(states)
        error = (values - returns) ** 2
        loss = error.sum() / batch_rows
        if self.value_coef:
            loss = loss + self.value_coef * ((self.head.shared(states) - returns) ** 2).sum() \
                / batch_rows
        return loss, {"value_mse_row": error.detach().sum(),
                      "value_mean_row": values.detach().sum()}

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def weights(self) -> dict[str, torch.Tensor]:
        """The head's weights by saved name (copies, on the CPU)."""
        return {name: p.detach().cpu().clone() for name, p in self.params().items()}

    def load_weights(self, weights: Mapping[str, torch.Tensor], where: str) -> None:
        params = self.params()
        if set(weights) != set(params):
            raise UbError(f"{where}: {VALUE_HEAD_FILE} holds {sorted(weights)}, the value head "
                          f"has {sorted(params)}: it was written by another model")
        with torch.no_grad():
            for name, p in params.items():
                if tuple(weights[name].shape) != tuple(p.shape):
                    raise UbError(f"{where}: {name} has shape {tuple(weights[name].shape)}, "
                                  f"the head {tuple(p.shape)}: it was trained on another "
                                  "base model")
                p.copy_(weights[name])


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
