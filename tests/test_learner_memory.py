"""The learner's memory on a GPU, exercised on the CPU through the same code: micro-batches
sized from the memory the learner has (``micro_batch_tokens: auto``), an out-of-memory update
retried at half the micro-batch, the body's kernels (``learner.policy.kernels``), and the engine's
sleep around a round's update.

What only a GPU shows (a real CUDA out-of-memory error, Liger's kernels, vLLM's sleep mode)
comes in here as the one thing faked: the out-of-memory error is raised by a hook, the device's
free memory is a patched ``torch.cuda.mem_get_info``, vLLM's sleep/wake calls are recorded.
``bench/gpu_learner.py`` measures the real thing on a GPU.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from ub.errors import UbError
from ub.learner import Learner, LearnerConfig
from ub.learner.kernels import resolve_kernels
from ub.learner.memory import (
    CPU_MICRO_BATCH_TOKENS,
    HEADROOM,
    auto_micro_batch_tokens,
    device_budget,
    learner_budget_bytes,
    longest_row_tokens,
)
from ub.learner.testing import build_qwen3, synthetic_batch
from ub.model.lora import LoraSettings

GIB = 2**30


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3(tmp_path_factory.mktemp("qwen3"), vocab_size=2000, hidden_size=64,
                       intermediate_size=128, num_hidden_layers=2)


def config(model: Path, **overrides) -> LearnerConfig:
    settings = dict(base_model=str(model), lora=LoraSettings(rank=4, alpha=8, dropout=0.1),
                    length_normalizer=16, learning_rate=1e-2, seed=5)
    return LearnerConfig(**{**settings, **overrides})


def batch(seed: int = 0):
    return synthetic_batch(40, 2000, seed=seed, prompt_lengths=(10, 60),
                           completion_lengths=(5, 30))


# ------------------------------------------------------------------------------------------
# micro_batch_tokens: auto
# ------------------------------------------------------------------------------------------


def test_auto_size_is_the_budget_over_the_bytes_per_token() -> None:
    """10 GiB at 1 MiB a token hold 10,240 tokens; activations may fill 85% of the memory
    (the rest for fragmentation and temporaries): 8,704 tokens, 34 x 256 exactly, the
    micro-batch and the longest row alike. (Pinned by hand: a larger headroom, 95%, would
    make it 9,728, and micro-batches that run a real GPU out of memory.)"""
    assert auto_micro_batch_tokens(10 * GIB, 2**20) == int(HEADROOM * 10 * 1024) // 256 * 256
    assert auto_micro_batch_tokens(10 * GIB, 2**20) == longest_row_tokens(10 * GIB, 2**20) \
        == 8704
    assert auto_micro_batch_tokens(10 * GIB, 3 * 2**20) == 2816  # 2,901.3 fit: 11 x 256
    assert auto_micro_batch_tokens(10 * GIB, 2**20, cap=4096) == 4096
    assert auto_micro_batch_tokens(-GIB, 2**20) == 256  # nothing left: the smallest size


def test_a_gpu_shared_with_an_awake_engine_gives_the_learner_its_share() -> None:
    """On an 80 GB GPU where vLLM takes 0.6, the learner gets 0.4 of it less what it holds,
    even before the engine has allocated its share; with no share (alone, or the engine
    asleep), whatever is free; never more than is free."""
    budget = learner_budget_bytes
    assert budget(free=70 * GIB, total=80 * GIB, own=4 * GIB, device_share=0.4) \
        == 0.4 * 80 * GIB - 4 * GIB
    assert budget(free=70 * GIB, total=80 * GIB, own=4 * GIB, device_share=None) == 70 * GIB
    assert budget(free=10 * GIB, total=80 * GIB, own=4 * GIB, device_share=0.4) \
        == 10 * GIB  # someone took it


def test_on_a_gpu_the_learners_own_cache_counts_as_free() -> None:
    """The driver's free memory leaves out what the learner's allocator cached (its last
    micro-batches' blocks), which the learner reuses first."""

    class Gpu:  # (no GPU here: the figures torch.cuda would report)
        def mem_get_info(self, device=None):
            return 20 * GIB, 80 * GIB

        def memory_reserved(self, device=None):
            return 54 * GIB

        def memory_allocated(self, device=None):
            return 4 * GIB

    cuda = torch.device("cuda", 0)
    assert device_budget(cuda, 4 * GIB, None, memory=Gpu()) == (70 * GIB, None)
    assert device_budget(cuda, 4 * GIB, 0.4, memory=Gpu()) == (28 * GIB, None)


def test_auto_measures_the_model_and_fits_the_memory_it_has(model_dir: Path,
                                                            monkeypatch) -> None:
    """auto on the CPU: 4,096 tokens where memory allows; with little memory, what fits it by
    the probe's measured bytes per token: twice the memory, about twice the tokens; a deeper
    model, fewer."""
    learner = Learner(config(model_dir))
    assert learner.micro_batch_tokens() == CPU_MICRO_BATCH_TOKENS
    assert learner.update(batch())["micro_batch_tokens"] == CPU_MICRO_BATCH_TOKENS

    import psutil

    def sized(layers: int, available_mib: int) -> int:
        class Memory:
            available = available_mib * 2**20  # (half of it for the learner's activations)

        monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory)
        path = model_dir.parent / f"layers-{layers}"
        if not path.exists():
            build_qwen3(path, vocab_size=2000, hidden_size=128, intermediate_size=512,
                        num_hidden_layers=layers)
        return Learner(config(path)).micro_batch_tokens()

    small, double, deeper = sized(2, 128), sized(2, 256), sized(6, 128)
    assert 256 <= deeper < small < CPU_MICRO_BATCH_TOKENS
    assert double == pytest.approx(2 * small, abs=256)


def test_probe_leaves_the_learner_as_it_was(model_dir: Path) -> None:
    """Sizing auto draws no randomness and changes no weight: an update after it equals one
    with the same size given."""
    auto, given = Learner(config(model_dir)), Learner(config(model_dir, micro_batch_tokens=4096))
    auto.update(batch())
    given.update(batch())
    for name, value in auto.lora_state().items():
        assert torch.equal(value, given.lora_state()[name]), name


def small_memory(monkeypatch, mib: int) -> None:
    """The CPU learner's memory (half of what the system has available) made ``mib`` MiB."""
    import psutil

    class Memory:
        available = 2 * mib * 2**20

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory)


def test_a_row_longer_than_the_memory_holds_is_refused_before_the_update(
        model_dir: Path, monkeypatch) -> None:
    """A row is never split: with auto, one whose activations alone pass the learner's
    memory is refused before any pass, in one line naming the setting that bounds it;
    nothing changes. Rows that fit train as usual; a given micro_batch_tokens is trusted."""
    small_memory(monkeypatch, 4)
    learner = Learner(config(model_dir))
    learner.micro_batch_tokens()
    fit = learner.budget.fit
    assert fit is not None and fit.longest_row == longest_row_tokens(4 * 2**20,
                                                                     fit.bytes_per_token)
    long_rows = synthetic_batch(6, 2000, prompt_lengths=(fit.longest_row, fit.longest_row),
                                completion_lengths=(5, 5))
    before = learner.lora_state()
    with pytest.raises(UbError) as refused:
        learner.update(long_rows)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        f"update 1: a row of {fit.longest_row + 5:,} tokens does not fit the learner's memory "
        "in one micro-batch")
    assert message.endswith(f"set batch.max_train_len (ub learn: --max-train-len) to at most "
                            f"{fit.longest_row:,}, or learner.gradient_checkpointing: true")
    with pytest.raises(UbError, match="does not fit the learner's memory"):
        learner.accumulate_gradients(long_rows)
    for name, value in learner.lora_state().items():
        assert torch.equal(value, before[name]), name
    assert learner.update_index == 0

    short_rows = synthetic_batch(6, 2000, prompt_lengths=(10, fit.longest_row - 5),
                                 completion_lengths=(5, 5))
    assert learner.update(short_rows)["rows_trained"] == 6
    trusted = Learner(config(model_dir, micro_batch_tokens=fit.longest_row))
    assert trusted.update(long_rows)["micro_batches"] == 6  # (a row each, longer than it)


# ------------------------------------------------------------------------------------------
# Out of memory: the update again at half the micro-batch
# ------------------------------------------------------------------------------------------


def fail_above(learner: Learner, tokens: int) -> list[int]:
    """Make the decoder raise CUDA's out-of-memory error for an input of more than ``tokens``
    tokens (what a GPU does when a micro-batch's activations do not fit); returns the sizes it
    saw."""
    seen: list[int] = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen.append(int(ids.numel()))
        if ids.numel() > tokens:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    learner.policy.causal_lm.model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def test_out_of_memory_retries_the_update_at_half_the_micro_batch(model_dir: Path, caplog
                                                                  ) -> None:
    """2,048 -> 1,024 -> 512 tokens, one log line each; the update equals one made at 512 from
    the start (LoRA dropout's draws included: a failed try consumes no randomness), and later
    updates keep the smaller size."""
    retried = Learner(config(model_dir, micro_batch_tokens=2048))
    seen = fail_above(retried, 600)
    direct = Learner(config(model_dir, micro_batch_tokens=512))
    with caplog.at_level(logging.WARNING, logger="ub.learner.learner"):
        metrics = retried.update(batch())
    assert [r.getMessage() for r in caplog.records] == [
        "learner: out of memory at micro_batch_tokens=2048 in update 1; retrying it at 1024",
        "learner: out of memory at micro_batch_tokens=1024 in update 1; retrying it at 512"]
    assert max(seen) > 600 and metrics["micro_batch_tokens"] == 512
    reference = direct.update(batch())
    assert metrics["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    for name, value in retried.lora_state().items():
        torch.testing.assert_close(value, direct.lora_state()[name], rtol=1e-5, atol=1e-7)

    caplog.clear()
    assert retried.update(batch(1))["micro_batch_tokens"] == 512
    assert not caplog.records


def test_out_of_memory_with_one_row_per_micro_batch_says_what_to_change(model_dir: Path
                                                                        ) -> None:
    learner = Learner(config(model_dir, micro_batch_tokens=1024))
    before = learner.lora_state()
    fail_above(learner, 0)
    with pytest.raises(UbError, match=r"out of memory with one row per micro-batch .*"
                                      r"gradient_checkpointing"):
        learner.update(batch())
    for name, value in learner.lora_state().items():  # nothing changed
        assert torch.equal(value, before[name])
    assert learner.update_index == 0


# ------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------


def test_kernels_auto_is_none_on_the_cpu_and_liger_says_why_it_cannot_run(model_dir: Path
                                                                          ) -> None:
    learner = Learner(config(model_dir, micro_batch_tokens=4096))
    assert learner.policy.kernels == "none"
    metrics = learner.update(batch())
    assert metrics["kernels"] == "none" and metrics["liger_kernels"] == []
    with pytest.raises(UbError, match=r"^learner.kernels is liger, but the learner runs on "
                                      r"cpu, and Liger's kernels are CUDA-only"):
        Learner(config(model_dir, kernels="liger"))
    # On a GPU without the gpu extra: auto falls back, liger says what to install.
    cuda = torch.device("cuda", 0)
    if not _liger_installed():
        assert resolve_kernels("auto", cuda, "qwen3") == "none"
        with pytest.raises(UbError, match=r"liger-kernel is not installed \(pip install"):
            resolve_kernels("liger", cuda, "qwen3")
    with pytest.raises(UbError, match=r"learner\.kernels: got 'fast'; input should be "
                                      r"'auto', 'liger' or 'none'"):
        LearnerConfig.from_dict({"base_model": str(model_dir), "kernels": "fast"})


@pytest.fixture()
def recording_liger(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Liger Kernel as the learner finds it, on the CPU: a stand-in ``liger_kernel`` whose
    Qwen3 patch function (the real one launches Triton kernels, CUDA-only) records each call,
    with the settings it got and how many LoRA layers the model had then, and patches each
    decoder layer's MLP as Liger's SwiGLU does: its forward replaced by one that calls the
    MLP's own projections (counted, to show the patched module runs in the update)."""
    import importlib.machinery
    import sys
    import types

    from peft.tuners.tuners_utils import BaseTunerLayer

    import ub.learner.kernels

    calls: list[dict] = []

    def apply_liger_kernel_to_qwen3(model, **settings) -> None:
        lora_layers = sum(isinstance(m, BaseTunerLayer) for m in model.modules())
        call = {"settings": settings, "lora_layers": lora_layers, "mlp_runs": 0}
        calls.append(call)
        for layer in model.model.layers:
            mlp = layer.mlp

            def swiglu(x, mlp=mlp):
                call["mlp_runs"] += 1
                return mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))

            mlp.forward = swiglu

    names = ("liger_kernel", "liger_kernel.transformers", "liger_kernel.transformers.monkey_patch")
    for name in names:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(sys.modules[names[-1]], "MODEL_TYPE_TO_APPLY_LIGER_FN",
                        {"qwen3": apply_liger_kernel_to_qwen3}, raising=False)
    monkeypatch.setattr(ub.learner.kernels, "LIGER_DEVICE_TYPES", frozenset({"cuda", "cpu"}))
    return calls


def test_liger_patches_the_base_model_before_lora_wraps_it_and_the_learner_records_it(
        model_dir: Path, recording_liger: list[dict]) -> None:
    """``learner.policy.kernels: auto`` where Liger runs: its patch function gets the loaded model
    with no LoRA layer yet and ub's settings (body kernels on, loss kernels off); PEFT then
    wraps the projections the patched MLP calls, so the update runs the patched modules and
    trains their LoRA weights; each update's metrics name the kernels (the round manifest and
    the run's ``learner`` view take them from there). A model PEFT wrapped is refused."""
    from ub.learner.kernels import LIGER_SETTINGS, apply_kernels

    learner = Learner(config(model_dir, micro_batch_tokens=4096))
    assert learner.policy.kernels == "liger"
    (call,) = recording_liger
    assert call["settings"] == LIGER_SETTINGS and call["lora_layers"] == 0
    mlp = learner.policy.causal_lm.model.layers[0].mlp
    assert all(isinstance(getattr(mlp, name).lora_A, torch.nn.ModuleDict)
               for name in ("gate_proj", "up_proj", "down_proj"))

    before = {name: value.clone() for name, value in learner.lora_state().items()
              if ".mlp." in name and "lora_B" in name}
    metrics = learner.update(batch())
    assert metrics["kernels"] == "liger"
    assert metrics["liger_kernels"] == ["rope", "rms_norm", "swiglu"]
    assert call["mlp_runs"] > 0
    after = learner.lora_state()
    assert before and all(not torch.equal(after[name], value) for name, value in before.items())

    with pytest.raises(UbError, match="before PEFT wraps it"):
        apply_kernels("liger", learner.policy.causal_lm)
    assert len(recording_liger) == 1


def _liger_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


# ------------------------------------------------------------------------------------------
# The engine sleeps through a round's update
# ------------------------------------------------------------------------------------------

ROUND_CONFIG = {
    "seed": 3, "rounds": 1, "model": {"base": "tiny"},
    "sampling": {"temperature": 1.0, "max_tokens": 8, "stop": ["]"]},
    "envs": [{"env_id": "TicTacToe-v0-train"}],
    "rollout": {"games_per_round": 4, "concurrency": 4},
    "batch": {"batch_size": 16}, "eval": {"every": 0},
}


def test_the_engine_sleeps_through_the_update_unless_rounds_are_pipelined(
        tiny_model, tmp_path: Path, own_worker) -> None:
    """Not pipelined: the engine sleeps after the round's games and before the learner's update,
    and wakes after it (vLLM's sleep and wake calls recorded: sleep mode is CUDA-only).
    Pipelined, the engine plays the next round meanwhile: it stays awake."""
    from ub.run.config.base_model import resolve_base_model
    from ub.run.config.load import validate_config
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.learn import initial_checkpoint, learn_round
    from ub.run.steps.plan import plan_round
    from ub.run.steps.play import rollout_shard
    from ub.run.steps.rounds import Run, open_run

    worker = own_worker  # one engine and one learner for both runs, as a process keeps them
    calls: list[str] = []
    try:
        for staleness in (0, 1):
            config = validate_config({**ROUND_CONFIG, "pipeline": {"max_staleness": staleness}})
            paths = RunPaths.of(tmp_path, f"staleness-{staleness}")
            open_run(paths, config)
            run = Run(paths, config, resolve_base_model(config))
            initial_checkpoint(run, worker=worker)
            for shard, games in enumerate(plan_round(run, 0)):
                rollout_shard(run, 0, shard, games, worker=worker)
            engine = worker._engine
            assert engine is not None
            if staleness == 0:
                assert not engine.can_sleep  # the CPU: no sleep mode
                engine.can_sleep = True  # as on a GPU, with vLLM's own calls recorded
                engine._llm.sleep = lambda level: calls.append(f"sleep {level}")
                engine._llm.wake_up = lambda: calls.append("wake")
                learner = worker.learner(config.learner_config(run.base_model))
                update = learner.update
                learner.update = lambda batch, update=update: (calls.append("update")
                                                               or update(batch))
            calls.append(f"staleness {staleness}")
            metrics = learn_round(run, 0, worker=worker)
            assert metrics["kernels"] == "none" and metrics["micro_batch_tokens"] == 4096
    finally:
        worker.close()
    assert calls == ["staleness 0", "sleep 1", "update", "wake", "staleness 1", "update"]
