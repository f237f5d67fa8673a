"""Where a CPU's time goes in the demo: which kernels run, and how fast, on this machine.

Not a test. ``.venv/bin/python bench/cpu_kernels.py [--steps 60] [--json]``

The demo (`make demo`) is mostly matrix products: the tiny model's pre-training, the learner's
forward and backward, and vLLM's prefill are float32 GEMMs of a few hundred columns. This
script says what a CPU does with them, in about a minute, so that two machines' demo times can
be told apart by cause (instruction set, library, cores, or plain speed):

1. **The CPU and the dispatch**: the instruction sets the kernel reports (AVX2, AVX-512,
   AVX-512 bf16, AMX), torch's ATen kernel level, the BLAS torch links (MKL), and which of
   vLLM's kernel libraries it loads on this CPU (``_C`` with AVX-512 bf16, ``_C_AVX512``,
   ``_C_AVX2``; vLLM picks by ``torch.cpu._is_avx512_supported()``, not by
   ``ATEN_CPU_CAPABILITY``).
2. **GEMM at the model's shapes**, in GFLOP/s: torch's ``mm`` (MKL's sgemm: what training and
   the build use) and oneDNN's (``mkldnn_linear``), on one and on two threads. Two threads at
   less than ~1.6x one thread mean the two vCPUs share a physical core (SMT siblings).
3. **Pre-training steps** of the tiny model's recipe (the build's inner loop), steps/s.
4. With ``--isa avx2`` (on a machine with AVX-512): all of the above again in a child process
   that caps torch, oneDNN and MKL at AVX2 (``ATEN_CPU_CAPABILITY=avx2``,
   ``ONEDNN_MAX_CPU_ISA=AVX2``, ``MKL_ENABLE_INSTRUCTIONS=AVX2``), side by side: what the
   instruction set alone costs on the same silicon.

Prints a table, or one JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_facts() -> dict[str, Any]:
    """What the kernel says the CPU is, and what torch and vLLM dispatch to on it."""
    import torch

    flags: set[str] = set()
    model = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    avx512 = torch.cpu._is_avx512_supported()
    avx512_bf16 = torch.cpu._is_avx512_bf16_supported()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": "amx_tile" in flags,
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "blas": "mkl" if torch.backends.mkl.is_available() else "other",
        # vllm/platforms/cpu.py import_kernels(): the same two checks, in the same order.
        "vllm_kernels": ("_C" if avx512 and avx512_bf16 else "_C_AVX512" if avx512
                         else "_C_AVX2"),
    }


# The tiny model's GEMMs (hidden 256, MLP 768, ~1,000 tokens a batch): forward, and the two
# products of a backward pass.
SHAPES = ((1000, 256, 768), (1000, 768, 256), (768, 1000, 256), (1000, 256, 256))


def gemm_rates(threads: int, seconds: float = 0.4) -> dict[str, float]:
    """GFLOP/s of MKL's and oneDNN's float32 GEMM over :data:`SHAPES` (total flops / time)."""
    import torch

    torch.set_num_threads(threads)
    rates: dict[str, float] = {}
    for name in ("mkl", "onednn"):
        flops = elapsed = 0.0
        for m, k, n in SHAPES:
            a, b = torch.randn(m, k), torch.randn(k, n)
            if name == "mkl":
                def product(a=a, b=b) -> Any:
                    return a @ b
            else:
                dense_a, weight = a.to_mkldnn(), b.t().contiguous()

                def product(a=dense_a, w=weight) -> Any:
                    return torch._C._nn.mkldnn_linear(a, w, None)
            for _ in range(5):
                product()
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                product()
                calls += 1
            elapsed += time.perf_counter() - start
            flops += 2.0 * m * k * n * calls
        rates[name] = round(flops / elapsed / 1e9, 1)
    return rates


def pretrain_rate(steps: int) -> float:
    """Steps/s of the tiny model's pre-training recipe (its data, shape and optimizer)."""

    import torch

    from ub.model.builder import init_model, train_tokenizer
    from ub.model.tiny.config import DEFAULT_CONFIG
    from ub.model.tiny.pretrain import encode_examples, pretrain
    from ub.model.transcripts import iter_transcripts
    from ub.seeding import derive_seed

    torch.set_num_threads(DEFAULT_CONFIG.num_threads)
    torch.use_deterministic_algorithms(True)  # as the build runs
    transcript = list(iter_transcripts(DEFAULT_CONFIG.env_ids, 300, 0))
    texts = [text for step in transcript for text in (step.prompt, step.completion)]
    tokenizer = train_tokenizer(iter(texts), DEFAULT_CONFIG.vocab_size)
    model = init_model(tokenizer, DEFAULT_CONFIG.shape, derive_seed("init", 0))
    examples = encode_examples(transcript, tokenizer, DEFAULT_CONFIG.max_position_embeddings)
    config = DEFAULT_CONFIG.replace(train_steps=5)
    pretrain(model, examples, config, 0)  # warm-up (allocator, oneDNN's JIT)
    config = DEFAULT_CONFIG.replace(train_steps=steps)
    start = time.perf_counter()
    pretrain(model, examples, config, 0)
    return round(steps / (time.perf_counter() - start), 2)


def measure(steps: int) -> dict[str, Any]:
    result = cpu_facts()
    one, two = gemm_rates(1), gemm_rates(2)
    result["gemm_gflops"] = {"1 thread": one, "2 threads": two}
    result["two_thread_scaling"] = round(two["mkl"] / one["mkl"], 2)
    if steps:
        result["pretrain_steps_per_s"] = pretrain_rate(steps)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="pre-training steps (0: none)")
    parser.add_argument("--isa", choices=["native", "avx2"], default="native",
                        help="avx2: also measure with torch, oneDNN and MKL capped at AVX2")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(measure(args.steps)))
        return
    runs = {"native": measure(args.steps)}
    if args.isa == "avx2":
        child = subprocess.run(
            [sys.executable, __file__, "--child", "--steps", str(args.steps)],
            env={**os.environ, **AVX2_CAPS}, check=True, capture_output=True, text=True)
        runs["avx2 caps"] = json.loads(child.stdout.splitlines()[-1])
    if args.json:
        print(json.dumps(runs))
        return
    facts = runs["native"]
    print(f"{facts['cpu']}, {facts['cores']} cores: AVX2 {facts['avx2']}, AVX-512 "
          f"{facts['avx512f']}, AVX-512 bf16 {facts['avx512_bf16']}, AMX {facts['amx']}; "
          f"BLAS {facts['blas']}")
    for label, run in runs.items():
        gemm = run["gemm_gflops"]
        print(f"[{label}] ATen {run['aten_capability']}, vLLM {run['vllm_kernels']}: GEMM "
              f"GFLOP/s MKL {gemm['1 thread']['mkl']} / {gemm['2 threads']['mkl']} (1 / 2 "
              f"threads), oneDNN {gemm['1 thread']['onednn']} / {gemm['2 threads']['onednn']}; "
              f"2-thread scaling {run['two_thread_scaling']}x"
              + (f"; pre-training {run['pretrain_steps_per_s']} steps/s"
                 if "pretrain_steps_per_s" in run else ""))


if __name__ == "__main__":
    main()
