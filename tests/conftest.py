"""Shared fixtures. Tests run offline: nothing is downloaded, W&B is disabled, and the tiny CPU
model is built once per machine (cached by content key under ``UB_CACHE_DIR``)."""

from __future__ import annotations

import os

import pytest

from ub.inference.vllm_engine import configure_vllm_environment

# Before anything imports vllm, transformers or wandb.
configure_vllm_environment()
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(scope="session")
def tiny_model():
    """The default tiny CPU model directory (built on first use, then cached)."""
    from ub.model.tiny import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def tiny_adapters(tiny_model, tmp_path_factory):
    """Two different rank-8 LoRA adapters of the tiny model with non-zero weights."""
    from ub.model.lora import LoraSettings, new_adapter

    root = tmp_path_factory.mktemp("adapters")
    return [
        new_adapter(tiny_model, root / f"adapter-{i}", LoraSettings(rank=8, alpha=16),
                    seed=i, init_std=0.05)
        for i in (1, 2)
    ]


@pytest.fixture()
def engine(tiny_model):
    """The process's vLLM engine on the tiny model (started once, shared by tests)."""
    from ub.inference.vllm_engine import EngineConfig, SamplingConfig, get_engine

    # The CLI's default engine settings, so in-process `ub play` tests reuse this engine.
    return get_engine(EngineConfig(model=str(tiny_model)),
                      SamplingConfig(temperature=1.0, max_tokens=16))
