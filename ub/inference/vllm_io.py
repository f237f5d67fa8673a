"""Translation between ub's request and result types (:mod:`ub.inference.types`) and vLLM's.

Pure functions, so what the engine asks of vLLM (seeds, logprobs, stop strings) and what it makes
of vLLM's answers (one logprob per token, text decoded from the tokens) are read in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ub.games.move_mask import MoveConstraint
from ub.inference.types import Generation, GenerationRequest, SamplingConfig

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.outputs import RequestOutput


def sampling_params(sampling: SamplingConfig, seed: int, stop_token_ids: tuple[int, ...] = (),
                    move_mask: MoveConstraint | None = None) -> SamplingParams:
    """vLLM's sampling parameters for one seeded request (ending at ``stop_token_ids`` too;
    under ``move_mask``, which :mod:`ub.inference.move_mask` applies)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from ub.inference.move_mask import EXTRA_ARG

    return SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.max_tokens,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(stop_token_ids) or None,
        include_stop_str_in_output=True,
        # vLLM only needs its incremental detokenizer to find stop strings; the text is decoded
        # once per finished completion instead (see generation_from).
        detokenize=bool(sampling.stop),
        # vLLM takes a seed in [0, 2**63) (-1 would mean "unseeded", 2**64 and up fail inside
        # the engine); any int maps to one deterministically.
        seed=seed % 2**63,
        # logprobs=0 returns exactly the sampled token's logprob (1 would add the top-1).
        logprobs=0,
        flat_logprobs=True,
        # Only the final output: no per-token RequestOutput objects for running requests.
        output_kind=RequestOutputKind.FINAL_ONLY,
        extra_args=None if move_mask is None else {EXTRA_ARG: move_mask.to_args()},
    )


def generation_from(
    output: RequestOutput, request: GenerationRequest, *, lora_id: int, tokenizer: Any,
    latency_s: float,
) -> Generation:
    """The :class:`Generation` of a finished vLLM output for ``request``.

    :raises RuntimeError: vLLM returned a logprob count that does not match the tokens.
    """
    completion = output.outputs[0]
    token_ids = list(completion.token_ids)
    logprobs = completion.logprobs
    if logprobs is None or len(logprobs) != len(token_ids):
        raise RuntimeError(
            f"vLLM returned {0 if logprobs is None else len(logprobs)} logprobs for "
            f"{len(token_ids)} tokens (request {output.request_id})"
        )
    values = [position[token].logprob for position, token in zip(logprobs, token_ids, strict=True)]
    return Generation(
        request_id=request.request_id,
        prompt_token_ids=list(request.prompt_token_ids),
        completion_token_ids=token_ids,
        completion_logprobs=values,
        # Decoded here so that text == decode(completion_token_ids) always: vLLM's incremental
        # text drops a trailing partial UTF-8 character and is cut right after a stop string,
        # which may end inside the last token.
        text=tokenizer.decode(token_ids, skip_special_tokens=True),
        finish_reason=str(completion.finish_reason),
        stop_reason=completion.stop_reason,
        adapter=request.adapter,
        lora_id=lora_id,
        seed=request.seed,
        latency_s=latency_s,
    )
