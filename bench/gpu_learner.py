"""The learner on a GPU at Qwen3 shapes: throughput, memory, and the correctness checks.

Not a test. On a GPU machine (random-init models, no hub, under 5 minutes on an H100/H200):

    .venv/bin/python bench/gpu_learner.py [--shapes 0.6b,1.7b,4b] [--rows 192] [--out FILE]

On the CPU, ``--quick`` runs the same code on tiny shapes in a minute (``make test`` runs it,
tests/test_gpu_learner_bench.py, so it cannot rot).

For each shape (ub.learner.testing.QWEN3_SHAPES, vocabulary 151,936):

1. A random-init Qwen3 in bfloat16 (float32 on the CPU), saved without a tokenizer.
2. ``--rows`` synthetic rows like SimpleTak's (prompts 300-900 tokens, completions 50-1500),
   seeded: the same rows for every shape and setting.
3. **learner**: the ``qwen3-1.7b-simpletak`` preset's learner settings (LoRA r=32 on every
   projection, reinforce, ``micro_batch_tokens: auto`` with vLLM keeping 0.6 of the GPU,
   ``kernels: auto``); a warm-up update on a quarter of the rows, then ``--repeats`` timed
   ones on all of them (the best counts). tokens/s counts real
   (unpadded) tokens; peak GiB is ``torch.cuda.max_memory_allocated`` over an update, the
   weights included.
4. **plain**: the same PEFT model, the same micro-batches, transformers' own forward with
   ``labels`` (full logits, its cross-entropy) and ``backward``, once: what a user's loop
   would cost. ``ratio`` = learner / plain tokens/s.
5. **MFU**: ``4 x frozen parameters x tokens/s`` (forward and the input-gradient backward; the
   frozen weights get no gradient) over the GPU's dense bf16 peak (``--peak-tflops``; 989 for
   an H100/H200).

Checks, once, on the first shape (with a few rows): three updates straight equal two, a resume
from the checkpoint in a fresh learner, and a third, bit for bit (adapter, optimizer and RNG
files); PEFT's ``PeftModel.from_pretrained`` loads the checkpoint and gives the learner's
logits; a one-rank process group (NCCL on a GPU, gloo on the CPU) joins, all-reduces and trains.

Prints one JSON object (``--out`` also writes it).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ub.batch import Batch
from ub.learner import Learner, LearnerConfig, plan_micro_batches
from ub.learner.checkpoint import ADAPTER_WEIGHTS, OPTIMIZER_STATE, RNG_STATE
from ub.learner.testing import QWEN3_SHAPES, build_qwen3, synthetic_batch
from ub.model.lora import ALL_PROJECTIONS, LoraSettings

QUICK_SHAPES = {  # tiny shapes for the CPU: the same code paths, seconds
    "tiny-a": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2},
    "tiny-b": {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 3,
               "num_attention_heads": 4, "num_key_value_heads": 2},
}
ENGINE_SHARE = 0.6  # the preset's engine.gpu_memory_utilization


def learner_config(model: Path, **overrides: Any) -> LearnerConfig:
    """The qwen3-1.7b-simpletak preset's learner (ub/presets), on ``model``."""
    settings: dict[str, Any] = dict(
        base_model=str(model), algorithm="reinforce", learning_rate=1e-5, max_grad_norm=0.2,
        lora=LoraSettings(rank=32, alpha=32, dropout=0.0, target_modules=list(ALL_PROJECTIONS)),
        micro_batch_tokens="auto", kernels="auto", length_normalizer=4096, temperature=1.0,
        device_share=1 - ENGINE_SHARE, seed=0)
    return LearnerConfig(**{**settings, **overrides})


def rows(count: int, quick: bool, seed: int = 0) -> Batch:
    if quick:
        return synthetic_batch(count, 151_936, seed=seed, prompt_lengths=(10, 40),
                               completion_lengths=(5, 30))
    return synthetic_batch(count, 151_936, seed=seed, prompt_lengths=(300, 900),
                           completion_lengths=(50, 1500))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_learner(learner: Learner, batch: Batch, repeats: int) -> dict[str, Any]:
    """The best of ``repeats`` updates on ``batch``, each from the cold start, after a warm-up
    update on a quarter of it (kernels, the allocator, auto's probe)."""
    learner.start(None)
    learner.update(batch.select(list(range(max(1, len(batch) // 4)))))
    best: dict[str, Any] = {}
    for _ in range(repeats):
        learner.start(None)
        sync(learner.policy.device)
        metrics = learner.update(batch)
        sync(learner.policy.device)
        if not best or metrics["tokens_per_second"] > best["tokens_per_second"]:
            best = metrics
    return best


def time_plain(learner: Learner, batch: Batch, budget: int | None) -> float:
    """Plain transformers forward (its own loss, full logits) + backward on the learner's
    micro-batches, once (the learner warmed the kernels up); tokens/s of real tokens."""
    model, device = learner.policy.model, learner.policy.device
    groups = plan_micro_batches(batch.lengths.tolist(), budget, None)
    sync(device)
    started = time.perf_counter()
    for group in groups:
        mb = batch.select(group)
        ids = mb.input_ids.to(device)
        labels = torch.where(mb.completion_mask.to(device) > 0, ids, -100)
        model(input_ids=ids, labels=labels).loss.backward()
    sync(device)
    seconds = time.perf_counter() - started
    for p in learner.policy.params.values():
        p.grad = None
    return int(batch.lengths.sum()) / seconds


def frozen_parameters(learner: Learner) -> int:
    return sum(p.numel() for p in learner.policy.model.parameters() if not p.requires_grad)


def measure_shape(name: str, shape: dict[str, int], folder: Path, args: argparse.Namespace,
                  device: torch.device) -> dict[str, Any]:
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    started = time.perf_counter()
    model = build_qwen3(folder / name, dtype=dtype, device=device.type, **shape)
    build_seconds = time.perf_counter() - started
    learner = Learner(learner_config(model))
    batch = rows(args.rows, args.quick)
    metrics = time_learner(learner, batch, args.repeats)
    plain = time_plain(learner, batch, learner.micro_batch_tokens())
    frozen = frozen_parameters(learner)
    result = {
        "shape": name, "frozen_parameters": frozen, "rows": len(batch),
        "tokens": metrics["tokens"], "completion_tokens": metrics["completion_tokens"],
        "kernels": metrics["kernels"], "micro_batch_tokens": metrics["micro_batch_tokens"],
        "micro_batches": metrics["micro_batches"],
        "learner_tokens_per_second": round(metrics["tokens_per_second"], 1),
        "plain_tokens_per_second": round(plain, 1),
        "ratio": round(metrics["tokens_per_second"] / plain, 3),
        "update_seconds": round(metrics["seconds"], 2), "build_seconds": round(build_seconds, 1),
    }
    if device.type == "cuda":
        result["peak_gib"] = round(metrics["peak_gpu_gib"], 2)
        result["mfu"] = round(4 * frozen * metrics["tokens_per_second"]
                              / (args.peak_tflops * 1e12), 4)
    else:
        result["peak_rss_mb"] = round(metrics["peak_rss_mb"])
    del learner
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


# -- correctness ----------------------------------------------------------------------------


def files_equal(a: Path, b: Path) -> bool:
    names = (ADAPTER_WEIGHTS, OPTIMIZER_STATE, RNG_STATE)
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def check_resume(model: Path, folder: Path) -> bool:
    """Three updates straight == two, a resume in a fresh learner, one more (bit for bit)."""
    config = learner_config(model, micro_batch_tokens=2048, learning_rate=1e-3)
    batches = [rows(6, True, seed=s) for s in (1, 2, 3)]
    straight = Learner(config)
    for k, b in enumerate(batches, 1):
        straight.update(b)
        straight.save(folder / f"straight-{k}")
    del straight
    fresh = Learner(config)
    fresh.start(folder / "straight-2")
    fresh.update(batches[2])
    fresh.save(folder / "resumed-3")
    return files_equal(folder / "straight-3", folder / "resumed-3")


def check_peft_load(model: Path, checkpoint: Path, device: torch.device) -> bool:
    """Plain PEFT loads the checkpoint and computes the learner's logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    learner = Learner(learner_config(model))
    learner.start(checkpoint)
    ids = rows(2, True, seed=9).input_ids[:, :16].to(device)
    with torch.no_grad():
        ours = learner.policy.model(input_ids=ids).logits.float()
    dtype = learner.policy.dtype
    del learner
    base = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)
    peft = PeftModel.from_pretrained(base, str(checkpoint))
    with torch.no_grad():
        theirs = peft(input_ids=ids).logits.float()
    return bool(torch.allclose(ours, theirs, rtol=1e-2, atol=1e-2))


def check_one_rank_group(model: Path, folder: Path) -> bool:
    """A one-rank process group (NCCL on a GPU, gloo on the CPU) joins, all-reduces, trains."""
    import torch.distributed as dist

    from ub.distributed import join, leave

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    join(0, 1, f"127.0.0.1:{port}")
    try:
        learner = Learner(learner_config(model, micro_batch_tokens=2048))
        flat = torch.ones(4, device=learner.policy.device)
        dist.all_reduce(flat)
        metrics = learner.update(rows(6, True, seed=4))
        learner.save(folder / "one-rank")
        return bool(flat.sum().item() == 4) and metrics["rows_trained"] > 0
    finally:
        leave()


def checks(model: Path, folder: Path, device: torch.device) -> dict[str, bool]:
    resume = check_resume(model, folder)
    return {"bitwise_resume": resume,
            "peft_load": check_peft_load(model, folder / "straight-3", device),
            "one_rank_group": check_one_rank_group(model, folder)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes on the CPU (what make test runs)")
    parser.add_argument("--shapes", default=None,
                        help="comma-separated, of " + ", ".join(QWEN3_SHAPES))
    parser.add_argument("--rows", type=int, default=None, help="rows per update (192; quick 24)")
    parser.add_argument("--repeats", type=int, default=1, help="timed updates after a warm-up")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="the GPU's dense bf16 peak, for MFU (H100/H200 SXM: 989)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    shapes = QUICK_SHAPES if args.quick else QWEN3_SHAPES
    chosen = args.shapes.split(",") if args.shapes else list(shapes)
    unknown = [s for s in chosen if s not in shapes]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(shapes)}")
    args.rows = args.rows or (24 if args.quick else 192)
    device = torch.device("cpu" if args.quick or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.quick:
        parser.error("no GPU here: run with --quick (tiny shapes on the CPU)")

    started = time.perf_counter()
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "quick": args.quick, "shapes": []}
    with tempfile.TemporaryDirectory(prefix="ub-gpu-learner-") as tmp:
        folder = Path(tmp)
        for name in chosen:
            report["shapes"].append(measure_shape(name, shapes[name], folder, args, device))
            print(json.dumps(report["shapes"][-1]), file=sys.stderr, flush=True)
        report["checks"] = checks(folder / chosen[0], folder, device)
    report["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
