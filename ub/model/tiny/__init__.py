"""`ub model tiny`: build the CPU default model locally, with no model hub.

The recipe, in order:

1. **Transcripts** (:mod:`ub.model.transcripts`): seeded random-vs-random games of the supported
   games; every decision is a ``plain``-template prompt, the move played, and all legal moves.
2. **Tokenizer** (:mod:`ub.model.builder`): a byte-level BPE trained on the transcript text,
   saved as a ``PreTrainedTokenizerFast`` with a Qwen-style chat template and ``<|endoftext|>``
   as EOS and pad.
3. **Model** (:mod:`ub.model.builder`): a few-million-parameter ``Qwen3ForCausalLM`` (so vLLM and
   PEFT treat it like any Qwen3 checkpoint), randomly initialised from the seed.
4. **Pre-training** (:mod:`.pretrain`): a short AdamW run on the transcripts so the model writes
   a legal move in the ``[...]`` format followed by EOS. The target of each completion token is
   the random player's whole next-token distribution (every legal move, uniformly), not the one
   move it happened to play: the same expected gradient, far less noise, so a CPU minute goes
   much further.
5. **Legality check** (:mod:`.legality`): greedy and temperature-1 completions on fresh
   positions; the rates per game go into the manifest.

The output directory is a function of (config, seed, :data:`RECIPE_VERSION`, textarena version),
byte-identical for the same inputs (apart from the timing in ``ub_model.json``), built in a hidden
sibling directory and renamed into place, so a killed build never leaves anything that looks
finished. ``ub_model.json`` is written last and is what marks a directory as complete.

The package, by seam: :mod:`.config` (what decides a build), :mod:`.cache` (key, manifest, lock,
atomic publish), :mod:`.pretrain`, :mod:`.legality`, and :mod:`.build` (the recipe in order and
:func:`build_tiny_model`). The command, ``ub model tiny``, is :mod:`ub.cli.model`.
"""

from __future__ import annotations

from ub.model.tiny.build import build_tiny_model
from ub.model.tiny.cache import (
    MANIFEST,
    cache_dir,
    cache_key,
    is_complete,
    read_manifest,
    textarena_version,
    tiny_model_path,
)
from ub.model.tiny.config import RECIPE_VERSION, TinyModelConfig
from ub.model.tiny.legality import measure_legality
from ub.model.tiny.pretrain import Example, encode_examples, pretrain

__all__ = [
    "MANIFEST",
    "RECIPE_VERSION",
    "Example",
    "TinyModelConfig",
    "build_tiny_model",
    "cache_dir",
    "cache_key",
    "encode_examples",
    "is_complete",
    "measure_legality",
    "pretrain",
    "read_manifest",
    "textarena_version",
    "tiny_model_path",
]
