"""``learner.adapter_compute``: the LoRA adapter computed in the base model's dtype (bf16) while
its weights, gradients and AdamW state stay float32 (ub.learner.precision).

On the CPU with a bf16 base model (the CPU's default stays float32): the update's loss and
gradient agree with the float32 adapter's within the tolerances stated below, the fast path
really runs (no float32 copy of any input, PEFT's LoRA modules never called), the adapter
switched off is exactly the base model, a resume is bit for bit, and the memory probe measures
the new compute.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ub.learner import Learner, LearnerConfig
from ub.learner.checkpoint import ADAPTER_WEIGHTS, OPTIMIZER_STATE, RNG_STATE
from ub.learner.precision import model_dtype_class, resolve_adapter_compute
from ub.learner.testing import synthetic_batch
from ub.model.lora import ALL_PROJECTIONS, LoraSettings

VOCAB = 500
LORA = LoraSettings(rank=8, alpha=16, dropout=0.0, target_modules=list(ALL_PROJECTIONS))
LOSS_RTOL = 1e-2
"""The bf16 adapter's loss against the float32 adapter's, relative (measured here: 5e-4)."""
GRAD_RTOL = 3e-2
"""Its LoRA gradient against the float32 adapter's, relative in norm (measured here: 1.1%;
1.6% on a 28-layer model)."""
GRAD_FACTOR = 1.25
"""Its gradient's error against a float32 model, at most this times the error the bf16 base
weights already make with a float32 adapter (measured: 1.09x here, 1.05x at 28 layers)."""


@pytest.fixture(scope="module")
def model_dir(small_qwen3: Path) -> Path:
    return small_qwen3


def config(model_dir: Path, **overrides) -> LearnerConfig:
    settings = dict(base_model=str(model_dir), lora=LORA, learning_rate=5e-3,
                    length_normalizer=16, micro_batch_tokens=512, seed=3)
    return LearnerConfig(**{**settings, **overrides})


def randomize_adapter(learner: Learner, seed: int = 7) -> None:
    """A random adapter of a trained one's size, a fraction of the base weights' output (a
    fresh adapter's B is 0, and so would be A's gradient)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in learner.policy.params.items():
            scale = p.shape[-1] ** -0.5 if ".lora_A." in name else 0.01
            p.copy_(torch.randn(p.shape, generator=generator) * scale)


def loss_and_gradient(model_dir: Path, **overrides) -> tuple[float, dict[str, torch.Tensor]]:
    learner = Learner(config(model_dir, **overrides))
    randomize_adapter(learner)
    metrics = learner.accumulate_gradients(synthetic_batch(8, VOCAB, seed=1))
    return metrics["loss"], learner.lora_gradients()


def relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    diff = sum(float(((a[k] - b[k]) ** 2).sum()) for k in b) ** 0.5
    return diff / sum(float((b[k] ** 2).sum()) for k in b) ** 0.5


def test_auto_computes_in_the_models_dtype_on_cuda_only() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_adapter_compute("auto", cuda, torch.bfloat16) == torch.bfloat16
    assert resolve_adapter_compute("auto", cpu, torch.bfloat16) == torch.float32
    assert resolve_adapter_compute("model", cpu, torch.bfloat16) == torch.bfloat16
    assert resolve_adapter_compute("float32", cuda, torch.bfloat16) == torch.float32
    assert resolve_adapter_compute("auto", cuda, torch.float32) == torch.float32


def test_bf16_compute_agrees_with_float32_on_a_fixed_batch(model_dir: Path) -> None:
    reference = loss_and_gradient(model_dir)  # a float32 model
    fp32 = loss_and_gradient(model_dir, dtype="bfloat16", adapter_compute="float32")
    bf16 = loss_and_gradient(model_dir, dtype="bfloat16", adapter_compute="model")
    assert all(g.dtype == torch.float32 for g in bf16[1].values())
    assert bf16[1].keys() == fp32[1].keys()
    assert abs(bf16[0] - fp32[0]) <= LOSS_RTOL * abs(fp32[0])
    assert 0 < relative(bf16[1], fp32[1]) <= GRAD_RTOL  # (not the same computation)
    assert relative(bf16[1], reference[1]) <= GRAD_FACTOR * relative(fp32[1], reference[1])


def test_the_adapter_computes_in_bf16_and_trains_in_float32(model_dir: Path) -> None:
    for compute, expected in (("model", torch.bfloat16), ("float32", torch.float32)):
        learner = Learner(config(model_dir, dtype="bfloat16", adapter_compute=compute))
        assert learner.policy.adapter_compute == expected
        layers = [m for m in learner.policy.model.modules() if isinstance(m, model_dtype_class())]
        assert len(layers) == 2 * 7  # every projection of both layers
        seen: list[torch.dtype] = []  # inputs of PEFT's own lora_A/lora_B modules
        hooks = [module.register_forward_hook(
            lambda m, i, o, record=seen.append: record(i[0].dtype))
                 for layer in layers for module in (*layer.lora_A.values(),
                                                    *layer.lora_B.values())]
        outputs: list[torch.dtype] = []
        hooks.append(layers[0].register_forward_hook(
            lambda m, i, o, record=outputs.append: record(o.dtype)))
        metrics = learner.update(synthetic_batch(8, VOCAB, seed=2))
        for hook in hooks:
            hook.remove()
        assert outputs and set(outputs) == {torch.bfloat16}
        if compute == "model":  # no float32 copy of the input, PEFT's modules never called
            assert seen == [] and metrics["adapter_compute"] == "bfloat16"
        else:
            assert seen and set(seen) == {torch.float32}
        assert metrics["adapter_compute"] == str(expected).removeprefix("torch.")
        assert all(p.dtype == torch.float32 for p in learner.policy.params.values())
        assert learner.optimizer is not None
        moments = [s[k] for s in learner.optimizer.state.values()
                   for k in ("exp_avg", "exp_avg_sq")]
        assert moments and all(m.dtype == torch.float32 for m in moments)


def test_the_adapter_switched_off_is_the_base_model_exactly(model_dir: Path) -> None:
    """A fresh adapter (B = 0) adds exactly nothing on the fast path, and with the adapter
    switched off (the KL penalty's base model) PEFT's own forward runs."""
    learner = Learner(config(model_dir, dtype="bfloat16", adapter_compute="model"))
    batch = synthetic_batch(4, VOCAB, seed=3)
    ids, scored = batch.input_ids, batch.completion_mask[:, 1:] > 0
    with torch.no_grad():
        with_adapter = learner.policy.score(ids, scored).logprobs
        with learner.policy.model.disable_adapter():
            base = learner.policy.score(ids, scored).logprobs
    assert torch.equal(with_adapter, base)
    learner.configure(config(model_dir, dtype="bfloat16", adapter_compute="model", kl_coef=0.1))
    randomize_adapter(learner)
    metrics = learner.update(batch)
    assert metrics["kl_to_base"] > 0


def test_resume_is_bitwise_with_bf16_compute(model_dir: Path, tmp_path: Path) -> None:
    """Within one setting: checkpoint 1 + update 2 == two updates straight, byte for byte
    (LoRA dropout on: the fast path draws its masks from the learner's streams)."""
    settings = config(model_dir, dtype="bfloat16", adapter_compute="model",
                      lora=LORA.model_copy(update={"dropout": 0.2}))
    b1, b2 = (synthetic_batch(12, VOCAB, seed=10 + i) for i in range(2))
    straight = Learner(settings)
    straight.update(b1)
    first = straight.save(tmp_path / "update-1")
    straight.update(b2)
    two = straight.save(tmp_path / "update-2")
    resumed = Learner(settings)
    resumed.start(first)
    resumed.update(b2)
    again = resumed.save(tmp_path / "update-2-resumed")
    for name in (ADAPTER_WEIGHTS, OPTIMIZER_STATE, RNG_STATE):
        assert (again / name).read_bytes() == (two / name).read_bytes(), name
    # The adapter is saved as PEFT saves it, float32, under the names a float32 learner uses.
    other = Learner(config(model_dir, dtype="bfloat16", adapter_compute="float32"))
    saved = other.save(tmp_path / "float32")
    ours, theirs = load_file(two / ADAPTER_WEIGHTS), load_file(saved / ADAPTER_WEIGHTS)
    assert ours.keys() == theirs.keys()
    assert all(t.dtype == torch.float32 for t in ours.values())


def test_the_memory_probe_measures_the_new_compute(model_dir: Path) -> None:
    """``micro_batch_tokens: auto`` measures with the adapter's compute: fewer bytes per token
    in bf16 (no float32 copies of the inputs), measured again when the setting changes."""
    learner = Learner(config(model_dir, dtype="bfloat16", adapter_compute="float32",
                             micro_batch_tokens="auto"))
    learner.micro_batch_tokens()
    assert learner.budget.fit is not None
    fp32 = learner.budget.fit.bytes_per_token
    learner.configure(config(model_dir, dtype="bfloat16", adapter_compute="model",
                             micro_batch_tokens="auto"))
    assert learner.budget.fit is None  # forgotten: measured again
    learner.micro_batch_tokens()
    assert learner.budget.fit is not None
    assert learner.budget.fit.bytes_per_token < 0.9 * fp32


def test_the_cpu_keeps_float32_unless_asked(model_dir: Path) -> None:
    learner = Learner(config(model_dir))
    assert learner.policy.dtype == torch.float32
    assert learner.policy.adapter_compute == torch.float32
    assert all(m.ub_compute_dtype is None for m in learner.policy.model.modules()
               if isinstance(m, model_dtype_class()))  # PEFT's own forward
    bf16 = Learner(config(model_dir, dtype="bfloat16"))
    assert bf16.policy.adapter_compute == torch.float32  # auto: float32 off CUDA
