"""Game specs: which TextArena env, how many players, how prompts are built and actions read.

``check_env`` starts an env once before any expensive work (engine start, model load), so a bad
env id or an env that cannot run offline fails in a second with a clear message.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from ub.errors import UbError
from ub.games.actions import get_extractor
from ub.games.legal import supports_legal_actions
from ub.games.positions import position_function
from ub.games.registry import GUIDE, entry_point, games_with, load_rules
from ub.games.templates import get_template
from ub.settings import Section

# Base games whose TextArena implementation needs the network at reset: an nltk corpus download
# (word games) or a hosted LLM judge (Debate, ScenarioPlanning). Refused up front so a run never
# hangs on a download.
NETWORK_GAMES = frozenset(
    {
        "Codenames", "Crosswords", "Debate", "DontSayIt", "GuessWho", "Hangman", "LetterAuction",
        "ScenarioPlanning", "SpellingBee", "TwentyQuestions", "WordChains", "WordLadder",
        "WordSearch", "Wordle",
    }
)


class EnvStartError(UbError):
    """An env that exists but does not start with a spec's settings: most often a player count
    the game does not have (TextArena checks it at reset)."""


def _known(lookup: Callable[[str], Any]) -> Callable[[str], str]:
    """A pydantic check that ``lookup`` knows a name (its :class:`UbError` lists the known
    ones, or says why a path does not import)."""
    def check(name: str) -> str:
        try:
            lookup(name)
        except UbError as exc:
            raise ValueError(str(exc)) from None
        return name
    return check


TemplateName = Annotated[str, AfterValidator(_known(get_template))]
"""A prompt template's name (:mod:`ub.games.templates`), checked where a config gives it."""
ExtractorName = Annotated[str, AfterValidator(_known(get_extractor))]
"""A move extractor's name (:mod:`ub.games.actions`), checked where a config gives it."""


PositionFunctionPath = Annotated[str, AfterValidator(_known(
    lambda path: position_function("", path)))]
"""A position function of one's own by import path (:mod:`ub.games.positions`), imported where
a config gives it."""
RulesPath = Annotated[str, AfterValidator(_known(load_rules))]
"""A game's rules of one's own by import path (:mod:`ub.games.registry`), imported and
registered where a config gives it."""


LegalMoveMode = Literal["free", "mask"]
"""What a model seat's sampling is held to: ``mask``, the game's legal moves; ``free``, any
text (a game's ``legal_moves``, and an evaluation's override of it)."""


class GameSpec(Section):
    """One game a rollout can play: a TextArena env, its seats, how its prompts are built and
    its moves read (a run's ``envs[]`` entries are these, with a weight).

    ``invalid_move_retries``: TextArena allows 1, but its ``-train`` observation hides the
    error, so the retry prompt is identical to the first: a greedy player repeats the move and
    forfeits while a sampling one usually recovers, and training would charge less for an
    invalid move than evaluation does. 0 (the default) charges the same everywhere: an invalid
    move loses the game (see docs/rewards.md).
    """

    env_id: str = Field(description="A TextArena env id, e.g. TicTacToe-v0-train.")
    num_players: int = Field(2, ge=1, description="Seats per game (1 for single-player games).")
    template: TemplateName = Field("plain", description="Prompt template (see "
                                   "docs/training.md).")
    extractor: ExtractorName | None = Field(None, description="Move extractor; null: the "
                                            "template's.")
    max_turns: int = Field(200, ge=1, description="Decisions after which a game is stopped and "
                           "recorded as errored (some TextArena games have no limit).")
    invalid_move_retries: int = Field(0, ge=0, description="Invalid moves a seat may replace "
                                      "before the next one loses the game (0: the first loses "
                                      "it, as in evaluation).")
    legal_moves: LegalMoveMode = Field(
        "free", description="mask: the model samples only moves the game accepts in the "
        "position (the engine constrains its tokens to the legal moves; the learner scores "
        "under the same constraint: docs/training.md); free: any text, an illegal move is "
        "the game's to judge.")
    position: PositionFunctionPath | None = Field(
        None, description="The function that keys a decision's position (steps.position), "
        "package.module:function taking (env, seat); it overrides the key of the game's "
        "rules alone; null: the rules' key, or none (docs/data.md).")
    rules: RulesPath | None = Field(
        None, description="The game's rules of one's own, package.module:Class (a "
        "ub.games.rules.GameRules subclass: legal moves, position key, expert, ...), imported "
        "and registered under its env's entry point; null: the built-in rules of the game, "
        "or none (docs/games.md).")

    def __init__(self, env_id: str | None = None, /, **settings: Any) -> None:
        # GameSpec("TicTacToe-v0-train"): the env id may come first, unnamed.
        if env_id is not None:
            settings["env_id"] = env_id
        super().__init__(**settings)

    @model_validator(mode="after")
    def _rules_fit_the_env(self) -> GameSpec:
        if self.rules is not None:
            rules = load_rules(self.rules)  # (imported and registered by the field's check)
            actual = entry_point(self.env_id)  # (an unknown id is refused when the env is made)
            if actual is not None and actual != rules.entry_point:
                raise ValueError(f"rules {self.rules!r} are for entry point "
                                 f"{rules.entry_point}, but {self.env_id} is {actual}: name the "
                                 "rules of this game, or the env id of theirs")
        return self

    @property
    def extractor_name(self) -> str:
        return self.extractor or get_template(self.template).extractor

    @property
    def base_game(self) -> str:
        return base_game(self.env_id)


def base_game(env_id: str) -> str:
    """``TicTacToe-v0-train`` -> ``TicTacToe``."""
    return env_id.split("-v", 1)[0]


def registered_env_ids() -> list[str]:
    import textarena  # noqa: F401  (registers the envs)
    from textarena.envs.registration import ENV_REGISTRY

    return sorted(ENV_REGISTRY)


def check_legal_moves(spec: GameSpec) -> None:
    """Refuse ``legal_moves: mask`` on a game whose legal moves ub cannot read (naming the
    games whose it can)."""
    if spec.legal_moves == "mask" and not supports_legal_actions(spec.env_id):
        raise UbError(f"mask needs the legal moves of {spec.env_id}, which ub does not know; "
                      f"the games that have them: {', '.join(games_with('legal_moves'))} (a "
                      f"game of one's own: rules with legal_moves, {GUIDE}; or set "
                      "legal_moves: free)")


def check_env_id(env_id: str) -> None:
    """Refuse an env id TextArena does not have (listing close matches) or one that needs the
    network."""
    known = registered_env_ids()
    if env_id not in known:
        close = difflib.get_close_matches(env_id, known, n=5, cutoff=0.6)
        hint = (f"; did you mean: {', '.join(close)}" if close else "; list them with `ub envs` "
                f"(a game of one's own is registered by naming its rules: {GUIDE})")
        raise UbError(f"unknown TextArena env {env_id!r}{hint}")
    if base_game(env_id) in NETWORK_GAMES:
        raise UbError(
            f"env {env_id!r} needs the network at start-up (a corpus download or a hosted judge), "
            "which ub does not allow at run time: choose another game"
        )


def make_env(env_id: str):
    """``textarena.make`` with ub's errors (see :func:`check_env_id`) and its fixes to games
    that break their own rules (:mod:`ub.games.env_fixes`)."""
    import textarena as ta

    from ub.games.env_fixes import fix_env

    check_env_id(env_id)
    return fix_env(ta.make(env_id=env_id), env_id)


def check_env(spec: GameSpec) -> None:
    """Make and reset the env once, offline, with the spec's player count."""
    env = make_env(spec.env_id)
    state = random.getstate()  # TextArena reseeds the global RNG; leave the caller's alone
    try:
        env.reset(num_players=spec.num_players, seed=0)
        env.get_observation()
    except SyntaxError as exc:
        raise UbError(f"env {spec.env_id!r} cannot run on this Python ({exc.msg})") from None
    except (LookupError, ConnectionError, TimeoutError) as exc:
        raise UbError(f"env {spec.env_id!r} needs the network or a download: {exc}") from None
    except Exception as exc:
        raise EnvStartError(
            f"env {spec.env_id!r} failed to start with {spec.num_players} player(s): "
            f"{type(exc).__name__}: {exc}"
        ) from None
    finally:
        random.setstate(state)
