"""Evaluation: Wilson intervals, seat-balanced assignments, per-(env, opponent) summaries."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ub.actors.spec import parse_actor
from ub.evaluation import (
    eval_assignments,
    random_baseline,
    summarize,
    wilson_interval,
    with_baseline,
)
from ub.games.specs import GameSpec
from ub.rollout import play_games


@pytest.mark.parametrize(("k", "n", "low", "high"), [
    (0, 10, 0.0, 0.27753),
    (5, 10, 0.23659, 0.76341),
    (10, 10, 0.72247, 1.0),
    (107, 400, 0.22648, 0.31294),
])
def test_wilson_interval_matches_known_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_wilson_interval_without_trials_is_uninformative():
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_assignments_balance_seats_and_share_positions_across_checkpoints():
    a, b = parse_actor("expert"), parse_actor("model")
    rival = parse_actor("random")
    specs = [GameSpec("TicTacToe-v0-train"), GameSpec("Nim-v0-train")]
    first = eval_assignments(a, [rival], specs, 6, seed=1)
    second = eval_assignments(b, [rival], specs, 6, seed=1)
    assert len(first) == 12
    for spec in specs:
        seats = [g.actors.index(a) for g in first if g.spec == spec]
        assert sorted(seats) == [0, 0, 0, 1, 1, 1]
    assert [g.seed for g in first] == [g.seed for g in second]


def test_an_opponent_added_to_an_evaluation_leaves_the_others_games_as_they_were():
    """The preset added the perfect player beside random: random's games keep their indices
    and seeds, so its figures compare with the evaluations before."""
    model, random_, perfect = (parse_actor(n) for n in ("model", "random", "perfect"))
    specs = [GameSpec("TicTacToe-v0-train"), GameSpec("Nim-v0-train")]
    alone = eval_assignments(model, [random_], specs, 6, seed=1)
    both = eval_assignments(model, [random_, perfect], specs, 6, seed=1)
    assert [(g.game_index, g.seed, g.spec.env_id, g.actors) for g in both[:len(alone)]] == [
        (g.game_index, g.seed, g.spec.env_id, g.actors) for g in alone]
    assert {g.actors[1 - g.actors.index(model)].name for g in both[len(alone):]} == {"perfect"}


def test_every_checkpoint_meets_the_same_opponent_moves():
    """Paired evaluation: the random opponent's moves do not depend on which checkpoint (round)
    is evaluated, only on the run seed and the game, and eval game ids never equal training
    ids (RUN-rNNNNNN-gNNNNNN)."""
    rival = parse_actor("random")
    assignments = eval_assignments(parse_actor("expert"), [rival],
                                   [GameSpec("TicTacToe-v0-train")], 30, seed=4)
    columns = ["game_index", "actors", "rewards", "num_turns"]
    plays = [play_games(assignments, run="r", round_=update, base_seed=9, seed_round="eval",
                        game_id_prefix=f"r-eval-c{update:06d}-s0000")
             for update in (0, 4)]
    assert plays[0].games.select(columns).equals(plays[1].games.select(columns))
    assert plays[0].steps["action"].equals(plays[1].steps["action"])
    training = play_games(assignments, run="r", round_=0, base_seed=9).games["game_id"]
    assert not set(plays[0].games["game_id"].to_pylist()) & set(training.to_pylist())


def test_random_baseline_is_random_in_the_actors_seats_on_the_same_seeds():
    expert, rival = parse_actor("expert"), parse_actor("random")
    assignments = eval_assignments(expert, [rival], [GameSpec("TicTacToe-v0-train")], 200,
                                   seed=2)
    baseline = random_baseline(assignments, "expert", base_seed=5)
    wins, decided = baseline[("TicTacToe-v0-train", "random")]
    assert decided == 200 and 0.3 < wins / decided < 0.55  # random vs random, seats balanced
    assert random_baseline(assignments, "expert", base_seed=5) == baseline  # deterministic
    played = play_games(assignments, base_seed=5, seed_round="eval")
    [row] = with_baseline(summarize(played.games, played.steps, "expert"), baseline)
    assert row.baseline_win_rate == wins / decided
    assert row.baseline_low < row.baseline_win_rate < row.baseline_high < row.win_rate


def test_summary_counts_wins_draws_losses_and_move_rates():
    expert, rival = parse_actor("expert"), parse_actor("random")
    played = play_games(eval_assignments(expert, [rival], [GameSpec("TicTacToe-v0-train")], 20,
                                         seed=3))
    [row] = summarize(played.games, played.steps, "expert")
    assert (row.env_id, row.opponent, row.games) == ("TicTacToe-v0-train", "random", 20)
    assert row.wins + row.draws + row.losses == 20 and row.losses == 0
    assert row.win_low <= row.win_rate <= row.win_high
    assert row.invalid_move_rate == 0.0 and row.format_rate == 1.0


def test_errored_games_are_counted_apart():
    games = pa.Table.from_pylist([
        {"game_id": "g1", "env_id": "E", "actors": ["me", "x"], "rewards": [1.0, -1.0],
         "outcome": "decisive"},
        {"game_id": "g2", "env_id": "E", "actors": ["x", "me"], "rewards": None,
         "outcome": "error"},
    ])
    steps = pa.Table.from_pylist([], schema=pa.schema([
        ("game_id", pa.string()), ("env_id", pa.string()), ("actor", pa.string()),
        ("invalid_move", pa.bool_()), ("format_ok", pa.bool_())]))
    [row] = summarize(games, steps, "me")
    assert (row.games, row.wins, row.errors, row.win_rate) == (2, 1, 1, 1.0)


def test_an_eval_env_not_trained_on_is_prompted_as_the_run_trains(engine):
    """The qwen3 preset trains SimpleTak in the qwen3-zs format (answers in \\boxed{}) and
    evaluates on KuhnPoker too: KuhnPoker games ask in the same format and read the same
    answer, not the plain template's brackets, which the policy never learned."""
    from ub.run.config.load import game_specs, load_config

    config = load_config("qwen3-1.7b-simpletak")
    specs = {s.env_id: s for s in game_specs(config, config.eval.envs)}
    assert (specs["KuhnPoker-v0-train"].template, specs["KuhnPoker-v0-train"].extractor_name) \
        == ("qwen3-zs", "boxed") == (specs["SimpleTak-v0-train"].template,
                                     specs["SimpleTak-v0-train"].extractor_name)
    assert specs["KuhnPoker-v0-train"].num_players == 2
    # The games an evaluation plays (on the tiny model: the prompts are the point here).
    games = eval_assignments(parse_actor("model"), [parse_actor("random")],
                             [specs["KuhnPoker-v0-train"]], 2, seed=3)
    steps = play_games(games, engine=engine, base_seed=3).steps.to_pylist()
    asked = [s for s in steps if s["actor_kind"] == "model"]
    assert asked and all(s["template"] == "qwen3-zs" and "\\boxed{}" in s["prompt"]
                         for s in asked)


def test_an_eval_env_entry_gives_its_own_format_and_mixed_formats_must():
    from ub.errors import UbError
    from ub.run.config.load import game_specs, load_config, validate_config

    own = load_config("qwen3-1.7b-simpletak", [
        "eval.envs=[SimpleTak-v0-train, {env_id: KuhnPoker-v0-train, template: plain}]"])
    kuhn = game_specs(own, own.eval.envs)[1]
    assert (kuhn.template, kuhn.extractor_name) == ("plain", "bracket")
    extractor_only = load_config("tiny-cpu", [
        "eval.envs=[{env_id: TicTacToe-v0-train, extractor: boxed}]"])
    (ttt,) = game_specs(extractor_only, extractor_only.eval.envs)
    assert (ttt.template, ttt.extractor_name, ttt.max_turns) == ("plain", "boxed", 200)
    mixed = {"envs": [{"env_id": "TicTacToe-v0-train"},
                      {"env_id": "Nim-v0-train", "template": "qwen3-zs"}],
             "eval": {"envs": ["KuhnPoker-v0-train"]}}
    with pytest.raises(UbError, match=r"eval.envs: KuhnPoker-v0-train is not a training env, "
                                      r"and the training envs use several prompt formats "
                                      r"\(plain/its own, qwen3-zs/its own\): give its own"):
        validate_config(mixed)
    mixed["eval"]["envs"] = [{"env_id": "KuhnPoker-v0-train", "template": "qwen3-zs"}]
    validate_config(mixed)
