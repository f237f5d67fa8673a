"""The learner's memory on the CPU: how much one update grows the process's peak RSS.

Not a test. ``.venv/bin/python bench/learner_memory.py [--model DIR] [--micro-batch-tokens N]``

One update of 64 synthetic rows (prompts 20-120 tokens, completions 30-95: ~4,000 completion
tokens) in one 16,384-token micro-batch, reinforce, on a random one-layer Qwen3 (hidden 128)
with Qwen3's 151,936-token vocabulary: there the output layer is what memory depends on (a
(tokens x vocabulary) float32 tensor is 2.4 GB). The peak RSS is reset just before the update
(``/proc/self/clear_refs``), so the figure is the update's own growth, not the model load's.

Prints one JSON object. ``--model`` takes an existing model folder (e.g. to run this script
against an older checkout with ``PYTHONPATH``; it then imports only ``ub.learner``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_kib(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model folder (default: build one)")
    parser.add_argument("--micro-batch-tokens", type=int, default=16_384)
    args = parser.parse_args()

    import torch

    from ub.learner import Learner, LearnerConfig
    from ub.learner.testing import synthetic_batch
    from ub.model.lora import LoraSettings

    with tempfile.TemporaryDirectory(prefix="ub-learner-memory-") as tmp:
        model = args.model
        if model is None:
            from ub.learner.testing import build_qwen3

            model = build_qwen3(Path(tmp) / "qwen3", hidden_size=128, intermediate_size=256,
                                num_hidden_layers=1)
        learner = Learner(LearnerConfig(
            base_model=str(model), lora=LoraSettings(rank=8, alpha=16), length_normalizer=128,
            micro_batch_tokens=args.micro_batch_tokens, algorithm="reinforce", seed=0))
        batch = synthetic_batch(64, 151_936, seed=0, prompt_lengths=(20, 120),
                                completion_lengths=(30, 95))
        Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
        before = rss_kib("VmRSS")
        started = time.perf_counter()
        metrics = learner.update(batch)
        seconds = time.perf_counter() - started
        peak = rss_kib("VmHWM")
    print(json.dumps({
        "rows": len(batch), "tokens": metrics["tokens"],
        "completion_tokens": metrics["completion_tokens"],
        "micro_batches": metrics["micro_batches"], "update_seconds": round(seconds, 2),
        "rss_before_mb": round(before / 1024), "peak_rss_growth_mb": round((peak - before) / 1024),
        "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
