"""Collapse warnings (ub.run.steps.health): which envs a round's metrics flag, and the line's
numbers."""

from __future__ import annotations

from ub.run.steps.health import env_alerts


def metrics(**per_env: tuple[float, float]) -> dict[str, float]:
    out = {}
    for env, (invalid, entropy) in per_env.items():
        out[f"collection/{env}/invalid_move_rate"] = invalid
        out[f"collection/{env}/entropy"] = entropy
        out[f"collection/{env}/decisions"] = 100.0
    out["learner/entropy_mean"] = 0.0  # not an env's: never flagged
    return out


def test_a_healthy_round_has_no_warning() -> None:
    assert env_alerts(metrics(ttt=(0.02, 0.8), nim=(0.0, 0.6)), 0.1, 0.05) == []


def test_invalid_moves_and_entropy_each_flag_an_env_with_its_numbers() -> None:
    # Issue 42's collapse: Nim answered with one invalid move in round 26.
    got = env_alerts(metrics(ttt=(0.01, 0.5), nim=(0.92, 0.01), kuhn=(0.0, 0.02)), 0.1, 0.05)
    assert got == [
        "warning: kuhn: entropy low (invalid moves 0.0%, entropy 0.020 nats/token; thresholds "
        "10% and 0.05): the policy may be collapsing",
        "warning: nim: invalid moves high and entropy low (invalid moves 92.0%, entropy 0.010 "
        "nats/token; thresholds 10% and 0.05): the policy may be collapsing",
    ]


def test_a_zero_entropy_threshold_never_flags_entropy() -> None:
    assert env_alerts(metrics(nim=(0.0, 0.0)), 0.1, 0.0) == []
