"""The final stage over a games table: games exploded to seat rows, folded in canonical order
through the chain of final transforms, with a JSON-able state (the watermark)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ub.errors import UbError
from ub.rewards.base import (
    FINAL_REWARDS_SCHEMA,
    STATE_FORMAT,
    FinalTransform,
    GameKey,
    SeatRows,
    TransformSpec,
    build_transforms,
)


def sort_games(games: pa.Table) -> pa.Table:
    """``games`` in the canonical order ``(round, game_index, game_id)``."""
    return games.sort_by([("round", "ascending"), ("game_index", "ascending"),
                          ("game_id", "ascending")])


def games_after(games: pa.Table, key: GameKey) -> pa.Array:
    """Mask of the games strictly after ``key`` in the canonical order."""
    r, i, gid = key
    rnd, idx, ids = games["round"], games["game_index"], games["game_id"]
    same_round = pc.equal(rnd, r)
    return pc.or_(pc.greater(rnd, r), pc.and_(same_round, pc.or_(
        pc.greater(idx, i), pc.and_(pc.equal(idx, i), pc.greater(ids, gid)))))


def seat_rows(games: pa.Table) -> SeatRows:
    """Explode sorted, non-errored ``games`` into :class:`SeatRows` (vectorized)."""
    games = games.combine_chunks()
    n = games.num_rows
    rewards = games["rewards"].chunk(0) if n else pa.array([], pa.list_(pa.float32()))
    lengths = pc.list_value_length(rewards).to_numpy(zero_copy_only=False)
    num_players = games["num_players"].to_numpy()
    for column, may_be_null in (("roles", True), ("actors", False), ("results", True)):
        col = games[column].chunk(0) if n else pa.array([], pa.list_(pa.string()))
        col_len = pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero((col_len != lengths) & ~(may_be_null & (col_len == -1)))
        if len(bad):
            g = int(bad[0])
            raise UbError(f"game {games['game_id'][g].as_py()} has {lengths[g]} rewards but "
                          f"{max(col_len[g], 0)} {column}: the games shard is inconsistent")
    bad = np.flatnonzero(lengths != num_players)
    if len(bad):
        g = int(bad[0])
        raise UbError(f"game {games['game_id'][g].as_py()} has {lengths[g]} rewards for "
                      f"{num_players[g]} players: the games shard is inconsistent")
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    game = np.repeat(np.arange(n), lengths)
    seat = (np.arange(total) - offsets[:-1][game]).astype(np.int32)
    raw = pc.list_flatten(rewards)
    if raw.null_count:
        row = int(np.flatnonzero(raw.is_null().to_numpy(zero_copy_only=False))[0])
        raise UbError(f"game {games['game_id'][int(game[row])].as_py()} has a null reward for "
                      f"seat {seat[row]} but is not marked as errored")
    roles_col = games["roles"].chunk(0) if n else pa.array([], pa.list_(pa.string()))
    role = _flatten_padded(roles_col, lengths)
    if role.null_count:  # a seat without a role name gets "seat N"
        seat_names = pa.array([f"seat {s}" for s in seat.tolist()], pa.string())
        role = pc.coalesce(role, seat_names)
    results_col = games["results"].chunk(0) if n else pa.array([], pa.list_(pa.string()))
    return SeatRows(
        game_id=games["game_id"].chunk(0) if n else pa.array([], pa.string()),
        round=games["round"].to_numpy(), game_index=games["game_index"].to_numpy(),
        offsets=offsets, game=game, seat=seat,
        env_id=games["env_id"].chunk(0).take(pa.array(game)) if n else pa.array([], pa.string()),
        role=role,
        actor=pc.list_flatten(games["actors"].chunk(0)) if n else pa.array([], pa.string()),
        result=_flatten_padded(results_col, lengths),
        raw_reward=raw.to_numpy(zero_copy_only=False).astype(np.float64),
    )


def _flatten_padded(lists: pa.Array, lengths: np.ndarray) -> pa.Array:
    """Flatten ``lists``, standing in ``lengths[i]`` nulls for a null list ``i``."""
    if not lists.null_count:
        return pc.list_flatten(lists)
    filled = [x if x is not None else [None] * int(n) for x, n in zip(
        lists.to_pylist(), lengths, strict=True)]
    return pa.array([v for x in filled for v in x], type=lists.type.value_type)


@dataclass
class FinalRewards:
    """The final stage's output.

    :param table: one row per (non-errored game, seat), in canonical order, with the columns of
        :data:`FINAL_REWARDS_SCHEMA` (``raw_reward`` from ``games.rewards``, ``reward`` after
        the chain).
    :param state: the chain's state after the last game (JSON-able; see
        :meth:`FinalRewardChain.state_dict`).
    :param state_by_round: the state after the last game of each round in the input (from
        ``snapshot_from`` on, see :meth:`FinalRewardChain.fold`).
    """

    table: pa.Table
    state: dict[str, Any]
    state_by_round: dict[int, dict[str, Any]]


class FinalRewardChain:
    """The final stage: a list of final transforms plus the watermark of the games folded in.

    :meth:`fold` accepts only games after the watermark, in any order (it sorts them), so a
    chain restored from :meth:`state_dict` continues exactly as an uninterrupted one would.
    """

    def __init__(self, specs: Iterable[TransformSpec] = ()) -> None:
        # Copies: the chain's folds change its transforms' state, and an object given here (a
        # config's parsed transform, :class:`RewardTransforms`) must stay as configured for the
        # next chain it builds.
        self.transforms: list[FinalTransform] = copy.deepcopy(build_transforms("final", specs))
        self.through: GameKey | None = None  # the last game folded in (canonical key)
        self.games_folded = 0  # games folded in, errored ones included

    def specs(self) -> list[dict[str, Any]]:
        """The config entries of the chain's transforms."""
        return [t.spec() for t in self.transforms]

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot: format, transform specs and states, watermark, games count."""
        return {
            "format": STATE_FORMAT,
            "transforms": [{"name": t.config_name(), "params": t.params(),
                            "state": t.state_dict()} for t in self.transforms],
            "through": list(self.through) if self.through is not None else None,
            "games": self.games_folded,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; refuse one saved with other transforms or parameters."""
        if state.get("format") != STATE_FORMAT:
            raise UbError(f"final-rewards state has format {state.get('format')!r}, this ub "
                          f"reads {STATE_FORMAT}: start from no state (replays from the first "
                          "round)")
        saved = [{"name": t["name"], **t["params"]} for t in state.get("transforms", [])]
        mine = json.loads(json.dumps(self.specs()))
        if json.loads(json.dumps(saved)) != mine:
            raise UbError(f"final-rewards state was saved with final transforms {saved} but the "
                          f"config has {mine}: use the matching config, or no state to replay "
                          "the games from the first round")
        for t, saved_t in zip(self.transforms, state["transforms"], strict=True):
            t.load_state_dict(saved_t.get("state", {}))
        through = state.get("through")
        self.through = (int(through[0]), int(through[1]), str(through[2])) if through else None
        self.games_folded = int(state.get("games", 0))

    def fold(self, games: pa.Table, snapshot_from: int | None = None) -> FinalRewards:
        """Fold ``games`` (all after the watermark) into the state; return their final rewards.

        Errored games (``outcome = 'error'`` or null ``rewards``) produce no rows and leave the
        transforms' state unchanged; they still move the watermark. The state is snapshotted
        after each round from ``snapshot_from`` on (every round when ``None``); earlier rounds
        are folded in one pass.
        """
        games = sort_games(games)
        if self.through is not None and games.num_rows:
            first = (games["round"][0].as_py(), games["game_index"][0].as_py(),
                     games["game_id"][0].as_py())
            if first <= self.through:
                raise UbError(
                    f"game {first[2]} (round {first[0]}, index {first[1]}) is at or before the "
                    f"final-rewards state's last game {self.through[2]} (round "
                    f"{self.through[0]}, index {self.through[1]}): it was already folded in; "
                    "pass only later games, or an earlier state")
        rounds = games["round"].to_numpy() if games.num_rows else np.array([], np.int32)
        cuts = np.flatnonzero(np.diff(rounds)) + 1  # where a new round starts
        if snapshot_from is not None:
            cuts = cuts[rounds[cuts] > snapshot_from]
        tables, by_round = [], {}
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(rounds)], strict=True):
            if hi <= lo:
                continue
            tables.append(self._fold_sorted(games.slice(int(lo), int(hi - lo))))
            if snapshot_from is None or rounds[hi - 1] >= snapshot_from:
                by_round[int(rounds[hi - 1])] = self.state_dict()
        table = (pa.concat_tables(tables) if tables
                 else FINAL_REWARDS_SCHEMA.empty_table())
        return FinalRewards(table, self.state_dict(), by_round)

    def _fold_sorted(self, games: pa.Table) -> pa.Table:
        ok = pc.and_(pc.invert(pc.is_null(games["rewards"])),
                     pc.not_equal(games["outcome"], "error"))
        played = games.filter(ok)
        seats = seat_rows(played)
        reward = seats.raw_reward.copy()
        for t in self.transforms:
            reward = np.asarray(t.apply(reward, seats), dtype=np.float64)
            if len(reward) != len(seats):
                raise UbError(f"final transform {t.config_name()} returned {len(reward)} "
                              f"rewards for {len(seats)} seats")
        if not np.all(np.isfinite(reward)):
            raise UbError("a final reward transform produced NaN or inf: check its parameters")
        last = games.num_rows - 1
        self.through = (games["round"][last].as_py(), games["game_index"][last].as_py(),
                        games["game_id"][last].as_py())
        self.games_folded += games.num_rows
        game = pa.array(seats.game)
        return pa.table({
            "game_id": seats.game_id.take(game),
            "seat": pa.array(seats.seat, pa.int32()),
            "env_id": seats.env_id,
            "role": seats.role,
            "round": pa.array(seats.round[seats.game], pa.int32()),
            "game_index": pa.array(seats.game_index[seats.game], pa.int32()),
            "raw_reward": pa.array(seats.raw_reward, pa.float64()),
            "reward": pa.array(reward, pa.float64()),
        }, schema=FINAL_REWARDS_SCHEMA)


def apply_final_transforms(
    games: pa.Table,
    specs: Iterable[TransformSpec],
    state: Mapping[str, Any] | None = None,
) -> FinalRewards:
    """Apply the final chain ``specs`` to ``games`` (sorted into canonical order first).

    Pure: ``state`` (a previous :attr:`FinalRewards.state`, or ``None`` for a fresh start) is not
    modified. Returns the per-(game, seat) rewards and the new state.
    """
    chain = FinalRewardChain(specs)
    if state is not None:
        chain.load_state_dict(state)
    return chain.fold(games)
