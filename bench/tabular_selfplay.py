"""A tabular reference for ub's self-play recipe (issue 77): the bound a model is compared with.

Not a test. ``.venv/bin/python bench/tabular_selfplay.py --game tictactoe|nim|kuhn
[--games 3072] [--games-per-round 96] [--lr 0.5] [--entropy-coef 0.1] [--magnet-coef 0.1]
[--opponents mirror=0.4,lagged=0.2,random=0.4] [--algorithm ppo|reinforce] [--seed 0]
[--every 1024 | --at 3072,10000,30000,60000] [--preset tiny-cpu]``; ``--help`` lists the rest.
The issue's sanity check (the outcome on every move, self-play, an update per game)::

    bench/tabular_selfplay.py --game nim --algorithm reinforce --credit outcome \
        --opponents mirror=1 --games-per-round 1 --constant-lr --lr 0.5 --entropy-coef 0.3

The algorithm ub ships, on a policy that is a table: one softmax over the legal moves per exact
position (information state, in Kuhn Poker) of the game, as ub keys positions
(:mod:`ub.games.positions`). Everything but the representation is ub's own:

- **the games**: ub's env (``ub.games.specs.make_env``: TextArena with ub's fixes, Kuhn
  Poker's bets paid into the pot), its legal moves and position keys
  (:mod:`ub.games.builtin`), each game's env seeded as a run seeds it (``ub.seeding``);
- **the opponents**: the preset's mix, drawn per game as :mod:`ub.pool.sampling` draws it
  (``mirror``: the current table in both seats; ``lagged``: uniform over the last ``k``
  tables, self-play before there is one; ``fixed [random]``: the uniformly random legal
  player), the learner in seat ``game_index % 2``;
- **the credit**: the preset's own reward transforms (:mod:`ub.rewards`), built from its
  ``batch:`` section and applied through their plain-Python forms (the forms
  ``tests/batch_reference.py`` checks the DuckDB batch against): the final stage game by game
  in canonical order (``win_draw_loss``, ``role_advantage``'s EMA baseline per role, updated by
  the model seats), the step stage per decision (``discount``: ``gamma ** seat_moves_after``),
  the batch's uniform sample of ``batch_size`` of the round's learner decisions, and the
  sampling stage on it (``normalize_per_env``);
- **the update**: PPO as ``ub/learner/update.py`` runs it (the batch shuffled and cut into
  ``minibatches``, ``epochs`` passes, the ratio to the policy that played clipped to
  ``1 +- clip_eps``, ``target_kl``'s stop before a step whose k3 ``approx_kl`` passes it, the
  learning-rate warm-up and decay of ``ub.learner.update.scheduled_learning_rate``), an
  entropy bonus on the masked distribution (``learner.entropy_coef``, exact gradient), or
  plain REINFORCE (``--algorithm reinforce``: one step on the round's batch);
- **the measure**: exact NashConv, greedy and sampled, by ub's solver
  (``ub.games.game_tree.exploitability``), the table plugged in as a ``TreePolicy``.

What differs, because a table is not a transformer: the loss is a *sum* over the batch's rows
stepped by plain gradient descent on the logits, so ``--lr`` is the step one decision of
advantage 1 gives its own logits (ub divides by the rows, ``B * L``, and steps a LoRA adapter
with AdamW: no learning rate carries over); no gradient-norm clipping (a table's gradient norm
grows with the positions a batch visits, not with one shared set of weights); and nothing is
shared between positions (a model generalizes, for better or worse). ``--magnet-coef`` adds a
term the preset does not have: ``coef * KL(policy || magnet)`` at each decision, the magnet a
slowly moving copy of the policy (magnetic mirror descent, Sokota et al. 2022,
arXiv 2206.05825), which moves halfway to the policy every ``--magnet-halflife`` games.

Prints one line per ``--every`` games, or at each of ``--at``'s game counts (at the first round
that reaches it): the games played, the exact NashConv of the greedy and the sampled table, the
positions met, the sampled policy's mean entropy over them (nats), the optimizer steps per round
since the line before (target_kl's stop shows as fewer than ``minibatches``), and the seconds
spent playing and learning (the NashConv walks not counted). ``--json PATH`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ub.exploitability import random_nash_conv
from ub.games.game_tree import MoveDistribution, TreeDecision, exploitability
from ub.games.loop import GameResult
from ub.games.positions import position_function
from ub.games.registry import rules_for
from ub.games.rules import unwrap
from ub.games.specs import make_env
from ub.learner import LearnerConfig
from ub.learner.update import scheduled_learning_rate
from ub.pool import OpponentConfig
from ub.rewards import GameView, RewardTransforms
from ub.run.config.load import read_config_data
from ub.seeding import env_seed

# game -> (the env id ub trains it as, the preset whose recipe is the default)
GAMES = {
    "tictactoe": ("TicTacToe-v0-train", "tiny-cpu"),
    "nim": ("Nim-v0-train", "tiny-cpu"),
    "kuhn": ("KuhnPoker-v0-train", "tiny-cpu-kuhn"),
}
LEARNER = "model"  # the actor name of the current policy: a model seat, as role_advantage reads it
RANDOM = "random"


# --------------------------------------------------------------------------------------------
# The recipe: the preset's values, each overridable by a flag
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", choices=sorted(GAMES), default="nim")
    parser.add_argument("--preset", help="the recipe's source: a preset's name or a config "
                        "file (default: tiny-cpu, or tiny-cpu-kuhn for kuhn)")
    parser.add_argument("--games", type=int, help="games in all (default: the last of --at, "
                        "else the preset's rounds x games_per_round)")
    parser.add_argument("--games-per-round", type=int, help="default: the preset's")
    parser.add_argument("--batch-size", type=int, help="learner decisions sampled per round "
                        "(default: the preset's batch.batch_size)")
    parser.add_argument("--lr", type=float, default=0.5, help="peak step on the logits of a "
                        "decision of advantage 1 (the preset's warm-up and decay apply)")
    parser.add_argument("--constant-lr", action="store_true", help="no warm-up or decay")
    parser.add_argument("--algorithm", choices=["ppo", "reinforce"], default="ppo")
    parser.add_argument("--entropy-coef", type=float, help="default: the preset's "
                        "learner.entropy_coef")
    parser.add_argument("--magnet-coef", type=float, default=0.0, help="KL(policy || magnet) "
                        "per decision (0: none)")
    parser.add_argument("--magnet-halflife", type=float, default=5000.0, help="games after "
                        "which the magnet has moved halfway to the policy")
    parser.add_argument("--opponents", help="the mix, e.g. mirror=0.4,lagged=0.2,random=0.4 "
                        "(default: the preset's; lagged's k is the preset's or --lagged-k)")
    parser.add_argument("--lagged-k", type=int, help="default: the preset's")
    parser.add_argument("--credit", choices=["preset", "outcome"], default="preset",
                        help="outcome: +1/0/-1 on every move of the seat, nothing else")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, help="print every this many games (default: "
                        "about ten lines)")
    parser.add_argument("--at", help="print at these game counts instead, e.g. "
                        "3072,10000,30000,60000")
    parser.add_argument("--no-sampled", action="store_true", help="skip the sampled NashConv "
                        "(TicTacToe's walks its 4,520 positions: ~10 s)")
    parser.add_argument("--json", type=Path, help="write the printed rows here")
    return parser.parse_args(argv)


@dataclass
class Recipe:
    """Everything a run needs, resolved from the preset and the flags."""

    env_id: str
    games: int
    games_per_round: int
    batch_size: int
    opponents: list[tuple[str, float]]  # (mirror | lagged | random, weight)
    lagged_k: int
    transforms: RewardTransforms
    learner: LearnerConfig  # its schedule, PPO settings and entropy_coef; lr is --lr
    algorithm: str
    magnet_coef: float
    magnet_halflife: float
    seed: int
    milestones: list[int]  # the game counts to print at (the first round reaching each)
    sampled: bool


def make_recipe(args: argparse.Namespace) -> Recipe:
    env_id, default_preset = GAMES[args.game]
    preset, _label = read_config_data(args.preset or default_preset)
    rollout, batch = preset.get("rollout", {}), preset.get("batch", {})
    games_per_round = args.games_per_round or int(rollout.get("games_per_round", 96))
    at = [int(n) for n in args.at.split(",")] if args.at else []
    games = args.games or max(at, default=int(preset.get("rounds", 32)) * games_per_round)

    # The preset's opponents, as ub validates them. Here `random` names the uniformly random
    # player (the preset's `{mode: fixed, names: [random]}`), not ub's mode `random`.
    modes = OpponentConfig.model_validate(preset.get("opponents", ["mirror"])).modes
    lagged_k = args.lagged_k or next((m.lagged_k for m in modes if m.mode == "lagged"), 4)
    if args.opponents:
        opponents = [(name.strip(), float(weight)) for name, weight in
                     (part.split("=") for part in args.opponents.split(","))]
    else:
        opponents = []
        for m in modes:
            if m.mode == "fixed" and m.names == [RANDOM]:
                opponents.append((RANDOM, m.weight))
            elif m.mode in ("mirror", "lagged"):
                opponents.append((m.mode, m.weight))
            else:
                raise SystemExit(f"the preset's opponents mode {m.mode} ({m.names or ''}) has "
                                 "no table here: give --opponents")
    unknown = {name for name, _ in opponents} - {"mirror", "lagged", RANDOM}
    if unknown:
        raise SystemExit(f"--opponents: unknown mode(s) {', '.join(sorted(unknown))}: "
                         "mirror, lagged, random")

    if args.credit == "outcome":  # the table: the game's outcome on every move
        transforms = RewardTransforms.build(["win_draw_loss"], [], [])
    else:
        transforms = RewardTransforms.build(batch.get("final", []), batch.get("step", []),
                                            batch.get("sampling", []))

    learner_section = dict(preset.get("learner", {}))
    learner_section["learning_rate"] = args.lr
    if args.entropy_coef is not None:
        learner_section["entropy_coef"] = args.entropy_coef
    if args.constant_lr:
        learner_section.update(warmup_steps=0, decay_steps=0)
    learner = LearnerConfig(base_model="(a table)", **learner_section)
    every = args.every or max(games_per_round, round(games / 10 / games_per_round)
                              * games_per_round)
    milestones = at or list(range(every, games, every))
    return Recipe(env_id, games, games_per_round,
                  args.batch_size or int(batch.get("batch_size", 512)), opponents, lagged_k,
                  transforms, learner, args.algorithm, args.magnet_coef, args.magnet_halflife,
                  args.seed, sorted({*milestones, games}), not args.no_sampled)


# --------------------------------------------------------------------------------------------
# The table: one row of logits per position, its legal moves in ub's order
# --------------------------------------------------------------------------------------------


class Table:
    """Logits by position key; a position gets a row (all zero: uniform) when first met."""

    def __init__(self, max_moves: int) -> None:
        self.index: dict[str, int] = {}
        self.moves: list[list[str]] = []
        self.logits = np.zeros((64, max_moves))
        self.legal = np.zeros(64, dtype=np.int64)  # how many of a row's columns are moves

    def __len__(self) -> int:
        return len(self.moves)

    def row(self, key: str, core: Any, rules: Any) -> int:
        found = self.index.get(key)
        if found is not None:
            return found
        moves = rules.legal_moves(core)  # a position's moves depend on its key alone
        if len(moves) > self.logits.shape[1]:
            self.logits = np.pad(self.logits, ((0, 0), (0, len(moves) - self.logits.shape[1])))
        if len(self.moves) == len(self.logits):  # (doubling: amortized O(1) per position)
            self.logits = np.concatenate([self.logits, np.zeros_like(self.logits)])
            self.legal = np.concatenate([self.legal, np.zeros_like(self.legal)])
        row = self.index[key] = len(self.moves)
        self.moves.append(moves)
        self.legal[row] = len(moves)
        return row

    def used(self) -> tuple[np.ndarray, np.ndarray]:
        """The logits and legal-move counts of the rows in use (views, not copies)."""
        return self.logits[:len(self)], self.legal[:len(self)]


def masked_softmax(logits: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the softmax over its first ``legal`` columns (the rest 0): ``(p, log p)``,
    ``log p`` 0 where ``p`` is (so ``p * log p`` is 0 there, not nan)."""
    mask = np.arange(logits.shape[1]) < legal[:, None]
    shifted = np.where(mask, logits, -np.inf)
    shifted = shifted - shifted.max(axis=1, keepdims=True)
    logp = np.where(mask, shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)), 0.0)
    return np.where(mask, np.exp(logp), 0.0), logp


class Frozen:
    """A table's policy as it stood (the current one for a round's games, a lagged one): each
    row's sampling probabilities, computed when first asked; a row made later is uniform."""

    def __init__(self, logits: np.ndarray, rows: int) -> None:
        self.logits, self.rows = logits, rows  # (the first `rows` rows are its own)
        self.cache: dict[int, np.ndarray] = {}

    def distribution(self, row: int, legal: int) -> np.ndarray:
        found = self.cache.get(row)
        if found is None:
            if row < self.rows:
                z = self.logits[row, :legal]
                found = np.exp(z - z.max())
                found /= found.sum()
            else:
                found = np.full(legal, 1.0 / legal)
            self.cache[row] = found
        return found


def freeze(table: Table, copy: bool) -> Frozen:
    """The table's policy now; ``copy``: kept as it is while the table learns on (a lagged
    opponent), else valid until the next update (the round's own games)."""
    logits = table.logits[:len(table)]
    return Frozen(logits.copy() if copy else logits, len(table))


class TablePolicy:
    """The table as ub's solver asks a policy (:class:`ub.games.game_tree.TreePolicy`): by the
    position key of each decision; a position never met plays uniformly (greedy: its first
    move)."""

    markov = True  # the key is the position, not the history: the walk shares positions

    def __init__(self, env_id: str, table: Table, greedy: bool) -> None:
        self.position = position_function(env_id)
        self.table, self.greedy = table, greedy
        self.probs = masked_softmax(*table.used())[0]

    def distributions(self, decisions: Sequence[TreeDecision]) -> list[MoveDistribution]:
        out = []
        for d in decisions:
            assert self.position is not None
            row = self.table.index.get(self.position(unwrap(d.env), d.seat) or "")
            moves = d.legal_moves
            if row is None:
                p = np.full(len(moves), 1.0 / len(moves))
            else:
                assert list(moves) == self.table.moves[row], "the solver's moves are not play's"
                p = self.probs[row, :len(moves)]
            if self.greedy:  # the likeliest move, the first of equals (as an argmax)
                out.append(MoveDistribution({moves[int(np.argmax(p))]: 1.0}))
            else:
                out.append(MoveDistribution(dict(zip(moves, p.tolist(), strict=True))))
        return out


def nash_conv(env_id: str, table: Table, greedy: bool) -> float:
    return exploitability(env_id, TablePolicy(env_id, table, greedy)).nash_conv


# --------------------------------------------------------------------------------------------
# Playing a round's games
# --------------------------------------------------------------------------------------------


@dataclass
class Decision:
    seat: int
    row: int
    move: int  # the column played
    behaviour_logp: float  # its log-probability under the policy that played it
    learner: bool  # the current policy's (the batch's): both seats of a mirror game


@dataclass
class Game:
    index: int
    actors: list[str]  # by seat: "model", "ckpt-NNNNNN" (a lagged table) or "random"
    decisions: list[Decision] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


def draw_opponents(recipe: Recipe, history: deque[tuple[int, Frozen]], rng: np.random.Generator,
                   num_games: int) -> list[str]:
    """One opponent per game, as ``ub.pool.sampling.sample_opponents``: a mode by weight, then
    uniform within it; ``lagged`` without an older table plays the current one."""
    names = [name for name, _ in recipe.opponents]
    weights = np.array([w for _, w in recipe.opponents])
    out = []
    for mode in rng.choice(names, size=num_games, p=weights / weights.sum()):
        if mode == "lagged" and history:
            update, _ = history[int(rng.integers(len(history)))]
            out.append(f"ckpt-{update:06d}")
        else:
            out.append(LEARNER if mode != RANDOM else RANDOM)
    return out


def play_game(env: Any, rules: Any, position: Any, table: Table, players: list[Frozen | None],
              actors: list[str], rng: np.random.Generator, seed: int, index: int) -> Game:
    """One game in ub's env: each seat's policy (``None``: uniformly random) picks a legal move;
    the table gains the positions met."""
    game = Game(index, actors)
    env.reset(num_players=2, seed=seed)
    core = unwrap(env)
    done = False
    while not done:
        seat = int(core.state.current_player_id)
        row = table.row(position(core, seat), core, rules)
        legal = int(table.legal[row])
        player = players[seat]
        if player is None:
            move, logp = int(rng.integers(legal)), -math.log(legal)
        else:
            p = player.distribution(row, legal)
            move = min(int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right")),
                       legal - 1)
            logp = math.log(p[move])
        game.decisions.append(Decision(seat, row, move, logp, actors[seat] == LEARNER))
        done, _ = env.step(action=table.moves[row][move])
    rewards, _info = env.close()
    game.rewards = [float(rewards.get(seat, 0.0)) for seat in range(2)]
    return game


# --------------------------------------------------------------------------------------------
# Credit: the preset's reward transforms, through their plain-Python forms
# --------------------------------------------------------------------------------------------


def credit(recipe: Recipe, games: list[Game], round_: int, rng: np.random.Generator
           ) -> list[tuple[Decision, float]]:
    """The round's batch: its learner decisions, each with its advantage, as ub's batch makes
    them (``ub/batch/sql.py``'s query; the transforms' own Python forms)."""
    transforms = recipe.transforms
    rows: list[tuple[Decision, float, dict[str, Any]]] = []
    for game in games:  # canonical order: (round, game_index)
        roles = [f"Player {seat}" for seat in range(2)]
        results = GameResult(game.rewards, roles, [False, False], "", None, 0.0).results
        assert results is not None
        view = GameView(f"r{round_}-g{game.index}", round_, game.index, recipe.env_id, roles,
                        game.actors, list(results), game.rewards)
        final = list(game.rewards)
        for t in transforms.final:  # stateful (role_advantage's baselines): every game, in order
            final = t.transform_game(final, view)
        moves_after = [0, 0]
        for d in reversed(game.decisions):  # seat_moves_after: the seat's later decisions
            if d.learner:
                row = {"seat": d.seat, "seat_moves_after": moves_after[d.seat],
                       "env_id": recipe.env_id, "role": roles[d.seat], "format_ok": True,
                       "invalid_move": False, "step_reward": 0.0, "final_reward": final[d.seat],
                       "raw_reward": game.rewards[d.seat], "game_min_final_reward": min(final),
                       "position": str(d.row), "branch_group": None}
                reward = final[d.seat]
                for step in transforms.step:
                    reward = step.apply_row(reward, row)
                rows.append((d, reward, {**row, "reward": reward}))
            moves_after[d.seat] += 1
    # The batch: a uniform sample without replacement of batch_size of the learner's decisions.
    if len(rows) > recipe.batch_size:
        rows = [rows[i] for i in sorted(rng.choice(len(rows), recipe.batch_size, replace=False))]
    values = [reward for _, reward, _ in rows]
    for sampling in transforms.sampling:
        values = sampling.apply_rows(values, [row for _, _, row in rows])
    return [(d, value) for (d, _, _), value in zip(rows, values, strict=True)]


# --------------------------------------------------------------------------------------------
# The update
# --------------------------------------------------------------------------------------------


def gradient(recipe: Recipe, logits: np.ndarray, legal: np.ndarray, moves: np.ndarray,
             behaviour_logp: np.ndarray, advantages: np.ndarray, magnet: np.ndarray | None,
             clip: bool) -> tuple[np.ndarray, float]:
    """The loss's gradient with respect to each row's logits (one row per decision), and the
    rows' mean approx_kl to the behaviour policy (k3). The loss, summed over decisions:
    ``-min(r A, clip(r) A) - entropy_coef * H(p) + magnet_coef * KL(p || magnet)``."""
    p, logp = masked_softmax(logits, legal)
    taken = np.arange(len(moves))
    ratio = np.exp(logp[taken, moves] - behaviour_logp)
    approx_kl = float(np.mean((ratio - 1.0) - np.log(ratio)))
    onehot = np.zeros_like(p)
    onehot[taken, moves] = 1.0
    weight = -advantages * ratio
    if clip:  # the clipped side of PPO's min has no gradient
        eps = recipe.learner.algorithm_params.get("clip_eps", 0.2)
        high = recipe.learner.algorithm_params.get("clip_eps_high") or eps
        weight = np.where(((advantages >= 0) & (ratio > 1 + high))
                          | ((advantages < 0) & (ratio < 1 - eps)), 0.0, weight)
    grad = weight[:, None] * (onehot - p)
    if recipe.learner.entropy_coef:  # d(-c H)/dz = c p (log p + H)
        entropy = -(p * logp).sum(axis=1, keepdims=True)
        grad += recipe.learner.entropy_coef * p * (logp + entropy)
    if magnet is not None:  # d(c KL)/dz = c p (log p - log m - KL)
        _, log_magnet = masked_softmax(magnet, legal)
        gap = logp - log_magnet
        kl = (p * gap).sum(axis=1, keepdims=True)
        grad += recipe.magnet_coef * p * (gap - kl)
    return grad, approx_kl


def update(recipe: Recipe, table: Table, magnet: np.ndarray | None,
           batch: list[tuple[Decision, float]], round_: int, rng: np.random.Generator) -> int:
    """One round's update of the table, in place; the optimizer steps it took."""
    if not batch:
        return 0
    rows = np.array([d.row for d, _ in batch])
    moves = np.array([d.move for d, _ in batch])
    behaviour = np.array([d.behaviour_logp for d, _ in batch])
    advantages = np.array([a for _, a in batch])
    config = recipe.learner
    ppo = recipe.algorithm == "ppo"
    minibatches, epochs = (config.minibatches, config.epochs) if ppo else (1, 1)
    steps = 0
    for _epoch in range(epochs):
        for part in np.array_split(rng.permutation(len(batch)), minibatches):
            if not len(part):
                continue
            r = rows[part]
            grad, approx_kl = gradient(recipe, table.logits[r], table.legal[r], moves[part],
                                       behaviour[part], advantages[part],
                                       None if magnet is None else magnet[r], clip=ppo)
            # target_kl: measured before each step after the first, on that step's rows.
            if ppo and steps and config.target_kl is not None and approx_kl > config.target_kl:
                return steps
            # ub counts a schedule's steps from the cold start: the round times its steps.
            lr = scheduled_learning_rate(config, round_ * minibatches * epochs + steps)
            np.subtract.at(table.logits, r, lr * grad)
            steps += 1
    return steps


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def train(recipe: Recipe, out: Any = sys.stdout) -> list[dict[str, float]]:
    """Train a table by the recipe; print (to ``out``, ``None``: nothing) and return a row of
    figures at the start and at the first round that reaches each of ``recipe.milestones``."""
    rng = np.random.default_rng(recipe.seed)
    env = make_env(recipe.env_id)
    rules, position = rules_for(recipe.env_id), position_function(recipe.env_id)
    table = Table(max_moves=12)
    magnet = np.zeros_like(table.logits) if recipe.magnet_coef else None  # uniform at first
    history: deque[tuple[int, Frozen]] = deque(maxlen=recipe.lagged_k)  # the older tables
    rounds = math.ceil(recipe.games / recipe.games_per_round)
    magnet_rate = 1.0 - 0.5 ** (recipe.games_per_round / recipe.magnet_halflife)
    figures: list[dict[str, float]] = []
    busy, steps, updates = 0.0, 0, 0  # (steps and updates since the last row)
    lagged = any(name == "lagged" and weight > 0 for name, weight in recipe.opponents)

    def report(games: int, round_: int) -> None:
        greedy = nash_conv(recipe.env_id, table, greedy=True)
        sampled = nash_conv(recipe.env_id, table, greedy=False) if recipe.sampled else math.nan
        p, logp = masked_softmax(*table.used())
        entropy = float(-(p * logp).sum(axis=1).mean()) if len(table) else math.nan
        # target_kl's stop shows here: fewer optimizer steps per round than minibatches
        steps_per_update = steps / updates if updates else math.nan
        row = {"games": games, "rounds": round_, "greedy": greedy, "sampled": sampled,
               "positions": len(table), "entropy": entropy, "steps": steps_per_update,
               "seconds": busy}
        figures.append(row)
        if out is not None:
            print(f"{games:>8} {round_:>6} {greedy:>8.4f} {sampled:>8.4f} {len(table):>9} "
                  f"{entropy:>7.3f} {steps_per_update:>5.2f} {busy:>8.1f}", file=out, flush=True)

    if out is not None:
        print(f"{recipe.env_id}: uniform policy's NashConv {random_nash_conv(recipe.env_id):.4f}"
              f"\n{'games':>8} {'rounds':>6} {'greedy':>8} {'sampled':>8} {'positions':>9} "
              f"{'entropy':>7} {'steps':>5} {'seconds':>8}", file=out)
    report(0, 0)
    played, milestones = 0, deque(recipe.milestones)
    for round_ in range(rounds):
        started = time.perf_counter()
        current = freeze(table, copy=False)
        num_games = min(recipe.games_per_round, recipe.games - played)
        games = []
        for index, opponent in enumerate(draw_opponents(recipe, history, rng, num_games)):
            if opponent == LEARNER:
                players: list[Frozen | None] = [current, current]
                actors = [LEARNER, LEARNER]
            else:
                other = None if opponent == RANDOM else dict(history)[int(opponent[5:])]
                seat = index % 2  # the learner's, as ub.pool.sampling.seat_players
                players = [current, other] if seat == 0 else [other, current]
                actors = [LEARNER, opponent] if seat == 0 else [opponent, LEARNER]
            games.append(play_game(env, rules, position, table, players, actors, rng,
                                   env_seed(recipe.seed, round_, index), index))
        if magnet is not None:  # (the table grew: a new row's magnet is uniform, as it is)
            magnet = np.pad(magnet, ((0, len(table.logits) - len(magnet)),
                                     (0, table.logits.shape[1] - magnet.shape[1])))
        steps += update(recipe, table, magnet, credit(recipe, games, round_, rng), round_, rng)
        updates += 1
        if magnet is not None:
            magnet += magnet_rate * (table.logits - magnet)
        if lagged:  # checkpoint round_ + 1, for lagged games
            history.append((round_ + 1, freeze(table, copy=True)))
        played += num_games
        busy += time.perf_counter() - started
        if milestones and played >= milestones[0]:
            report(played, round_ + 1)
            steps = updates = 0
            while milestones and milestones[0] <= played:
                milestones.popleft()
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    recipe = make_recipe(args)
    config, transforms = recipe.learner, recipe.transforms
    update_line = (f"ppo (clip {config.algorithm_params.get('clip_eps', 0.2)}, "
                   f"{config.minibatches} minibatches x {config.epochs} epochs, target_kl "
                   f"{config.target_kl})" if recipe.algorithm == "ppo" else "reinforce")
    print(f"{args.game}: {recipe.games} games, {recipe.games_per_round} a round, batch "
          f"{recipe.batch_size}; opponents {recipe.opponents} (lagged k={recipe.lagged_k})\n"
          f"credit: final {[t.spec() for t in transforms.final]}, step "
          f"{[t.spec() for t in transforms.step]}, sampling "
          f"{[t.spec() for t in transforms.sampling]}\n"
          f"update: {update_line}; lr {config.learning_rate} (warm-up {config.warmup_steps}, "
          f"decay to {config.final_lr_fraction} by step {config.decay_steps}); entropy_coef "
          f"{config.entropy_coef}; magnet_coef {recipe.magnet_coef}; seed {recipe.seed}")
    started = time.perf_counter()
    figures = train(recipe)
    print(f"wall time {time.perf_counter() - started:.1f} s (NashConv walks included)")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
