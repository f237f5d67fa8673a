"""bench/tabular_selfplay.py, the tabular reference of issue 77: a table of logits per position
trained by ub's recipe learns Nim by self-play (its exact NashConv falls from the uniform
policy's), its gradient is the loss's, its credit is ub's transforms', and the table plugs into
ub's solver as the game's own positions and moves. Seconds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from ub.exploitability import UniformPolicy, random_nash_conv
from ub.games.game_tree import exploitability

ROOT = Path(__file__).resolve().parents[1]
NIM, KUHN = "Nim-v0-train", "KuhnPoker-v0-train"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("tabular_selfplay",
                                                  ROOT / "bench" / "tabular_selfplay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def recipe(bench, *flags: str):
    return bench.make_recipe(bench.parse_args(list(flags)))


def test_nim_nash_conv_falls_from_the_uniform_policys_with_an_entropy_bonus(bench) -> None:
    """The issue's recipe (the outcome on every move, self-play, an update per game, lr 0.5)
    with an entropy bonus of 0.3: in 4,000 games the greedy table plays Nim perfectly and the
    sampled one is far below the uniform policy's 1.9998 (seeds 0-4 measured 0.39-0.92)."""
    figures = bench.train(recipe(bench, "--game", "nim", "--games", "4000", "--at", "4000",
                                 "--algorithm", "reinforce", "--credit", "outcome",
                                 "--opponents", "mirror=1", "--games-per-round", "1",
                                 "--constant-lr", "--lr", "0.5", "--entropy-coef", "0.3",
                                 "--seed", "0"), out=None)
    start, end = figures[0], figures[-1]
    assert start["games"] == 0 and end["games"] == 4000
    assert start["sampled"] == pytest.approx(random_nash_conv(NIM), abs=1e-12)
    assert start["greedy"] == 2.0  # (an untrained table's greedy move: the first legal one)
    assert end["positions"] >= 225  # of Nim [3, 4, 5]'s 230 the solver walks
    assert end["greedy"] == pytest.approx(0.0, abs=1e-9)
    assert end["sampled"] < 1.2


def test_the_preset_recipe_runs_and_its_update_stops_at_target_kl(bench) -> None:
    """ub's demo recipe as the preset ships it, for a few rounds: PPO's four minibatch steps
    a round, fewer where target_kl stops the update (a large step makes it stop)."""
    made = recipe(bench, "--game", "nim", "--games", "384", "--no-sampled", "--lr", "8")
    assert (made.games_per_round, made.batch_size, made.lagged_k) == (96, 512, 3)
    assert made.opponents == [("mirror", 0.4), ("lagged", 0.2), ("random", 0.4)]
    assert (made.learner.minibatches, made.learner.target_kl) == (4, 0.03)
    figures = bench.train(made, out=None)
    assert [f["games"] for f in figures] == [0, 96, 192, 288, 384]
    assert all(1 <= f["steps"] <= 4 for f in figures[1:])
    assert any(f["steps"] < 4 for f in figures[1:])


def test_the_gradient_is_the_losss(bench) -> None:
    """PPO's clipped term, the entropy bonus and the magnet's KL, against finite differences
    of the loss they are the gradient of (rows of 3 and 2 legal moves in 4 columns)."""
    made = recipe(bench, "--game", "nim", "--entropy-coef", "0.3", "--magnet-coef", "0.2")
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 4))
    legal = np.array([3, 2, 3, 2, 3])
    moves = np.array([0, 1, 2, 0, 1])
    magnet = rng.normal(size=(5, 4))
    advantages = np.array([1.0, -0.5, 0.7, -1.2, 0.3])
    # Behaviour probabilities that put rows 0 and 1 outside the clip range (no gradient there).
    _, logp = bench.masked_softmax(logits, legal)
    behaviour = logp[np.arange(5), moves] + np.array([-0.5, 0.5, 0.05, -0.05, 0.0])

    def loss(z: np.ndarray) -> float:
        p, logp = bench.masked_softmax(z, legal)
        ratio = np.exp(logp[np.arange(5), moves] - behaviour)
        clipped = np.clip(ratio, 0.8, 1.2)
        surrogate = -np.minimum(ratio * advantages, clipped * advantages)
        entropy = -(p * logp).sum(axis=1)
        _, log_magnet = bench.masked_softmax(magnet, legal)
        kl = (p * (logp - log_magnet)).sum(axis=1)
        return float((surrogate - 0.3 * entropy + 0.2 * kl).sum())

    grad, _ = bench.gradient(made, logits, legal, moves, behaviour, advantages, magnet, clip=True)
    numeric = np.zeros_like(logits)
    for i in range(5):
        for j in range(legal[i]):
            step = np.zeros_like(logits)
            step[i, j] = 1e-6
            numeric[i, j] = (loss(logits + step) - loss(logits - step)) / 2e-6
    assert np.abs(grad - numeric).max() < 1e-6
    assert np.all(grad[np.arange(4) >= legal[:, None]] == 0)  # (no gradient off the moves)


def test_credit_is_ubs_transforms(bench) -> None:
    """The preset's credit on two games by hand: win_draw_loss, role_advantage's baselines
    (read before each game updates them, the random player's seat not updating), discount 0.5
    per later move of the seat, then (x - mean) / std over the batch."""
    made = recipe(bench, "--game", "nim")
    d = bench.Decision
    mirror = bench.Game(0, ["model", "model"], [d(0, 0, 0, 0.0, True), d(1, 1, 0, 0.0, True),
                                                d(0, 2, 0, 0.0, True)], [1.0, -1.0])
    against_random = bench.Game(1, ["random", "model"], [d(0, 3, 0, 0.0, False),
                                                         d(1, 4, 0, 0.0, True)], [1.0, -1.0])
    batch = bench.credit(made, [mirror, against_random], 0, np.random.default_rng(0))
    # Game 0: baselines 0, so seat 0 earns +1 (its last move) and 0.5, seat 1 -1; then
    # b0 = 0.1, b1 = -0.1. Game 1: seat 1 (the model) lost: -1 - (-0.1) = -0.9.
    by_row = {dec.row: value for dec, value in batch}
    raw = np.array([0.5, -1.0, 1.0, -0.9])
    assert sorted(by_row) == [0, 1, 2, 4]
    assert np.allclose([by_row[r] for r in (0, 1, 2, 4)], (raw - raw.mean()) / raw.std())


def test_the_table_is_a_policy_of_ubs_solver(bench) -> None:
    """An untrained table is the uniform policy to ub's solver (Nim sampled, Kuhn Poker's
    information sets), and a trained one is asked in the positions and moves play met (the
    policy checks each decision's moves against the table's)."""
    table = bench.Table(max_moves=12)
    assert bench.nash_conv(KUHN, table, greedy=False) == pytest.approx(
        exploitability(KUHN, UniformPolicy()).nash_conv, abs=1e-12)
    made = recipe(bench, "--game", "kuhn", "--games", "192", "--no-sampled")
    figures = bench.train(made, out=None)
    # Kuhn Poker's keys hold the hand (r1/3 ...), its chips and betting: the first hand's 12
    # information sets are among those met in three-hand games.
    assert figures[-1]["positions"] > 12
    assert 0.0 <= figures[-1]["greedy"] <= 4.0
