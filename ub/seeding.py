"""Seeds as pure functions of where they are used.

Every random choice in a run draws from a seed derived from (run seed, round, game, turn, ...),
so a resumed run replays exactly what an uninterrupted one would have done, whatever order the
work happens to be scheduled in.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from ``parts``, e.g. ``derive_seed(run_seed, round, game, "env")``."""
    text = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1



def env_seed(run_seed: int, round_: int, game_index: int) -> int:
    """The seed a game's env is reset with: game ``game_index`` of round ``round_`` (its
    cards, targets and first mover), the same in a training shard, ``ub play`` and a replay."""
    return derive_seed(run_seed, round_, game_index, "env")


DEFAULT_SEED = 0
"""The run's seed when a config gives none (``seed``); the learner's too (``learner.seed``)."""
