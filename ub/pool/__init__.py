"""The model pool: TrueSkill ratings of checkpoints and fixed opponents, and opponent sampling.

See docs/pool.md.
"""

from ub.pool.ratings import Member, RatingConfig, RatingTable
from ub.pool.sampling import (
    LAGGED_K,
    MODES,
    OpponentConfig,
    OpponentMode,
    PoolView,
    sample_opponents,
    seat_players,
)

__all__ = ["LAGGED_K", "MODES", "Member", "OpponentConfig", "OpponentMode", "PoolView",
           "RatingConfig", "RatingTable", "sample_opponents", "seat_players"]
