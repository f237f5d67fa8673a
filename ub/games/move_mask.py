"""The legal-move mask (``envs[].legal_moves: mask``): which tokens the model may sample at each
step of a completion, so that the move it plays is always one the game accepts.

One :class:`MoveConstraint` per decision, built by :func:`move_constraint` from the game's
legal moves (:func:`ub.games.legal.legal_actions`), the prompt template and the tokenizer. The
engine applies it while sampling (:mod:`ub.inference.move_mask`, a vLLM logits processor) and
the learner scores each completion token under the same constraint (the log-softmax over the
tokens allowed there): both walk the completion with :meth:`MoveConstraint.allowed_steps`, so
sampler and learner cannot disagree on what was allowed.

How a completion is constrained:

- **The move** is one of the legal moves' token sequences: each move string as the tokenizer
  encodes it on its own (its canonical tokenization), alone or after one space (the tiny model
  answers ``Your action:`` with `` [0 3]``), followed by the template's closing text (``}``
  after a ``\\boxed{`` move).
  Where a move is one token (the tiny model), the constraint is one choice among the legal
  moves' tokens; where it is several (a real tokenizer), each step allows the tokens that
  continue some legal move. Other tokenizations of the same text are not allowed.
- **After the move** only the tokens that end the completion (EOS, the template's end of turn).
  A stop string (the tiny preset's ``]``) ends it at the move's last token anyway.
- **Text before the move** (templates with ``free_text``, e.g. a reasoning model's): free until
  the model samples a token that begins a legal move, which the move then continues; in that
  text every token holding ``[`` that does not begin a legal move, and every token that ends
  the completion, is excluded. So the move is the completion's first bracket, and the completion
  cannot end without one. What this cannot cover: a reasoning text that writes brackets of its
  own (``I could play [0 3]...``) commits to its first one as the move; a completion cut at
  ``max_tokens`` before its move ends plays no move (it is scored as today: an invalid move).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ub.games.templates import PromptTemplate

MOVE_OPEN = "["
"""Every legal move string begins with it (:mod:`ub.games.legal`): a token holding it outside a
move's first token would open a bracket that is not the move."""

Allowed = tuple[int, ...] | None
"""The tokens allowed at one step: these ids, or ``None``: text before the move (every token
but :attr:`MoveConstraint.banned`)."""


@dataclass(frozen=True)
class MoveConstraint:
    """What the model may sample in one decision (see the module docstring).

    Attributes:
        moves: the legal moves' token sequences (each move with its closing text).
        ends: the tokens that end the completion once a move is complete.
        free_text: text may come before the move.
        banned: in that text, the tokens excluded (empty without free text).
    """

    moves: tuple[tuple[int, ...], ...]
    ends: tuple[int, ...]
    free_text: bool = False
    banned: frozenset[int] = field(default_factory=frozenset)

    @functools.cached_property
    def starts(self) -> frozenset[int]:
        """The tokens a move begins with."""
        return frozenset(move[0] for move in self.moves)

    def next_allowed(self, move_so_far: Sequence[int] | None) -> Allowed:
        """The tokens allowed after ``move_so_far``, the move's tokens sampled so far
        (``None``: no move has begun, which is only possible with free text)."""
        if move_so_far is None:
            return None if self.free_text else tuple(sorted(self.starts))
        k = len(move_so_far)
        prefix = tuple(move_so_far)
        candidates = [m for m in self.moves if m[:k] == prefix]
        if not candidates:
            raise ValueError(f"tokens {list(prefix)} begin no legal move")
        following = {m[k] for m in candidates if len(m) > k}
        if any(len(m) == k for m in candidates):  # complete: the completion may end here
            following.update(self.ends)
        return tuple(sorted(following))

    def allowed_steps(self, completion: Sequence[int]) -> list[Allowed]:
        """What was allowed at each step of ``completion`` (one entry per token, for the
        learner's scoring; the engine walks the same way, a token at a time).

        :raises ValueError: the completion holds a token the constraint did not allow.
        """
        walk, out = MoveWalk(self), []
        for token in completion:
            out.append(walk.allowed())
            walk.take(token, check=True)
        return out

    def to_args(self) -> dict[str, Any]:
        """As plain lists, for a request's ``extra_args`` (msgpack across vLLM's processes)."""
        return {"moves": [list(m) for m in self.moves], "ends": list(self.ends),
                "free_text": self.free_text, "banned": sorted(self.banned)}

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> MoveConstraint:
        return cls(tuple(tuple(int(t) for t in m) for m in args["moves"]),
                   tuple(int(t) for t in args["ends"]), bool(args["free_text"]),
                   frozenset(int(t) for t in args["banned"]))


class MoveWalk:
    """A completion under a constraint, a token at a time: what is allowed next
    (:meth:`allowed`), then the token sampled (:meth:`take`)."""

    def __init__(self, constraint: MoveConstraint) -> None:
        self.constraint = constraint
        self.move: list[int] | None = None  # the move's tokens so far; None: not begun

    def allowed(self) -> Allowed:
        return self.constraint.next_allowed(self.move)

    def take(self, token: int, *, check: bool = False) -> None:
        """Follow ``token``; with ``check``, refuse one that was not allowed (ValueError)."""
        c = self.constraint
        if check:
            allowed = self.allowed()
            if allowed is None and token in c.banned:
                raise ValueError(f"token {token} is excluded from the text before a move")
            if allowed is not None and token not in allowed:
                raise ValueError(f"token {token} was not allowed there (allowed: "
                                 f"{list(allowed)[:8]})")
        if self.move is not None:
            self.move.append(token)
        elif not c.free_text or token in c.starts:
            self.move = [token]


def move_constraint(legal_moves: Sequence[str], tokenizer: Any, *, free_text: bool,
                    close: str = "", ends: Sequence[int] = ()) -> MoveConstraint:
    """The constraint of one decision whose legal moves are ``legal_moves``.

    :param tokenizer: the model's (a transformers tokenizer).
    :param free_text: the template lets text come before the move.
    :param close: the text the template closes a move with (``}`` in ``\\boxed{[0 3]}``).
    :param ends: tokens that end the completion besides the tokenizer's EOS (the template's end
        of turn).
    :raises ValueError: no legal move (the game has none to play).
    """
    if not legal_moves:
        raise ValueError("no legal move to constrain to")
    texts = [move + close for move in legal_moves]
    texts += [" " + text for text in texts]  # as a model often writes it: after a space
    opening = _opening_tokens(tokenizer)
    moves: dict[tuple[int, ...], None] = {}
    for text in texts:
        ids = _token_ids(tokenizer, text)
        if free_text:
            # " [0 3]" may encode as " " then "[0 3]": after free text the space is text too,
            # and the move begins at its bracket.
            while ids and ids[0] not in opening:
                ids = ids[1:]
        if ids:
            moves[ids] = None
    end_ids = tuple(sorted({*ends, *_eos_ids(tokenizer)}))
    banned: frozenset[int] = frozenset()
    if free_text:
        starts = {m[0] for m in moves}
        banned = frozenset((opening | set(end_ids)) - starts)
    return MoveConstraint(tuple(moves), end_ids, free_text, banned)


def template_constraint(template: PromptTemplate, legal_moves: Sequence[str], tokenizer: Any
                        ) -> MoveConstraint:
    """The constraint of a decision prompted with ``template``: what the engine samples under
    and the learner scores under, built from what a ``steps`` row records (its template and
    legal moves) and the model's tokenizer."""
    return move_constraint(legal_moves, tokenizer, free_text=template.free_text,
                           close=template.move_close, ends=template.end_token_ids(tokenizer))


def played_move(completion: str, legal_moves: Sequence[str]) -> str | None:
    """The move a completion sampled under the mask plays: its first bracket, if that is a
    legal move (``None``: the completion was cut before its move ended)."""
    start = completion.find(MOVE_OPEN)
    end = completion.find("]", start + 1)
    if start < 0 or end < 0:
        return None
    move = completion[start:end + 1]
    return move if move in legal_moves else None


@functools.lru_cache(maxsize=1 << 16)
def _token_ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    """``text`` as the tokenizer spells it on its own (a game's moves recur decision after
    decision: each is encoded once)."""
    return tuple(tokenizer.encode(text, add_special_tokens=False))


@functools.lru_cache(maxsize=8)
def _opening_tokens(tokenizer: Any) -> frozenset[int]:
    """The ids of the tokens whose text holds ``[`` (once per tokenizer: a pass over the
    vocabulary, ~1 s at Qwen3's 151,936)."""
    size = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(size)])
    return frozenset(i for i, text in enumerate(texts) if MOVE_OPEN in text)


def _eos_ids(tokenizer: Any) -> tuple[int, ...]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list | tuple) else (int(eos),)
