"""Rollouts: games played by the actors in their seats, batched around one engine.

- :mod:`ub.rollout.assignments`: which games (env, seed, seats);
- :mod:`ub.rollout.runner`: the loop that advances games and steps the actors' batches;
- :mod:`ub.rollout.engine_batch`: the model seats' requests to the engine;
- :mod:`ub.rollout.rows`: the ``steps`` and ``games`` rows a finished game adds.
"""

from ub.rollout.assignments import GameAssignment, assign_games
from ub.rollout.runner import Rollout, RolloutRunner, RolloutStats, play_games

__all__ = ["GameAssignment", "Rollout", "RolloutRunner", "RolloutStats", "assign_games",
           "play_games"]
