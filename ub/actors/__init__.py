"""Who sits in a seat: an :class:`Actor` takes its turn and hands back its :class:`Move`
(:mod:`ub.actors.base`); the model, scripted players and hosted endpoints are its built-in
kinds, and one's own is named by import path (docs/pool.md)."""

from ub.actors.base import Actor, Batch, Move, MoveFailed, Pending, Turn

__all__ = ["Actor", "Batch", "Move", "MoveFailed", "Pending", "Turn"]
