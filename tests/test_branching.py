"""Dynamic branching (ub.branching, ``rollout.branch``): which decisions become branch points,
copying a game's state, the copies a rollout plays, and the refusals at preflight. (A real
2-round run with branching, resumed, is tests/test_train_flow.py's reference run; killed and
resumed and on Ray, the faults' reference run.)"""

from __future__ import annotations

import math
import threading

import pyarrow.compute as pc
import pytest

from ub.actors.spec import parse_actor
from ub.branching import BranchConfig, Candidate, check_copyable, choose_points, spread_score
from ub.errors import UbError
from ub.games.loop import Game
from ub.games.specs import GameSpec
from ub.rollout import assign_games, play_games

TIMINGS = ["gen_seconds", "env_seconds", "completion_logprobs"]


def _candidates() -> list[Candidate]:
    return [Candidate(0, 0.5, "a"), Candidate(2, 3.0, "b"), Candidate(4, 1.0, "c"),
            Candidate(6, 0.1, None)]


def test_random_points_are_a_seeded_choice_among_the_candidates():
    config = BranchConfig(k=2, points=2)
    chosen = {tuple(choose_points(_candidates(), config, seed)) for seed in range(40)}
    assert all(len(turns) == 2 and turns == tuple(sorted(turns)) and set(turns) <= {0, 2, 4, 6}
               for turns in chosen)
    assert len(chosen) == 6  # every pair comes up
    assert choose_points(_candidates(), config, 7) == choose_points(_candidates(), config, 7)
    assert choose_points(_candidates()[:1], config, 7) == [0]  # fewer than points: all
    assert choose_points([], config, 7) == []


def test_surprisal_and_spread_rank_the_least_sure_decisions_first():
    assert choose_points(_candidates(), BranchConfig(k=2, points=2, select="surprisal"),
                         1) == [2, 4]
    spread = {"a": 0.4, "b": 0.05}  # c: never seen twice, so the least certain
    config = BranchConfig(k=2, points=2, select="spread")
    assert choose_points(_candidates(), config, 1, spread) == [0, 4]
    assert spread_score(spread, "c") == math.inf and spread_score(spread, None) == 0.0


def test_k_of_one_is_refused_in_one_line():
    from ub.run.config.load import load_config

    with pytest.raises(UbError, match=r"rollout.branch.k: .*1 is one move per branch point, "
                                      r"which is no branching: give 0 \(off\) or 2 or more"):
        load_config("tiny-cpu", ["rollout.branch.k=1"])
    assert load_config("tiny-cpu", ["rollout.branch.k=3"]).rollout.branch.on
    assert not load_config("tiny-cpu").rollout.branch.on  # off by default


def test_a_copy_plays_on_as_the_game_would_and_apart_from_it():
    spec = GameSpec("Nim-v0-train")
    game = Game(spec, 3, "g")
    game.apply("[0 1]")
    snapshot = game.snapshot()
    first, second = game.copy(snapshot, "g-c1"), game.copy(snapshot, "g-c2")
    assert first.first_turn == 1 and first.decisions == game.decisions
    for g in (game, first):
        g.apply("[1 2]")
    assert first.observation == game.observation and first.position == game.position
    second.apply("[2 1]")  # another move from the same position: the others do not see it
    assert second.position != game.position and first.position == game.position
    assert [d.turn for d in second.decisions] == [0, 1] and len(game.decisions) == 2


def test_a_copy_of_a_game_that_draws_at_random_plays_on_exactly_as_the_game():
    """Kuhn Poker deals a new hand each round from the game's randomness: a copy taken
    mid-hand must deal the parent's next hands, or the copies of a branch point would be
    other games than the one whose move they replace (their returns not comparable). Given
    the same moves, parent and copy see the same observations, positions and legal moves at
    every later turn and end with the same result. (A copy that kept a fresh randomness of
    the game's seed instead deals other cards in most seeds.)"""
    import random

    def play_out(game: Game, choices: random.Random) -> list:
        seen = []
        while not game.done:
            game.apply(choices.choice(game.legal_moves))
            seen.append((game.current_seat, game.observation, game.position, game.legal_moves))
        return [*seen, game.final.rewards, game.final.reason]

    spec = GameSpec("KuhnPoker-v0-train")
    for seed in range(6):
        game = Game(spec, seed, "g")
        game.apply(random.Random(seed).choice(game.legal_moves))  # (into the first hand)
        copy = game.copy(game.snapshot(), "g-c1")
        assert copy.observation == game.observation and copy.first_turn == 1
        mine, its = play_out(game, random.Random(100 + seed)), play_out(copy, random.Random(
            100 + seed))
        assert len(mine) > 4 and "round 3" in " ".join(str(s) for s in mine)  # (a new deal)
        assert its == mine, f"seed {seed}: the copy played on differently"


def test_a_game_whose_state_cannot_be_copied_is_refused_at_preflight(monkeypatch):
    import ub.games.loop as loop
    from ub.run.config.load import load_config

    made = loop.make_env

    def with_a_lock(env_id):  # an env holding something deepcopy refuses (a lock, a socket)
        env = made(env_id)
        env.lock = threading.Lock()
        return env

    monkeypatch.setattr(loop, "make_env", with_a_lock)
    with pytest.raises(UbError) as caught:
        load_config("tiny-cpu", ["rollout.branch.k=2"])
    message = str(caught.value)
    assert "\n" not in message
    assert ("envs.0: TicTacToe-v0-train's state cannot be copied for rollout.branch (TypeError"
            in message and message.endswith("set rollout.branch.k to 0"))
    load_config("tiny-cpu")  # (branching off: not checked)
    monkeypatch.undo()
    check_copyable(GameSpec("KuhnPoker-v0-train"))  # (the built-in games copy)


def test_a_game_whose_copy_plays_on_differently_is_refused_at_preflight(monkeypatch):
    """A game that keeps part of its state outside the env (here a handle to a move counter,
    as a game served elsewhere would: deepcopy copies the handle, not what it points at)
    copies without an error, but its copy does not play on as the game: branching on it would
    credit moves with other games' returns. Preflight plays one move in a game and its copy
    and refuses, in one line, naming the env and the way out."""
    import ub.games.loop as loop
    from ub.run.config.load import load_config

    class Outside:
        moves = 0

        def __deepcopy__(self, memo):
            return self  # (a handle: the copy shares what it points at)

    made = loop.make_env

    def keeping_state_outside(env_id):
        env = made(env_id)

        class Counted(type(env)):
            def step(self, action):
                self.outside.moves += 1
                return super().step(action)

            def get_observation(self):
                seat, observation = super().get_observation()
                return seat, f"{observation}\n(moves so far: {self.outside.moves})"

        env.__class__, env.outside = Counted, Outside()
        return env

    monkeypatch.setattr(loop, "make_env", keeping_state_outside)
    with pytest.raises(UbError) as caught:
        load_config("tiny-cpu", ["rollout.branch.k=2"])
    message = str(caught.value)
    assert "\n" not in message
    assert message.endswith(
        "envs.0: TicTacToe-v0-train's state cannot be copied for rollout.branch (a copy plays "
        "on differently from the game: it keeps state outside the env or Python's random): "
        "set rollout.branch.k to 0")
    monkeypatch.undo()
    load_config("tiny-cpu", ["rollout.branch.k=2"])  # (TicTacToe itself copies)


def test_spread_needs_position_keys():
    from ub.run.config.load import load_config

    with pytest.raises(UbError, match=r"rollout.branch.select: spread reads the returns seen in "
                                      r"each position, and IndianPoker-v0-train has no position"):
        load_config("tiny-cpu", ["rollout.branch.k=2", "rollout.branch.select=spread",
                                 "envs.0.env_id=IndianPoker-v0-train",
                                 "envs.0.legal_moves=free", "eval.envs=null"])


def test_a_rollout_branches_at_the_learners_decisions_and_replays_the_same_copies(engine):
    """Nim, the model against the random player, 2 points a game of k 3: each point's copies
    start from its position with seeds of their own, play on against a fresh random player,
    and record only their own turns; another concurrency (another batch mix) plays the same
    games and copies."""
    spec = GameSpec("Nim-v0-train", legal_moves="mask")
    games = assign_games(spec, [parse_actor("model"), parse_actor("random")], 6, base_seed=2)
    branch = BranchConfig(k=3, points=2)
    a = play_games(games, engine=engine, base_seed=2, branch=branch, learner="model")
    b = play_games(games, engine=engine, base_seed=2, branch=branch, learner="model",
                   concurrency=4)
    assert a.steps.drop_columns(TIMINGS).equals(b.steps.drop_columns(TIMINGS))
    assert a.games.drop_columns(["seconds"]).equals(b.games.drop_columns(["seconds"]))
    games_rows = a.games.to_pylist()
    originals = [g for g in games_rows if g["parent_game_id"] is None]
    copies = [g for g in games_rows if g["parent_game_id"] is not None]
    assert len(originals) == 6 and a.stats.copies == len(copies) > 0
    steps = a.steps.to_pylist()
    by_game: dict = {}
    for row in steps:
        by_game.setdefault(row["game_id"], []).append(row)
    for g in originals:
        rows = by_game[g["game_id"]]
        assert [r["turn"] for r in rows] == list(range(g["num_turns"]))
        points = [r for r in rows if r["branch_group"] is not None]
        model_turns = [r for r in rows if r["actor"] == "model"]
        assert len(points) == min(2, len(model_turns)) and all(r["actor"] == "model"
                                                                for r in points)
        assert len([c for c in copies if c["parent_game_id"] == g["game_id"]]) == 2 * len(points)
    for c in copies:
        rows = by_game[c["game_id"]]
        assert [r["turn"] for r in rows] == list(range(c["branch_turn"], c["num_turns"]))
        parent_point = next(r for r in by_game[c["parent_game_id"]]
                            if r["turn"] == c["branch_turn"])
        first = rows[0]
        assert first["branch_group"] == parent_point["branch_group"]
        assert c["game_id"].startswith(first["branch_group"])
        assert first["position"] == parent_point["position"]
        assert first["sampling_seed"] != parent_point["sampling_seed"]
        assert first["actor"] == "model" and all(r["branch_group"] is None for r in rows[1:])
    # A branch point's moves are sampled anew: across the points, more than one move each.
    moves: dict = {}
    for row in steps:
        if row["branch_group"] is not None:
            moves.setdefault(row["branch_group"], set()).add(row["action"])
    assert sum(len(m) > 1 for m in moves.values()) > len(moves) / 2
    assert pc.all(pc.equal(a.steps.filter(pc.is_valid(a.steps["branch_group"]))["actor"],
                           "model")).as_py()


def test_spread_is_the_standard_error_of_each_positions_returns_in_the_rounds_read(
        rollout, tmp_path):
    """``select: spread`` reads, per position of the env, the standard error of the mean
    ``env_reward`` of the model's decisions there in the rounds asked (positions seen fewer
    than twice left out: the least certain of all); plain Python over the same rows agrees."""
    import statistics

    import pyarrow as pa

    from ub.branching import read_spread
    from ub.data.shards import ShardId, write_shard

    steps = rollout.steps
    steps = steps.set_column(steps.schema.get_field_index("actor_kind"), "actor_kind",
                             pa.array(["model"] * steps.num_rows))
    half = steps.num_rows // 2
    for round_, part in ((0, steps.slice(0, half)), (1, steps.slice(half))):
        part = part.set_column(part.schema.get_field_index("round"), "round",
                               pa.array([round_] * part.num_rows, pa.int32()))
        ids = set(part["game_id"].to_pylist())
        games = rollout.games.filter(pc.is_in(rollout.games["game_id"], pa.array(sorted(ids))))
        games = games.set_column(games.schema.get_field_index("round"), "round",
                                 pa.array([round_] * games.num_rows, pa.int32()))
        write_shard(tmp_path, ShardId(round_, 0), "run", part, games)

    def by_hand(rows: list[dict]) -> dict[tuple[str, str], float]:
        returns: dict = {}
        for r in rows:
            returns.setdefault((r["env_id"], r["position"]), []).append(r["env_reward"])
        return {k: statistics.stdev(x) / len(x) ** 0.5 for k, x in returns.items()
                if len(x) >= 2}

    for first, last, rows in ((0, 1, steps), (0, 0, steps.slice(0, half)),
                              (1, 1, steps.slice(half))):
        got = {(env, position): value for env, by_position in read_spread(
            tmp_path, first, last).items() for position, value in by_position.items()}
        want = by_hand(rows.to_pylist())
        assert got.keys() == want.keys() and len(got) > 5
        assert {env for env, _ in got} == {"TicTacToe-v0-train"}  # (no Nim in these rounds)
        assert all(got[k] == pytest.approx(want[k], abs=1e-6) for k in got)
