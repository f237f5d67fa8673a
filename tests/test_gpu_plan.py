"""``ub train CONFIG --dry-run``: a run's GPU memory plan from the base model's config.json
alone (:mod:`ub.run.checks.gpu_plan`), on the Qwen3 config.json files of ``bench/qwen3-shapes``
(the published shapes, no weights, no tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ub.flows.cli import main
from ub.learner.memory import HEADROOM, MULTIPLE
from ub.learner.testing import QWEN3_SHAPES, QWEN3_VOCAB
from ub.run.checks.gpu_plan import (
    ENGINE_ALONE_UTILIZATION,
    ENGINE_RESERVE_GIB,
    GIB,
    LEARNER_BYTES_PER_LORA_PARAM,
    ModelShape,
    plan_gpus,
)
from ub.run.config.load import load_config

SHAPES = Path(__file__).resolve().parents[1] / "bench" / "qwen3-shapes"
QWEN3_1_7B = json.loads((SHAPES / "Qwen3-1.7B-Base" / "config.json").read_text())
QWEN3_4B = json.loads((SHAPES / "Qwen3-4B-Base" / "config.json").read_text())

# Qwen3-1.7B in the presets' settings, from its shape (the numbers the plans below are
# derived from, as the planner's own terms are checked in the first test).
BF16 = 2
WEIGHTS_GIB = 1_720_574_976 * BF16 / GIB  # 1.7 B parameters (1.4 B without embeddings)
KV_BYTES_PER_TOKEN = 2 * 28 * 8 * 128 * BF16  # K and V of 28 layers, 8 KV heads of 128
RANK_32_PARAMS = 32 * 28 * 38_912  # a rank-32 adapter on the 7 projections of 28 layers
ENGINE_LORA_GIB = 5 * RANK_32_PARAMS * BF16 / GIB  # engine.max_loras 5 slots of rank 32
LEARNER_OWN_GIB = WEIGHTS_GIB + RANK_32_PARAMS * LEARNER_BYTES_PER_LORA_PARAM / GIB
ACTIVATION_BYTES = ModelShape.from_config(QWEN3_1_7B, "config.json").learner_bytes_per_token(
    False)  # (per token, within 5% of GPU.md's measurement: the first test)


def kv_tokens(share_gib: float) -> int:
    """The tokens of KV cache an engine's share holds after weights, LoRA slots, reserve."""
    rest = share_gib - WEIGHTS_GIB - ENGINE_LORA_GIB - ENGINE_RESERVE_GIB
    return int(rest * GIB // KV_BYTES_PER_TOKEN)


def row_limit(budget_gib: float) -> int:
    """The longest row whose activations fit the learner's headroom of ``budget_gib``."""
    return int(HEADROOM * budget_gib * GIB / ACTIVATION_BYTES)


def micro_batch(budget_gib: float) -> int:
    """The largest multiple of MULTIPLE tokens that fits (``micro_batch_tokens: auto``)."""
    return row_limit(budget_gib) // MULTIPLE * MULTIPLE


def test_the_learners_micro_batch_on_an_80_gib_gpu_in_figures() -> None:
    """The figures a user of qwen3-1.7b-simpletak on one 80 GiB GPU reads in the plan, worked
    out by hand rather than from the planner's constants (which the other tests reuse, so a
    changed headroom would pass them):

    - the learner holds the weights (1,720,574,976 params x 2 B = 3.205 GiB) and a rank-32
      adapter (32 x 28 layers x 38,912 = 34,865,152 params x 16 B, with its gradient and
      Adam's moments, = 0.520 GiB): 3.724 GiB in all;
    - an update keeps 5,509,632 B (5.25 MiB) of activations per token;
    - the engine awake through the update (sleep_mode false): the learner's share is 0.4 x 80
      = 32 GiB, its budget 32 - 3.724 = 28.276 GiB, of which activations may fill 85% (the
      rest for fragmentation and the output layer's chunks): 24.034 GiB, 4,683.9 tokens. So
      the longest row is 4,683 tokens, and a micro-batch 4,608 (18 x 256);
    - the engine asleep: 80 - 2 GiB it keeps = 78 GiB, a budget of 74.276, 85% of it
      63.134 GiB, 12,303.9 tokens: micro-batches of 12,288 (48 x 256).

    (At 95% they would be 5,234 / 5,120 and 13,568: micro-batches 11-12% larger, out of memory
    on the real GPU more often than the retry at half can absorb.)"""
    [(_, _, asleep)] = plan_gpus(load_config("qwen3-1.7b-simpletak"), QWEN3_1_7B, 80).gpus
    awake_plan = plan_gpus(load_config("qwen3-1.7b-simpletak", ["engine.sleep_mode=false"]),
                           QWEN3_1_7B, 80)
    [(_, _, awake)] = awake_plan.gpus
    assert asleep is not None and awake is not None
    assert awake.bytes_per_token == asleep.bytes_per_token == 5_509_632
    assert awake.weights_gib + awake.lora_gib == pytest.approx(3.724, abs=1e-3)
    assert awake.budget_gib == pytest.approx(28.276, abs=1e-3)
    assert (awake.micro_batch_tokens, awake.row_limit) == (4608, 4683)
    assert "set batch.max_train_len to at most 4,683," in awake_plan.problems[0]
    assert asleep.budget_gib == pytest.approx(74.276, abs=1e-3)
    assert asleep.micro_batch_tokens == 12288


@pytest.mark.parametrize(("config", "size"), [(QWEN3_1_7B, "1.7b"), (QWEN3_4B, "4b")])
def test_the_planning_shapes_are_the_ones_the_gpu_benchmark_builds(config: dict,
                                                                   size: str) -> None:
    assert {k: config[k] for k in QWEN3_SHAPES[size]} == QWEN3_SHAPES[size]
    assert (config["vocab_size"], config["head_dim"], config["tie_word_embeddings"]) == (
        QWEN3_VOCAB, 128, True)


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
    assert engine.weights_gib == pytest.approx(WEIGHTS_GIB)
    assert engine.lora_gib == pytest.approx(ENGINE_LORA_GIB)
    assert engine.kv_tokens == kv_tokens(48.0)
    assert engine.demand_tokens == 128 * 4096 > engine.kv_tokens  # (issue 43, item 5)
    assert "vLLM will preempt" in plan.warnings[0]
    # The engine sleeps through the update: the learner has all the GPU but the 2 GiB a
    # sleeping engine keeps, and trains the preset's longest rows (max_train_len 8,192: what
    # the engine generates) whole.
    assert learner.share_gib == pytest.approx(80.0 - ENGINE_RESERVE_GIB)
    assert learner.budget_gib == pytest.approx(80.0 - ENGINE_RESERVE_GIB - LEARNER_OWN_GIB)
    assert learner.micro_batch_tokens == micro_batch(learner.budget_gib)
    assert learner.longest_row == 8192 < learner.row_limit == row_limit(learner.budget_gib)
    assert plan.problems == []

    # Awake through the update (no sleep mode, or rounds pipelined), the learner keeps to the
    # 0.4 the engine leaves it: an 8,192-token row no longer fits.
    for awake in (["engine.sleep_mode=false"], ["pipeline.max_staleness=1"]):
        shared = plan_gpus(load_config("qwen3-1.7b-simpletak", awake), QWEN3_1_7B, 80)
        [(label, _, learner)] = shared.gpus
        assert label.startswith("GPU 0 (engine and learner") and "asleep" not in label
        assert learner is not None and learner.share_gib == pytest.approx(0.4 * 80)
        assert learner.budget_gib == pytest.approx(0.4 * 80 - LEARNER_OWN_GIB)
        assert learner.micro_batch_tokens == micro_batch(learner.budget_gib)
        assert row_limit(learner.budget_gib) < 8192
        [problem] = shared.problems
        assert problem.startswith("a row of up to 8,192 tokens") and problem.endswith(
            f"set batch.max_train_len to at most {row_limit(learner.budget_gib):,}, or set "
            "learner.gradient_checkpointing: true, or lower engine.gpu_memory_utilization")
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
    kv_gib = 48.0 - WEIGHTS_GIB - ENGINE_LORA_GIB - ENGINE_RESERVE_GIB
    assert f"KV cache {kv_gib:.1f} GiB = {kv_tokens(48.0):,} tokens" in out
    assert (f"learner  {80 - ENGINE_RESERVE_GIB:.1f} GiB (what the sleeping engine's "
            f"{ENGINE_RESERVE_GIB:.1f} leaves)") in out
    micro = micro_batch(80.0 - ENGINE_RESERVE_GIB - LEARNER_OWN_GIB)
    assert (f"micro-batch (auto) {micro:,} tokens = {micro * ACTIVATION_BYTES / GIB:.1f} GiB; "
            "longest row 8,192 tokens") in out
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
    budget = 24 - ENGINE_RESERVE_GIB - LEARNER_OWN_GIB
    assert budget < 4096 * ACTIVATION_BYTES / GIB
    assert err == (
        f"ub: error: a row of up to 4,096 tokens (engine.max_model_len, batch.max_train_len "
        f"4096) needs {4096 * ACTIVATION_BYTES / GIB:.1f} GiB of activations in one "
        f"micro-batch, the learner has {budget:.1f} (rows up to {row_limit(budget):,} tokens): "
        f"set batch.max_train_len to at most {row_limit(budget):,}, or set "
        "learner.gradient_checkpointing: true\n")
    assert not root.exists()
    code = main(["train", "qwen3-1.7b-simpletak", "--gpu-memory", "40", "--root", str(root)])
    assert code == 2 and "it goes with --dry-run" in capsys.readouterr().err


EIGHT_GPU = "qwen3-1.7b-simpletak-8gpu"


def test_the_8_gpu_preset_gives_every_engine_and_the_learner_a_gpu_of_its_own() -> None:
    """Seven engines, one shard each, awake on their own GPUs (no sleep mode, 0.9 of the
    card), the learner alone on the eighth with the whole card, rounds pipelined: it plans to
    fit on 8 x 80 GiB with nothing idle to warn about."""
    config = load_config(EIGHT_GPU)
    cluster = config.cluster
    assert cluster.address is not None  # (Ray: the only way to a GPU per worker)
    assert config.rollout.shards == cluster.rollout_workers == 7
    assert cluster.learner_workers == 1
    assert cluster.rollout.num_gpus == cluster.learner.num_gpus == 1
    assert config.pipeline.max_staleness == 1
    assert config.engine.sleep_mode is False and not config.engine_sleeps_during_updates
    assert config.engine.gpu_memory_utilization == ENGINE_ALONE_UTILIZATION

    plan = plan_gpus(config, QWEN3_1_7B, 80)
    [(engines, engine, none), (learners, no_engine, learner)] = plan.gpus
    assert engines == "GPUs 0-6 (rollout workers 0-6, one each)" and none is None
    assert learners == "GPU 7 (learner rank 0)" and no_engine is None
    assert engine is not None and learner is not None
    assert engine.share_gib == pytest.approx(0.9 * 80)
    assert engine.kv_tokens == kv_tokens(0.9 * 80) > engine.demand_tokens == 128 * 4096
    assert learner.share_gib == 80 and not learner.engine_asleep
    assert learner.budget_gib == pytest.approx(80.0 - LEARNER_OWN_GIB)
    assert learner.micro_batch_tokens == micro_batch(learner.budget_gib)
    assert learner.longest_row == 8192 < learner.row_limit == row_limit(learner.budget_gib)
    assert (plan.problems, plan.warnings) == ([], [])


def test_the_8_gpu_preset_is_the_one_gpu_experiment_pipelined() -> None:
    """What the run's data depends on is the one-GPU preset's, but for the pipeline: the
    node changes how the work is executed, not what is learned."""
    one_gpu = load_config("qwen3-1.7b-simpletak", ["pipeline.max_staleness=1"])
    assert load_config(EIGHT_GPU).training_settings() == one_gpu.training_settings()


def test_an_engine_that_never_sleeps_starts_without_the_sleep_allocator(tmp_path) -> None:
    """vLLM's sleep mode only where the engine sleeps: on one GPU beside a learner of the
    same process, rounds not pipelined. On a Ray worker or beside a pipelined learner the
    engine never sleeps, whatever engine.sleep_mode says."""
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.play import run_engine_config
    from ub.run.steps.rounds import Run

    folder = str(SHAPES / "Qwen3-1.7B-Base")

    def sleeps(preset: str, *overrides: str) -> bool:
        config = load_config(preset, [f"model.base={folder}", *overrides])
        return run_engine_config(Run(RunPaths(tmp_path / "run"), config, folder)).sleep_mode

    assert sleeps("qwen3-1.7b-simpletak")
    assert not sleeps("qwen3-1.7b-simpletak", "pipeline.max_staleness=1")
    assert not sleeps("qwen3-1.7b-simpletak", "cluster.address=auto")
    assert not sleeps(EIGHT_GPU) and not sleeps(EIGHT_GPU, "engine.sleep_mode=true")


def test_a_cluster_plan_warns_about_what_leaves_gpus_idle() -> None:
    """The one-GPU preset on the 8-GPU node as shipped: one shard for seven engines, each
    engine at the 0.6 meant for a GPU it shares, synchronous rounds; and GPU requests the
    plan's layout (a GPU per worker) does not describe."""
    plan = plan_gpus(load_config("qwen3-1.7b-simpletak", ["cluster.address=auto"]),
                     QWEN3_1_7B, 80)
    assert plan.problems == []
    idle, unused, synchronous = plan.warnings[1:]  # (after the KV cache's, issue 43 item 5)
    assert idle == ("rollout.shards 1 < cluster.rollout_workers 7: 6 engine(s) idle every "
                    "round; set rollout.shards to a multiple of 7")
    assert unused == ("each engine alone on its GPU leaves 32.0 GiB of it unused "
                      "(engine.gpu_memory_utilization 0.6): raise it to 0.9 for more KV cache")
    assert synchronous.startswith("rounds are synchronous (pipeline.max_staleness 0)")

    uneven = plan_gpus(load_config(EIGHT_GPU, ["rollout.shards=8"]), QWEN3_1_7B, 80)
    assert uneven.warnings == [
        "rollout.shards 8 is no multiple of cluster.rollout_workers 7: 1 engine(s) play a "
        "shard more each round while the others wait; set rollout.shards to a multiple of 7"]
    shared = plan_gpus(load_config(EIGHT_GPU, ["cluster.rollout.num_gpus=0.5",
                                               "cluster.learner.num_gpus=2"]), QWEN3_1_7B, 80)
    assert shared.warnings == [
        "cluster.rollout.num_gpus 0.5: Ray may put 2 workers on one GPU, where their memory "
        "adds up (the plan gives each a GPU of its own); set it to 1",
        "cluster.learner.num_gpus 2: a learner rank uses one GPU: 1 of each worker's 2 idle; "
        "set it to 1"]


def test_dry_run_of_the_8_gpu_preset(capsys, tmp_path) -> None:
    root = tmp_path / "runs"
    code = main(["train", EIGHT_GPU, "--dry-run", "--root", str(root),
                 "--set", f"model.base={SHAPES / 'Qwen3-1.7B-Base'}"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert "GPUs 0-6 (rollout workers 0-6, one each), 80 GiB each:\n  engine   72.0 GiB" in out
    assert "GPU 7 (learner rank 0), 80 GiB:\n  learner  80.0 GiB: weights 3.2" in out
    assert "warning" not in out and not root.exists()
