"""Legal moves and scripted players on real TextArena games.

Random players in every seat must never make an invalid move (not even the first, forgiven one),
must be reproducible from their seeds, and must never touch Python's global ``random``, which the
games themselves use for dealing and targets.
"""

from __future__ import annotations

import copy
import random
import sys
from typing import Any

import pytest
import textarena as ta
from textarena.envs.registration import ENV_REGISTRY

from ub.actors.scripted import (
    SCRIPTED_PLAYERS,
    RandomPlayer,
    make_scripted_player,
    random_action,
)
from ub.errors import UbError
from ub.games.builtin import BUILT_IN_RULES
from ub.games.legal import legal_actions, supports_legal_actions
from ub.games.rules import unwrap

# The built-in games with legal moves (a game of one's own another test registers is not here).
SUPPORTED_GAMES = sorted(r.name for r in BUILT_IN_RULES if r.provides("legal_moves"))

ONE_PLAYER_GAMES = {"TowerOfHanoi", "GuessTheNumber"}
# Every registered id of a supported game (-train, -raw and difficulty variants included).
SUPPORTED_IDS = sorted(env_id for env_id in ENV_REGISTRY if supports_legal_actions(env_id)
                       and env_id.split("-v")[0] in SUPPORTED_GAMES)
# The ids training uses get the full 200 games; the other variants share the code paths (same
# core env class) and get a lighter run so the whole file stays fast.
PRIMARY_IDS = [
    f"{game}-v0{suffix}" for game in SUPPORTED_GAMES for suffix in ("", "-train", "-raw")
]
OTHER_IDS = [env_id for env_id in SUPPORTED_IDS if env_id not in PRIMARY_IDS]
MAX_STEPS = 2_000  # far above any supported game's length; guards against a stuck loop
INVALID_MARK = "attempted an invalid move"  # what TextArena logs for a forgiven invalid move


def _game(env_id: str) -> str:
    return env_id.split("-")[0]


def _num_players(env_id: str) -> int:
    return 1 if _game(env_id) in ONE_PLAYER_GAMES else 2


def _acted_alone(player: RandomPlayer, env: Any) -> tuple[str, bool]:
    """``player``'s move, and whether it changed the global RNG's state.

    A library's background thread may draw from the global RNG meanwhile (Prefect's or
    websockets' retry jitter, in a process that ran a flow earlier; a long switch interval
    narrows the window but a thread woken from I/O or a finalizer still runs). So a change
    counts only if the same move, replayed from the same player state, changes it every time:
    a foreign draw does not land in three windows in a row."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60)
    try:
        for _ in range(3):
            replay = copy.deepcopy(player)
            before = random.getstate()
            action = replay.act(env)
            if random.getstate() == before:
                player.__dict__.update(replay.__dict__)  # the move as played: the player's draw
                return action, False
        return action, True
    finally:
        sys.setswitchinterval(interval)


def play(env_id: str, seed: int, player_seed: int) -> tuple[list[tuple[int, str]], dict[int, Any]]:
    """Play one game with a seeded random player per seat, checking every move on the way.

    :returns: the ``(player_id, action)`` sequence and the final rewards.
    """
    n = _num_players(env_id)
    players = [RandomPlayer(seed=player_seed * 101 + seat) for seat in range(n)]
    env = ta.make(env_id)  # a fresh env per game: observation wrappers keep history across resets
    env.reset(num_players=n, seed=seed)
    moves: list[tuple[int, str]] = []
    done = False
    while not done:
        assert len(moves) < MAX_STEPS, f"{env_id} seed {seed}: game did not end"
        pid, _observation = env.get_observation()
        action, touched = _acted_alone(players[pid], env)
        assert not touched, "a scripted player touched the global RNG"
        moves.append((pid, action))
        done, _info = env.step(action=action)
    rewards, game_info = env.close()

    core = unwrap(env)
    assert rewards is not None and set(rewards) == set(range(n)), f"{env_id}: bad end {rewards}"
    assert all(not game_info[pid]["invalid_move"] for pid in range(n)), game_info
    assert not any(INVALID_MARK in message for _, message in core.state.logs), (env_id, seed)
    # TextArena only advances the turn counter on accepted moves: every step must have counted.
    assert core.state.turn == len(moves), (env_id, seed, core.state.turn, len(moves))
    return moves, rewards


def test_supported_ids_cover_the_claimed_games() -> None:
    assert set(SUPPORTED_GAMES) >= {
        "TicTacToe",
        "Nim",
        "KuhnPoker",
        "SimpleTak",
        "TowerOfHanoi",
        "GuessTheNumber",
    }
    assert set(PRIMARY_IDS) <= set(SUPPORTED_IDS)
    assert {"TicTacToe-v0-train", "KuhnPoker-v0-medium-train", "Nim-v0-large"} <= set(SUPPORTED_IDS)


@pytest.mark.parametrize("env_id", PRIMARY_IDS)
def test_random_players_never_move_illegally(env_id: str) -> None:
    outcomes = set()
    for seed in range(200):
        _moves, rewards = play(env_id, seed=seed, player_seed=seed)
        outcomes.add(tuple(sorted(rewards.items())))
    # Sanity against a degenerate player: random play reaches more than one result.
    assert len(outcomes) > 1, outcomes


@pytest.mark.parametrize("env_id", OTHER_IDS)
def test_random_players_never_move_illegally_in_other_variants(env_id: str) -> None:
    for seed in range(8):
        play(env_id, seed=seed, player_seed=seed)


@pytest.mark.parametrize("env_id", [f"{game}-v0-train" for game in SUPPORTED_GAMES])
def test_random_players_are_deterministic(env_id: str) -> None:
    first = [play(env_id, seed=s, player_seed=s) for s in range(20)]
    again = [play(env_id, seed=s, player_seed=s) for s in range(20)]
    assert first == again
    # Different player seeds on the same deals give different play somewhere.
    other = [play(env_id, seed=s, player_seed=s + 1_000) for s in range(20)]
    assert [m for m, _ in other] != [m for m, _ in first]


def test_random_action_uses_only_the_given_rng() -> None:
    env = ta.make("TicTacToe-v0")
    env.reset(num_players=2, seed=0)
    global_state = random.getstate()
    picks = [random_action(env, random.Random(7)) for _ in range(3)]
    assert random.getstate() == global_state
    assert len(set(picks)) == 1  # same seed, same position -> same pick
    assert picks[0] in legal_actions(env)


def _accepts(env: Any, action: str) -> bool:
    """Whether the game accepts ``action`` now, tried on a copy so ``env`` is untouched."""
    global_state = random.getstate()  # KuhnPoker deals from the global RNG when a round ends
    trial = copy.deepcopy(env)
    before = unwrap(trial).state.turn
    trial.step(action=action)
    accepted = unwrap(trial).state.turn == before + 1
    random.setstate(global_state)
    return accepted


def _candidates(core: Any) -> list[str]:
    """Plausible actions for the game, legal or not, including off-by-one ones."""
    name = type(core).__name__
    if name == "TicTacToeEnv":
        return [f"[{i}]" for i in range(10)]
    if name == "SimpleTakEnv":
        return [f"[{i}]" for i in range(core.board_size**2 + 1)]
    if name == "NimEnv":
        piles = core.initial_piles
        return [f"[{p} {q}]" for p in range(len(piles) + 1) for q in range(max(piles) + 2)]
    if name == "KuhnPokerEnv":
        return ["[check]", "[bet]", "[fold]", "[call]"]
    if name == "TowerOfHanoiEnv":
        # Same-tower moves are accepted no-ops, deliberately not listed (see the next test).
        return [f"[{s} {t}]" for s in "ABC" for t in "ABC" if s != t]
    if name == "GuessTheNumberEnv":
        return [f"[{n}]" for n in range(core.min_number - 1, core.max_number + 2)]
    if name == "ConnectFourEnv":
        return [f"[col {c}]" for c in range(core.num_cols + 1)]
    raise AssertionError(f"no candidate list for {name}")


@pytest.mark.parametrize("env_id", [f"{game}-v0-train" for game in SUPPORTED_GAMES])
def test_legal_actions_are_exactly_the_accepted_ones(env_id: str) -> None:
    n = _num_players(env_id)
    for seed in range(4):
        env = ta.make(env_id)
        env.reset(num_players=n, seed=seed)
        rng = random.Random(seed)
        done = False
        while not done:
            legal = legal_actions(env)
            assert len(legal) == len(set(legal))
            accepted = [a for a in _candidates(unwrap(env)) if _accepts(env, a)]
            assert sorted(accepted) == sorted(legal), (env_id, seed)
            env.get_observation()
            done, _ = env.step(action=random_action(env, rng))


def test_tower_of_hanoi_same_tower_is_an_unlisted_no_op() -> None:
    env = ta.make("TowerOfHanoi-v0")
    env.reset(num_players=1, seed=0)
    assert _accepts(env, "[A A]")  # TextArena quirk: burns a turn, changes nothing
    assert "[A A]" not in legal_actions(env)


def _after(env_id: str, moves: list[str]) -> Any:
    env = ta.make(env_id)
    env.reset(num_players=_num_players(env_id), seed=0)
    for move in moves:
        done, _ = env.step(action=move)
        assert not done
    return env


def test_tictactoe_position() -> None:
    env = _after("TicTacToe-v0-train", ["[4]", "[0]", "[8]"])
    assert legal_actions(env) == ["[1]", "[2]", "[3]", "[5]", "[6]", "[7]"]
    # Also straight from a hand-set board.
    unwrap(env).state.game_state["board"] = [["X", "O", "X"], ["", "O", ""], ["O", "X", ""]]
    assert legal_actions(env) == ["[3]", "[5]", "[8]"]


def test_nim_position() -> None:
    env = _after("Nim-v0-train", ["[1 4]", "[2 3]"])  # piles 3 4 5 -> 3 0 2
    assert legal_actions(env) == ["[0 1]", "[0 2]", "[0 3]", "[2 1]", "[2 2]"]


def test_kuhn_poker_positions() -> None:
    assert legal_actions(_after("KuhnPoker-v0-train", [])) == ["[check]", "[bet]"]
    assert legal_actions(_after("KuhnPoker-v0-train", ["[check]"])) == ["[check]", "[bet]"]
    assert legal_actions(_after("KuhnPoker-v0-train", ["[bet]"])) == ["[fold]", "[call]"]
    assert legal_actions(_after("KuhnPoker-v0-train", ["[check]", "[bet]"])) == ["[fold]", "[call]"]


def test_simple_tak_position() -> None:
    legal = legal_actions(_after("SimpleTak-v0-train", ["[5]", "[0]"]))
    assert legal == [f"[{i}]" for i in range(16) if i not in (0, 5)]


def test_tower_of_hanoi_positions() -> None:
    assert legal_actions(_after("TowerOfHanoi-v0-train", [])) == ["[A B]", "[A C]"]
    # A = [3, 2], C = [1]: disk 2 cannot go onto disk 1.
    assert legal_actions(_after("TowerOfHanoi-v0-train", ["[A C]"])) == ["[A B]", "[C A]", "[C B]"]


def test_guess_the_number_position() -> None:
    env = ta.make("GuessTheNumber-v0-train")
    env.reset(num_players=1, seed=0)
    target = unwrap(env).state.game_state["game_number"]
    wrong = 1 if target != 1 else 2
    assert legal_actions(env) == [f"[{n}]" for n in range(1, 21)]
    env.step(action=f"[{wrong}]")
    assert legal_actions(env) == [f"[{n}]" for n in range(1, 21) if n != wrong]


def test_connect_four_full_column() -> None:
    env = _after("ConnectFour-v0-train", ["[col 3]"] * 6)
    assert legal_actions(env) == [f"[col {c}]" for c in range(7) if c != 3]


def test_unwrap() -> None:
    env = ta.make("TicTacToe-v0-train")
    core = unwrap(env)
    assert type(core).__name__ == "TicTacToeEnv"
    assert unwrap(core) is core


def test_supports_legal_actions() -> None:
    assert supports_legal_actions("TicTacToe-v0")
    assert supports_legal_actions("KuhnPoker-v0-train")
    assert supports_legal_actions("SimpleTak-v0-medium-raw")
    assert not supports_legal_actions("Othello-v0")
    assert not supports_legal_actions("TicTacToe")  # not a registered id
    assert not supports_legal_actions("NoSuchGame-v0")


def test_unsupported_game_error() -> None:
    env = ta.make("Othello-v0")
    with pytest.raises(UbError, match=r"no legal-move function for Othello-v0; .*TicTacToe"):
        legal_actions(env)
    with pytest.raises(UbError, match="no legal-move function"):
        RandomPlayer(seed=0).act(env)


def test_misuse_errors() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        legal_actions(ta.make("TicTacToe-v0"))
    env = _after("TicTacToe-v0", ["[0]", "[3]", "[1]", "[4]"])
    env.step(action="[2]")  # player 0 completes the top row
    with pytest.raises(RuntimeError, match="over"):
        legal_actions(env)


def test_scripted_player_registry() -> None:
    player = make_scripted_player("random", seed=3)
    assert isinstance(player, RandomPlayer) and player.name == "random"
    assert set(SCRIPTED_PLAYERS) >= {"random"}
    with pytest.raises(UbError, match=r"unknown scripted player 'nope'; choose one of: .*random"):
        make_scripted_player("nope", seed=0)
