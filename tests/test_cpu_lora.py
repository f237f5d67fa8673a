"""ub's CPU LoRA ops give each token its own adapter's product, and base-model tokens none.

The reference is the per-token definition vLLM's torch ops implement (``x @ W[index].T``), with
index -1 meaning "no adapter" as on the GPU. The engine-level checks (mixed batches equal alone,
more adapters than slots) are in test_vllm_engine.py.
"""

from __future__ import annotations

import pytest
import torch

from ub.inference import cpu_lora


def reference(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    rows = [torch.zeros(weights.shape[1]) if i < 0 else weights[i] @ x
            for x, i in zip(inputs, indices.tolist(), strict=True)]
    return torch.stack(rows)


@pytest.fixture
def case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(37, 24, generator=g)
    weights = torch.randn(4, 1, 8, 24, generator=g)  # 4 slots, rank 8, hidden 24 (vLLM's 4D)
    indices = torch.randint(-1, 4, (37,), generator=g)
    indices[:3] = -1
    return inputs, weights, indices


def test_shrink_is_per_token_product_and_base_rows_get_zero(case) -> None:
    inputs, weights, indices = case
    out = torch.full((37, 8), 99.0)
    cpu_lora.bgmv_shrink(inputs, weights, out, indices, scaling=0.5)
    torch.testing.assert_close(out, 0.5 * reference(inputs, weights, indices))
    assert out[:3].abs().sum() == 0  # base-model rows: no delta (upstream read slot -1)


@pytest.mark.parametrize("add", [True, False])
def test_expand_and_expand_slice_match_the_reference(case, add: bool) -> None:
    indices = case[2]
    g = torch.Generator().manual_seed(1)
    lora_b = torch.randn(4, 1, 24, 8, generator=g)
    shrunk = torch.randn(37, 8, generator=g)
    expected = reference(shrunk, lora_b, indices)

    base = torch.randn(37, 30, generator=g)
    out = base.clone()
    cpu_lora.bgmv_expand(shrunk, lora_b, out, indices, add_inputs=add)
    torch.testing.assert_close(out[:, :24], expected + (base[:, :24] if add else 0))
    torch.testing.assert_close(out[:, 24:], base[:, 24:])  # padding beyond the adapter's width

    out = base.clone()
    cpu_lora.bgmv_expand_slice(shrunk, lora_b, out, indices, 3, 24, add_inputs=add)
    torch.testing.assert_close(out[:, 3:27], expected + (base[:, 3:27] if add else 0))
    torch.testing.assert_close(out[:, :3], base[:, :3])


def test_one_adapter_for_all_rows_and_no_adapter_at_all(case) -> None:
    inputs, weights, _ = case
    for index in (2, -1):
        indices = torch.full((37,), index)
        out = torch.empty(37, 8)
        cpu_lora.bgmv_shrink(inputs, weights, out, indices)
        torch.testing.assert_close(out, reference(inputs, weights, indices))
