"""Best responses and exploitability of a policy, exactly, over a real TextArena game's tree.

A policy here is whatever sits in both seats of a two-player zero-sum game and answers, for
each decision, a distribution over the legal moves (and the probability of an illegal move,
which loses the game). Its **exploitability** (NashConv, as OpenSpiel reports it) is what a best
response wins against it, summed over the seats: 0 at a Nash equilibrium, 2 (a game won in
each seat) at the most. The best response is computed exactly by walking the game's tree in
the real env (every prompt the policy meets is the env's own observation after that history,
so a policy that reads the move history, as an LLM does, is measured as it plays):

- at the policy's decisions the value is its expectation over its moves (a greedy policy has
  one); an illegal move is a leaf worth the game's worst outcome to the policy;
- at the best response's decisions it takes the best move of each *information set*: the
  decisions its seat cannot tell apart, keyed by the observation that seat has seen (in
  TicTacToe and Nim every decision is its own; in Kuhn Poker the opponent's card is hidden).

Where a policy spreads its probability over every move (a sampled LLM), the tree is the whole
game's (TicTacToe's 294,778 non-terminal histories); ``cut`` stops a line once the policy's
own probability of reaching it is below the cut, and counts it as the best or worst outcome:
the best response's value is then an interval that holds the exact one (``low``, ``high``).

What ub knows of a game for this (its rules' :attr:`~ub.games.rules.GameRules.tree`, found by
the core env's class: :mod:`ub.games.registry`): the chance outcomes at the start (Kuhn
Poker's six deals, each an env seed that deals it), where the measured game ends (one hand of
Kuhn Poker, in chips, though the env plays on), and the worst outcome (what an illegal move
costs). A game without rules gets a
one-line refusal naming the games that have them.
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ub.errors import UbError
from ub.games.legal import legal_actions
from ub.games.positions import position_function
from ub.games.registry import games_with, rules_for
from ub.games.rules import TreeRules, unwrap
from ub.games.specs import make_env

# --------------------------------------------------------------------------------------------
# What a policy is asked, and answers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeDecision:
    """One decision of the policy: the env before the move (read it, never step it), the seat
    to move, what that seat observes (the prompt's source) and the legal moves."""

    env: Any
    seat: int
    observation: str
    legal_moves: tuple[str, ...]


@dataclass(frozen=True)
class MoveDistribution:
    """A policy's answer at one decision: ``probs`` over legal moves (moves left out have 0)
    and ``illegal``, the probability of a move the game refuses (it loses the game). The two
    add up to 1."""

    probs: dict[str, float]
    illegal: float = 0.0


class TreePolicy(Protocol):
    """What :func:`best_response` needs of a policy."""

    markov: bool
    """True when its answer depends only on the position (the game state and the seat to
    move), not on the history that led there (a scripted player): positions reached by
    several histories are then walked once."""

    def distributions(self, decisions: Sequence[TreeDecision]) -> list[MoveDistribution]:
        """One distribution per decision (asked in batches: an LLM scores them together)."""
        ...


# --------------------------------------------------------------------------------------------
# What ub knows of each game's tree: its rules' (ub.games.rules.TreeRules)
# --------------------------------------------------------------------------------------------


def tree_rules(env_id: str) -> TreeRules:
    """The rules of ``env_id``'s tree.

    :raises UbError: ub has none for its game (one line naming those it has).
    """
    rules = rules_for(env_id)
    if rules is None or rules.tree is None:
        raise UbError(f"no exploitability solver for {env_id}: ub has one for "
                      f"{', '.join(games_with('tree'))}")
    return rules.tree


def has_tree_rules(env_id: str) -> bool:
    """Whether ``env_id``'s game has tree rules (an exploitability solver)."""
    rules = rules_for(env_id)
    return rules is not None and rules.provides("tree")


def __getattr__(name: str) -> tuple[str, ...]:
    # SOLVED_GAMES: the games with a solver, read when asked (a game of one's own that a spec
    # registered has joined them since this module was imported).
    if name == "SOLVED_GAMES":
        return games_with("tree")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------
# The walk
# --------------------------------------------------------------------------------------------


def _isolated(call: Callable[[], Any]) -> Any:
    # TextArena draws from (and reseeds) the global RNG: leave the caller's as it was.
    state = random.getstate()
    try:
        return call()
    finally:
        random.setstate(state)


def _reset(env_id: str, seed: int) -> Any:
    env = make_env(env_id)
    _isolated(lambda: env.reset(num_players=2, seed=seed))
    return env


@dataclass(eq=False)
class _Node:
    seat: int = -1  # to move; -1 at a leaf
    reach: float = 1.0  # chance and the policy's probability of getting here
    payoff: tuple[float, ...] | None = None  # at a leaf
    infoset: object = None  # the best response's decisions: what its seat tells apart
    children: list[tuple[str, float, _Node]] = field(default_factory=list)  # (move, p, node)
    illegal: float = 0.0  # the policy's illegal mass here
    cut: float = 0.0  # the policy's mass on lines cut (below the reach cut)
    answer: MoveDistribution | None = None  # the policy's, at its nodes


@dataclass(frozen=True)
class BestResponse:
    """The best response of ``seat`` against the policy in the other seat.

    ``low`` and ``high`` bound its value (in the rules' unit, to ``seat``): equal when the tree
    was walked whole (``exact``). ``illegal``: the probability that the policy loses by an
    illegal move when the best response plays its (lower-bound) strategy. ``line``: the
    likeliest line of that play (the moves, then the result), for reading what it exploits.
    ``decisions``: the policy's decisions scored; ``nodes``: the tree's size.
    """

    seat: int
    low: float
    high: float
    illegal: float
    decisions: int
    nodes: int
    line: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return self.low == self.high

    @property
    def value(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class Exploitability:
    """Both seats' best responses: NashConv is their sum (bounded by ``low``/``high``)."""

    env_id: str
    unit: str
    responses: tuple[BestResponse, BestResponse]

    @property
    def low(self) -> float:
        return sum(r.low for r in self.responses)

    @property
    def high(self) -> float:
        return sum(r.high for r in self.responses)

    @property
    def nash_conv(self) -> float:
        return (self.low + self.high) / 2

    @property
    def exact(self) -> bool:
        return all(r.exact for r in self.responses)


Progress = Callable[[float], None]
"""Told the share of a walk done so far, from 0 to 1, after each batch of the policy's
decisions (where the time goes)."""


def exploitability(env_id: str, policy: TreePolicy, *, cut: float = 0.0,
                   progress: Progress | None = None) -> Exploitability:
    """The policy's NashConv in ``env_id``: :func:`best_response` in each seat (``progress``:
    the first seat's walk is its first half)."""
    rules = tree_rules(env_id)

    def half(seat: int) -> Progress | None:
        return None if progress is None else lambda done: progress((seat + done) / 2)

    responses = (best_response(env_id, policy, 0, cut=cut, progress=half(0)),
                 best_response(env_id, policy, 1, cut=cut, progress=half(1)))
    return Exploitability(env_id, rules.unit, responses)


def best_response(env_id: str, policy: TreePolicy, seat: int, *, cut: float = 0.0,
                  progress: Progress | None = None) -> BestResponse:
    """The exact best response of ``seat`` against ``policy`` in the other seat.

    :param cut: stop a line where the policy's (and chance's) probability of reaching it is
        below this (0: never), bounding its value by the game's best and worst outcome.
    :param progress: told the share of the tree walked (:data:`Progress`): each line weighs
        its chance and policy probability, the best response's moves at a decision alike.
    """
    rules = tree_rules(env_id)
    roots = [(_reset(env_id, s), p) for s, p in rules.roots(env_id)]
    walk = _Walk(rules, policy, seat, cut, position_function(env_id), progress)
    tops = [walk.node(env, p) for env, p in roots]
    walk.ask([(n, env) for n, env in zip(tops, (e for e, _ in roots), strict=True)
              if n.seat != seat])
    for top, (env, p) in zip(tops, roots, strict=True):
        walk.grow(top, env, p)
    walk.tell_progress()
    low = sum(p * walk.value(n, high=False) for n, (_, p) in zip(tops, roots, strict=True))
    high = sum(p * walk.value(n, high=True) for n, (_, p) in zip(tops, roots, strict=True))
    illegal = sum(p * walk.illegal(n) for n, (_, p) in zip(tops, roots, strict=True))
    likeliest = max(zip(tops, roots, strict=True), key=lambda t: t[1][1])[0]
    return BestResponse(seat, low, high, illegal, walk.decisions, walk.nodes,
                        walk.line(likeliest))


class _Walk:
    """One best response's tree, grown depth first: the policy's decisions that follow one
    decision of the best response are asked together (they share most of their prompt), and
    in a game of perfect information the best response stops trying moves once one wins for
    certain (its value cannot be beaten)."""

    def __init__(self, rules: TreeRules, policy: TreePolicy, seat: int, cut: float,
                 position_key: Callable[[Any, int], str | None] | None,
                 progress: Progress | None = None) -> None:
        self.rules, self.policy, self.seat = rules, policy, seat
        self.progress, self.done = progress, 0.0  # (the share of the tree walked)
        # A policy of positions in a game of perfect information: a position reached by two
        # histories is one node (the best response's value there is the same; such a tree is
        # small, and is never cut).
        self.shared = (policy.markov and rules.perfect_information and position_key
                       is not None)
        self.cut = 0.0 if self.shared else cut
        self.position_key = position_key
        self.seen: dict[object, _Node] = {}
        self.decisions = self.nodes = 0
        self._values: dict[tuple[int, bool], float] = {}
        self._choices: dict[tuple[object, bool], str] = {}
        self.members: dict[object, list[_Node]] = {}
        self._grown: set[int] = set()

    def node(self, env: Any, reach: float) -> _Node:
        """The node of ``env`` before a move (the one already made, if its position is
        shared), with the seat to move and, for the best response, its information set."""
        core = unwrap(env)
        key = None
        if self.shared:
            key = self.position_key(core, core.state.current_player_id)  # type: ignore[misc]
            if key in self.seen:
                return self.seen[key]
        node = _Node(seat=int(core.state.current_player_id), reach=reach)
        self.nodes += 1
        if key is not None:
            self.seen[key] = node
        if node.seat == self.seat:
            if self.rules.perfect_information:
                node.infoset = id(node)
            else:
                node.infoset = _isolated(env.get_observation)[1]
            self.members.setdefault(node.infoset, []).append(node)
        return node

    def ask(self, pending: list[tuple[_Node, Any]]) -> None:
        """The policy's distributions at its nodes of ``pending`` (not asked before), at once."""
        todo = [(n, env) for n, env in pending if n.answer is None]
        if not todo:
            return
        decisions = []
        for n, env in todo:
            _seat, observation = _isolated(env.get_observation)
            moves = tuple(_isolated(functools.partial(legal_actions, env)))
            decisions.append(TreeDecision(env, n.seat, observation, moves))
        for (n, _), answer in zip(todo, self.policy.distributions(decisions), strict=True):
            n.answer = answer
        self.decisions += len(todo)
        self.tell_progress()

    def tell_progress(self) -> None:
        if self.progress is not None:
            self.progress(min(self.done, 1.0))

    def grow(self, node: _Node, env: Any, share: float = 0.0) -> None:
        """Grow ``node``'s subtree (``env``: its state); ``share``: its weight in the
        progress (done once the subtree is)."""
        if id(node) in self._grown:
            self.done += share
            return  # (a shared position, grown where it was first met)
        self._grown.add(id(node))
        if node.seat == self.seat:
            moves = tuple(_isolated(lambda: legal_actions(env)))
            made = [(move, *self._child(env, move, node.reach)) for move in moves]
            self.ask([(c, e) for _, c, e in made if e is not None and c.seat != self.seat])
            best = -self.rules.worst
            each = share / len(made) if made else 0.0
            for tried, (move, child, child_env) in enumerate(made, start=1):
                node.children.append((move, 1.0, child))
                if child_env is not None:
                    self.grow(child, child_env, each)
                else:
                    self.done += each
                # Nothing beats the best outcome for certain: the other moves need no look.
                if (self.rules.perfect_information
                        and self.value(child, high=False) >= best):
                    self.done += each * (len(made) - tried)
                    break
            if not made:
                self.done += share
            return
        answer = node.answer
        assert answer is not None
        node.illegal = answer.illegal
        grown: list[tuple[_Node, Any, float]] = []
        walked = 0.0  # (the mass whose lines go on; the rest is done here)
        for move, p in answer.probs.items():
            if p <= 0.0:
                continue
            if self.cut and node.reach * p < self.cut:
                node.cut += p
                continue
            child, child_env = self._child(env, move, node.reach * p)
            node.children.append((move, p, child))
            if child_env is not None:
                grown.append((child, child_env, p))
                walked += p
        self.done += share * max(0.0, 1.0 - walked)
        self.ask([(c, e) for c, e, _ in grown if c.seat != self.seat])
        for child, child_env, p in grown:
            self.grow(child, child_env, share * p)

    def _child(self, env: Any, move: str, reach: float) -> tuple[_Node, Any]:
        """The node after ``move`` and its env (``None`` at a leaf)."""
        payoff = self.rules.payoff(unwrap(env), move) if self.rules.payoff else None
        if payoff is None:
            child_env = copy.deepcopy(env)
            done, _ = _isolated(lambda: child_env.step(action=move))
            if not done:
                return self.node(child_env, reach), child_env
            rewards, _info = _isolated(child_env.close)
            payoff = (float(rewards.get(0, 0.0)), float(rewards.get(1, 0.0)))
        self.nodes += 1
        return _Node(reach=reach, payoff=payoff), None

    # ---- values --------------------------------------------------------------------------

    def value(self, node: _Node, *, high: bool) -> float:
        """The best response's value at ``node`` (cut lines at the best or worst outcome)."""
        if node.payoff is not None:
            return node.payoff[self.seat]
        key = (id(node), high)
        if key in self._values:
            return self._values[key]
        if node.seat == self.seat:
            move = self.choice(node.infoset, high=high)
            value = next(self.value(c, high=high) for m, _, c in node.children if m == move)
        else:
            bound = -self.rules.worst if high else self.rules.worst
            value = (sum(p * self.value(c, high=high) for _, p, c in node.children)
                     + node.illegal * -self.rules.worst + node.cut * bound)
        self._values[key] = value
        return value

    def choice(self, infoset: object, *, high: bool) -> str:
        """The best response's move in ``infoset``: the best, weighed over its decisions by
        the probability of reaching each (the first of equals, in legal-move order)."""
        key = (infoset, high)
        if key not in self._choices:
            members = self.members[infoset]
            totals: dict[str, float] = {}
            for node in members:
                for move, _, child in node.children:
                    totals[move] = totals.get(move, 0.0) + node.reach * self.value(child,
                                                                                    high=high)
            self._choices[key] = max(totals, key=totals.__getitem__)
        return self._choices[key]

    def illegal(self, node: _Node) -> float:
        """The probability that the policy plays an illegal move, the best response playing
        its lower-bound strategy."""
        if node.payoff is not None:
            return 0.0
        if node.seat == self.seat:
            move = self.choice(node.infoset, high=False)
            return next(self.illegal(c) for m, _, c in node.children if m == move)
        return node.illegal + sum(p * self.illegal(c) for _, p, c in node.children)

    def line(self, node: _Node) -> tuple[str, ...]:
        """The likeliest line of the best response's play from ``node``, and its result."""
        out: list[str] = []
        while node.payoff is None:
            if node.seat == self.seat:
                move = self.choice(node.infoset, high=False)
                node = next(c for m, _, c in node.children if m == move)
                out.append(move)
                continue
            best = max(node.children, key=lambda t: t[1], default=None)
            if best is None or best[1] < max(node.illegal, node.cut):
                out.append("(illegal)" if node.illegal >= node.cut else "(cut)")
                return tuple(out)
            out.append(best[0])
            node = best[2]
        out.append(f"= {node.payoff[self.seat]:+g}")
        return tuple(out)
