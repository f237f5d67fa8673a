"""Prompt templates: how a game observation becomes the text a model reads.

A template is a pure function ``observation -> prompt text``. The rollout tokenizes the rendered
text once and stores the token ids, so the learner later trains on exactly what the model saw.

- ``plain``: the observation and a short cue; what the tiny CPU model is pre-trained on.
- ``qwen3-zs``: the zero-shot Qwen3 chat prompt of the original UnstableBaselines (answer in
  ``\\boxed{}``).
- ``chat``: the model tokenizer's own chat template with the observation as the user turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ub.errors import UbError

PLAIN_CUE = "\n\nYour action:"

QWEN3_ZS = (
    "<|im_start|>user\n"
    "You are playing a two-player zero-sum game. Make valid actions to win.\n"
    "Observation: {observation}\n"
    "Please reason step by step, and put your final answer within \\boxed{{}}.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@dataclass(frozen=True)
class PromptTemplate:
    """A named way of turning an observation into a prompt.

    :param name: the name used in configs and stored with every step.
    :param extractor: the action extractor that matches the answer format the prompt asks for.
    :param needs_tokenizer: True when rendering uses the tokenizer's chat template.
    :param end: the text that ends the model's turn in the prompt's format (``<|im_end|>``),
        given the tokenizer; ``None``: the format has none (the model's EOS ends it).
    :param chat: the prompt is a chat turn (a user message, the answer the assistant's): a run
        playing in it is scored on benchmarks through the chat template too
        (:func:`ub.benchmarks.chat_format`).
    :param free_text: the answer may hold text before its move (reasoning); ``False``: the
        completion is the move itself. The legal-move mask lets that text be
        (:mod:`ub.games.move_mask`).
    :param move_close: the text that closes a move in this format (``}`` of ``\\boxed{[4]}``),
        which the legal-move mask adds after the move.
    """

    name: str
    extractor: str
    needs_tokenizer: bool
    _render: Callable[[str, Any], str]
    end: Callable[[Any], str | None] = lambda _tokenizer: None
    chat: bool = False
    free_text: bool = False
    move_close: str = ""

    def render(self, observation: str, tokenizer: Any = None) -> str:
        if self.needs_tokenizer and tokenizer is None:
            raise UbError(f"prompt template {self.name!r} needs the model's tokenizer to render")
        return self._render(observation, tokenizer)

    def end_token_ids(self, tokenizer: Any) -> tuple[int, ...]:
        """The token that ends the model's turn in this format, where the tokenizer has it as
        one token: generation stops there as at EOS. A base model's EOS is often another token
        (Qwen3-Base: ``<|endoftext|>``), so a completion that closed its turn would otherwise
        run on into a turn of its own invention, up to ``max_tokens``."""
        text = self.end(tokenizer)
        if not text:
            return ()
        token_id = tokenizer.get_vocab().get(text)
        return () if token_id is None else (int(token_id),)


def _plain(observation: str, _tokenizer: Any) -> str:
    return observation.strip() + PLAIN_CUE


def _qwen3_zs(observation: str, _tokenizer: Any) -> str:
    return QWEN3_ZS.format(observation=observation)


def _chat_end(tokenizer: Any) -> str | None:
    """The special token right after an assistant message in the tokenizer's chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    mark = "UB-END-OF-ANSWER"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": mark}],
        tokenize=False)
    after = text.partition(mark)[2]
    specials = sorted(getattr(tokenizer, "all_special_tokens", []), key=len, reverse=True)
    return next((t for t in specials if t and after.startswith(t)), None)


def _chat(observation: str, tokenizer: Any) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise UbError(
            "prompt template 'chat' needs a tokenizer with a chat template; "
            "this model has none: use template 'plain' or 'qwen3-zs'"
        )
    messages = [
        {"role": "system",
         "content": "You are playing a game. Answer with your action in [brackets]."},
        {"role": "user", "content": observation},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


TEMPLATES: dict[str, PromptTemplate] = {
    t.name: t
    for t in (
        PromptTemplate("plain", "bracket", False, _plain),
        PromptTemplate("qwen3-zs", "boxed", False, _qwen3_zs, lambda _tokenizer: "<|im_end|>",
                       chat=True, free_text=True, move_close="}"),
        PromptTemplate("chat", "bracket", True, _chat, _chat_end, chat=True, free_text=True),
    )
}


def get_template(name: str) -> PromptTemplate:
    """Return the template called ``name`` or raise a :class:`UbError` listing the valid ones."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise UbError(
            f"unknown prompt template {name!r}; choose one of: {', '.join(sorted(TEMPLATES))}"
        ) from None
