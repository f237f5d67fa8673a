"""The learner on a GPU at Qwen3 shapes: throughput on the batches training sees, memory, and
the correctness checks.

Not a test. On a GPU machine (random-init models, no hub):

    .venv/bin/python bench/gpu_learner.py [--shapes 0.6b,1.7b,4b] [--rows 192] [--out FILE]
        [--learner-gib 32] [--variant before:adapter_compute=float32,attention_kernel=torch]

On the CPU, ``--quick`` runs the same code on tiny shapes in a minute (``make test`` runs it,
tests/test_gpu_learner_bench.py, so it cannot rot).

For each shape (ub.learner.testing.QWEN3_SHAPES, vocabulary 151,936) a random-init Qwen3 in
bfloat16 (float32 on the CPU) is saved once; then, for each ``--variant`` (learner settings
over the preset's; default: the preset's as they are), a **fresh process** (so that its first
update is a process's first) measures:

1. **learner**: the ``qwen3-1.7b-simpletak`` preset's learner settings (LoRA r=32 on every
   projection, reinforce, ``micro_batch_tokens: auto``, ``kernels: auto``, the learner's memory
   ``--learner-gib``, or 1 - 0.6 of the GPU beside vLLM as in the preset). Every batch has
   ``--rows`` synthetic rows like SimpleTak's (prompts 300-900 tokens, completions 50-1500) of
   lengths no earlier batch had: ``first_update_tokens_per_second`` is the process's first
   update (the auto probe, kernel loading and every plan included), then one warm-up batch,
   then ``steady_tokens_per_second``: the median over ``--steady-batches`` (>= 3) batches.
   Each update starts cold (a fresh adapter and optimizer). tokens/s counts real tokens; peak
   GiB is ``torch.cuda.max_memory_allocated`` over the updates, the weights included, against
   the learner's share (``share_gib``); ``padding`` the fraction of the positions the model
   computed that were padding (rows of a micro-batch padded to its longest, and to
   ``pad_to_multiple``).
2. **plain**: the same PEFT model, the same micro-batches of the first steady batch,
   transformers' own forward with ``labels`` (full logits, its cross-entropy) and ``backward``:
   what a user's loop would cost. PEFT's own LoRA forward, under bf16 autocast where the
   learner computes the adapter in bf16 (what transformers' Trainer does with ``bf16=True``),
   else as PEFT computes it. Twice; the second counts (its shapes planned: the best case for
   plain, so ``ratio`` = learner steady / plain errs against the learner).
3. **MFU**: ``4 x frozen parameters x steady tokens/s`` (forward and the input-gradient
   backward; the frozen weights get no gradient) over the GPU's dense bf16 peak
   (``--peak-tflops``; 989 for an H100/H200).

Checks, once, on the first shape (unless ``--no-checks``): three updates straight equal two, a
resume from the checkpoint in a fresh learner, and a third, bit for bit (adapter, optimizer and
RNG files; short rows); PEFT's ``PeftModel.from_pretrained`` loads the checkpoint and gives the
learner's logits (the adapter computed as PEFT does); a one-rank process group (NCCL on a GPU,
gloo on the CPU) joins, all-reduces and trains; the adapter computed in bf16 against float32 on
a fixed batch on bf16 base weights (:func:`check_adapter_compute`); and on a GPU, the same
update twice from the same state on rows of real length (hundreds of tokens), bit for bit, per
attention kernel (``same_update_twice``: a report, not a pass/fail).

The device figures of docs/scaling.md: ``--rows 96``, ``--warm-kernels``, the variants
``before`` and the preset's (``after``), ``--learner-gib 32`` and ``78`` for the 1.7B.

Prints one JSON object (``--out`` also writes it; ``--jsonl`` appends each result as it comes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ub.batch import Batch
from ub.learner import Learner, LearnerConfig, plan_micro_batches
from ub.learner.batching import padded_width
from ub.learner.checkpoint import ADAPTER_WEIGHTS, OPTIMIZER_STATE, RNG_STATE
from ub.learner.precision import set_adapter_compute
from ub.learner.testing import QWEN3_SHAPES, build_qwen3, synthetic_batch
from ub.model.lora import ALL_PROJECTIONS, LoraSettings

QUICK_SHAPES = {  # tiny shapes for the CPU: the same code paths, seconds
    "tiny-a": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2},
    "tiny-b": {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 3,
               "num_attention_heads": 4, "num_key_value_heads": 2},
}
ENGINE_SHARE = 0.6  # the preset's engine.gpu_memory_utilization
BEFORE = "adapter_compute=float32,attention_kernel=torch,pad_to_multiple=1"
"""The learner as it was before issue 61 (``--variant before:`` + this)."""


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


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME[:key=value,...]``: learner settings (values read as YAML), ``learner_gib`` too."""
    import yaml

    name, _, rest = text.partition(":")
    settings: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"variant {text!r}: {item!r} is not key=value")
        settings[key.strip()] = yaml.safe_load(value)
    return name, settings


# -- one (shape, variant), in a process of its own --------------------------------------------


def timed_update(learner: Learner, batch: Batch) -> tuple[float, dict[str, Any]]:
    """tokens/s of one update from the cold start (wall clock, the device synchronized)."""
    device = learner.policy.device
    learner.start(None)
    sync(device)
    started = time.perf_counter()
    metrics = learner.update(batch)
    sync(device)
    return metrics["tokens"] / (time.perf_counter() - started), metrics


def time_plain(learner: Learner, batch: Batch) -> float:
    """Plain transformers forward (its own loss, full logits) + backward on the learner's
    micro-batches (as they come, unpadded), with PEFT's own LoRA forward (under autocast where
    the learner computes the adapter in a 16-bit dtype); tokens/s of real tokens."""
    policy = learner.policy
    model, device = policy.model, policy.device
    groups = plan_micro_batches(batch.lengths.tolist(), learner.micro_batch_tokens(), None)
    compute = policy.adapter_compute
    set_adapter_compute(model, torch.float32)
    autocast = torch.autocast(device.type, dtype=compute) if compute != torch.float32 \
        else contextlib.nullcontext()
    model.train()
    try:
        sync(device)
        started = time.perf_counter()
        for group in groups:
            mb = batch.select(group)
            ids = mb.input_ids.to(device)
            labels = torch.where(mb.completion_mask.to(device) > 0, ids, -100)
            with autocast:
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            del loss
        sync(device)
        seconds = time.perf_counter() - started
    finally:
        set_adapter_compute(model, compute)
        for p in policy.params.values():
            p.grad = None
    return int(batch.lengths.sum()) / seconds


def padding(batch: Batch, budget: int | None, multiple: int) -> float:
    """The fraction of the positions the learner's micro-batches compute that are padding."""
    lengths = batch.lengths.tolist()
    groups = plan_micro_batches(lengths, budget, None, multiple)
    computed = sum(len(g) * padded_width(max(lengths[i] for i in g), multiple) for g in groups)
    return 1.0 - sum(lengths) / computed


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One shape with one variant's settings: what the module's docstring lists."""
    started = time.perf_counter()
    settings = dict(spec["settings"])
    gib = settings.pop("learner_gib", None)
    device = torch.device("cuda" if torch.cuda.is_available() and not spec["quick"] else "cpu")
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" \
        else None
    if gib is not None and total is not None:
        settings["device_share"] = min(1.0, gib * 2**30 / total)
    learner = Learner(learner_config(Path(spec["model"]), **settings))
    load_seconds = time.perf_counter() - started
    n, quick, seed = spec["rows"], spec["quick"], spec["seed"]
    if spec.get("warm_only"):  # the kernels compiled (Triton's cache on disk), nothing timed
        first_tps, first = timed_update(learner, rows(4, quick, seed=seed - 1))
        return {"shape": spec["shape"], "variant": "kernel warm-up", "tokens": first["tokens"],
                "first_update_tokens_per_second": round(first_tps, 1),
                "seconds": round(time.perf_counter() - started, 1)}
    first_tps, first = timed_update(learner, rows(n, quick, seed=seed))
    peaks = [first.get("peak_gpu_gib", 0.0)]
    warm_tps, warm = timed_update(learner, rows(n, quick, seed=seed + 1))
    peaks.append(warm.get("peak_gpu_gib", 0.0))
    steady: list[float] = []
    paddings: list[float] = []
    plain: list[float] = []
    plain_error = None
    for k in range(spec["steady_batches"]):
        batch = rows(n, quick, seed=seed + 2 + k)
        tps, metrics = timed_update(learner, batch)
        steady.append(tps)
        peaks.append(metrics.get("peak_gpu_gib", 0.0))
        paddings.append(padding(batch, metrics["micro_batch_tokens"],
                                learner.policy.pad_to_multiple))
        if k == 0 and not spec["no_plain"]:
            try:
                plain = [time_plain(learner, batch) for _ in range(2)]
            except torch.OutOfMemoryError as e:
                plain_error = " ".join(str(e).split())[:160]
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    frozen = sum(p.numel() for p in learner.policy.model.parameters() if not p.requires_grad)
    steady_tps = statistics.median(steady)
    fit = learner.budget.fit
    result: dict[str, Any] = {
        "shape": spec["shape"], "variant": spec["variant"], "settings": spec["settings"],
        "adapter_compute": str(learner.policy.adapter_compute).removeprefix("torch."),
        "attention_kernel": learner.policy.attention_kernel,
        "pad_to_multiple": learner.policy.pad_to_multiple, "kernels": learner.policy.kernels,
        "frozen_parameters": frozen, "rows": n, "tokens": first["tokens"],
        "completion_tokens": first["completion_tokens"],
        "micro_batch_tokens": first["micro_batch_tokens"],
        "micro_batches": first["micro_batches"],
        "bytes_per_token_mib": None if fit is None else round(fit.bytes_per_token / 2**20, 3),
        "first_update_tokens_per_second": round(first_tps, 1),
        "warmup_tokens_per_second": round(warm_tps, 1),
        "steady_tokens_per_second": round(steady_tps, 1),
        "steady_batches": [round(x, 1) for x in steady],
        "first_update_slowdown": round(steady_tps / first_tps, 3),
        "plain_tokens_per_second": round(plain[1], 1) if plain else None,
        "plain_new_lengths_tokens_per_second": round(plain[0], 1) if plain else None,
        "ratio": round(steady_tps / plain[1], 3) if plain else None,
        "padding": round(statistics.mean(paddings), 4),
        "load_seconds": round(load_seconds, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }
    if plain_error:
        result["plain_error"] = plain_error
    if device.type == "cuda":
        assert total is not None
        share = learner.config.device_share
        result["peak_gib"] = round(max(peaks), 2)
        result["share_gib"] = round((share if share is not None else 1.0) * total / 2**30, 1)
        result["peak_within_share"] = max(peaks) <= result["share_gib"]
        result["mfu"] = round(4 * frozen * steady_tps / (spec["peak_tflops"] * 1e12), 4)
    else:
        result["peak_rss_mb"] = round(first["peak_rss_mb"])
    return result


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`measure` in a fresh Python process (its first update is a process's first)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                          stdout=subprocess.PIPE, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"shape": spec["shape"], "variant": spec["variant"],
                "error": f"exit {done.returncode}"}
    return dict(json.loads(lines[-1]))


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
    """Plain PEFT loads the checkpoint and computes the learner's logits (the learner's adapter
    computed as PEFT computes it, in float32: in bf16 the logits differ by bf16 rounding, a
    few hundredths, which is the precision's business, not the checkpoint's)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    learner = Learner(learner_config(model, adapter_compute="float32"))
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


ADAPTER_LOSS_RTOL = 1e-2
ADAPTER_GRAD_FACTOR = 1.25


def check_adapter_compute(model: Path) -> dict[str, Any]:
    """The adapter computed in bf16 against float32, on bf16 base weights, on one fixed batch
    (a random adapter of a trained one's size, B a fraction of the base weights' output, so
    that every gradient is nonzero): the loss and the LoRA gradient of each, and of a float32
    model as the reference. It holds if the bf16 adapter's loss is within
    ``ADAPTER_LOSS_RTOL`` of the float32 adapter's, and its gradient's error against the
    reference within ``ADAPTER_GRAD_FACTOR`` times the error the bf16 base weights already
    make (the float32 adapter's): tests/test_adapter_compute.py states the same on the CPU."""
    batch = rows(6, True, seed=5)
    found: dict[str, tuple[float, dict[str, torch.Tensor]]] = {}
    for name, dtype, compute in (("reference", "float32", "float32"),
                                 ("float32", "bfloat16", "float32"),
                                 ("model", "bfloat16", "model")):
        learner = Learner(learner_config(model, dtype=dtype, adapter_compute=compute,
                                         micro_batch_tokens=2048))
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for key, p in learner.policy.params.items():
                scale = p.shape[-1] ** -0.5 if ".lora_A." in key else 0.01
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
        metrics = learner.accumulate_gradients(batch)
        found[name] = (metrics["loss"], {k: v.cpu() for k, v in
                                         learner.lora_gradients().items()})
        del learner

    def grad_rel(a: str, b: str) -> float:
        ga, gb = found[a][1], found[b][1]
        diff = sum(float(((ga[k] - gb[k]) ** 2).sum()) for k in gb) ** 0.5
        return diff / sum(float((gb[k] ** 2).sum()) for k in gb) ** 0.5

    loss_rel = abs(found["model"][0] - found["float32"][0]) / abs(found["float32"][0])
    base_error, bf16_error = grad_rel("float32", "reference"), grad_rel("model", "reference")
    return {"loss_rel": round(loss_rel, 5), "grad_rel": round(grad_rel("model", "float32"), 5),
            "grad_error_bf16_base": round(base_error, 5),
            "grad_error_bf16_adapter": round(bf16_error, 5),
            "ok": loss_rel <= ADAPTER_LOSS_RTOL and bf16_error <= ADAPTER_GRAD_FACTOR * base_error}


def check_repeatable(model: Path, kernels: list[str]) -> dict[str, bool]:
    """The same update twice from the same state, on rows of real length, bit for bit (the
    adapter after it), per attention kernel: what a bitwise resume needs of a GPU."""
    batch = synthetic_batch(8, 151_936, seed=11, prompt_lengths=(300, 600),
                            completion_lengths=(200, 600))
    out = {}
    for kernel in kernels:
        learner = Learner(learner_config(model, attention_kernel=kernel,
                                         micro_batch_tokens=8192))
        states = []
        for _ in range(2):
            learner.start(None)
            learner.update(batch)
            states.append(learner.lora_state())
        out[kernel] = all(torch.equal(states[0][k], states[1][k]) for k in states[0])
        del learner
    return out


def checks(model: Path, folder: Path, device: torch.device) -> dict[str, Any]:
    resume = check_resume(model, folder)
    found: dict[str, Any] = {
        "bitwise_resume": resume,
        "peft_load": check_peft_load(model, folder / "straight-3", device),
        "one_rank_group": check_one_rank_group(model, folder),
        "adapter_compute": check_adapter_compute(model)}
    if device.type == "cuda":
        found["same_update_twice"] = check_repeatable(model, ["torch", "flash"])
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes on the CPU (what make test runs)")
    parser.add_argument("--shapes", default=None,
                        help="comma-separated, of " + ", ".join(QWEN3_SHAPES))
    parser.add_argument("--rows", type=int, default=None, help="rows per batch (192; quick 24)")
    parser.add_argument("--steady-batches", type=int, default=3,
                        help="batches of new lengths the steady figure is the median of (>= 3)")
    parser.add_argument("--learner-gib", type=float, default=None,
                        help="the learner's memory on the GPU, weights included (default: 1 - "
                        f"{ENGINE_SHARE} of it, beside vLLM as in the preset)")
    parser.add_argument("--variant", action="append", default=None,
                        help="NAME[:key=value,...]: learner settings over the preset's, "
                        "measured in turn (default: 'preset', as it is); 'before' alone: the "
                        "learner before issue 61 (" + BEFORE + ")")
    parser.add_argument("--models", type=Path, default=None,
                        help="keep the built models here (reused when present)")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain reference")
    parser.add_argument("--no-checks", action="store_true", help="skip the checks")
    parser.add_argument("--checks-only", action="store_true", help="only the checks")
    parser.add_argument("--warm-kernels", action="store_true",
                        help="before a shape's variants, a process of one small update: "
                        "Triton's kernel cache on disk is then warm for every first update "
                        "(as for any process but a machine's first)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="the GPU's dense bf16 peak, for MFU (H100/H200 SXM: 989)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--jsonl", type=Path, help="append each result here as it comes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = measure(json.loads(args.child))
        print(json.dumps(result), flush=True)
        return result
    shapes = QUICK_SHAPES if args.quick else QWEN3_SHAPES
    chosen = args.shapes.split(",") if args.shapes else list(shapes)
    unknown = [s for s in chosen if s not in shapes]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(shapes)}")
    if args.steady_batches < 3:
        parser.error("--steady-batches must be at least 3")
    try:
        variants = [parse_variant(f"before:{BEFORE}" if v == "before" else v)
                    for v in args.variant or ["preset"]]
    except ValueError as e:
        parser.error(str(e))
    args.rows = args.rows or (24 if args.quick else 192)
    device = torch.device("cpu" if args.quick or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.quick:
        parser.error("no GPU here: run with --quick (tiny shapes on the CPU)")

    started = time.perf_counter()
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "quick": args.quick, "rows": args.rows,
        "steady_batches": args.steady_batches, "learner_gib": args.learner_gib, "shapes": []}
    with tempfile.TemporaryDirectory(prefix="ub-gpu-learner-") as tmp:
        folder = Path(tmp)
        models = args.models or folder / "models"
        dtype = "bfloat16" if device.type == "cuda" else "float32"
        for name in chosen:
            model = models / name
            if not (model / "config.json").is_file():
                build_qwen3(model, dtype=dtype, device=device.type, **shapes[name])
            if device.type == "cuda":
                torch.cuda.empty_cache()
            runs = [] if args.checks_only else variants
            if args.warm_kernels and runs:
                runs = [("warm", {**variants[0][1], "warm_only": True}), *runs]
            for variant, settings in runs:
                if args.learner_gib is not None:
                    settings = {"learner_gib": args.learner_gib, **settings}
                settings = dict(settings)
                warm_only = bool(settings.pop("warm_only", False))
                result = run_child({
                    "shape": name, "variant": variant, "settings": settings,
                    "model": str(model), "rows": args.rows, "quick": args.quick, "seed": 1000,
                    "steady_batches": args.steady_batches, "no_plain": args.no_plain,
                    "peak_tflops": args.peak_tflops, "warm_only": warm_only})
                report["shapes"].append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
                if args.jsonl:
                    with args.jsonl.open("a") as f:
                        f.write(json.dumps(result) + "\n")
        if not args.no_checks:
            report["checks"] = checks(models / chosen[0], folder, device)
            if args.jsonl:
                with args.jsonl.open("a") as f:
                    f.write(json.dumps({"checks": report["checks"]}) + "\n")
    report["seconds"] = round(time.perf_counter() - started, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
