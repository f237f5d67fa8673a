"""`ub compare`'s arithmetic (ub.compare), on figures written out here: the end-to-end sweep
and its CSV are tests/test_sweep.py's."""

from __future__ import annotations

import math

import pytest

from ub.compare import Measured, compare, measured


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


def eval_row(run: str, legal_moves: str, win_rate: float) -> dict:
    """An ``evals`` view row of checkpoint 32 on Nim against the random player."""
    return {"run": run, "update": 32, "env_id": "Nim", "opponent": "random", "games": 400,
            "legal_moves": legal_moves, "win_rate": win_rate, "win_low": win_rate - 0.05,
            "baseline_high": 0.55, "draws": 0, "wins": int(400 * win_rate)}


def test_a_masked_arm_pairs_with_a_free_one_and_a_run_measured_both_ways_keeps_two_figures():
    """docs/learning.md's first table: each arm as it plays (the mask, or free), paired by
    seed; where one run evaluated both ways, the two ways are two figures."""
    runs = [{"run": f"{arm}-s{seed}", "seed": seed, "settings": [("moves", arm)]}
            for arm in ("free", "mask") for seed in (0, 1)]
    evals = [eval_row("free-s0", "free", 0.58), eval_row("free-s1", "free", 0.67),
             eval_row("mask-s0", "mask", 0.73), eval_row("mask-s1", "mask", 0.72)]
    summaries, (paired,) = compare(measured(runs, evals, [], 32), "moves=free")
    assert {(s.figure, s.arm, s.moves) for s in summaries} == {
        ("Nim vs random: win rate", "moves=free", "free"),
        ("Nim vs random: win rate", "moves=mask", "mask")}
    assert paired.mean == pytest.approx((0.15 + 0.05) / 2) and paired.up == 2

    both = measured(runs, [*evals, eval_row("mask-s0", "free", 0.70)], [], 32)
    assert {m.figure for m in both} == {"Nim vs random, free: win rate",
                                        "Nim vs random, mask: win rate"}
