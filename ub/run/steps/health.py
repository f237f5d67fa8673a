"""Signs that a run is collapsing, per env, from a round's tracked metrics.

A policy that collapses onto one move shows it in its games before its evaluation does: the
env's invalid-move rate climbs, and the entropy of what it samples falls towards zero (every
decision the same move). ``ub train``'s round line and ``ub dashboard`` print one warning line
per env that crossed a threshold (``tracking.alert_invalid_move_rate``,
``tracking.alert_entropy``), with the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping


def per_env(metrics: Mapping[str, float], prefix: str = "collection"
            ) -> dict[str, dict[str, float]]:
    """``{env: {name: value}}`` from flat metric names ``PREFIX/ENV/NAME``."""
    out: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == prefix:
            out.setdefault(parts[1], {})[parts[2]] = value
    return out


def env_alerts(metrics: Mapping[str, float], invalid_move_rate: float,
               entropy: float) -> list[str]:
    """One line per env whose invalid-move rate in the round's games is above
    ``invalid_move_rate``, or whose sampled entropy (nats per completion token) is below
    ``entropy`` (0: never), with its numbers; ``[]`` for a healthy round.

    :param metrics: a round's tracked metrics (:func:`ub.run.steps.tracking.round_metrics`).
    """
    lines = []
    for env, m in sorted(per_env(metrics).items()):
        invalid, sampled = m.get("invalid_move_rate"), m.get("entropy")
        high = invalid is not None and invalid > invalid_move_rate
        low = sampled is not None and sampled < entropy
        if high or low:
            what = " and ".join([*(["invalid moves high"] if high else []),
                                 *(["entropy low"] if low else [])])
            numbers = f"invalid moves {100 * invalid:.1f}%" if invalid is not None else ""
            if sampled is not None:
                numbers += f"{', ' if numbers else ''}entropy {sampled:.3f} nats/token"
            lines.append(f"warning: {env}: {what} ({numbers}; thresholds "
                         f"{100 * invalid_move_rate:.0f}% and {entropy:g}): the policy may be "
                         "collapsing")
    return lines
