"""TowerOfHanoi: legal moves and position keys."""

from __future__ import annotations

from typing import Any

from ub.games.rules import GameRules


class TowerOfHanoiRules(GameRules):
    """TowerOfHanoi (one player): ``[A C]`` moves the top disk of A onto C; the key is each
    tower's disks, bottom first (``A:3,2 B: C:1``)."""

    name = "TowerOfHanoi"
    entry_point = "textarena.envs.TowerOfHanoi.env:TowerOfHanoiEnv"

    def legal_moves(self, core: Any) -> list[str]:
        """A disk may go onto an empty tower or a larger disk. ``[X X]`` (same tower) is
        accepted by TextArena as a no-op that burns a turn; it is not a real move, so it is
        not listed."""
        towers: dict[str, list[int]] = core.state.game_state["towers"]
        actions = []
        for source, source_disks in towers.items():
            if not source_disks:
                continue
            for target, target_disks in towers.items():
                if target != source and (not target_disks or target_disks[-1] > source_disks[-1]):
                    actions.append(f"[{source} {target}]")
        return actions

    def position(self, core: Any, seat: int) -> str:
        """Each tower's disks, bottom first (one player: the seat adds nothing)."""
        towers: dict[str, list[int]] = core.state.game_state["towers"]
        return " ".join(f"{name}:{','.join(map(str, disks))}" for name, disks in towers.items())
