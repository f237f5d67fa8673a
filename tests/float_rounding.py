"""Tolerances from the float arithmetic a test checks, not from the CPU it was written on.

Two computations that differ only in the order of their float32 sums (micro-batches, padding,
attention kernels, AVX2's 8 lanes against AVX-512's 16) agree to the rounding of those sums;
the optimizer can magnify that rounding, and these bounds say by how much.
"""

from __future__ import annotations

import torch

FLOAT32_UNIT = 2.0 ** -24
"""float32's unit roundoff: one rounding is within this much of its value, relatively."""


def sum_rounding(terms: int, scale: float) -> float:
    """How far two float32 sums of ``terms`` terms of magnitude at most ``scale`` can be apart,
    whatever order each adds them in (the classic bound: ``terms`` roundings of ``scale``)."""
    return terms * FLOAT32_UNIT * scale


def gradients_within_rounding(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                              terms: int) -> None:
    """Assert that two sets of gradients agree to the rounding of sums of ``terms`` terms at
    the scale of the largest expected element."""
    assert found.keys() == expected.keys()
    scale = max(float(g.abs().max()) for g in expected.values())
    for name, grad in expected.items():
        torch.testing.assert_close(found[name], grad, rtol=0,
                                   atol=sum_rounding(terms, scale), msg=name)


def adam_first_step_bound(gradient: torch.Tensor, other: torch.Tensor, lr: float, eps: float,
                          weight: torch.Tensor) -> torch.Tensor:
    """How far apart one Adam(W) step from zero moments puts a weight, element by element,
    when two computations gave it ``gradient`` and ``other``.

    The step is ``lr * g / (|g| + eps)``: its slope in ``g`` is ``lr * eps / (|g| + eps)^2``,
    largest where ``|g|`` is smallest (0 where the two gradients' signs differ). So near
    ``eps`` a rounding of ``g`` is magnified up to ``lr / eps`` times (an element whose gradient
    was 1e-8 moved 2e-6 apart on an AVX2-only EPYC). Plus the rounding of the step itself.
    """
    smallest = torch.where(gradient.sign() == other.sign(),
                           torch.minimum(gradient.abs(), other.abs()), 0.0)
    return (lr * eps * (gradient - other).abs() / (smallest + eps) ** 2
            + 4 * FLOAT32_UNIT * (weight.abs() + lr))
