"""Small models and batches for the learner's tests and benchmark (no model hub, seconds to build).

:func:`build_random_model` writes a random-init Qwen3 model with a locally trained byte-level BPE
tokenizer: vLLM, transformers and PEFT load it like any hub checkpoint. :func:`synthetic_batch`
makes a :class:`~ub.batch.Batch` of random token ids with variable prompt and
completion lengths, for tests that need a real forward pass but no real games.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from ub.batch import Batch


def build_random_model(path: str | Path, hidden_size: int = 128, num_layers: int = 2,
                       vocab_size: int = 1000, seed: int = 0,
                       corpus: list[str] | None = None) -> Path:
    """Write a tiny random Qwen3 model and its tokenizer to ``path``; return ``path``.

    The same builder as the tiny CPU default (:mod:`ub.model.builder`), without its
    pre-training, chat tokens or rounded-up vocabulary.

    :param hidden_size: residual width (4 heads of ``hidden_size // 4``, 2 KV heads).
    :param num_layers: transformer blocks.
    :param vocab_size: BPE vocabulary upper bound (``<|endoftext|>`` is eos and pad).
    :param seed: tokenizer corpus and weight seed. A large init scale keeps the logits peaked,
        so greedy decoding has no near-ties that a different summation order could flip.
    :param corpus: texts to train the tokenizer on (e.g. game observations, which then
        tokenize into few tokens: BPE may merge across spaces within a line); ``None``: random
        words.
    """
    from ub.model.builder import (
        LINE_SPLIT_PATTERN,
        Qwen3Shape,
        init_model,
        save_model,
        train_tokenizer,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if corpus is None:
        rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))
                 for _ in range(3000)]
        words += ["[0]", "[1]", "[4]", "[8]", "X", "O", "move", "board", "player", "pass"]
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 16)))
                 for _ in range(4000)]
        split_pattern = None  # the byte-level pre-tokenizer's word regex
    else:
        # Digits alone, any other run of text up to a line end: recurring sentences of a game's
        # text become single tokens, as in ub's tiny model.
        lines, split_pattern = list(corpus), LINE_SPLIT_PATTERN
    tokenizer = train_tokenizer(lines, vocab_size, split_pattern=split_pattern, min_frequency=0,
                                chat=False)
    shape = Qwen3Shape(hidden_size=hidden_size, num_layers=num_layers, num_heads=4,
                       num_kv_heads=2, head_dim=hidden_size // 4,
                       intermediate_size=2 * hidden_size, initializer_range=0.2,
                       vocab_multiple=1)
    save_model(init_model(tokenizer, shape, seed), tokenizer, path)
    return path


QWEN3_VOCAB = 151_936
QWEN3_SHAPES: dict[str, dict[str, int]] = {
    # The published Qwen3 base models' shapes (config.json): tied embeddings, head_dim 128.
    "0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8},
    "1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8},
    "4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
           "num_attention_heads": 32, "num_key_value_heads": 8},
}


def build_qwen3(path: str | Path, *, vocab_size: int = QWEN3_VOCAB, hidden_size: int = 64,
                intermediate_size: int = 128, num_hidden_layers: int = 1,
                num_attention_heads: int = 4, num_key_value_heads: int = 2,
                head_dim: int | None = None, dtype: str = "float32", device: str = "cpu",
                seed: int = 0) -> Path:
    """Write a random-init ``Qwen3ForCausalLM`` of any shape (e.g. ``**QWEN3_SHAPES["1.7b"]``,
    head_dim 128 then) to ``path``, weights only: no tokenizer, which the learner never needs.
    The real vocabulary size by default, for what depends on it (the output layer's memory).
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if head_dim is None:
        head_dim = 128 if hidden_size >= 1024 else hidden_size // num_attention_heads
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, head_dim=head_dim,
        max_position_embeddings=32_768, tie_word_embeddings=True, eos_token_id=0,
        pad_token_id=0, bos_token_id=0)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    path = Path(path)
    model.save_pretrained(path)
    return path


def synthetic_batch(num_rows: int, vocab_size: int, *, seed: int = 0,
                    prompt_lengths: tuple[int, int] = (4, 40),
                    completion_lengths: tuple[int, int] = (1, 12),
                    pad_token_id: int = 0) -> Batch:
    """Random right-padded sequences: a prompt, then a completion with made-up sampling logprobs.

    :param num_rows: sequences in the batch.
    :param vocab_size: token ids are drawn from ``[1, vocab_size)``.
    :param seed: makes the batch reproducible.
    :param prompt_lengths: inclusive range of prompt lengths.
    :param completion_lengths: inclusive range of completion lengths.
    :param pad_token_id: the id that fills the padding.
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(num_rows):
        prompt = [rng.randrange(1, vocab_size) for _ in range(rng.randint(*prompt_lengths))]
        completion = [rng.randrange(1, vocab_size)
                      for _ in range(rng.randint(*completion_lengths))]
        rows.append((prompt, completion))
    width = max(len(p) + len(c) for p, c in rows)
    input_ids = torch.full((num_rows, width), pad_token_id, dtype=torch.int64)
    completion_mask = torch.zeros(num_rows, width)
    behaviour = torch.zeros(num_rows, width)
    for b, (prompt, completion) in enumerate(rows):
        n = len(prompt) + len(completion)
        input_ids[b, :n] = torch.tensor(prompt + completion)
        completion_mask[b, len(prompt):n] = 1.0
        behaviour[b, len(prompt):n] = torch.tensor(
            [-rng.uniform(0.05, 6.0) for _ in completion])
    advantages = torch.tensor([rng.gauss(0.0, 1.0) for _ in rows])
    lengths = torch.tensor([len(p) + len(c) for p, c in rows], dtype=torch.int64)
    # (No sampling stage: the returns are the advantages.)
    return Batch(input_ids=input_ids, completion_mask=completion_mask,
                 behaviour_logprobs=behaviour, advantages=advantages, lengths=lengths,
                 returns=advantages.clone())


def data_parallel_updates(rank: int, world: int, address: str, model_dir: str | Path,
                          out: str | Path, micro_batch_tokens: int = 256, updates: int = 2,
                          rows: int = 12, threads: int = 1, algorithm: str = "reinforce") -> None:
    """``updates`` learner updates of ``algorithm`` on synthetic batches of ``rows`` rows as
    rank ``rank`` of ``world`` (``world`` 1: one process) with ``threads`` torch threads;
    checkpoints
    ``out/ckpt-N`` and every update's metrics in ``out/metrics-RANK.json``. What the
    data-parallel test compares between one process and two, and what the benchmark times."""
    import json

    from ub.distributed import join, leave
    from ub.learner import LearnerConfig, learn_on_batch
    from ub.learner.entry import KeptLearner
    from ub.model.lora import LoraSettings

    out = Path(out)
    if world > 1:
        join(rank, world, address)
    config = LearnerConfig(base_model=str(model_dir),
                           lora=LoraSettings(rank=8, alpha=16, dropout=0.0),
                           learning_rate=5e-3, length_normalizer=16,
                           micro_batch_tokens=micro_batch_tokens, seed=3, num_threads=threads,
                           algorithm=algorithm)
    previous, metrics = None, []
    worker = KeptLearner()  # one learner for all the updates, as a round's learner process keeps
    for update in range(1, updates + 1):
        checkpoint = out / f"ckpt-{update}"
        batch = synthetic_batch(rows, 500, seed=10 + update)
        metrics.append(learn_on_batch(batch, config, previous, checkpoint, worker=worker))
        previous = checkpoint
    (out / f"metrics-{rank}.json").write_text(json.dumps(metrics, default=str))
    worker.close()
    leave()
