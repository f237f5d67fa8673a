"""LoRA adapters on disk: the PEFT format that both the learner and vLLM load.

:func:`new_adapter` writes a fresh adapter for a base model. With ``init_std=0`` it is PEFT's
standard initialisation (B = 0, so the adapter starts as the base model): the learner's cold
start. A positive ``init_std`` perturbs B so the adapter changes the outputs, which tests and
benchmarks use to exercise real LoRA compute.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.run.sections import ALL_PROJECTIONS, LoraSection, default_of

__all__ = ["ALL_PROJECTIONS", "LoraSettings", "new_adapter"]


def _schema(name: str) -> Callable[[], Any]:
    """The default of the schema's field ``name``, as a dataclass default factory."""
    return lambda: default_of(LoraSection, name)


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyper-parameters: the fields, defaults and meanings of
    :class:`ub.run.sections.LoraSection` (``target_modules`` as a tuple)."""

    rank: int = field(default_factory=_schema("rank"))
    alpha: int = field(default_factory=_schema("alpha"))
    dropout: float = field(default_factory=_schema("dropout"))
    target_modules: tuple[str, ...] = field(
        default_factory=lambda: tuple(default_of(LoraSection, "target_modules")))

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
            target_modules=list(self.target_modules), bias="none", task_type="CAUSAL_LM",
        )


def new_adapter(
    base_model: str | Path,
    out_dir: str | Path,
    lora: LoraSettings = LoraSettings(),
    *,
    seed: int = 0,
    init_std: float = 0.0,
) -> Path:
    """Write a new LoRA adapter for ``base_model`` to ``out_dir`` (atomically) and return it."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    if not (Path(base_model) / "config.json").exists():
        raise UbError(f"base model {base_model} has no config.json: is it a model directory?")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32)
    peft_model = get_peft_model(model, lora.peft_config())
    if init_std > 0:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * init_std)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    peft_model.save_pretrained(str(tmp), safe_serialization=True)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir
