"""How often a model writes a legal move: greedy and sampled completions on fresh positions
(games no training stream plays), per game. A build records these rates in its manifest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ub.model.builder import EOS_TOKEN
from ub.model.transcripts import DEFAULT_ENV_IDS, iter_transcripts
from ub.seeding import derive_seed


def measure_legality(
    model: Any,
    tokenizer: Any,
    env_ids: Sequence[str] = DEFAULT_ENV_IDS,
    positions_per_env: int = 100,
    seed: int = 0,
    max_new_tokens: int = 12,
    batch_size: int = 64,
) -> dict[str, dict[str, dict[str, float]]]:
    """Legal-move rates of ``model`` on fresh positions (games no training stream plays).

    For each env, greedy and temperature-1 (no top-k/top-p) completions of the ``plain`` prompt:
    ``legal`` = the bracketed action the rollout would extract is a legal move; ``exact`` = the
    completion is exactly ``" [move]"`` then EOS, as in training; ``eos`` = it ended with EOS.
    Sampling is seeded and the caller's torch RNG is left untouched.
    """
    import torch

    from ub.games.actions import extract_bracket

    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    results: dict[str, dict[str, dict[str, float]]] = {}
    model.eval()
    for env_id in env_ids:
        # One position per game, at a random turn: many different games, early and late.
        steps = list(
            iter_transcripts([env_id], positions_per_env, seed, stream="eval", positions_per_game=1)
        )
        results[env_id] = {}
        for mode in ("greedy", "sampled"):
            counts = {"legal": 0, "exact": 0, "eos": 0}
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(derive_seed("eval", seed, env_id, mode))
                for start in range(0, len(steps), batch_size):
                    chunk = steps[start : start + batch_size]
                    outputs = _generate(
                        model, tokenizer, [s.prompt for s in chunk], mode, max_new_tokens, eos
                    )
                    for step, out in zip(chunk, outputs, strict=True):
                        ended = eos in out
                        text = tokenizer.decode(out[: out.index(eos)] if ended else out)
                        action, format_ok = extract_bracket(text)
                        counts["legal"] += format_ok and action in step.legal
                        counts["exact"] += ended and text.startswith(" ") and (
                            text[1:] in step.legal
                        )
                        counts["eos"] += ended
            results[env_id][mode] = {k: v / len(steps) for k, v in counts.items()}
    return results


def _generate(
    model: Any, tokenizer: Any, prompts: list[str], mode: str, max_new_tokens: int, eos: int
) -> list[list[int]]:
    """New token ids per prompt (transformers ``generate``, left-padded batch)."""
    import torch

    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(len(ids) for ids in encoded)
    ids = torch.full((len(encoded), width), eos, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, seq in enumerate(encoded):
        ids[row, width - len(seq) :] = torch.tensor(seq)
        mask[row, width - len(seq) :] = 1
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    output = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=eos,
        **(sampling if mode == "sampled" else {"do_sample": False}),
    )
    return [row[width:].tolist() for row in output]

