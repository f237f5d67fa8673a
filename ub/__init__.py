"""ub: self-play reinforcement learning for language models on TextArena games."""

__version__ = "0.1.0"
