"""The rows a finished game adds to the ``steps`` and ``games`` tables (:mod:`ub.data.schema`).

``where`` holds the columns the rollout sets for every row: ``run``, ``round`` and ``shard``.
"""

from __future__ import annotations

from typing import Any

from ub.games.loop import Game
from ub.rollout.assignments import GameAssignment


def step_rows(a: GameAssignment, g: Game, where: dict[str, Any],
              groups: dict[int, str] | None = None) -> list[dict]:
    """The ``steps`` rows of a finished game, one per decision (a copy's: from the turn it was
    copied at); ``groups``: the branch group of each branch point's turn."""
    result = g.final
    groups = groups or {}
    rows = []
    for d in g.decisions[g.first_turn:]:
        actor = a.actors[d.seat]
        det = d.details
        rows.append({
            **where, "game_id": g.game_id,
            "env_id": a.spec.env_id, "turn": d.turn, "seat": d.seat,
            "role": result.roles[d.seat], "actor": actor.name, "actor_kind": actor.kind,
            "checkpoint": actor.checkpoint, "template": det.get("template"),
            "observation": d.observation, "position": d.position, "prompt": det.get("prompt"),
            "completion": det.get("completion"),
            "prompt_token_ids": det.get("prompt_token_ids"),
            "completion_token_ids": det.get("completion_token_ids"),
            "completion_logprobs": det.get("completion_logprobs"),
            "num_prompt_tokens": det.get("num_prompt_tokens"),
            "num_completion_tokens": det.get("num_completion_tokens"),
            "action": d.action, "format_ok": d.format_ok, "invalid_move": d.invalid_move,
            "step_reward": 0.0,
            "env_reward": None if result.rewards is None else result.rewards[d.seat],
            "finish_reason": det.get("finish_reason"),
            "sampling_seed": det.get("sampling_seed"),
            "gen_seconds": det.get("gen_seconds"), "env_seconds": d.env_seconds,
            "legal_moves": d.legal_moves, "legal_moves_mode": det.get("legal_moves_mode"),
            "branch_group": groups.get(d.turn),
        })
    return rows


def game_row(a: GameAssignment, g: Game, where: dict[str, Any], parent: str | None = None
             ) -> dict:
    """The ``games`` row of a finished game (``parent``: a copy's parent game id)."""
    result = g.final
    return {
        **where, "game_id": g.game_id,
        "game_index": a.game_index, "env_id": a.spec.env_id, "seed": a.seed,
        "num_players": a.spec.num_players, "actors": [x.name for x in a.actors],
        "roles": result.roles, "rewards": result.rewards, "results": result.results,
        "invalid_moves": result.invalid_moves, "outcome": result.outcome,
        "winner": result.winner, "num_turns": g.turn, "reason": result.reason,
        "error": result.error, "seconds": result.seconds,
        "parent_game_id": parent, "branch_turn": g.first_turn if parent else None,
    }
