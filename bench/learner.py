"""Learner throughput vs raw forward+backward of the same model on the same tokens.

Not a test. ``.venv/bin/python bench/learner.py [--batch-size 384] [--repeats 3]``

1. **Decisions** (cached in ``--data``): a child process (so that vLLM's memory and thread
   pinning stay out of this one) plays TicTacToe, Nim and KuhnPoker games with the model and a
   LoRA adapter at temperature 1 through vLLM, and writes them as a shard: real decisions with
   real, variable prompt and completion lengths.
2. **Batch**: :func:`ub.batch.assemble_batch` samples ``--batch-size`` of them.
3. **Learner**: :meth:`Learner.update` (micro-batching by length, trimming, float32 token
   logprobs at completion positions, REINFORCE loss, clipping, AdamW step), timed from the
   same checkpoint ``--repeats`` times after a warm-up. tokens/s = real tokens / seconds.
4. **Raw**: the same PEFT model in train mode does forward + backward on the same tokens
   concatenated without padding into rows of ``--raw-row-len`` (default: the batch's longest
   sequence, so attention spans are comparable), micro-batched to the same token budget, with
   the plain causal-LM loss on every position (full logits): what a packed trainer with no
   padding would cost. No optimizer step. (The learner runs the output layer on completion
   positions only, which is why it can beat this baseline.) Also reported: the same packed
   tokens through the transformer body alone (no output layer at all), a lower bound.

Prints one JSON object: both tokens/s figures (best of ``--repeats``, the measurements
interleaved), their ratio (target >= 0.8), padding, peak RSS of this (learner) process, and the
machine's load average (the machine is shared: figures vary).

The model: ``--model``, else the tiny CPU default if it is already built (``ub model tiny``),
else a random model of the tiny model's shape (same compute per token).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ENVS = ("TicTacToe-v0-train", "Nim-v0-train", "KuhnPoker-v0-train")


def pick_model(args: argparse.Namespace) -> tuple[Path, str]:
    if args.model:
        return Path(args.model), "given"
    from ub.model.tiny import read_manifest, tiny_model_path

    tiny = tiny_model_path()
    if read_manifest(tiny) is not None:
        return tiny, "tiny"
    stand_in = Path(args.data) / "random-tiny-shape"
    if not (stand_in / "config.json").exists():
        from ub.actors.spec import parse_actor
        from ub.games.specs import GameSpec
        from ub.learner.testing import build_random_model
        from ub.rollout import assign_games, play_games

        corpus = []
        for env in ENVS:
            played = play_games(assign_games(GameSpec(env), [parse_actor("random")] * 2, 60,
                                             base_seed=0))
            corpus += [o + "\n\nYour action:" for o in played.steps["observation"].to_pylist()]
        # The tiny model's shape: hidden 256, 4 layers, 4 heads (KV 2) of 64.
        build_random_model(stand_in, hidden_size=256, num_layers=4, vocab_size=2048,
                           corpus=corpus)
    return stand_in, "random model of the tiny shape (tiny model not built yet)"


def make_data(model: Path, data: Path, games: int, max_tokens: int) -> None:
    """(child process) Play games through vLLM and commit them as shard (0, 0) under data."""
    from ub.inference.types import EngineConfig, SamplingConfig
    from ub.run.processes.worker import Worker
    from ub.vllm_environment import configure_vllm_environment

    configure_vllm_environment()
    import pyarrow as pa

    from ub.actors.spec import parse_actor
    from ub.data.shards import ShardId, write_shard
    from ub.games.specs import GameSpec
    from ub.model.lora import LoraSettings, new_adapter
    from ub.rollout import assign_games, play_games

    adapter = new_adapter(model, data / "adapter", LoraSettings(rank=16), seed=1, init_std=0.02)
    engine = Worker().engine(EngineConfig(model=str(model), max_num_seqs=64, max_lora_rank=16),
                             SamplingConfig(temperature=1.0, max_tokens=max_tokens))
    actor = parse_actor(f"model:{adapter}")
    steps, game_rows = [], []
    for i, env in enumerate(ENVS):
        assignments = assign_games(GameSpec(env), [actor, actor], games, base_seed=0,
                                   first_index=i * games)
        rollout = play_games(assignments, engine=engine, run="bench", base_seed=0)
        steps.append(rollout.steps)
        game_rows.append(rollout.games)
    write_shard(data / "run", ShardId(0, 0), "bench", pa.concat_tables(steps),
                pa.concat_tables(game_rows))


def raw_forward_backward(learner, batch, row_len: int, token_budget: int,
                         decoder_only: bool = False) -> tuple[float, int]:
    """Seconds for forward + backward over the batch's real tokens, packed with no padding.

    ``decoder_only``: the transformer body alone (no output layer, a trivial loss on the hidden
    states): a lower bound on any trainer's cost per token.
    """
    import torch

    ids = torch.cat([batch.input_ids[b, :n] for b, n in enumerate(batch.lengths.tolist())])
    usable = len(ids) // row_len * row_len
    rows = ids[:usable].view(-1, row_len)
    per_step = max(1, token_budget // row_len)
    model = learner.policy.model
    model.train()
    started = time.perf_counter()
    for start in range(0, len(rows), per_step):
        chunk = rows[start:start + per_step].to(learner.policy.device)
        if decoder_only:
            body = learner.policy.causal_lm.model
            hidden = body(input_ids=chunk, use_cache=False).last_hidden_state
            loss = hidden.float().square().mean()
        else:
            logits = model(input_ids=chunk, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), chunk[:, 1:].flatten())
        loss.backward()
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    return seconds, usable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="base model directory (default: see module docstring)")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "ub-bench-learner"),
                        help="cache folder for the decisions")
    parser.add_argument("--games", type=int, default=64, help="games per env for the data")
    parser.add_argument("--max-tokens", type=int, default=32, help="generation budget per move")
    parser.add_argument("--batch-size", type=int, default=384)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--raw-row-len", type=int, default=None,
                        help="row length of the packed baseline (default: longest sequence)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--make-data", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    model, model_kind = pick_model(args)
    if args.make_data:
        make_data(model, data, args.games, args.max_tokens)
        return
    marker = data / "run" / "games"
    if not marker.exists():
        started = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--make-data", "--model", str(model),
                        "--data", str(data), "--games", str(args.games),
                        "--max-tokens", str(args.max_tokens)], check=True)
        print(f"decisions made in {time.perf_counter() - started:.0f} s", file=sys.stderr)

    import torch

    from ub.batch import BatchConfig, assemble_batch
    from ub.learner import Learner, LearnerConfig
    from ub.model.lora import LoraSettings

    batch = assemble_batch(data / "run", BatchConfig(batch_size=args.batch_size))
    config = LearnerConfig(base_model=str(model), lora=LoraSettings(rank=16, alpha=32),
                           length_normalizer=args.max_tokens, learning_rate=1e-5,
                           micro_batch_tokens=args.micro_batch_tokens,
                           gradient_checkpointing=args.gradient_checkpointing)
    learner = Learner(config)
    start = learner.save(Path(tempfile.mkdtemp()) / "start")

    row_len = args.raw_row_len or int(batch.lengths.max())
    learner.update(batch)  # warm-ups: kernels, allocator
    # Peak RSS of the learner alone (the baselines below run in this process too).
    learner_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    raw_forward_backward(learner, batch, row_len, args.micro_batch_tokens)
    # Interleaved, so that the three measurements see the same machine load (it is shared).
    runs, raw, decoder = [], [], []
    for _ in range(args.repeats):
        learner.start(start)
        runs.append(learner.update(batch))
        seconds, tokens = raw_forward_backward(learner, batch, row_len, args.micro_batch_tokens)
        raw.append(tokens / seconds)
        seconds, tokens = raw_forward_backward(learner, batch, row_len, args.micro_batch_tokens,
                                               decoder_only=True)
        decoder.append(tokens / seconds)
    best = max(runs, key=lambda m: m["tokens_per_second"])

    learner_tps = best["tokens_per_second"]
    raw_tps = max(raw)
    print(json.dumps({
        "model": str(model),
        "model_kind": model_kind,
        "threads": torch.get_num_threads(),
        "decisions": len(batch),
        "tokens": best["tokens"],
        "completion_tokens": best["completion_tokens"],
        "prompt_len_mean": round((batch.lengths.sum().item() - batch.stats.completion_tokens)
                                 / len(batch), 1),
        "seq_len_min_max": [int(batch.lengths.min()), int(batch.lengths.max())],
        "micro_batch_tokens": args.micro_batch_tokens,
        "micro_batches": best["micro_batches"],
        "padding_fraction": round(best["padding_fraction"], 4),
        "learner_seconds": [round(m["seconds"], 3) for m in runs],
        "learner_tokens_per_s": round(learner_tps, 1),
        "learner_tokens_per_s_median": round(statistics.median(
            m["tokens_per_second"] for m in runs), 1),
        "raw_row_len": row_len,
        "raw_tokens_per_s": round(raw_tps, 1),
        "raw_tokens_per_s_all": [round(r, 1) for r in raw],
        "ratio": round(learner_tps / raw_tps, 3),
        "ratio_median_of_pairs": round(statistics.median(
            m["tokens_per_second"] / r for m, r in zip(runs, raw, strict=True)), 3),
        "raw_decoder_only_tokens_per_s": round(max(decoder), 1),
        "ratio_vs_decoder_only": round(learner_tps / max(decoder), 3),
        "peak_rss_mb_learner": round(learner_rss_mb, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "target": {"ratio": ">= 0.8"},
    }, indent=2))


if __name__ == "__main__":
    main()
