"""Both GPU presets play and learn one round on the CPU, as shipped but for their sizes.

The model is a random Qwen3 of the real vocabulary size (151,936) and head size (128), two
layers of width 64; its tokenizer is the tiny model's (a byte-level BPE with the chat tokens
``<|im_start|>``/``<|im_end|>``): there is no Qwen tokenizer on a machine without network, and
the vocabulary that matters for memory and the output layer is the model's. Each preset keeps
its template, LoRA rank and alpha, ``max_loras``, algorithm (and so its ``tis_cap``), reward
transforms and gradient checkpointing; only what sizes a run changes (:data:`SIZES`). The
evaluation is off (``eval.every: 0``): it plays the same engine and template as the round.
What only a GPU runs (bfloat16, sleep mode, Liger, vLLM's GPU arguments) is checked elsewhere
(``test_vllm_engine.py``, ``test_learner_memory.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from ub.learner.testing import build_qwen3
from ub.run.config.base_model import resolve_base_model
from ub.run.config.load import load_config
from ub.run.folder.layout import RunPaths
from ub.run.processes.worker import Worker
from ub.run.steps.learn import initial_checkpoint, learn_round
from ub.run.steps.plan import plan_round
from ub.run.steps.play import rollout_shard
from ub.run.steps.rounds import Run, open_run

GPU_PRESETS = ("qwen3-1.7b-simpletak", "spiral-kuhn")
QWEN3_VOCAB = 151_936
SIZES = ["rounds=1", "engine.max_model_len=2048", "engine.max_num_seqs=4",
         "engine.kv_cache_gib=0.25", "sampling.max_tokens=16", "rollout.games_per_round=2",
         "rollout.concurrency=2", "batch.batch_size=4", "batch.max_train_len=2048",
         "eval.every=0"]


@pytest.fixture(scope="module")
def random_qwen3(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = build_qwen3(tmp_path_factory.mktemp("qwen3") / "model", vocab_size=QWEN3_VOCAB,
                         hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=128)
    for file in Path(tiny_model).iterdir():
        if file.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(file, folder / file.name)
    return folder


def _without(data: dict[str, Any], dotted: str) -> None:
    *parents, last = dotted.split("=")[0].split(".")
    for key in parents:
        data = data[key]
    data.pop(last, None)


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_a_gpu_preset_plays_and_learns_a_round_on_the_cpu(preset: str, random_qwen3: Path,
                                                          tmp_path: Path,
                                                          own_worker: Worker) -> None:
    shipped = load_config(preset)
    config = load_config(preset, [f"model.base={random_qwen3}", *SIZES])
    as_shipped, sized = shipped.model_dump(), config.model_dump()
    for setting in ["model.base", *SIZES]:
        _without(as_shipped, setting)
        _without(sized, setting)
    assert sized == as_shipped  # (everything but the sizes)

    paths = RunPaths.of(tmp_path, preset)
    open_run(paths, config)
    run = Run(paths, config, resolve_base_model(config))
    worker = own_worker
    try:
        initial_checkpoint(run, worker=worker)
        shards = [rollout_shard(run, 0, shard, games, worker=worker)
                  for shard, games in enumerate(plan_round(run, 0))]
        metrics = learn_round(run, 0, worker=worker)
        engine = worker._engine
        assert engine is not None
        assert engine.config.max_loras == shipped.engine.max_loras
        assert engine.config.max_lora_rank == shipped.engine.max_lora_rank == 32
        assert engine.tokenizer is not None and len(engine.tokenizer) < QWEN3_VOCAB
    finally:
        worker.close()

    assert sum(s.games for s in shards) == 2 and sum(s.model_decisions for s in shards) > 0
    steps = pq.read_table(paths.train_data / "steps").to_pylist()
    assert {row["template"] for row in steps} == {"qwen3-zs"}
    assert all(row["prompt"].startswith("<|im_start|>user\n") for row in steps)
    # The algorithm's truncated importance sampling ran (its statistics exist with a tis_cap).
    assert metrics["tokens"] > 0 and "tis_ratio_mean" in metrics
    adapter = json.loads((paths.checkpoint(1) / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (shipped.learner.lora.rank,
                                                     shipped.learner.lora.alpha)
    model = json.loads((random_qwen3 / "config.json").read_text())
    assert model["vocab_size"] == QWEN3_VOCAB and model["head_dim"] == 128
