"""The model pool: TrueSkill ratings of checkpoints and fixed opponents, and opponent sampling.

See docs/pool.md.
"""

from ub.pool.ratings import Member, RatingConfig, RatingTable
from ub.pool.sampling import MODES, OpponentConfig, PoolView, sample_opponents, seat_players

__all__ = ["MODES", "Member", "OpponentConfig", "PoolView", "RatingConfig", "RatingTable",
           "sample_opponents", "seat_players"]
