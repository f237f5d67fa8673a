"""Shapes that repeat: ``learner.pad_to_multiple`` (micro-batch widths padded, the plan counting
the padding) and ``learner.attention_kernel`` (SDPA's kernel while the learner scores).

Padding changes no score: rows are right-padded, attention is causal and the padding is never
scored. Both default off the GPU, so the CPU computes exactly as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from float_rounding import adam_first_step_bound, gradients_within_rounding
from pydantic import ValidationError

from ub.learner import Learner, LearnerConfig, plan_micro_batches
from ub.learner.batching import pad_right, padded_width, resolve_pad_to_multiple
from ub.learner.kernels import resolve_attention_kernel
from ub.learner.testing import synthetic_batch
from ub.model.lora import LoraSettings

VOCAB = 500


@pytest.fixture(scope="module")
def model_dir(small_qwen3: Path) -> Path:
    return small_qwen3


def config(model_dir: Path, **overrides) -> LearnerConfig:
    settings = dict(base_model=str(model_dir), lora=LoraSettings(rank=8, alpha=16, dropout=0.0),
                    learning_rate=5e-3, length_normalizer=16, micro_batch_tokens=256, seed=3)
    return LearnerConfig(**{**settings, **overrides})


def test_widths_are_padded_so_that_the_models_input_is_a_multiple() -> None:
    # The model sees width - 1 tokens (the last token is only a target).
    assert [padded_width(w, 64) for w in (1, 2, 64, 65, 66, 129, 130)] == \
        [1, 65, 65, 65, 129, 129, 193]
    assert [padded_width(w, 1) for w in (1, 7, 130)] == [1, 7, 130]
    ids, scored = torch.ones(2, 10, dtype=torch.int64), torch.ones(2, 9, dtype=torch.bool)
    padded_ids, padded_scored = pad_right(ids, scored, 4)
    assert padded_ids.shape == (2, 13) and padded_scored.shape == (2, 12)
    assert padded_ids[:, 10:].eq(0).all() and not padded_scored[:, 9:].any()
    assert pad_right(ids, scored, 1)[0] is ids


def test_the_plan_counts_the_padded_width_against_the_budget() -> None:
    lengths = [90, 10, 70, 65, 30, 12]
    assert plan_micro_batches(lengths, 200, None, 1) == plan_micro_batches(lengths, 200, None)
    for budget in (130, 200, 300):
        for group in plan_micro_batches(lengths, budget, None, 64):
            width = padded_width(max(lengths[i] for i in group), 64)
            assert len(group) == 1 or len(group) * width <= budget
    # 90 -> 129 wide: two such rows (258) no longer fit a 200-token budget.
    assert plan_micro_batches(lengths, 200, None, 64)[0] == [0]


def test_defaults_pad_and_pick_kernels_on_cuda_only() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_pad_to_multiple("auto", cpu) == 1
    assert resolve_pad_to_multiple("auto", cuda) == 128
    assert resolve_pad_to_multiple(32, cpu) == 32
    assert resolve_attention_kernel("auto", cpu) == "torch"
    assert resolve_attention_kernel("auto", cuda) == "cudnn"
    assert resolve_attention_kernel("flash", cpu) == "flash"
    with pytest.raises(ValidationError, match="positive integer or auto"):
        LearnerConfig(base_model="m", pad_to_multiple=0)


def test_padding_changes_no_score_and_the_model_sees_repeating_widths(model_dir: Path) -> None:
    batch = synthetic_batch(6, VOCAB, seed=1)
    ids, scored = batch.input_ids, batch.completion_mask[:, 1:] > 0
    found = {}
    for multiple in (1, 16):  # (the rows as they are: packed rows' widths are their own)
        learner = Learner(config(model_dir, pad_to_multiple=multiple, pack_prefixes=False))
        widths: list[int] = []
        embed = learner.policy.causal_lm.model.embed_tokens
        hook = embed.register_forward_hook(
            lambda m, i, o, record=widths.append: record(i[0].shape[1]))
        with torch.no_grad():
            found[multiple] = learner.policy.score(ids, scored)
        hook.remove()
        assert widths == [padded_width(ids.shape[1], multiple) - 1]
    assert widths[0] % 16 == 0 and widths[0] > ids.shape[1] - 1
    plain, padded = found[1], found[16]
    assert plain.entropy is not None and padded.entropy is not None
    assert plain.logprobs.shape == padded.logprobs.shape == (int(scored.sum()),)
    torch.testing.assert_close(padded.logprobs, plain.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded.entropy, plain.entropy, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [
    {"pad_to_multiple": 32},
    {"attention_kernel": "flash"},
    {"attention_kernel": "cudnn"},  # (no cuDNN on the CPU: its fallbacks)
    {"attention_kernel": "flash", "gradient_checkpointing": True},  # the recompute's kernel
])
def test_an_update_is_the_same_with_shapes_that_repeat(model_dir: Path, overrides) -> None:
    """Padding and kernels change only the order of float32 sums: the gradients agree to that
    rounding, and the update to what one Adam step makes of it (:mod:`float_rounding`)."""
    batch = synthetic_batch(8, VOCAB, seed=2)
    plain, repeating = Learner(config(model_dir)), Learner(config(model_dir, **overrides))
    plain.accumulate_gradients(batch)
    repeating.accumulate_gradients(batch)
    grads, repeated_grads = plain.lora_gradients(), repeating.lora_gradients()
    # A LoRA gradient sums over the batch's tokens (and no more terms than that).
    gradients_within_rounding(repeated_grads, grads, terms=batch.input_ids.numel())

    expected, metrics = plain.update(batch), repeating.update(batch)
    assert metrics["attention_kernel"] == overrides.get("attention_kernel", "torch")
    assert metrics["pad_to_multiple"] == overrides.get("pad_to_multiple", 1)
    assert metrics["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-7)
    assert not expected["grad_clipped"] and expected["optimizer_steps"] == 1
    lr, eps = expected["learning_rate"], plain.config.adam_eps
    state, repeated_state = plain.lora_state(), repeating.lora_state()
    for name, weight in state.items():
        bound = adam_first_step_bound(grads[name], repeated_grads[name], lr, eps, weight)
        assert ((repeated_state[name] - weight).abs() <= bound).all(), name


def test_the_cpu_default_computes_as_before(model_dir: Path) -> None:
    learner = Learner(config(model_dir))
    assert (learner.policy.attention_kernel, learner.policy.pad_to_multiple) == ("torch", 1)
    metrics = learner.update(synthetic_batch(8, VOCAB, seed=2))
    assert (metrics["adapter_compute"], metrics["attention_kernel"],
            metrics["pad_to_multiple"]) == ("float32", "torch", 1)
