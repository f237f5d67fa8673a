"""Transcripts of scripted play: the text the tiny CPU model is pre-trained on.

Seeded games of two-player TextArena games are played by uniformly random legal players; every
decision becomes one :class:`TranscriptStep`: the prompt the model would read (the ``plain``
template of the observation), the completion it should write (``" " + action``; the EOS token is
added by whoever tokenizes), and every legal action of that position (so a trainer can use the
random player's whole move distribution as a soft target instead of one sampled move).

Determinism: TextArena draws from Python's *global* ``random`` (``State.__init__`` calls
``random.seed(seed)``, KuhnPoker shuffles with it). Each game therefore resets with its own derived
seed, the players draw from their own ``random.Random``, and the caller's global ``random`` state
is restored afterwards, so the stream is a pure function of its arguments and does not disturb
(or get disturbed by) anything else in the process.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ub.errors import UbError
from ub.seeding import derive_seed

# The games whose observations the tiny model learns by default: the demo's two games and
# KuhnPoker (short, cheap, used by tests), all with a legal-move function (ub.games.legal).
# SimpleTak left the default: its long boards took a large share of the pre-training tokens for a
# game the CPU demo does not play.
DEFAULT_ENV_IDS: tuple[str, ...] = (
    "TicTacToe-v0-train",
    "Nim-v0-train",
    "KuhnPoker-v0-train",
)

# Far above any supported game's length: guards against a game that never ends.
_MAX_TURNS = 1_000


@dataclass(frozen=True)
class TranscriptStep:
    """One decision of a scripted game.

    :param env_id: the TextArena env id the position comes from.
    :param game_seed: the seed the game was reset with (replays the game with the same players).
    :param turn: the index of the decision within its game (0 = first move).
    :param player_id: the seat to move.
    :param prompt: what the model reads: the ``plain`` template of the observation.
    :param completion: what the model should write: ``" " + action`` (no EOS token).
    :param legal: every legal action in the position, in the game's fixed order.
    """

    env_id: str
    game_seed: int
    turn: int
    player_id: int
    prompt: str
    completion: str
    legal: tuple[str, ...]

    @property
    def pair(self) -> tuple[str, str]:
        """``(prompt, completion)``."""
        return self.prompt, self.completion


TRANSCRIPT_SEATS = 2
"""Random players per transcript game."""


def _require_legal_actions(env_id: str) -> None:
    from ub.games.legal import supports_legal_actions

    if not supports_legal_actions(env_id):
        raise UbError(
            f"cannot play {env_id!r} for transcripts: not a TextArena id with a legal-move "
            "function (see ub.games.legal)"
        )


def check_transcript_env(env_id: str) -> None:
    """Refuse a game transcripts cannot be played of: not a TextArena id with a legal-move
    function, or a game that does not start with :data:`TRANSCRIPT_SEATS` players.

    :raises UbError: naming the env and why.
    """
    from ub.games.specs import GameSpec, check_env

    _require_legal_actions(env_id)
    try:
        check_env(GameSpec(env_id, num_players=TRANSCRIPT_SEATS))
    except UbError as exc:
        raise UbError(f"cannot play {env_id!r} for transcripts ({TRANSCRIPT_SEATS} random "
                      f"players): {exc}") from None


def play_game(env_id: str, game_seed: int, player_seed: int) -> list[TranscriptStep]:
    """Play one game of ``env_id`` with random legal players; return every decision in order.

    :raises UbError: the env id is unknown or its game has no legal-move function.
    """
    import textarena as ta

    from ub.actors.scripted import random_action
    from ub.games.legal import legal_actions
    from ub.games.templates import get_template

    _require_legal_actions(env_id)
    template = get_template("plain")
    rng = random.Random(player_seed)  # one stream for both seats; never the global one
    outer_state = random.getstate()
    try:
        env = ta.make(env_id=env_id)
        env.reset(num_players=TRANSCRIPT_SEATS, seed=game_seed)
        steps: list[TranscriptStep] = []
        done = False
        while not done:
            if len(steps) >= _MAX_TURNS:
                raise RuntimeError(f"{env_id} game {game_seed} did not end in {_MAX_TURNS} turns")
            player_id, observation = env.get_observation()
            legal = tuple(legal_actions(env))
            action = random_action(env, rng)
            steps.append(
                TranscriptStep(
                    env_id=env_id,
                    game_seed=game_seed,
                    turn=len(steps),
                    player_id=player_id,
                    prompt=template.render(observation),
                    completion=" " + action,
                    legal=legal,
                )
            )
            done, _info = env.step(action=action)
        env.close()
        return steps
    finally:
        random.setstate(outer_state)


def iter_transcripts(
    env_ids: Iterable[str] = DEFAULT_ENV_IDS,
    positions_per_env: int = 1000,
    seed: int = 0,
    stream: str = "train",
    positions_per_game: int | None = None,
) -> Iterator[TranscriptStep]:
    """Yield ``positions_per_env`` decisions of each game, from seeded random-vs-random games.

    Games are interleaved round-robin over ``env_ids`` (so any prefix of the stream is balanced)
    and the last game of an env is cut at the quota. ``stream`` namespaces the seeds: a ``"eval"``
    stream gives positions from games that no ``"train"`` stream plays. With
    ``positions_per_game`` set, only that many decisions (drawn at random, kept in turn order) are
    taken from each game: fewer, more varied positions per game, e.g. for evaluation.
    """
    env_ids = tuple(env_ids)
    if not env_ids:
        raise UbError("no env ids given for transcripts")
    if positions_per_env < 1:
        raise UbError(f"positions_per_env must be >= 1, got {positions_per_env}")
    if positions_per_game is not None and positions_per_game < 1:
        raise UbError(f"positions_per_game must be >= 1 or None, got {positions_per_game}")
    remaining = dict.fromkeys(env_ids, positions_per_env)
    game_index = 0
    while any(remaining.values()):
        for env_id in env_ids:
            if not remaining[env_id]:
                continue
            game_seed = derive_seed("game", stream, seed, env_id, game_index)
            player_seed = derive_seed("players", stream, seed, env_id, game_index)
            steps = play_game(env_id, game_seed, player_seed)
            if positions_per_game is not None and positions_per_game < len(steps):
                pick = random.Random(derive_seed("pick", stream, seed, env_id, game_index))
                chosen = sorted(pick.sample(range(len(steps)), positions_per_game))
                steps = [steps[i] for i in chosen]
            for step in steps[: remaining[env_id]]:
                remaining[env_id] -= 1
                yield step
        game_index += 1


def transcript_pairs(
    env_ids: Iterable[str] = DEFAULT_ENV_IDS,
    positions_per_env: int = 1000,
    seed: int = 0,
) -> Iterator[tuple[str, str]]:
    """The ``(prompt_text, completion_text)`` pairs of :func:`iter_transcripts`."""
    for step in iter_transcripts(env_ids, positions_per_env, seed):
        yield step.pair
