"""Pre-training the tiny model on random-play transcripts.

The target of each completion token is the random player's whole next-token distribution (every
legal move, uniformly), not the one move it happened to play: the same expected gradient, far
less noise, so a CPU minute goes much further. Prompt tokens get a weighted plain LM loss.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ub.model.builder import EOS_TOKEN
from ub.model.tiny.config import TinyModelConfig
from ub.model.transcripts import TranscriptStep
from ub.seeding import derive_seed


def silent(_message: str) -> None:
    """A log function that drops its message."""


@dataclass(frozen=True)
class Example:
    """One tokenized decision with its soft targets.

    :param ids: prompt token ids followed by the played completion's ids and EOS.
    :param prompt_len: how many of ``ids`` are the prompt.
    :param targets: for each completion position ``j``, the random player's next-token
        distribution given the prompt and ``completion[:j]``: ``((token, prob), ...)``.
    """

    ids: tuple[int, ...]
    prompt_len: int
    targets: tuple[tuple[tuple[int, float], ...], ...]


def soft_targets(
    played: Sequence[int], legal: Sequence[Sequence[int]]
) -> tuple[tuple[tuple[int, float], ...], ...]:
    """Per position of ``played``: the distribution of the next token over the legal sequences
    that share ``played``'s prefix so far (every legal move equally likely, as the random player).
    """
    targets = []
    alive = [seq for seq in legal]
    for j in range(len(played)):
        counts: dict[int, int] = {}
        for seq in alive:
            if len(seq) > j:
                counts[seq[j]] = counts.get(seq[j], 0) + 1
        total = sum(counts.values())
        targets.append(tuple((tok, n / total) for tok, n in sorted(counts.items())))
        alive = [seq for seq in alive if len(seq) > j and seq[j] == played[j]]
    return tuple(targets)


def encode_examples(
    steps: Sequence[TranscriptStep], tokenizer: Any, max_len: int
) -> list[Example]:
    """Tokenize prompts and completions separately (as rollouts do) and attach soft targets."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    cache: dict[str, list[int]] = {}

    def completion_ids(text: str) -> list[int]:
        if text not in cache:
            cache[text] = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        return cache[text]

    examples = []
    for step in steps:
        prompt = tokenizer(step.prompt, add_special_tokens=False)["input_ids"]
        played = completion_ids(step.completion)
        if len(prompt) + len(played) > max_len:
            continue  # cannot happen with the default games (prompts ~50-150 tokens)
        legal = [completion_ids(" " + action) for action in step.legal]
        examples.append(
            Example(tuple(prompt + played), len(prompt), soft_targets(played, legal))
        )
    return examples


def _batches(
    examples: Sequence[Example], batch_tokens: int, generator: Any, window: int = 1024
) -> list[list[int]]:
    """One epoch of batches: shuffled, then bucketed by length within windows to cut padding."""
    import torch

    order = torch.randperm(len(examples), generator=generator).tolist()
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: len(examples[i].ids))
        batch: list[int] = []
        for index in chunk:
            longest = len(examples[index].ids)  # sorted: the newest is the longest
            if batch and longest * (len(batch) + 1) > batch_tokens:
                batches.append(batch)
                batch = []
            batch.append(index)
        if batch:
            batches.append(batch)
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffled]


def _batch_loss(model: Any, examples: Sequence[Example], prompt_weight: float) -> Any:
    """Soft cross-entropy on the completion tokens (+ weighted LM loss on the prompt tokens)."""
    import torch

    eos = model.config.pad_token_id
    width = max(len(ex.ids) for ex in examples)
    # Right padding needs no attention mask: causal attention never looks at later (pad) tokens.
    ids = torch.full((len(examples), width), eos, dtype=torch.long)
    for row, ex in enumerate(examples):
        ids[row, : len(ex.ids)] = torch.tensor(ex.ids)
    hidden = model.model(input_ids=ids).last_hidden_state

    rows: list[int] = []
    cols: list[int] = []
    tok_index: list[tuple[int, int]] = []
    tok_prob: list[float] = []
    for row, ex in enumerate(examples):
        for j, dist in enumerate(ex.targets):
            position = len(rows)
            rows.append(row)
            cols.append(ex.prompt_len - 1 + j)  # the hidden state that predicts completion[j]
            for tok, prob in dist:
                tok_index.append((position, tok))
                tok_prob.append(prob)
    # Only positions with a loss go through the LM head: it is a third of the model's compute.
    logp = torch.log_softmax(model.lm_head(hidden[rows, cols]).float(), dim=-1)
    target = torch.zeros_like(logp)
    index = torch.tensor(tok_index)
    target[index[:, 0], index[:, 1]] = torch.tensor(tok_prob)
    loss = -(target * logp).sum(-1).mean()

    if prompt_weight > 0:
        p_rows, p_cols, p_next = [], [], []
        for row, ex in enumerate(examples):
            for t in range(ex.prompt_len - 1):
                p_rows.append(row)
                p_cols.append(t)
                p_next.append(ex.ids[t + 1])
        logits = model.lm_head(hidden[p_rows, p_cols]).float()
        loss = loss + prompt_weight * torch.nn.functional.cross_entropy(
            logits, torch.tensor(p_next)
        )
    return loss


def learning_rate_at(step: int, config: TinyModelConfig) -> float:
    """Linear warm-up to ``config.learning_rate``, then cosine decay to ``min_lr_ratio`` of it."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.train_steps - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.learning_rate * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def _optimizer(model: Any, config: TinyModelConfig) -> Any:
    """AdamW with weight decay on the matrices only (not norms)."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.learning_rate,
        betas=(0.9, 0.95),
        foreach=False,  # the plain loop: same bytes whatever torch picks as fastest
    )


def pretrain(
    model: Any,
    examples: Sequence[Example],
    config: TinyModelConfig,
    seed: int,
    log: Callable[[str], None] = silent,
    progress: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Train the whole model on ``examples`` for ``config.train_steps`` steps; return the losses.
    ``progress`` is called with (steps done, steps) after each step."""
    import torch

    generator = torch.Generator().manual_seed(derive_seed("batches", seed))
    optimizer = _optimizer(model, config)
    # float32 on every CPU: bf16 autocast was no faster on AVX-512/AMX here and falls back to a
    # ~10x slower reference kernel on AVX2-only CPUs; one recipe gives one model everywhere.
    log("pre-training in float32")
    model.train()
    losses: list[float] = []
    pending: list[list[int]] = []
    start = time.perf_counter()
    for step in range(config.train_steps):
        if not pending:
            pending = _batches(examples, config.batch_tokens, generator)
        batch = [examples[i] for i in pending.pop()]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, config)
        loss = _batch_loss(model, batch, config.prompt_loss_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
        if progress is not None:
            progress(step + 1, config.train_steps)
        if (step + 1) % 50 == 0 or step + 1 == config.train_steps:
            recent = losses[-50:]
            log(
                f"step {step + 1}/{config.train_steps} loss {sum(recent) / len(recent):.3f} "
                f"({time.perf_counter() - start:.0f} s)"
            )
    model.eval()
    return losses
