"""`ub compare`'s arithmetic (ub.compare), on figures and view rows written out here, and the
command on run folders made of a config and a manifest: a trained sweep and its CSV are
tests/test_sweep.py's."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil

import pytest
import yaml

from ub.compare import Measured, arm_letters, arm_names, comparable_runs, compare, measured
from ub.run.folder.sweep import sweep_arm


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


def eval_row(run: str, legal_moves: str, win_rate: float, **fields) -> dict:
    """An ``evals`` view row of checkpoint 32 on Nim against the random player (``fields``
    replace its own)."""
    return {"run": run, "update": 32, "env_id": "Nim", "opponent": "random", "games": 400,
            "legal_moves": legal_moves, "win_rate": win_rate, "win_low": win_rate - 0.05,
            "baseline_high": 0.55, "draws": 0, "wins": int(400 * win_rate), **fields}


def run_row(run: str, seed: int | None, rate: str) -> dict:
    """A ``runs`` view row: the run's seed and its one setting that differs."""
    return {"run": run, "seed": seed, "settings": [("learner.learning_rate", rate)]}


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


def test_clearing_random_is_the_runs_interval_above_the_random_players():
    """A win rate above the random player's interval that is not above it with its own
    interval's low end (a few games' luck) does not clear; the low end above it does."""
    runs = [run_row("a-s0", 0, "0.001"), run_row("a-s1", 1, "0.001")]
    evals = [eval_row("a-s0", "mask", 0.60, win_low=0.50, baseline_high=0.55),
             eval_row("a-s1", "mask", 0.70, win_low=0.56, baseline_high=0.55)]
    figures = measured(runs, evals, [], 32)
    assert {m.run: m.clears for m in figures} == {"a-s0": False, "a-s1": True}
    (arm,), _ = compare(figures)
    assert (arm.clears, arm.barred) == (1, 2)


def test_the_no_loss_rate_counts_wins_and_draws():
    """10 wins and 20 draws of 40 games: 30 of 40 not lost."""
    runs = [run_row("a-s0", 0, "0.001")]
    row = eval_row("a-s0", "mask", 0.25, wins=10, draws=20, games=40)
    by_figure = {m.figure: m.value for m in measured(runs, [row], [], 32)}
    assert by_figure == {"Nim vs random: win rate": 0.25,
                         "Nim vs random: no-loss rate": pytest.approx(0.75)}


def test_a_seed_counts_once_in_its_arm_however_many_runs_repeat_it():
    """Issue 76: two arms whose settings resolve alike, or a copied run, are the same seed
    again: the first run by name counts it, the others are left out with a line each, and the
    pairing uses that run's value (the one seed's interval is its value)."""
    runs = [run_row("a-s0", 0, "0.001"), run_row("b-s0", 0, "0.002"),
            run_row("c-s0", 0, "0.001"), run_row("d-s0", 0, "0.001")]
    counted, left_out = comparable_runs(runs)
    assert [r["run"] for r in counted] == ["a-s0", "b-s0"]
    assert left_out == [
        f"{run} repeats seed 0 of arm learner.learning_rate=0.001 (run a-s0, the first by "
        "name, counts it): left out" for run in ("c-s0", "d-s0")]
    evals = [eval_row("a-s0", "mask", 0.30), eval_row("b-s0", "mask", 0.50),
             eval_row("c-s0", "mask", 0.90), eval_row("d-s0", "mask", 0.80)]
    (a, b), (paired,) = compare(measured(runs, evals, [], 32))
    assert (a.arm, a.seeds, a.mean, a.low, a.high) == (
        "learner.learning_rate=0.001", 1, pytest.approx(0.3), pytest.approx(0.3),
        pytest.approx(0.3))
    assert (paired.arm, paired.seeds, paired.mean) == (b.arm, 1, pytest.approx(0.2))


def test_compare_counts_a_figure_given_twice_for_one_seed_once():
    twice = figures("Nim vs random: win rate", "A", [0.5]) * 2 + figures(
        "Nim vs random: win rate", "B", [0.7])
    (a, _), (paired,) = compare(twice)
    assert (a.seeds, a.low, a.high) == (1, 0.5, 0.5) and paired.seeds == 1


def test_a_run_whose_config_did_not_read_is_left_out_not_made_an_arm():
    """Issue 76: a run without settings or seed in the ``runs`` view (its config.yaml is
    damaged, or its seed no whole number) is in no arm: it cannot become the reference and
    take the pairing with it."""
    runs = [run_row("a-s0", 0, "0.001"), run_row("a-s1", 1, "0.001"),
            run_row("b-s0", 0, "0.002"), {"run": "b-s1", "seed": None, "settings": None},
            run_row("b-s2", None, "0.002")]
    counted, left_out = comparable_runs(runs)
    assert [r["run"] for r in counted] == ["a-s0", "a-s1", "b-s0"]
    assert left_out == [
        "b-s1 has no settings (its config does not read as a run's): in no arm, left out",
        "b-s2 has no seed (its config's is no whole number): nothing to pair it by, left out"]
    evals = [eval_row(run, "mask", 0.5) for run in ("a-s0", "a-s1", "b-s1", "b-s2")] + [
        eval_row("b-s0", "mask", 0.6)]
    summaries, (paired,) = compare(measured(runs, evals, [], 32))
    assert [(s.arm, s.seeds) for s in summaries] == [("learner.learning_rate=0.001", 2),
                                                     ("learner.learning_rate=0.002", 1)]
    assert (paired.reference, paired.seeds) == ("learner.learning_rate=0.001", 1)


def write_run(folder, name: str, config: dict, win_rate: float) -> None:
    """A run's folder as `ub compare` reads it: its config and one round's manifest, which
    evaluated checkpoint 1 on Nim against the random player."""
    run = folder / name
    (run / "rounds").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    wins = round(100 * win_rate)
    row = {"env_id": "Nim", "opponent": "random", "games": 100, "wins": wins, "draws": 0,
           "losses": 100 - wins, "win_rate": win_rate, "win_low": win_rate - 0.1,
           "win_high": win_rate + 0.1, "baseline_high": 0.55, "legal_moves": "mask"}
    (run / "rounds" / "round-000000.json").write_text(json.dumps({"evals": {"1": [row]}}))


def test_ub_compare_says_which_runs_it_left_out_and_pairs_the_rest(tmp_path, capsys):
    """Issue 76 end to end: a copied run and a run whose config.yaml is damaged are named on
    stderr and left out; the arms pair on the seeds that remain."""
    from ub.flows.cli import main

    for name, rate, win_rate in (("a-s0", 0.001, 0.5), ("a-s1", 0.001, 0.6),
                                 ("b-s0", 0.002, 0.7), ("b-s1", 0.002, 0.9)):
        config = {"seed": int(name[-1]), "learner": {"learning_rate": rate}}
        write_run(tmp_path, name, config, win_rate)
    shutil.copytree(tmp_path / "a-s0", tmp_path / "c-s0")
    (tmp_path / "b-s1" / "config.yaml").write_text(": : [bad\n")
    assert main(["compare", str(tmp_path), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert "ub: warning: b-s1 has no " in err and ", left out\n" in err
    assert "ub: warning: c-s0 repeats seed 0 of arm " in err and "(run a-s0, " in err
    a, b = csv.DictReader(io.StringIO(out))
    assert (a["seeds"], a["mean"], a["less the reference"]) == ("2", "0.550", "(reference)")
    assert (b["seeds"], b["mean"], b["less the reference"], b["seeds up"]) == (
        "1", "0.700", "+0.200", "1 of 1")


def test_an_arm_is_shown_by_the_name_its_sweep_gave_it_where_that_name_is_its_own():
    """Issue 78: a sweep's arms showed as "arm A" and "arm B". The settings make the arm; the
    name (the runs view's ``arm``: ``ub sweep`` names runs ARM-sSEED) shows it, unless its runs
    disagree on it or another arm's runs carry it too."""
    def row(run: str, arm: str | None, rate: str) -> dict:
        return {**run_row(run, 0, rate), "arm": arm}

    names = arm_names([row("base-s0", "base", "0.003"), row("base-s1", "base", "0.003"),
                       row("ent-s0", "ent", "0.002"),
                       row("x-s0", "x", "0.001"), row("y-s0", "y", "0.001"),  # one arm, 2 names
                       row("z-s0", "z", "0.004"), row("z-s1", "z", "0.005"),  # one name, 2 arms
                       row("demo", None, "0.006")])
    assert names == {"base-s0": "base", "base-s1": "base", "ent-s0": "ent",
                     "x-s0": "learner.learning_rate=0.001", "y-s0": "learner.learning_rate=0.001",
                     "z-s0": "learner.learning_rate=0.004", "z-s1": "learner.learning_rate=0.005",
                     "demo": "learner.learning_rate=0.006"}
    assert sweep_arm("lr2-s10", 10) == "lr2" and sweep_arm("a-s1-s0", 0) == "a-s1"
    assert [sweep_arm(run, seed) for run, seed in
            (("lr2-s10", 1), ("demo", 0), ("-s0", 0), ("lr2-s", 0), ("x-s0", None))] == [None] * 5
    # Letters for the arms without a name, none of them one a named arm has.
    assert arm_letters(["A", "k=1", "k=2", "(base)"],
                       {"A": "k=0", "k=1": "k=1", "k=2": "k=2", "(base)": "(base)"}) == {
        "(base)": "B", "A": "A", "k=1": "C", "k=2": "D"}


def test_a_folder_that_is_no_folder_of_runs_is_told_what_to_give(tmp_path, capsys):
    """Issue 78: the refusal's hint (`ub sql FOLDER "SELECT * FROM runs"`) answered a Catalog
    Error on the very folder it was printed for. Each case now says what it found."""
    from ub.flows.cli import main

    write_run(tmp_path / "sweep", "a-s0", {"seed": 0}, 0.5)
    (tmp_path / "sweep" / "a-s0" / "ub-run.json").write_text('{"format": 2}')
    (tmp_path / "empty").mkdir()
    for folder, said in (
            (tmp_path / "gone", f"no folder {tmp_path / 'gone'}: give the folder that holds a "
             "sweep's runs (its --root)"),
            (tmp_path / "empty", f"{tmp_path / 'empty'} holds no run (a run is a folder with "
             "ub-run.json, as ub train and ub sweep make them): give the folder a sweep's "
             "--root named"),
            (tmp_path / "sweep" / "a-s0", f"{tmp_path / 'sweep' / 'a-s0'} is one run, not a "
             f"folder of runs: give the folder that holds it with the runs to compare it to "
             f"({tmp_path / 'sweep'}, say)")):
        assert main(["compare", str(folder)]) == 2
        assert capsys.readouterr().err == f"ub: error: {said}\n"
