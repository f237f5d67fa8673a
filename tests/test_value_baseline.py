"""``learner.algorithm: a2c`` (ub/learner/algorithms/a2c.py): a value head on the policy's last
hidden state, trained with the policy, advantages from it (the return less the value, or GAE
over a seat's whole game), saved beside the adapter and restored bit for bit; the learner knows
it only by what a2c declares (the head it trains, the column it adds, its statistics)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file

from ub.batch import Batch
from ub.errors import UbError
from ub.learner import Learner, LearnerConfig, gae, make_algorithm
from ub.learner.checkpoint import ADAPTER_WEIGHTS, module_file, read_manifest
from ub.learner.testing import build_random_model, synthetic_batch
from ub.model.lora import LoraSettings

VOCAB = 500
HEAD_FILE = module_file("value_head")  # what a2c's build() names its head


def config(model_dir: Path, **overrides) -> LearnerConfig:
    settings = dict(base_model=str(model_dir), lora=LoraSettings(rank=8, alpha=16),
                    learning_rate=1e-3, length_normalizer=16, micro_batch_tokens=512, seed=3,
                    algorithm="a2c", algorithm_params={"value_learning_rate": 0.05})
    return LearnerConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def learner(model_dir: Path) -> Learner:
    return Learner(config(model_dir))


def test_gae_equals_a_hand_computation() -> None:
    rewards, values, gamma, lam = [0.0, 0.5, 1.0], [0.2, -0.1, 0.4], 0.9, 0.8
    d2 = 1.0 - 0.4  # the last decision: nothing follows
    d1 = 0.5 + 0.9 * 0.4 - (-0.1)
    d0 = 0.0 + 0.9 * -0.1 - 0.2
    a2 = d2
    a1 = d1 + 0.9 * 0.8 * a2
    a0 = d0 + 0.9 * 0.8 * a1
    assert gae(rewards, values, gamma, lam) == pytest.approx([a0, a1, a2])
    # lambda 1: the discounted return less the value; lambda 0: the one-step TD error
    returns = [0.0 + 0.9 * (0.5 + 0.9 * 1.0), 0.5 + 0.9 * 1.0, 1.0]
    assert gae(rewards, values, gamma, 1.0) == pytest.approx(
        [g - v for g, v in zip(returns, values, strict=True)])
    assert gae(rewards, values, gamma, 0.0) == pytest.approx([d0, d1, d2])


def _seat_batch(returns: list[float], values: list[float], moves_after: list[int],
                invalid: list[bool] | None = None) -> Batch:
    """Rows of one game: seat 0's decisions at turns 0, 2, 4 and seat 1's at 1, 3 (tensors
    are placeholders: prepare reads the returns, the values measured and the rows)."""
    n = len(returns)
    rows = pa.table({"game_id": ["g"] * n, "seat": [t % 2 for t in range(n)],
                     "turn": list(range(n)), "seat_moves_after": moves_after,
                     "invalid_move": invalid or [False] * n})
    zeros = torch.zeros(n, 4)
    return Batch(input_ids=zeros.long(), completion_mask=zeros, behaviour_logprobs=zeros,
                 advantages=torch.full((n,), 9.0), lengths=torch.full((n,), 4), rows=rows,
                 returns=torch.tensor(returns), measured={"values": torch.tensor(values)})


def test_a2c_advantages_are_the_return_less_the_value_or_gae_over_a_whole_seat() -> None:
    returns, values = [0.25, -0.5, 0.5, -1.0, 1.0], [0.1, 0.2, -0.3, 0.0, 0.4]
    plain = make_algorithm("a2c").prepare(_seat_batch(returns, values, [2, 1, 1, 0, 0]),
                                          random.Random(0))
    assert plain.advantages.tolist() == pytest.approx([g - v for g, v in zip(returns, values,
                                                                              strict=True)])
    assert plain.returns is not None and plain.returns.tolist() == pytest.approx(returns)
    # (the batch's advantages, 9 here, are not what a2c reads: it reads the returns)

    gamma, lam = 0.5, 0.7
    a2c = make_algorithm("a2c", {"gae_lambda": lam, "gamma": gamma})
    whole = a2c.prepare(_seat_batch(returns, values, [2, 1, 1, 0, 0]), random.Random(0))
    for seat in (0, 1):  # r_t = G_t - gamma G_{t+1}; the last decision's reward is its return
        rows = [t for t in range(5) if t % 2 == seat]
        g = [returns[t] for t in rows]
        rewards = [g[k] - gamma * g[k + 1] for k in range(len(g) - 1)] + [g[-1]]
        want = gae(rewards, [values[t] for t in rows], gamma, lam)
        assert whole.advantages[rows].tolist() == pytest.approx(want, abs=1e-6)
    # Seat 0 misses its middle decision (moves after: 2, then 0): that seat keeps G - V.
    holed = a2c.prepare(_seat_batch(returns, values, [2, 1, 0, 0, 0]), random.Random(0))
    assert holed.advantages[[0, 2, 4]].tolist() == pytest.approx(
        [returns[t] - values[t] for t in (0, 2, 4)])


def test_a2c_caps_an_invalid_moves_advantage_after_its_own_normalization() -> None:
    """A return capped at -1 is diluted once a2c subtracts the value and standardizes (what is
    left of -1 depends on the batch); a2c's invalid_move_cap caps the advantage it trains on."""
    returns, values = [0.25, -1.0, 0.5, -1.0, 1.0], [0.1, 0.2, -0.3, -0.9, 0.4]
    invalid = [False, True, False, True, False]
    plain = make_algorithm("a2c", {"normalize": True}).prepare(
        _seat_batch(returns, values, [2, 1, 1, 0, 0], invalid), random.Random(0))
    assert plain.advantages[3] > -1.0  # the transform's -1, diluted: G - V = -0.1 here
    capped = make_algorithm("a2c", {"normalize": True, "invalid_move_cap": -1.0}).prepare(
        _seat_batch(returns, values, [2, 1, 1, 0, 0], invalid), random.Random(0))
    for row in range(5):
        want = min(plain.advantages[row].item(), -1.0) if invalid[row] else \
            plain.advantages[row].item()
        assert capped.advantages[row].item() == pytest.approx(want)
    assert capped.returns is not None and capped.returns.tolist() == pytest.approx(returns)
    with pytest.raises(UbError, match=r"invalid_move_cap: Input should be less than 0"):
        make_algorithm("a2c", {"invalid_move_cap": 0.5})
    no_column = _seat_batch(returns, values, [2, 1, 1, 0, 0])
    no_column = dataclasses.replace(no_column, rows=no_column.rows.drop_columns(["invalid_move"]))
    with pytest.raises(UbError, match="reads the batch's invalid_move column"):
        make_algorithm("a2c", {"invalid_move_cap": -1.0}).prepare(no_column,
                                                                        random.Random(0))


def test_the_value_head_learns_a_known_return(learner: Learner, model_dir: Path) -> None:
    """Returns +1 for prompts ending in one token, -1 for another: the head, on the
    policy's hidden state at the prompt's end, learns to tell them apart."""
    learner.configure(config(model_dir))
    learner.start(None)
    batch = synthetic_batch(16, vocab_size=VOCAB, seed=5)
    returns = torch.tensor([1.0 if b % 2 else -1.0 for b in range(len(batch))])
    ids = batch.input_ids.clone()
    for b in range(len(batch)):  # the prompt's last token says the return
        last = int(torch.nonzero(batch.completion_mask[b])[0]) - 1
        ids[b, last] = 7 if b % 2 else 11
    batch = dataclasses.replace(batch, input_ids=ids, returns=returns)
    first = learner.update(batch)
    assert first["value_mean"] == 0.0  # the head starts at 0: the advantages are the returns
    assert first["value_mse"] == pytest.approx(1.0)
    for _ in range(30):
        last = learner.update(batch)
    values = learner.measure(batch)["values"]
    assert last["value_mse"] < 0.1
    assert torch.all(values * returns > 0.5), values


TIMINGS = ("seconds", "tokens_per_second", "peak_rss_mb", "peak_gpu_gib")


def assert_same_checkpoint(found: Path, expected: Path) -> None:
    """Every file of two checkpoints byte for byte, but the update's timings in metrics.json
    (and so its size and sha256 in the manifest)."""
    assert sorted(p.name for p in found.iterdir()) == sorted(p.name for p in expected.iterdir())
    for path in sorted(expected.iterdir()):
        mine, theirs = (found / path.name).read_bytes(), path.read_bytes()
        if path.name == "metrics.json":
            mine, theirs = (json.dumps({k: v for k, v in json.loads(x).items()
                                        if k not in TIMINGS}) for x in (mine, theirs))
        elif path.name == "ub_checkpoint.json":
            mine, theirs = (json.dumps({**json.loads(x), "files": {
                k: v for k, v in json.loads(x)["files"].items() if k != "metrics.json"}})
                for x in (mine, theirs))
        assert mine == theirs, path.name


def test_resume_with_the_head_is_bit_equal_and_peft_ignores_it(
        learner: Learner, model_dir: Path, tmp_path: Path) -> None:
    learner.configure(config(model_dir))
    learner.start(None)
    b1, b2 = (synthetic_batch(12, vocab_size=VOCAB, seed=s) for s in (1, 2))
    learner.update(b1)
    saved = learner.save(tmp_path / "update-1")
    assert HEAD_FILE in read_manifest(saved)["files"]
    head = load_file(saved / HEAD_FILE)
    assert set(head) == {"value_head.linear.weight", "value_head.linear.bias"}
    learner.update(b2)
    straight = learner.save(tmp_path / "straight-2")

    resumed = Learner(config(model_dir))
    resumed.start(saved)
    resumed.update(b2)
    # Every file of the checkpoint: the adapter, its AdamW state and the head's, the head, the
    # RNG streams, the metrics (value_mse and value_mean among them).
    assert_same_checkpoint(resumed.save(tmp_path / "resumed-2"), straight)
    assert json.loads((straight / "metrics.json").read_text())["algorithm_statistics"] == [
        "tis_capped_fraction", "tis_ratio_max", "tis_ratio_mean", "value_mean", "value_mse"]
    assert {f"exp_avg/value_head.linear.{w}" for w in ("weight", "bias")} <= set(
        load_file(straight / "optimizer.safetensors"))

    # PEFT reads the folder as a plain adapter (the head is not in adapter_model.safetensors)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = load_file(saved / ADAPTER_WEIGHTS)
    assert not any("value_head" in key for key in adapter)
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), saved)

    # A checkpoint without a head cannot resume a2c (it would start its baseline over), and
    # an a2c checkpoint cannot resume an algorithm that trains no head (it would drop it).
    plain = Learner(config(model_dir, algorithm="reinforce", algorithm_params={}))
    no_head = plain.save(tmp_path / "reinforce-0")
    with pytest.raises(UbError, match=r"has no value_head\.safetensors \(what the algorithm "
                                      r"trains besides the adapter\): it was trained by "
                                      r"'reinforce'"):
        resumed.start(no_head)
    with pytest.raises(UbError, match=r"holds value_head\.safetensors, which the algorithm does "
                                      r"not train: it was trained by 'a2c'"):
        plain.start(saved)


def test_a2c_settings_out_of_range_are_refused() -> None:
    with pytest.raises(UbError, match=r"^learner\.algorithm_params\.gae_lambda: Input should "
                                      r"be less than or equal to 1 \(got 1\.5\)$"):
        make_algorithm("a2c", {"gae_lambda": 1.5})
    with pytest.raises(UbError, match=r"^learner\.algorithm_params\.value_learning_rate: Input "
                                      r"should be greater than 0 \(got 0\)$"):
        make_algorithm("a2c", {"value_learning_rate": 0})


def test_a2c_is_refused_a_batch_whose_sampling_stage_makes_advantages(
        model_dir: Path, tmp_path: Path) -> None:
    """a2c reads returns and makes its own advantages: ``ub learn`` with a sampling transform
    is refused before any data is read, as a run's preflight refuses it (one line)."""
    from ub.batch import BatchConfig
    from ub.learner import learn_step

    with pytest.raises(UbError, match=r"^batch\.sampling: \[normalize_per_env\] makes the "
                                      r"batch's advantages, and learner\.algorithm 'a2c' reads "
                                      r"its returns .*: set batch\.sampling: \[\]"):
        learn_step(tmp_path / "no-data", BatchConfig(), config(model_dir), None, tmp_path / "out")
    assert not (tmp_path / "out").exists()
