"""A game of one's own, outside ub (tests/own_game.py, found through ``PYTHONPATH``): a real
``ub play`` of the tiny model against the ``expert`` under the legal-move mask, which no file
of ub names; and the registry's one key (the core env's entry point) serving every consumer,
built-in games and one's own alike, with one-line refusals of rules that cannot register."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import own_game
import pytest
from textarena.envs.registration import ENV_REGISTRY

from ub.actors.scripted import check_scripted_supports, make_scripted_player
from ub.components import own_components
from ub.data.sql import query
from ub.errors import UbError
from ub.flows.cli import main
from ub.games import registry
from ub.games.builtin import BUILT_IN_RULES
from ub.games.env_fixes import fix_env
from ub.games.game_tree import has_tree_rules
from ub.games.legal import legal_actions, supports_legal_actions
from ub.games.positions import position_function
from ub.games.rules import GameRules, unwrap
from ub.games.specs import GameSpec, check_legal_moves, make_env

HERE = Path(__file__).resolve().parent
RULES = "own_game:TakeAwayRules"
ENV_IDS = (own_game.ENV_ID, f"{own_game.ENV_ID}-train")
GAMES = 6


def test_ub_play_masks_keys_and_seats_the_expert_in_ones_own_game(tiny_model, tmp_path):
    """``ub play`` as a user runs it, in a child process whose PYTHONPATH holds this folder:
    every model move is one of the legal moves the rules gave (the mask held it there), every
    decision has its position key, and the expert played its own moves."""
    out = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-m", "ub.flows.cli", "play", "--env", ENV_IDS[1], "--rules", RULES,
         "--players", "model,expert", "--legal-moves", "mask", "--games", str(GAMES),
         "--model", str(tiny_model), "--max-tokens", "8", "--seed", "3", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # vLLM's notices of ub's own CPU settings are not the user's to act on (issue 78)
    assert "Enforce eager set" not in done.stderr, done.stderr[-3000:]
    games = query(out, "SELECT results FROM games").to_pylist()
    assert len(games) == GAMES and all(g["results"] for g in games)  # none errored
    steps = query(out, "SELECT actor, action, position, legal_moves, legal_moves_mode, "
                  "invalid_move FROM steps").to_pylist()
    model = [s for s in steps if s["actor"] == "model"]
    expert = [s for s in steps if s["actor"] == "expert"]
    assert model and expert and len(model) + len(expert) == len(steps)
    for step in model:
        assert step["legal_moves_mode"] == "mask", step
        assert step["action"] in step["legal_moves"] and not step["invalid_move"], step
    assert all(s["position"] is not None and s["legal_moves"] for s in steps)
    for step in expert:
        pile = int(step["position"].split()[0])
        assert step["action"] == f"[{own_game.expert_take(pile)}]", step


@pytest.fixture()
def own_rules() -> GameRules:
    """The game's rules, registered as a spec naming them registers them."""
    GameSpec(ENV_IDS[0], rules=RULES)
    rules = registry.rules_for(ENV_IDS[0])
    assert isinstance(rules, own_game.TakeAwayRules)
    return rules


def _ids_of(entry_point: str) -> list[str]:
    """Every TextArena id registered with ``entry_point``."""
    return [env_id for env_id in ENV_REGISTRY if registry.entry_point(env_id) == entry_point]


def test_every_consumer_reads_the_one_key(own_rules):
    """Each game's env ids (every variant) find its one rules instance by their entry point,
    and legal moves, position keys, the scripted players, the mask check, the solver and the
    env fixes all answer from it: for every built-in game and for one's own."""
    games = [registry.rules_for(_ids_of(cls.entry_point)[0]) for cls in BUILT_IN_RULES]
    for rules in [*games, own_rules]:
        assert rules is not None
        ids = _ids_of(rules.entry_point)
        assert ids and all(registry.rules_for(i) is rules for i in ids), rules.name
        for env_id in ids:
            assert supports_legal_actions(env_id) == rules.provides("legal_moves")
            function = position_function(env_id)
            assert (function is not None) == rules.provides("position")
            assert function is None or getattr(function, "__self__", None) is rules
            assert has_tree_rules(env_id) == rules.provides("tree")
            for player, needs in (("expert", "expert_move"), ("perfect",
                                                              "perfect_distribution")):
                if rules.provides(needs):  # type: ignore[arg-type]
                    check_scripted_supports([player], env_id)
                else:
                    with pytest.raises(UbError, match=f"the {player} player cannot play"):
                        check_scripted_supports([player], env_id)
        if rules.provides("legal_moves"):
            check_legal_moves(GameSpec(ids[0], legal_moves="mask"))
    # A made env is found by its core's class: the same key.
    env = make_env(ENV_IDS[1])
    env.reset(num_players=2, seed=0)
    assert registry.rules_of(env) is own_rules and fix_env(env, ENV_IDS[1]) is env
    assert legal_actions(env) == ["[1]", "[2]", "[3]"]
    assert make_scripted_player("expert", 0).act(env) == "[2]"  # 10 leaves 8, a multiple of 4
    assert position_function(ENV_IDS[1])(unwrap(env), 0) == "10 p0"  # type: ignore[misc]
    assert "TakeAway" in registry.games_with("expert_move")
    assert "TakeAway" not in registry.games_with("tree")


def test_ub_envs_lists_ones_own_game_with_what_its_rules_give(capsys):
    assert main(["envs", "--rules", RULES]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"{ENV_IDS[0]}  (legal moves, position keys, expert)" in out
    assert ("TicTacToe-v0-train  (legal moves, position keys, expert, perfect, exploitability)"
            in out)


def test_preflight_checks_the_rules_import():
    config = {"envs": [{"env_id": ENV_IDS[0], "rules": RULES, "position": "own_game:x"}]}
    assert own_components(config) == [("envs.0.position", "own_game:x"), ("envs.0.rules", RULES)]


def test_position_setting_overrides_the_key_alone(own_rules):
    """``envs[].position`` replaces the rules' key; the rules keep the rest."""
    own = position_function(ENV_IDS[0], "own_game:expert_take")
    assert own is own_game.expert_take and supports_legal_actions(ENV_IDS[0])


class _Unregistered(GameRules):
    name = "Nowhere"
    entry_point = "own_game:NoSuchEnv"


class _SecondRules(own_game.TakeAwayRules):
    pass


class _Nameless(GameRules):
    entry_point = "own_game:TakeAwayEnv"


@pytest.mark.parametrize(("rules", "message"), [
    (_Unregistered, "TextArena has no env registered with entry point own_game:NoSuchEnv: "
                    "register it"),
    (_SecondRules, r"own_game:TakeAwayEnv already has rules \(own_game:TakeAwayRules\)"),
    (_Nameless, "need a name and an entry_point 'module:Class'"),  # (an empty name)
])
def test_rules_that_cannot_register_are_refused_in_one_line(own_rules, rules, message):
    with pytest.raises(UbError, match=message) as refused:
        registry.register_rules(rules)
    assert "\n" not in str(refused.value)
    assert registry.rules_for(ENV_IDS[0]) is own_rules  # (unchanged)


@pytest.mark.parametrize(("settings", "message"), [
    ({"rules": "own_game:expert_take"}, "is a function, not a class: name a subclass of "
                                        "ub.games.rules.GameRules"),
    ({"rules": "no_such_module:Rules"}, "importing no_such_module failed"),
    ({"env_id": "Nim-v0", "rules": RULES}, "are for entry point own_game:TakeAwayEnv, but "
                                           "Nim-v0 is textarena.envs.Nim.env:NimEnv"),
])
def test_a_spec_naming_bad_rules_is_refused(settings, message):
    with pytest.raises(UbError, match=message):
        GameSpec.from_dict({"env_id": ENV_IDS[0], **settings})


def test_mask_on_a_game_without_legal_moves_says_how_to_give_them():
    with pytest.raises(UbError, match=r"mask needs the legal moves of Othello-v0.*docs/games\.md"):
        check_legal_moves(GameSpec("Othello-v0", legal_moves="mask"))
