"""The model seats' requests of one rollout: every model seat's prompt goes to one engine,
which batches them (the base model and any number of LoRA adapters mixed) and returns each
completion as soon as it finishes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ub.actors.base import Batch, Move, MoveFailed, Pending, Turn
from ub.games.actions import get_extractor
from ub.games.move_mask import played_move, template_constraint
from ub.games.templates import get_template
from ub.inference.types import GenerationRequest

if TYPE_CHECKING:
    from ub.inference.protocols import InferenceEngine
    from ub.inference.types import SamplingConfig


def prompt_problem(prompt_tokens: int, max_model_len: int, max_tokens: int) -> str | None:
    """Why a prompt of ``prompt_tokens`` cannot get a whole completion of up to ``max_tokens``
    within the engine's context, or ``None``."""
    room = max_model_len - prompt_tokens
    if room >= max_tokens:
        return None
    return (f"prompt of {prompt_tokens} tokens leaves {max(room, 0)} of engine.max_model_len "
            f"{max_model_len} for a completion of up to sampling.max_tokens {max_tokens}: raise "
            "engine.max_model_len, lower sampling.max_tokens, or shorten the game "
            "(max_turns)")


class EngineBatch(Batch):
    """Model turns through ``engine``, sampled with ``sampling`` (``None``: the engine's
    default): the prompt as the game's template renders it, its token ids as the engine's
    tokenizer makes them (what the learner scores), the legal-move mask where the game asks
    for one."""

    computes = True  # (an engine step is the work itself)

    def __init__(self, engine: InferenceEngine, sampling: SamplingConfig | None) -> None:
        self.engine, self.sampling = engine, sampling
        self._end_tokens: dict[str, tuple[int, ...]] = {}  # template name -> its end of turn
        self._waiting: dict[str, tuple[dict[str, Any], str, list[str]]] = {}

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, turn: Turn, adapter: str | None) -> Pending:
        """Queue ``turn``'s prompt for the base model with ``adapter``.

        :raises MoveFailed: the prompt cannot fit, or a masked position has no legal move.
        """
        game, spec, tokenizer = turn.game, turn.spec, self.engine.tokenizer
        template = get_template(spec.template)
        prompt = template.render(game.observation, tokenizer)
        ids = tokenizer.encode(prompt)
        problem = prompt_problem(len(ids), self.engine.config.max_model_len, self._max_tokens())
        if problem:
            # vLLM would cut the completion at the context's end, and the cut answer would be
            # scored as an invalid move: the game is stopped instead (errored games are not
            # trained on), saying why.
            raise MoveFailed(ValueError(problem))
        if template.name not in self._end_tokens:
            self._end_tokens[template.name] = template.end_token_ids(tokenizer)
        legal = game.legal_moves or []
        mask = None
        if spec.legal_moves == "mask":
            try:  # (preflight refuses a game without legal moves; a position without any:)
                mask = template_constraint(template, legal, tokenizer)
            except ValueError as exc:
                raise MoveFailed(ValueError(f"legal_moves mask at turn {game.turn}: {exc}")
                                 ) from exc
        request = GenerationRequest(turn.request_id, ids, turn.seed, adapter, self.sampling,
                                    stop_token_ids=self._end_tokens[template.name],
                                    move_mask=mask)
        self.engine.submit(request)
        details = {"template": template.name, "prompt": prompt, "prompt_token_ids": ids,
                   "sampling_seed": turn.seed, "legal_moves_mode": spec.legal_moves,
                   "submitted": time.perf_counter()}
        self._waiting[turn.request_id] = (details, spec.extractor_name, legal)
        return Pending(self, turn.request_id)

    def _max_tokens(self) -> int:
        """The completion budget of this rollout's model turns."""
        sampling = self.sampling or getattr(self.engine, "sampling", None)
        return sampling.max_tokens if sampling is not None else 1

    def collect(self, block: bool) -> list[tuple[str, Move | MoveFailed]]:
        """One engine step: every finished completion, in the engine's order."""
        answers: list[tuple[str, Move | MoveFailed]] = []
        for gen in self.engine.step():
            details, extractor, legal = self._waiting.pop(gen.request_id)
            action, format_ok = get_extractor(extractor)(gen.text)
            if details["legal_moves_mode"] == "mask":
                # The move is the completion's first bracket, legal by construction (unless
                # max_tokens cut it: then the extractor's reading, as unmasked).
                action = played_move(gen.text, legal) or action
            details.update(
                completion=gen.text,
                completion_token_ids=list(gen.completion_token_ids),
                completion_logprobs=list(gen.completion_logprobs),
                num_prompt_tokens=len(details["prompt_token_ids"]),
                num_completion_tokens=len(gen.completion_token_ids),
                finish_reason=gen.finish_reason,
                gen_seconds=time.perf_counter() - details.pop("submitted"),
            )
            answers.append((gen.request_id, Move(action, format_ok, details)))
        return answers

    def close(self) -> None:
        if self._waiting:  # failed midway: nothing of this rollout may surface in the next one
            self.engine.abort(list(self._waiting))
            self._waiting.clear()
