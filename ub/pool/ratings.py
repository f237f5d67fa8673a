"""TrueSkill ratings of the pool: the learner's checkpoints and the fixed opponents.

Ratings are a pure function of the ``games`` records processed in a fixed order, so they can
always be rebuilt from the data (``ub.run.steps.rate.rebuild_ratings``); a JSON snapshot per round
(:meth:`RatingTable.snapshot`) makes resuming cheap and equals the rebuild exactly.

Rules:

- a game updates ratings when 2+ *different* actors played it and it did not error; the seats'
  ranks come from their rewards (higher is better, equal rewards tie);
- a mirror game (one actor in several seats, as in self-play) is counted but not rated: a
  player cannot gain or lose skill against itself;
- a new checkpoint starts at its parent's mu with ``sigma`` inflated by ``checkpoint_sigma_boost``
  (capped at the initial sigma): it is probably a bit better, and we are less sure;
- fixed opponents start at the configured prior.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import trueskill
from pydantic import Field, ValidationError

from ub.errors import UbError
from ub.settings import Section, format_errors


class RatingConfig(Section):
    """TrueSkill settings of the pool's ratings (see docs/pool.md)."""

    # float fields read an int as the float it means (`beta: 3` rates as `beta: 3.0`, bit for
    # bit, as the hand-written reader's float() did): snapshots compare exactly.

    mu: float = Field(25.0, description="Initial mean of the first checkpoint.")
    sigma: float = Field(25.0 / 3, gt=0, description="Initial standard deviation, also the cap "
                         "of an inflated sigma.")
    beta: float = Field(25.0 / 6, gt=0, description="Skill difference giving ~76% win chance: "
                        "the game's luck.")
    tau: float = Field(25.0 / 300, ge=0, description="Dynamics: sigma added before each game.")
    draw_probability: float = Field(0.1, ge=0, lt=1, description="Prior probability of a draw.")
    fixed_mu: float = Field(25.0, description="Prior mean of fixed opponents.")
    fixed_sigma: float = Field(25.0 / 3, gt=0, description="Prior standard deviation of fixed "
                               "opponents.")
    checkpoint_sigma_boost: float = Field(1.0, ge=0, description="Added to the parent's sigma "
                                          "for a new checkpoint.")

    key = "rating"

    def env(self) -> trueskill.TrueSkill:
        """A TrueSkill environment of these settings (a local one, never trueskill's global
        one)."""
        return trueskill.TrueSkill(mu=self.mu, sigma=self.sigma, beta=self.beta, tau=self.tau,
                                   draw_probability=self.draw_probability)


@dataclass
class Member:
    """One pool member's rating and record."""

    name: str
    kind: str  # "checkpoint" or "fixed"
    mu: float
    sigma: float
    parent: str | None = None
    games: int = 0
    rated_games: int = 0
    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def conservative(self) -> float:
        """mu - 3 sigma: a rating the member is very likely above."""
        return self.mu - 3 * self.sigma

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "conservative": self.conservative}


@dataclass
class RatingTable:
    """The pool's ratings, records and match matrix; updated game by game."""

    config: RatingConfig = field(default_factory=RatingConfig)
    members: dict[str, Member] = field(default_factory=dict)
    matches: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """``matches[a][b] = [wins, draws, losses]`` of ``a`` against ``b``."""
    games_seen: int = 0
    errored_games: int = 0

    # --- members -------------------------------------------------------------------------

    def add_checkpoint(self, name: str, parent: str | None = None) -> Member:
        """Add a learner checkpoint (kept as is if already present)."""
        if name in self.members:
            return self.members[name]
        c = self.config
        if parent is not None and parent in self.members:
            p = self.members[parent]
            member = Member(name, "checkpoint", p.mu,
                            min(c.sigma, p.sigma + c.checkpoint_sigma_boost), parent)
        else:
            member = Member(name, "checkpoint", c.mu, c.sigma, parent)
        self.members[name] = member
        return member

    def add_fixed(self, name: str) -> Member:
        """Add a fixed opponent at the prior (kept as is if already present)."""
        if name not in self.members:
            self.members[name] = Member(name, "fixed", self.config.fixed_mu,
                                        self.config.fixed_sigma)
        return self.members[name]

    def _member(self, name: str) -> Member:
        # An actor seen only in the data (e.g. the base "model") joins as a fixed member.
        return self.members.get(name) or self.add_fixed(name)

    # --- games ---------------------------------------------------------------------------

    def rate_games(self, games: Any) -> None:
        """Update from ``games`` rows (a pyarrow Table or dicts with ``actors``, ``rewards``,
        ``outcome``), in the order given."""
        rows = games.to_pylist() if hasattr(games, "to_pylist") else list(games)
        env = self.config.env()
        for g in rows:
            self._rate_one(env, g["actors"], g.get("rewards"), g.get("outcome"))

    def _rate_one(self, env: trueskill.TrueSkill, actors: list[str],
                  rewards: list[float] | None, outcome: str | None) -> None:
        self.games_seen += 1
        members = [self._member(a) for a in actors]
        for m in {m.name: m for m in members}.values():
            m.games += 1
        if outcome == "error" or rewards is None or len(rewards) != len(actors):
            self.errored_games += 1
            return
        distinct = list(dict.fromkeys(actors))
        # Best reward per actor (a mirror actor's seats collapse into one).
        best = {a: max(r for x, r in zip(actors, rewards, strict=True) if x == a)
                for a in distinct}
        for a in distinct:
            for b in distinct:
                if a != b:
                    cell = self.matches.setdefault(a, {}).setdefault(b, [0, 0, 0])
                    cell[0 if best[a] > best[b] else 1 if best[a] == best[b] else 2] += 1
        if len(distinct) < 2:
            return  # mirror game: recorded, not rated
        top = max(best.values())
        for a in distinct:
            m = self.members[a]
            if all(best[a] == v for v in best.values()):
                m.draws += 1
            elif best[a] == top:
                m.wins += 1
            else:
                m.losses += 1
        order = sorted(set(best.values()), reverse=True)
        ranks = [order.index(best[a]) for a in distinct]
        groups = [(env.create_rating(self.members[a].mu, self.members[a].sigma),)
                  for a in distinct]
        for a, (new,) in zip(distinct, env.rate(groups, ranks=ranks), strict=True):
            m = self.members[a]
            m.mu, m.sigma = float(new.mu), float(new.sigma)
            m.rated_games += 1

    # --- views ---------------------------------------------------------------------------

    def rating(self, name: str) -> trueskill.Rating:
        m = self._member(name)
        return self.config.env().create_rating(m.mu, m.sigma)

    def leaderboard(self) -> list[dict[str, Any]]:
        """Members by conservative rating (mu - 3 sigma), best first; ties by name."""
        ordered = sorted(self.members.values(), key=lambda m: (-m.conservative, m.name))
        return [m.to_dict() for m in ordered]

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state; :meth:`from_snapshot` restores it exactly."""
        return {"config": self.config.to_dict(),
                "members": [dataclasses.asdict(m) for m in self.members.values()],
                "matches": self.matches, "games_seen": self.games_seen,
                "errored_games": self.errored_games}

    @classmethod
    def from_snapshot(cls, data: Mapping[str, Any]) -> RatingTable:
        try:
            table = cls(RatingConfig.model_validate(data["config"]))
            for m in data["members"]:
                member = Member(**m)
                _check_member(member)
                table.members[member.name] = member
            table.matches = {a: {b: list(c) for b, c in row.items()}
                             for a, row in data["matches"].items()}
            table.games_seen = int(data["games_seen"])
            table.errored_games = int(data["errored_games"])
        except (KeyError, TypeError) as exc:
            raise UbError(f"not a rating snapshot: {exc}") from None
        except ValidationError as exc:
            raise UbError(f"not a rating snapshot: {format_errors(exc, 'config')}") from None
        return table


def _check_member(member: Member) -> None:
    """A snapshot's member as ub writes it: a name, finite numbers for its rating, whole
    numbers for its record (a crafted or damaged snapshot read on otherwise)."""
    def number(value: object) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
            value)

    wrong = [f"{name}={getattr(member, name)!r}" for name in ("mu", "sigma")
             if not number(getattr(member, name))]
    wrong += [f"{name}={getattr(member, name)!r}" for name in ("games", "rated_games", "wins",
                                                              "draws", "losses")
              if not isinstance(getattr(member, name), int)]
    if not isinstance(member.name, str) or wrong:
        raise TypeError(f"member {member.name!r} has "
                        f"{', '.join(wrong) or 'a name that is no text'}")
