"""The data-parallel learner (``ub.distributed``): two real learner processes joined by
``torch.distributed`` (gloo, as NCCL would join GPUs) take the same updates as one process on
the whole batch, and only rank 0 writes checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from faults.runs import free_port
from safetensors.torch import load_file

from ub.learner.checkpoint import ADAPTER_WEIGHTS, OPTIMIZER_STATE, module_file
from ub.learner.testing import build_random_model

METRICS = ("loss", "grad_norm", "entropy_mean", "logprob_mean")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("model"))


def learners(world: int, model_dir: Path, out: Path, micro_batch_tokens: int,
             algorithm: str) -> None:
    """Run ``world`` learner processes at once (ranks 0..world-1) and wait for them all."""
    out.mkdir()
    address = f"127.0.0.1:{free_port()}"
    code = ("import sys; from ub.learner.testing import data_parallel_updates as run; "
            "run(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], "
            "int(sys.argv[6]), algorithm=sys.argv[7])")
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(rank), str(world), address,
                               str(model_dir), str(out), str(micro_batch_tokens), algorithm],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    for rank in ranks:
        _, err = rank.communicate(timeout=300)
        assert rank.returncode == 0, err[-3000:]


# 64 tokens: many micro-batches, unevenly split; 4096: one, so rank 1 has none. a2c (REINFORCE
# less a value head) also shows the ranks scoring the values at the start between them and
# summing the head's gradients.
@pytest.mark.parametrize(("micro_batch_tokens", "algorithm"), [(64, "a2c"), (4096, "reinforce")])
def test_two_ranks_take_the_one_process_update(model_dir, tmp_path, micro_batch_tokens,
                                               algorithm):
    learners(1, model_dir, tmp_path / "one", micro_batch_tokens, algorithm)
    learners(2, model_dir, tmp_path / "two", micro_batch_tokens, algorithm)
    one = json.loads((tmp_path / "one" / "metrics-0.json").read_text())[-1]
    for rank in (0, 1):
        two = json.loads((tmp_path / "two" / f"metrics-{rank}.json").read_text())[-1]
        for key in ("tokens", "completion_tokens", "micro_batches", "rows_trained", "update"):
            assert two[key] == one[key], key
        for key in METRICS:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    for update in (1, 2):
        names = (ADAPTER_WEIGHTS, OPTIMIZER_STATE) + (
            (module_file("value_head"),) if algorithm == "a2c" else ())
        for name in names:
            expected = load_file(tmp_path / "one" / f"ckpt-{update}" / name)
            found = load_file(tmp_path / "two" / f"ckpt-{update}" / name)
            assert found.keys() == expected.keys()
            for key, tensor in expected.items():
                # (float sums in another order, through Adam's normalisation: ~1e-6 apart)
                torch.testing.assert_close(found[key], tensor, rtol=1e-3, atol=1e-5)
    # The second update started from the first's checkpoint, which only rank 0 wrote.
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [
        "ckpt-1", "ckpt-2", "metrics-0.json", "metrics-1.json"]


def test_a_rank_that_cannot_reach_the_group_says_so():
    # (in a process of its own: a failed init would spoil torch.distributed for this one)
    code = ("import sys; from ub.distributed import join\n"
            "try: join(1, 2, sys.argv[1], timeout_minutes=0.05)\n"
            "except Exception as e: print(type(e).__name__, e)")
    address = f"127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                         timeout=120).stdout
    assert out.startswith(f"UbError learner rank 1 of 2 cannot join the process group at "
                          f"{address}"), out
