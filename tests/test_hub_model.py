"""A hub model (``model.base: ORG/NAME``) on a machine without network: the real
huggingface_hub fetches it from a Hugging Face hub on loopback (``stub_hub.py``) into an empty
cache, once per process, with exactly what vLLM and the learner read; then the engine and the
learner load the snapshot, offline, and checkpoints name the hub id."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from stub_hub import REVISION, stub_hub

REPO = "ub-test/tiny-hub"

# A fresh process, as a Ray worker is: ub's offline default was set before huggingface_hub was
# imported (an earlier engine of the process on a local folder would have), and the run's
# engine settings and learner settings each ask for the model.
FETCH = """
import json, sys
from ub.errors import UbError
from ub.vllm_environment import set_env_defaults
set_env_defaults({"HF_HUB_OFFLINE": "1"}, replace_ours=False)
from ub.run.config.load import validate_config
from ub.run.folder.layout import RunPaths
from ub.run.steps.play import run_engine_config
from ub.run.steps.rounds import Run
config = validate_config({"model": {"base": sys.argv[1]},
                          "envs": [{"env_id": "TicTacToe-v0-train"}]})
run = Run(RunPaths(sys.argv[2]), config, sys.argv[1])
try:
    engine = run_engine_config(run).model
    learner = config.learner_config(run.model_folder()).base_model
except UbError as exc:
    print(json.dumps({"error": str(exc)}))
else:
    print(json.dumps({"engine": engine, "learner": learner}))
"""


def fetch(tmp_path: Path, endpoint: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    clean.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), **env)
    out = subprocess.run([sys.executable, "-c", FETCH, REPO, str(tmp_path / "run")],
                         env=clean, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory) -> Path:
    """The hub's copy of the model: the tiny model, plus PyTorch weights no one reads."""
    folder = tmp_path_factory.mktemp("hub") / "model"
    shutil.copytree(tiny_model, folder)
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 4096)
    return folder


def test_a_hub_model_is_fetched_once_with_what_vllm_and_the_learner_read(served, tmp_path):
    from ub.inference.types import EngineConfig, GenerationRequest, SamplingConfig
    from ub.learner import Learner, LearnerConfig
    from ub.learner.base_identity import model_identity
    from ub.model.lora import LoraSettings
    from ub.run.processes.worker import process_worker

    with stub_hub(served, REPO) as (endpoint, requests):
        got = fetch(tmp_path, endpoint)
    snapshot = Path(got["engine"])
    assert got["learner"] == got["engine"]
    assert snapshot == (tmp_path / "hf" / "hub" / f"models--{REPO.replace('/', '--')}"
                        / "snapshots" / REVISION)
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(
        p.name for p in served.iterdir() if p.suffix != ".bin")
    # Once per process: the engine's settings and the learner's asked, the hub was asked once.
    assert sum("/revision/main" in r for r in requests) == 1
    assert not [r for r in requests if r.endswith(".bin")]

    # This process is offline (as the suite is): the engine and the learner load the snapshot.
    greedy = SamplingConfig(temperature=0.0, max_tokens=4)
    engine = process_worker().engine(EngineConfig(model=str(snapshot)), greedy)
    (gen,) = engine.generate([GenerationRequest("hub", [5, 6, 7], seed=0)])
    assert gen.completion_token_ids
    assert model_identity(snapshot)["path"] == REPO
    learner = Learner(LearnerConfig(base_model=str(snapshot), lora=LoraSettings(rank=8,
                                                                                alpha=16)))
    checkpoint = learner.save(tmp_path / "ckpt")
    adapter = json.loads((checkpoint / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == REPO  # portable: the hub id, not this cache


def test_a_hub_model_that_cannot_be_fetched_says_why_in_one_line(served, tmp_path):
    # The user's own HF_HUB_OFFLINE is obeyed: only the (empty) cache is looked at.
    with stub_hub(served, REPO) as (endpoint, requests):
        offline = fetch(tmp_path, endpoint, HF_HUB_OFFLINE="1")["error"]
    assert not requests
    assert offline.startswith(f"cannot fetch model.base {REPO} from the Hugging Face hub")
    assert "HF_HUB_OFFLINE is set" in offline and f"hf download {REPO}" in offline
    # Nobody listening where the hub should be.
    unreachable = fetch(tmp_path, "http://127.0.0.1:9")["error"]
    assert "check the id, the network and HF_TOKEN" in unreachable
    assert "\n" not in offline + unreachable
