"""``ub train CONFIG --dry-run``: a run's GPU memory plan from the base model's config.json
alone (:mod:`ub.run.gpu_plan`), on a Qwen3-1.7B config.json written here (real shapes, no
weights, no tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli import main
from ub.run.config import load_config
from ub.run.gpu_plan import GIB, ModelShape, plan_gpus

QWEN3_1_7B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "num_hidden_layers": 28, "hidden_size": 2048, "intermediate_size": 6144,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 151936, "tie_word_embeddings": True,
              "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}


@pytest.fixture()
def qwen3_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "Qwen3-1.7B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_1_7B))
    return folder


def test_the_plan_of_qwen3_1_7b_on_an_80_gib_gpu() -> None:
    shape = ModelShape.from_config(QWEN3_1_7B, "config.json")
    assert shape.params == 1_720_574_976  # (Qwen3-1.7B: 1.7 B, 1.4 B without embeddings)
    assert shape.kv_bytes_per_token(2) == 2 * 28 * 8 * 128 * 2
    # Within 5% of GPU.md's H200 measurements: 5.14 MiB/token, 2.16 with checkpointing.
    assert shape.learner_bytes_per_token(False) / 2**20 == pytest.approx(5.14, rel=0.05)
    assert shape.learner_bytes_per_token(True) / 2**20 == pytest.approx(2.16, rel=0.05)

    plan = plan_gpus(load_config("qwen3-1.7b-simpletak"), QWEN3_1_7B, 80)
    [(_, engine, learner)] = plan.gpus  # one GPU: engine and learner share it
    assert engine is not None and learner is not None
    assert engine.share_gib == 48.0  # gpu_memory_utilization 0.6
    assert engine.weights_gib == pytest.approx(1_720_574_976 * 2 / GIB)
    # 5 LoRA slots of rank 32 on the 7 projections of 28 layers, bf16
    assert engine.lora_gib == pytest.approx(5 * 32 * 28 * 38_912 * 2 / GIB)
    assert engine.kv_tokens == 397_620
    assert engine.demand_tokens == 128 * 4096 > engine.kv_tokens  # (issue 43, item 5)
    assert "vLLM will preempt" in plan.warnings[0]
    assert learner.share_gib == pytest.approx(32.0)
    assert learner.budget_gib == pytest.approx(32.0 - 3.2048 - 0.5191, abs=1e-3)
    assert learner.micro_batch_tokens == 4608  # auto, as ub.learner.memory sizes it
    # As shipped, an 8,192-token row (max_train_len null) cannot fit the learner's 0.4.
    [problem] = plan.problems
    assert problem.startswith("a row of up to 8,192 tokens") and "batch.max_train_len" in problem

    fits = plan_gpus(load_config("qwen3-1.7b-simpletak", ["batch.max_train_len=4096"]),
                     QWEN3_1_7B, 80)
    assert fits.problems == []

    small = plan_gpus(load_config("qwen3-1.7b-simpletak"), QWEN3_1_7B, 8)
    assert small.problems[0].startswith("the engine's share (engine.gpu_memory_utilization: "
                                        "4.8 GiB) holds 0 tokens of KV cache")
    assert "raise engine.gpu_memory_utilization to at least 0.80" in small.problems[0]

    # On a Ray node: 7 engines with a GPU each, the learner alone on the eighth.
    ray = plan_gpus(load_config("qwen3-1.7b-simpletak", [
        "cluster.address=auto", "engine.gpu_memory_utilization=0.9"]), QWEN3_1_7B, 80)
    [(engines, engine, none), (learners, no_engine, learner)] = ray.gpus
    assert engines == "GPUs 0-6 (rollout workers 0-6, one each)" and none is None
    assert learners == "GPU 7 (learner rank 0)" and no_engine is None
    assert engine is not None and engine.kv_tokens > engine.demand_tokens
    assert learner is not None and learner.share_gib == 80 and ray.problems == []


def test_dry_run_prints_the_plan_and_writes_nothing(capsys, tmp_path, qwen3_folder) -> None:
    root = tmp_path / "runs"
    code = main(["train", "qwen3-1.7b-simpletak", "--dry-run", "--root", str(root),
                 "--set", f"model.base={qwen3_folder}", "--set", "batch.max_train_len=4096"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.startswith(f"run qwen3-1.7b-simpletak at {root / 'qwen3-1.7b-simpletak'} (new")
    assert "KV cache 42.5 GiB = 397,620 tokens" in out
    assert "micro-batch (auto) 4,608 tokens" in out
    assert not root.exists()  # nothing written: no run folder, no Prefect home


def test_dry_run_of_a_plan_that_cannot_fit_is_one_error_line(capsys, tmp_path,
                                                              qwen3_folder) -> None:
    root = tmp_path / "runs"
    code = main(["train", "qwen3-1.7b-simpletak", "--dry-run", "--gpu-memory", "40",
                 "--root", str(root), "--set", f"model.base={qwen3_folder}",
                 "--set", "batch.max_train_len=4096"])
    out, err = capsys.readouterr()
    assert code == 2 and "GPUs of 40 GiB (--gpu-memory)" in out
    assert err.count("\n") == 1 and err.startswith(
        "ub: error: a row of up to 4,096 tokens (engine.max_model_len, batch.max_train_len "
        "4096) needs 21.0 GiB of activations in one micro-batch, the learner has 12.3: set "
        "batch.max_train_len to at most 2,")
    assert not root.exists()
    code = main(["train", "qwen3-1.7b-simpletak", "--gpu-memory", "40", "--root", str(root)])
    assert code == 2 and "it goes with --dry-run" in capsys.readouterr().err
