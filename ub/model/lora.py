"""LoRA adapters on disk: the PEFT format that both the learner and vLLM load.

:func:`new_adapter` writes a fresh adapter for a base model. With ``init_std=0`` it is PEFT's
standard initialisation (B = 0, so the adapter starts as the base model): the learner's cold
start. A positive ``init_std`` perturbs B so the adapter changes the outputs, which tests and
benchmarks use to exercise real LoRA compute.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import Field

from ub.errors import UbError
from ub.settings import Section

__all__ = ["ALL_PROJECTIONS", "LoraSettings", "new_adapter"]

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of a Llama/Qwen-style block: the default LoRA targets."""


class LoraSettings(Section):
    """LoRA hyper-parameters (rank, alpha and targets must match a resumed checkpoint's).

    ``target_modules`` is a list, as YAML gives it (strict pydantic takes no list for a tuple):
    two settings are equal only with the targets in the same order, while a checkpoint's
    compatibility check ignores their order (:func:`ub.learner.base_identity.check_compatible`).
    """

    rank: int = Field(16, ge=1, description="Adapter rank r (<= engine.max_lora_rank).")
    alpha: int | float = Field(32, gt=0, description="Scaling numerator: the update is scaled "
                               "by alpha / r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter input in "
                           "training.")
    target_modules: list[str] = Field(default_factory=lambda: list(ALL_PROJECTIONS),
                                      min_length=1, description="Module names that get "
                                      "adapters.")

    key = "learner.lora"

    def peft_config(self) -> Any:
        """PEFT's ``LoraConfig`` of these settings (a causal LM's adapter, no bias)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
            target_modules=list(self.target_modules), bias="none", task_type="CAUSAL_LM",
        )


def new_adapter(
    base_model: str | Path,
    out_dir: str | Path,
    lora: LoraSettings | None = None,
    *,
    seed: int = 0,
    init_std: float = 0.0,
) -> Path:
    """Write a new LoRA adapter for ``base_model`` to ``out_dir`` (atomically) and return it
    (``lora``: the default settings when not given)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    if not (Path(base_model) / "config.json").exists():
        raise UbError(f"base model {base_model} has no config.json: is it a model directory?")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32)
    peft_model = get_peft_model(model, (lora or LoraSettings()).peft_config())
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
