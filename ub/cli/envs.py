"""``ub envs``: the TextArena env ids ub can play, and what ub knows of each game."""

from __future__ import annotations

import argparse

from ub.games.rules import Capability

# What a game's rules provide, as `ub envs` shows it.
_SHOWN: dict[Capability, str] = {
    "legal_moves": "legal moves", "position": "position keys", "expert_move": "expert",
    "perfect_distribution": "perfect", "tree": "exploitability"}


def add_parser(sub) -> None:
    envs = sub.add_parser("envs", help="list TextArena env ids ub can play")
    envs.add_argument("--all", action="store_true",
                      help="every registered id, not just those of games ub has rules for")
    envs.add_argument("--rules", action="append", default=[], metavar="PATH",
                      help="a game's rules of one's own to list too, package.module:Class "
                      "(docs/games.md); repeatable")
    envs.set_defaults(func=cmd_envs)


def cmd_envs(args: argparse.Namespace) -> int:
    from ub.games.registry import load_rules, rules_for
    from ub.games.specs import NETWORK_GAMES, base_game, registered_env_ids

    for path in args.rules:
        load_rules(path)
    for env_id in registered_env_ids():
        rules = rules_for(env_id)
        if args.all or rules is not None:
            notes = [shown for what, shown in _SHOWN.items()
                     if rules is not None and rules.provides(what)]
            if base_game(env_id) in NETWORK_GAMES:
                notes.append("needs network: refused")
            print(f"{env_id}" + (f"  ({', '.join(notes)})" if notes else ""))
    return 0
