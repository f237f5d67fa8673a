"""`ub compare`'s arithmetic (ub.compare), on figures written out here: the end-to-end sweep
and its CSV are tests/test_sweep.py's."""

from __future__ import annotations

import math

import pytest

from ub.compare import Measured, compare


def figures(name: str, arm: str, values: list[float]) -> list[Measured]:
    return [Measured(f"{arm}-s{seed}", arm, seed, name, value, None)
            for seed, value in enumerate(values)]


def test_an_arm_has_its_seeds_mean_and_t_interval_and_the_other_arm_its_paired_difference():
    rows = figures("Nim vs random: win rate", "A", [0.5, 0.6, 0.7]) + figures(
        "Nim vs random: win rate", "B", [0.6, 0.6, 0.9])
    (a, b), (paired,) = compare(rows)
    assert b.mean == pytest.approx(0.7)
    assert (a.arm, a.seeds, a.mean) == ("A", 3, pytest.approx(0.6))
    half = 4.303 * 0.1 / math.sqrt(3)  # t(0.975, 2 df) * sd / sqrt(n)
    assert (a.low, a.high) == (pytest.approx(0.6 - half), pytest.approx(0.6 + half))
    assert (paired.arm, paired.reference, paired.seeds) == ("B", "A", 3)
    assert paired.mean == pytest.approx((0.1 + 0.0 + 0.2) / 3)
    assert paired.se == pytest.approx(0.1 / math.sqrt(3)) and paired.up == 2


def test_an_interval_stays_within_what_its_figure_can_be():
    """Two seeds far apart give a t-interval wider than a rate's range: it stops at 0 and 1
    (a NashConv, not a rate, only at 0)."""
    rows = (figures("TicTacToe vs random: win rate", "A", [0.05, 0.95])
            + figures("Nim free: NashConv", "A", [0.1, 1.9]))
    summaries, _ = compare(rows)
    by_figure = {s.figure: s for s in summaries}
    rate, nash = by_figure["TicTacToe vs random: win rate"], by_figure["Nim free: NashConv"]
    assert (rate.low, rate.high) == (0.0, 1.0)
    assert nash.low == 0.0 and nash.high > 1.9
