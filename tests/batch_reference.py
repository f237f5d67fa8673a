"""A plain-Python reference of the batch's rows: tests and ``bench/batch.py`` compare
:func:`ub.batch.select_rows` against it."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ub.batch import DECISION_COLUMNS, GAME_COLUMNS, TOKEN_COLUMNS, ZERO_EPS, BatchConfig
from ub.batch.plan import final_chain
from ub.data.shards import committed_shards, shard_path
from ub.rewards import GameView


def sample_key(seed: int, run: str, game_id: str, turn: int, branch_group: str | None = None
               ) -> int:
    """The sampling key of a decision, as the batch query computes it (``md5_number``): the
    game id (or the branch group) less its run's name, so that the key depends on the seed,
    not the run's name; a branch point's decisions share theirs."""
    def less_run(text: str) -> str:
        return text[len(run) + 1:] if text.startswith(f"{run}-") else text

    group = (f"{less_run(branch_group)}/branch" if branch_group is not None
             else f"{less_run(game_id)}/{turn}")
    return int.from_bytes(hashlib.md5(f"{seed}/{group}".encode()).digest(), "little")


def _final_rewards(root: Path, shards: list, config: BatchConfig,
                   state: Mapping[str, Any] | None, first: int, last: int
                   ) -> tuple[dict[tuple[str, int], tuple[float, float]], dict[str, float]]:
    """The final stage game by game: every game through ``last`` after the watermark, in
    canonical order; the (raw, final) reward of each (game, seat) of the window, and each
    window game's lowest final reward."""
    chain = final_chain(config.transforms.final, state)
    games = []
    for sid in shards:
        if sid.round <= last:
            games += pq.read_table(shard_path(root, "games", sid), columns=GAME_COLUMNS).to_pylist()
    games.sort(key=lambda g: (g["round"], g["game_index"], g["game_id"]))
    final: dict[tuple[str, int], tuple[float, float]] = {}
    game_min: dict[str, float] = {}
    for g in games:
        key = (g["round"], g["game_index"], g["game_id"])
        if chain.through is not None and key <= chain.through:
            continue
        if g["rewards"] is None or g["outcome"] == "error":
            continue
        roles = [r if r is not None else f"seat {s}"
                 for s, r in enumerate(g["roles"] or [None] * len(g["rewards"]))]
        view = GameView(g["game_id"], g["round"], g["game_index"], g["env_id"], roles,
                        g["actors"], g["results"] or [None] * len(g["rewards"]),
                        [float(r) for r in g["rewards"]])
        rewards = list(view.raw_rewards)
        for t in chain.transforms:
            rewards = t.transform_game(rewards, view)
        if g["round"] >= first:
            for seat, (raw, r) in enumerate(zip(view.raw_rewards, rewards, strict=True)):
                final[(g["game_id"], seat)] = (raw, r)
            game_min[g["game_id"]] = min(rewards)
    return final, game_min


def reference_rows(root: Path, config: BatchConfig,
                   final_rewards_state: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The batch rows :func:`select_rows` returns, computed by loading shards into Python and
    looping: the final stage game by game (``transform_game``), step and sampling transforms
    through their Python forms. Slow; an oracle, not for training.
    """
    root = Path(root)
    shards = committed_shards(root)
    rounds = [s.round for s in shards]
    first = min(rounds) if config.first_round is None else config.first_round
    last = max(rounds) if config.last_round is None else config.last_round

    final, game_min = _final_rewards(root, shards, config, final_rewards_state, first, last)

    # steps: filter, shape, keep the batch_size smallest (sample key, game id, turn)
    steps = config.transforms.step
    pool: list[tuple[int, str, int, dict]] = []
    for sid in shards:
        if not first <= sid.round <= last:
            continue
        table = pq.read_table(shard_path(root, "steps", sid),
                              columns=[*DECISION_COLUMNS, "run", "actor_kind", *TOKEN_COLUMNS])
        rows = table.to_pylist()
        turns: dict[tuple[str, int], list[int]] = {}
        for row in rows:
            if row["actor_kind"] == "model":
                turns.setdefault((row["game_id"], row["seat"]), []).append(row["turn"])
        for row in rows:
            if row["actor_kind"] != "model":
                continue
            if config.actors is not None and row["actor"] not in config.actors:
                continue
            if config.checkpoints is not None and row["checkpoint"] not in config.checkpoints:
                continue
            got = final.get((row["game_id"], row["seat"]))
            if got is None:
                continue
            row["raw_reward"], row["final_reward"] = got
            row["game_min_final_reward"] = game_min[row["game_id"]]
            row["seat_moves_after"] = sum(
                t > row["turn"] for t in turns[(row["game_id"], row["seat"])])
            reward = row["final_reward"] + row["step_reward"]
            for t in steps:
                reward = t.apply_row(reward, row)
            row["reward"] = reward
            if config.drop_zero_reward and abs(reward) <= ZERO_EPS:
                continue
            key = sample_key(config.seed, row["run"], row["game_id"], row["turn"],
                             row["branch_group"])
            pool.append((key, row["game_id"], row["turn"], row))
    pool.sort(key=lambda item: item[:3])
    picked = [item[3] for item in pool[:config.batch_size]]
    values = [r["reward"] for r in picked]
    for t in config.transforms.sampling:
        values = t.apply_rows(values, picked)
    for r, v in zip(picked, values, strict=True):
        r["advantage"] = v
        del r["actor_kind"]
    return picked
