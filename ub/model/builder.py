"""The one way ub makes a model from nothing: a byte-level BPE tokenizer trained on given texts,
and a randomly initialised ``Qwen3ForCausalLM`` sized to it (so vLLM and PEFT treat it like any
Qwen3 checkpoint).

Two callers: the tiny CPU default (:mod:`ub.model.tiny`, which then pre-trains the model) and the
test models of :func:`ub.learner.testing.build_random_model` (random weights, saved as they are).
Everything here is deterministic for the same inputs: the BPE trainer breaks count ties by the
pair itself, and the weights come from the given torch seed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHAT_SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END)  # ids 0, 1, 2

# Qwen-style chat template (no tools, no default system prompt): what template "chat" renders.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Pre-tokenizer split: a bracketed move ("[4]", "[0 3]", "[check]") is one piece, so BPE makes
# each frequent move one token, and choosing a legal move is copying one token from the prompt's
# move list (or, in Nim, one class from the pile counts): greedy legality on fresh positions went
# from 95-97% to 98.7-100%. Other digits stay alone, and any other run of text up to a line end
# is one piece: BPE merges across spaces, so a recurring rule sentence or board row becomes one
# token and prompts are ~3x shorter than with word-level tokens. Any text still encodes
# (byte-level alphabet); a lone "[" is its own piece.
MOVE_SPLIT_PATTERN = r"\[[^\[\]\r\n]{1,16}\]|\p{N}|[^\p{N}\r\n\[]+[\r\n]*|[\r\n]+|\["

# Digits alone, any other run of text up to a line end: as above without the move pieces.
LINE_SPLIT_PATTERN = r"\p{N}|[^\p{N}\r\n]+[\r\n]*|[\r\n]+"


def train_tokenizer(
    texts: Iterator[str] | Sequence[str],
    vocab_size: int,
    *,
    split_pattern: str | None = MOVE_SPLIT_PATTERN,
    min_frequency: int = 2,
    chat: bool = True,
) -> Any:
    """Train a byte-level BPE on ``texts``; return it as a ``PreTrainedTokenizerFast``.

    ``<|endoftext|>`` is EOS and pad. Any text encodes (every byte is in the alphabet).

    :param split_pattern: pieces BPE never merges across (then bytes); ``None``: the byte-level
        pre-tokenizer's own word regex.
    :param min_frequency: the fewest occurrences a merge needs.
    :param chat: also ``<|im_start|>``/``<|im_end|>`` and a Qwen-style chat template (and a
        2048-token ``model_max_length``, no clean-up of decoded spaces); else EOS alone.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    if split_pattern is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(CHAT_SPECIAL_TOKENS if chat else (EOS_TOKEN,)),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: any text encodes
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    extra: dict[str, Any] = {}
    if chat:
        extra = {
            "additional_special_tokens": [IM_START, IM_END],
            "model_max_length": 2048,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
        }
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, **extra
    )


@dataclass(frozen=True)
class Qwen3Shape:
    """The size of a random Qwen3 (tied embeddings; ``hidden_size`` = heads x ``head_dim``)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int = 2048
    rope_theta: float = 10_000.0
    initializer_range: float = 0.02
    """Standard deviation of the initial weights."""
    vocab_multiple: int = 64
    """The embedding rows are the tokenizer's size rounded up to a multiple of this (Qwen uses
    64: friendlier matmul shapes; the extra ids are never produced once the model is trained)."""


def init_model(tokenizer: Any, shape: Qwen3Shape, torch_seed: int) -> Any:
    """A randomly initialised float32 ``Qwen3ForCausalLM`` of ``shape`` for ``tokenizer``; the
    weights come from ``torch_seed`` and the caller's torch RNG is left as it was."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    vocab = shape.vocab_multiple * math.ceil(len(tokenizer) / shape.vocab_multiple)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        initializer_range=shape.initializer_range,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed)
        model = Qwen3ForCausalLM(config)
    return model.to(torch.float32)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No transformers progress bars (e.g. "Writing model shards") in ub's concise logs."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def save_model(model: Any, tokenizer: Any, out: Path) -> None:
    """Write the weights, config and tokenizer to ``out``. With a chat tokenizer the generation
    config stops at either end: ``<|endoftext|>`` after a plain completion, ``<|im_end|>`` in
    chat."""
    from transformers import GenerationConfig

    with quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    if IM_END in tokenizer.all_special_tokens:
        eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
        im_end = tokenizer.convert_tokens_to_ids(IM_END)
        GenerationConfig(
            bos_token_id=eos, eos_token_id=[eos, im_end], pad_token_id=eos, max_new_tokens=64
        ).save_pretrained(out)
