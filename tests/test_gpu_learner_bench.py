"""bench/gpu_learner.py --quick: the GPU benchmark's code on tiny shapes on the CPU, so that it
runs (and its correctness checks hold) wherever the suite runs; on a GPU the same script
measures the Qwen3 shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_learner_benchmark_runs_quick_on_the_cpu(tmp_path: Path) -> None:
    """Slow (~1 min on two cores): the script builds a model and trains it with the learner
    in a process of its own (a first update, a warm-up and three steady batches of new
    lengths), plain transformers and its checks, each at the real 151,936-token vocabulary.
    One shape, one variant and 8 rows run every code path (a second shape only loops them
    again, and the checks take their own rows), at half the time of the full ``--quick``."""
    out = tmp_path / "gpu_learner.json"
    result = subprocess.run([sys.executable, "bench/gpu_learner.py", "--quick", "--shapes",
                             "tiny-a", "--rows", "8", "--learner-gib", "32", "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["quick"] and report["learner_gib"] == 32
    assert [(s["shape"], s["variant"], s["rows"]) for s in report["shapes"]] == \
        [("tiny-a", "preset", 8)]
    for shape in report["shapes"]:
        assert shape["kernels"] == "none" and shape["micro_batch_tokens"] == 4096
        # The CPU's defaults: the adapter in float32, torch's attention, no padding.
        assert (shape["adapter_compute"], shape["attention_kernel"],
                shape["pad_to_multiple"]) == ("float32", "torch", 1)
        assert len(shape["steady_batches"]) == 3
        assert shape["steady_tokens_per_second"] == sorted(shape["steady_batches"])[1]
        for key in ("first_update_tokens_per_second", "steady_tokens_per_second",
                    "plain_tokens_per_second", "ratio"):
            assert shape[key] > 0, key
        assert 0 < shape["padding"] < 1
        assert shape["tokens"] > shape["completion_tokens"] > 0
    checks = report["checks"]
    assert {k: checks[k] for k in ("bitwise_resume", "peft_load", "one_rank_group")} == \
        {"bitwise_resume": True, "peft_load": True, "one_rank_group": True}
    assert checks["adapter_compute"]["ok"], checks["adapter_compute"]
    assert json.loads(result.stdout) == report


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the full benchmark")
def test_gpu_learner_benchmark_refuses_the_full_run_without_a_gpu() -> None:
    result = subprocess.run([sys.executable, "bench/gpu_learner.py", "--shapes", "1.7b"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "no GPU here: run with --quick" in result.stderr
