"""``ub envs``: the TextArena env ids ub can play."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    envs = sub.add_parser("envs", help="list TextArena env ids ub can play")
    envs.add_argument("--all", action="store_true", help="every registered id, not just scripted")
    envs.set_defaults(func=cmd_envs)


def cmd_envs(args: argparse.Namespace) -> int:
    from ub.games.legal import SUPPORTED_GAMES
    from ub.games.specs import NETWORK_GAMES, base_game, registered_env_ids

    for env_id in registered_env_ids():
        game = base_game(env_id)
        if args.all or game in SUPPORTED_GAMES:
            notes = []
            if game in SUPPORTED_GAMES:
                notes.append("scripted players")
            if game in NETWORK_GAMES:
                notes.append("needs network: refused")
            print(f"{env_id}" + (f"  ({', '.join(notes)})" if notes else ""))
    return 0

