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

QWEN3_4B = {**QWEN3_1_7B, "num_hidden_layers": 36, "hidden_size": 2560,
            "intermediate_size": 9728, "num_attention_heads": 32}


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
    [(label, engine, learner)] = plan.gpus  # one GPU: engine and learner share it
    assert label == "GPU 0 (engine and learner, engine asleep during updates)"
    assert engine is not None and learner is not None
    assert engine.share_gib == 48.0  # gpu_memory_utilization 0.6
    assert engine.weights_gib == pytest.approx(1_720_574_976 * 2 / GIB)
    # 5 LoRA slots of rank 32 on the 7 projections of 28 layers, bf16
    assert engine.lora_gib == pytest.approx(5 * 32 * 28 * 38_912 * 2 / GIB)
    assert engine.kv_tokens == 397_620
    assert engine.demand_tokens == 128 * 4096 > engine.kv_tokens  # (issue 43, item 5)
    assert "vLLM will preempt" in plan.warnings[0]
    # The engine sleeps through the update: the learner has all the GPU but the 2 GiB a
    # sleeping engine keeps, and trains the preset's longest rows (max_train_len 8,192: what
    # the engine generates) whole.
    assert learner.share_gib == pytest.approx(78.0)
    assert learner.budget_gib == pytest.approx(78.0 - 3.2048 - 0.5191, abs=1e-3)
    assert learner.micro_batch_tokens == 12_288  # auto, as ub.learner.memory sizes it
    assert learner.longest_row == 8192 < learner.row_limit == 12_303
    assert plan.problems == []

    # Awake through the update (no sleep mode, or rounds pipelined), the learner keeps to the
    # 0.4 the engine leaves it: an 8,192-token row no longer fits.
    for awake in (["engine.sleep_mode=false"], ["pipeline.max_staleness=1"]):
        shared = plan_gpus(load_config("qwen3-1.7b-simpletak", awake), QWEN3_1_7B, 80)
        [(label, _, learner)] = shared.gpus
        assert label.startswith("GPU 0 (engine and learner") and "asleep" not in label
        assert learner is not None and learner.share_gib == pytest.approx(32.0)
        assert learner.budget_gib == pytest.approx(32.0 - 3.2048 - 0.5191, abs=1e-3)
        assert learner.micro_batch_tokens == 4608
        [problem] = shared.problems
        assert problem.startswith("a row of up to 8,192 tokens") and problem.endswith(
            "set batch.max_train_len to at most 4,683, or set learner.gradient_checkpointing: "
            "true, or lower engine.gpu_memory_utilization")
    fits = plan_gpus(load_config("qwen3-1.7b-simpletak", ["engine.sleep_mode=false",
                                                          "batch.max_train_len=4096"]),
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


@pytest.mark.parametrize(("preset", "model"), [("qwen3-1.7b-simpletak", QWEN3_1_7B),
                                               ("spiral-kuhn", QWEN3_4B)])
def test_each_gpu_preset_fits_an_80_gib_gpu_and_trains_every_row_it_generates(
        preset: str, model: dict) -> None:
    """Every row the engine can generate (prompt + completion: engine.max_model_len) is
    trained whole, beside the sleeping engine on one 80 GiB GPU (the 4B with gradient
    checkpointing: without it, not)."""
    config = load_config(preset)
    plan = plan_gpus(config, model, 80)
    [(_, _, learner)] = plan.gpus
    assert learner is not None and plan.problems == []
    assert learner.longest_row == config.batch.max_train_len == config.engine.max_model_len
    if preset == "spiral-kuhn":
        without = plan_gpus(load_config(preset, ["learner.gradient_checkpointing=false"]),
                            model, 80)
        assert without.problems[0].startswith("a row of up to 8,192 tokens")


def test_dry_run_prints_the_plan_and_writes_nothing(capsys, tmp_path, qwen3_folder) -> None:
    root = tmp_path / "runs"
    code = main(["train", "qwen3-1.7b-simpletak", "--dry-run", "--root", str(root),
                 "--set", f"model.base={qwen3_folder}"])  # (the preset as shipped)
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.startswith(f"run qwen3-1.7b-simpletak at {root / 'qwen3-1.7b-simpletak'} (new")
    assert "KV cache 42.5 GiB = 397,620 tokens" in out
    assert "learner  78.0 GiB (what the sleeping engine's 2.0 leaves)" in out
    assert "micro-batch (auto) 12,288 tokens = 63.1 GiB; longest row 8,192 tokens" in out
    assert not root.exists()  # nothing written: no run folder, no Prefect home


def test_dry_run_of_a_plan_that_cannot_fit_is_one_error_line(capsys, tmp_path,
                                                              qwen3_folder) -> None:
    root = tmp_path / "runs"
    code = main(["train", "qwen3-1.7b-simpletak", "--dry-run", "--gpu-memory", "24",
                 "--root", str(root), "--set", f"model.base={qwen3_folder}",
                 "--set", "batch.max_train_len=4096"])
    out, err = capsys.readouterr()
    assert code == 2 and "GPUs of 24 GiB (--gpu-memory)" in out
    # (the engine asleep: its gpu_memory_utilization is no advice)
    assert err == (
        "ub: error: a row of up to 4,096 tokens (engine.max_model_len, batch.max_train_len "
        "4096) needs 21.0 GiB of activations in one micro-batch, the learner has 18.3 (rows "
        "up to 3,027 tokens): set batch.max_train_len to at most 3,027, or set "
        "learner.gradient_checkpointing: true\n")
    assert not root.exists()
    code = main(["train", "qwen3-1.7b-simpletak", "--gpu-memory", "40", "--root", str(root)])
    assert code == 2 and "it goes with --dry-run" in capsys.readouterr().err
