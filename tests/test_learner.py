"""The learner on real decisions: a tiny random Qwen3 model plays TicTacToe and Nim through vLLM
(CPU), and the learner trains on the stored token ids and sampling logprobs of those decisions.

One vLLM engine (LoRA enabled) and one learner (one loaded base model) serve the whole module.
The engine starts first: an in-process vLLM pins this process's threads when it starts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
from float_rounding import gradients_within_rounding

import ub.learner.update
from ub.actors.spec import parse_actor
from ub.batch import Batch, BatchConfig, collate
from ub.data.shards import ShardId, write_shard
from ub.distributed import Ranks
from ub.errors import UbError
from ub.games.specs import GameSpec
from ub.inference.types import EngineConfig, GenerationRequest, SamplingConfig
from ub.learner import (
    Learner,
    LearnerConfig,
    learn_step,
    read_manifest,
)
from ub.learner.testing import build_random_model, synthetic_batch
from ub.learner.update import scored_at_start
from ub.model.lora import LoraSettings
from ub.rollout import assign_games, play_games
from ub.run.processes.worker import process_worker
from ub.vllm_environment import configure_vllm_environment

GAMES = (GameSpec("TicTacToe-v0-train"), GameSpec("Nim-v0-train"))
MAX_TOKENS = 16
LORA = LoraSettings(rank=8, alpha=16)


def learner_config(model_dir: Path, **overrides) -> LearnerConfig:
    settings = dict(base_model=str(model_dir), lora=LORA, length_normalizer=MAX_TOKENS,
                    learning_rate=1e-3, max_grad_norm=None, micro_batch_tokens=2048)
    return LearnerConfig(**{**settings, **overrides})


# ------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random model whose tokenizer knows the games' text (prompts of 40-80 tokens)."""
    random_players = [parse_actor("random")] * 2
    scripted = play_games([a for i, game in enumerate(GAMES)
                           for a in assign_games(game, random_players, 20, 0, first_index=20 * i)])
    corpus = [o + "\n\nYour action:" for o in scripted.steps["observation"].to_pylist()]
    return build_random_model(tmp_path_factory.mktemp("model"), corpus=corpus)


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    configure_vllm_environment(cache_dir=tmp_path_factory.mktemp("vllm"))
    config = EngineConfig(model=str(model_dir), max_model_len=512, max_num_seqs=64,
                          enable_lora=True, max_lora_rank=LORA.rank, max_loras=2,
                          kv_cache_gib=0.25)
    yield process_worker().engine(config, SamplingConfig(temperature=1.0, max_tokens=MAX_TOKENS))
    process_worker().close_engine()


@pytest.fixture(scope="module")
def learner(model_dir: Path, engine) -> Learner:
    # The process's learner (learn_step is given the process's worker and reuses it), loaded
    # after the engine started.
    return process_worker().learner(learner_config(model_dir))


@pytest.fixture(scope="module")
def trained(learner: Learner, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint whose adapter visibly changes the model (a few large REINFORCE steps).
    The synthetic batch's sampling logprobs are made up, not the model's: no importance
    correction towards them (it would weigh its tokens ~0.05)."""
    learner.configure(learner_config(model_dir, learning_rate=0.05,
                                     algorithm_params={"tis_cap": None}))
    learner.start(None)
    batch = synthetic_batch(16, vocab_size=500, seed=1)
    for _ in range(3):
        learner.update(batch)
    return learner.save(tmp_path_factory.mktemp("ckpt") / "trained")


@pytest.fixture(scope="module")
def rollout(engine, trained: Path):
    """Real decisions: the trained checkpoint plays TicTacToe and Nim against a random player
    (either seat) at temperature 1 through vLLM: prompts of several lengths."""
    actors = [parse_actor(f"model:{trained}"), parse_actor("random")]
    games = [a for i, game in enumerate(GAMES)
             for a in assign_games(game, actors, 8, base_seed=5, first_index=8 * i)]
    return play_games(games, engine=engine, run="t", base_seed=5)


def model_rows(rollout) -> pa.Table:
    return rollout.steps.filter(pc.equal(rollout.steps["actor_kind"], "model"))


def decisions(rollout, advantages=None) -> Batch:
    """The rollout's model decisions as a batch; advantages ``+-1`` by a hash of the
    completion unless given (identical completions get the same sign)."""
    rows = model_rows(rollout)
    tensors = collate(rows)
    if advantages is None:
        signs = [1.0 if hashlib.md5(str(ids).encode()).digest()[0] % 2 else -1.0
                 for ids in rows["completion_token_ids"].to_pylist()]
        advantages = torch.tensor(signs)
    return Batch(input_ids=tensors.input_ids, completion_mask=tensors.completion_mask,
                      behaviour_logprobs=tensors.behaviour_logprobs,
                      advantages=advantages.float(), lengths=tensors.lengths)


def sequence_logprobs(learner: Learner, batch: Batch) -> torch.Tensor:
    return (learner.token_logprobs(batch) * batch.completion_mask).sum(1)


# ------------------------------------------------------------------------------------------
# Algorithms on real decisions
# ------------------------------------------------------------------------------------------


def test_reinforce_raises_positive_and_lowers_negative_completions(
        learner: Learner, model_dir: Path, rollout, trained: Path) -> None:
    learner.configure(learner_config(model_dir, learning_rate=2e-3))
    learner.start(trained)
    batch = decisions(rollout)
    positive = batch.advantages > 0
    assert 0 < int(positive.sum()) < len(batch), "the test needs both signs"
    before = sequence_logprobs(learner, batch)
    metrics = learner.update(batch)
    delta = sequence_logprobs(learner, batch) - before
    assert metrics["update"] == read_manifest(trained)["update"] + 1
    assert metrics["rows_trained"] == len(batch) and metrics["completion_tokens"] > 0
    assert bool((delta[positive] > 0).all()), delta[positive]
    assert bool((delta[~positive] < 0).all()), delta[~positive]


def test_ppo_is_on_policy_on_vllm_samples(learner: Learner, model_dir: Path, rollout,
                                          trained: Path) -> None:
    """vLLM's sampling logprobs (temperature 1, the trained adapter) are the learner's logprobs
    of the same tokens: the learner scores exactly what was sampled, so PPO's ratio is 1."""
    learner.configure(learner_config(model_dir, algorithm="ppo",
                                     algorithm_params={"clip_eps": 0.2}))
    learner.start(trained)
    batch = decisions(rollout)
    mask = batch.completion_mask.bool()
    diff = (learner.token_logprobs(batch) - batch.behaviour_logprobs)[mask]
    assert float(diff.abs().max()) < 1e-3

    metrics = learner.accumulate_gradients(batch)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["clip_fraction"] == 0.0
    # k3 is >= 0 term by term, but float32 rounding of (r - 1) - log r near r = 1 can leave a
    # sum of -2e-10 (seen on an AMD EPYC): zero within rounding is what on-policy means here.
    assert abs(metrics["approx_kl"]) < 1e-6
    assert metrics["logprob_abs_diff_max"] < 1e-3

    assert metrics["tis_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["tis_capped_fraction"] == 0.0

    # After a large step on the same data the policy has moved away from the sampler: the
    # learner-to-sampler ratios leave 1 (the importance weights, capped), the k3 KL grows.
    learner.configure(learner_config(model_dir, algorithm="ppo", learning_rate=0.05))
    learner.update(batch)
    moved = learner.accumulate_gradients(batch)
    assert moved["tis_capped_fraction"] > 0 and moved["tis_ratio_max"] > 2.0
    assert moved["approx_kl"] > 1e-4
    # Against the weights of its own update's start (no steps taken yet) PPO's ratio is 1.
    assert moved["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and moved["clip_fraction"] == 0


def _gradients(learner: Learner, batch: Batch) -> dict[str, torch.Tensor]:
    metrics = learner.accumulate_gradients(batch)
    return {**learner.lora_gradients(), "metrics": metrics}  # type: ignore[dict-item]


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float) -> bool:
    """The two gradients agree to ``rtol`` of their norm (the on-policy weights are 1 only
    within vLLM's and the learner's float rounding, ~1e-4 here)."""
    keys = [k for k in a if k != "metrics"]
    diff = torch.cat([(a[k] - b[k]).flatten() for k in keys]).norm()
    return bool(diff <= rtol * torch.cat([b[k].flatten() for k in keys]).norm())


@pytest.mark.parametrize("algorithm", ["reinforce", "ppo"])
def test_truncated_importance_sampling_caps_what_the_sampler_misjudged(
        learner: Learner, model_dir: Path, rollout, trained: Path, algorithm: str) -> None:
    """vLLM on a GPU scores tokens unlike the learner. Here the sampler's logprobs of half the
    rows are lowered by 3 on purpose (the learner finds those tokens e^3 = 20x likelier than
    the sampler did): each such token weighs the cap (2), exactly as if its row's advantage
    were doubled, and the update says how many tokens were capped; the other rows, on which
    sampler and learner agree, weigh 1."""
    learner.configure(learner_config(model_dir, algorithm=algorithm))
    learner.start(trained)
    batch = decisions(rollout)
    misjudged = torch.arange(len(batch)) % 2 == 0
    perturbed = Batch(**{**batch.__dict__, "behaviour_logprobs": batch.behaviour_logprobs
                              - 3.0 * misjudged[:, None] * batch.completion_mask})
    doubled = Batch(**{**batch.__dict__,
                            "advantages": batch.advantages * (1 + misjudged.float())})

    on_policy = _gradients(learner, batch)
    capped = _gradients(learner, perturbed)
    assert on_policy["metrics"]["tis_capped_fraction"] == 0.0
    assert on_policy["metrics"]["tis_ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert _close(capped, _gradients(learner, doubled), rtol=1e-3)
    assert not _close(capped, on_policy, rtol=0.1)
    tokens = batch.completion_mask[:, 1:]
    share = float(tokens[misjudged].sum() / tokens.sum())
    assert capped["metrics"]["tis_capped_fraction"] == pytest.approx(share, abs=1e-6)
    assert capped["metrics"]["tis_ratio_max"] == pytest.approx(torch.e ** 3, rel=1e-2)
    assert capped["metrics"]["tis_ratio_mean"] > 1 + share * 10

    # tis_cap: null turns the correction off: the misjudged tokens weigh 20x under ppo (its
    # ratio is then the sampler's: clipped at 1 + eps where the advantage is positive, and
    # unbounded where it is negative), 1x under reinforce.
    learner.configure(learner_config(model_dir, algorithm=algorithm,
                                     algorithm_params={"tis_cap": None}))
    uncorrected = _gradients(learner, perturbed)
    assert "tis_capped_fraction" not in uncorrected["metrics"]
    if algorithm == "reinforce":
        assert _close(uncorrected, on_policy, rtol=1e-3)
    else:
        assert uncorrected["metrics"]["clip_fraction"] > share / 2


def assert_scored_at_its_start(learner: Learner, batch: Batch) -> None:
    """The old log-probs a multi-step update measures against are the learner's at its start,
    on every completion token of ``batch``."""
    start = learner.token_logprobs(batch)
    old = scored_at_start(learner.policy, batch, learner.algorithm, learner.config,
                          Ranks(), None, old_logprobs=True).measured["old_logprobs"]
    mask = batch.completion_mask.bool()
    assert torch.allclose(old[mask], start[mask], atol=1e-5)


def test_an_update_of_several_steps_measures_against_its_start(
        learner: Learner, model_dir: Path, rollout, trained: Path) -> None:
    """PPO with minibatches: every step's trust region and importance weights are measured
    against the learner at the update's start (scored once, before the first step), not
    against the sampler: with the sampler's logprobs lowered by 3 everywhere, the uncorrected
    ratio (20) clips every positive-advantage token, while the corrected update caps the
    importance weights (all of them) and stays inside its trust region."""
    batch = decisions(rollout)
    perturbed = Batch(**{**batch.__dict__, "behaviour_logprobs":
                              batch.behaviour_logprobs - 3.0 * batch.completion_mask})
    learner.configure(learner_config(model_dir, algorithm="ppo", minibatches=2))
    learner.start(trained)
    assert_scored_at_its_start(learner, perturbed)
    corrected = learner.update(perturbed)
    assert corrected["tis_capped_fraction"] == 1.0
    assert corrected["clip_fraction"] < 0.1
    learner.configure(learner_config(model_dir, algorithm="ppo", minibatches=2,
                                     algorithm_params={"tis_cap": None}))
    learner.start(trained)
    assert learner.update(perturbed)["clip_fraction"] > 0.3


def test_a_kl_term_trains_zero_advantage_rows_against_the_updates_start_too(
        learner: Learner, model_dir: Path, rollout, trained: Path) -> None:
    """``kl_coef`` with PPO of several steps (and its truncated importance weights): a row of
    zero advantage still trains (its divergence from the base model), so it is scored at the
    update's start like the others. Left at zero old log-probs, its ratios would be
    ``e^logprob`` (far from 1 on the first step, where every ratio is exactly 1)."""
    batch = decisions(rollout)
    zero = torch.arange(len(batch)) % 2 == 0
    batch = Batch(**{**batch.__dict__,
                     "advantages": torch.where(zero, 0.0, batch.advantages)})
    learner.configure(learner_config(model_dir, algorithm="ppo", minibatches=2, kl_coef=0.1))
    learner.start(trained)
    assert bool(batch.completion_mask[zero].any())
    assert_scored_at_its_start(learner, batch)  # the zero-advantage rows included
    metrics = learner.update(batch)
    assert metrics["rows_trained"] == int((batch.completion_mask[:, 1:].sum(1) > 0).sum())
    assert metrics["approx_kl"] < 0.05 and metrics["kl_to_base"] > 0


def test_learner_scores_at_the_sampling_temperature(learner: Learner, engine, model_dir: Path,
                                                    rollout, trained: Path) -> None:
    prompts = model_rows(rollout)["prompt_token_ids"].to_pylist()[:6]
    sampling = SamplingConfig(temperature=0.7, max_tokens=MAX_TOKENS)
    gens = engine.generate([GenerationRequest(f"temp-{i}", p, seed=i, adapter=str(trained),
                                              sampling=sampling) for i, p in enumerate(prompts)])
    table = pa.table({"prompt_token_ids": [g.prompt_token_ids for g in gens],
                      "completion_token_ids": [g.completion_token_ids for g in gens],
                      "completion_logprobs": [g.completion_logprobs for g in gens]})
    batch = decisions_from(table)
    learner.configure(learner_config(model_dir, algorithm="ppo", temperature=0.7))
    learner.start(trained)
    assert learner.accumulate_gradients(batch)["logprob_abs_diff_max"] < 1e-3
    learner.configure(learner_config(model_dir, algorithm="ppo", temperature=1.0))
    assert learner.accumulate_gradients(batch)["logprob_abs_diff_max"] > 1e-2


def decisions_from(table: pa.Table) -> Batch:
    tensors = collate(table)
    return Batch(input_ids=tensors.input_ids, completion_mask=tensors.completion_mask,
                      behaviour_logprobs=tensors.behaviour_logprobs,
                      advantages=torch.ones(table.num_rows), lengths=tensors.lengths)


@pytest.mark.parametrize("algorithm", ["reinforce", "ppo"])
def test_micro_batching_gives_the_full_batch_gradient(learner: Learner, model_dir: Path,
                                                      rollout, trained: Path,
                                                      algorithm: str) -> None:
    generator = torch.Generator().manual_seed(0)
    rows = model_rows(rollout)
    rows = rows.take(list(range(0, rows.num_rows, max(1, rows.num_rows // 8))))
    batch = decisions_from(rows)
    batch.advantages = torch.randn(len(batch), generator=generator)
    assert len(set(batch.lengths.tolist())) > 1, "the test needs rows of several lengths"
    results = {}
    for name, tokens, size in [("full", None, None), ("one_row", None, 1),
                               ("tokens", 200, None), ("mixed", 400, 3)]:
        learner.configure(learner_config(model_dir, algorithm=algorithm,
                                         micro_batch_tokens=tokens, micro_batch_size=size))
        learner.start(trained)
        metrics = learner.accumulate_gradients(batch)
        results[name] = (metrics, learner.lora_gradients())
    full_metrics, full = results["full"]
    assert full_metrics["micro_batches"] == 1
    for name in ("one_row", "tokens", "mixed"):
        metrics, grads = results[name]
        assert metrics["micro_batches"] > 1
        assert metrics["loss"] == pytest.approx(full_metrics["loss"], rel=1e-5, abs=1e-7)
        # Micro-batches add the batch's tokens in another order.
        gradients_within_rounding(grads, full, terms=batch.input_ids.numel())
    assert results["one_row"][0]["padding_fraction"] == 0.0
    assert full_metrics["padding_fraction"] > 0
    assert results["tokens"][0]["padded_tokens"] < full_metrics["padded_tokens"]


# ------------------------------------------------------------------------------------------
# Checkpoints in vLLM
# ------------------------------------------------------------------------------------------


def test_checkpoint_serves_in_vllm_like_peft(engine, model_dir: Path, rollout,
                                             trained: Path) -> None:
    """The learner's checkpoint is a LoRA adapter vLLM serves; vLLM's greedy tokens equal
    transformers + PEFT greedy tokens with the same adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    prompts = [list(p) for p in dict.fromkeys(
        tuple(p) for p in model_rows(rollout)["prompt_token_ids"].to_pylist())][:4]
    greedy = SamplingConfig(temperature=0.0, max_tokens=MAX_TOKENS)
    gens = engine.generate([GenerationRequest(f"greedy-{i}", p, seed=0, adapter=str(trained),
                                              sampling=greedy) for i, p in enumerate(prompts)])
    base = engine.generate([GenerationRequest(f"base-{i}", p, seed=0, sampling=greedy)
                            for i, p in enumerate(prompts)])
    assert [g.completion_token_ids for g in gens] != [g.completion_token_ids for g in base]

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(trained)).eval()
    eos = model.config.eos_token_id
    for prompt, gen in zip(prompts, gens, strict=True):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS,
                                 do_sample=False, eos_token_id=eos, pad_token_id=eos)
        assert out[0, len(prompt):].tolist() == gen.completion_token_ids


def test_learn_step_from_shards(learner: Learner, model_dir: Path, rollout, trained: Path,
                                tmp_path: Path) -> None:
    """The lead's entry point: shards -> DuckDB batch -> update -> checkpoint; then reuse."""
    root = tmp_path / "run"
    write_shard(root, ShardId(0, 0), "t", rollout.steps, rollout.games)
    batch_config = BatchConfig(batch_size=64, final=["win_draw_loss"], sampling=[])
    config = learner_config(model_dir)
    out = tmp_path / "checkpoints" / "update-1"
    metrics = learn_step(root, batch_config, config, trained, out, worker=process_worker())
    assert metrics["update"] == read_manifest(trained)["update"] + 1
    assert metrics["batch"]["size"] == model_rows(rollout).num_rows
    assert metrics["rows_trained"] > 0 and metrics["grad_norm"] > 0
    assert read_manifest(out)["update"] == metrics["update"]
    again = learn_step(root, batch_config, config, trained, out, worker=process_worker())
    assert again["reused"] is True and again["loss"] == pytest.approx(metrics["loss"])


def test_minibatches_and_epochs_take_several_steps_and_a_failure_undoes_them_all(
        learner: Learner, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``minibatches * epochs`` optimizer steps per update, cut by the learner's saved RNG (so a
    resumed run repeats them); a step failing after others leaves nothing changed."""
    config = learner_config(model_dir, minibatches=2, epochs=2, learning_rate=1e-2,
                            algorithm="ppo")
    batch = synthetic_batch(16, vocab_size=500, seed=3)
    learner.configure(config)
    learner.start(None)
    before = learner.lora_state()
    metrics = learner.update(batch)
    assert metrics["optimizer_steps"] == 4 and metrics["update"] == 1
    assert metrics["grad_norm_max"] >= metrics["grad_norm"] > 0
    after = learner.lora_state()
    assert any(not torch.equal(before[k], after[k]) for k in before)

    learner.start(None)  # the same update again from the cold start: the same weights
    learner.update(batch)
    assert all(torch.equal(after[k], v) for k, v in learner.lora_state().items())

    learner.start(None)
    weights, optimizer = learner.lora_state(), str(learner.optimizer.state_dict())
    original, calls = ub.learner.update.scheduled_learning_rate, []

    def third_step_fails(config, step):
        calls.append(step)
        if len(calls) == 3:
            raise RuntimeError("injected")
        return original(config, step)

    monkeypatch.setattr(ub.learner.update, "scheduled_learning_rate", third_step_fails)
    with pytest.raises(RuntimeError, match="injected"):
        learner.update(batch)
    assert learner.update_index == 0 and calls == [0, 1, 2]
    assert all(torch.equal(weights[k], v) for k, v in learner.lora_state().items())
    assert str(learner.optimizer.state_dict()) == optimizer


def test_target_kl_stops_an_update_before_the_step_that_passes_it(
        learner: Learner, model_dir: Path, rollout, trained: Path) -> None:
    """PPO's early stop: four large steps on one batch move the policy far from where the
    update started; with target_kl the update stops before the first step whose approx_kl
    passes it, and the policy it leaves is the one of the steps it took."""
    def weights(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]

    def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
        return all(torch.allclose(x, y, rtol=1e-5, atol=1e-7) for x, y in zip(a, b, strict=True))

    batch = decisions(rollout)
    settings = dict(algorithm="ppo", minibatches=4, learning_rate=3e-2,
                    algorithm_params={"tis_cap": None})
    learner.configure(learner_config(model_dir, **settings))
    learner.start(trained)
    after_step: list[list[torch.Tensor]] = []  # the policy after each step of the free update
    hook = learner.optimizer.register_step_post_hook(
        lambda optimizer, *_: after_step.append(weights(optimizer)))
    try:
        free = learner.update(batch)
    finally:
        hook.remove()
    assert free["optimizer_steps"] == 4 and not free["early_stopped"] and len(after_step) == 4

    learner.configure(learner_config(model_dir, **settings, target_kl=1e-3))
    learner.start(trained)
    start = weights(learner.optimizer)
    stopped = learner.update(batch)
    taken = stopped["optimizer_steps"]
    assert stopped["early_stopped"] and 1 <= taken < 4  # (the first step always goes)
    assert stopped["stopped_at_kl"] > 1e-3
    # The policy it leaves is the free update's after the same steps, and not one step more.
    left = weights(learner.optimizer)
    assert not same(left, start)
    assert same(left, after_step[taken - 1]) and not same(left, after_step[taken])


def test_target_kl_must_be_positive(model_dir: Path) -> None:
    for bad, problem in ((0.0, "greater than 0"), (-1.0, "greater than 0"),
                         (float("inf"), "a finite number")):
        with pytest.raises(UbError, match=f"^learner.target_kl: Input should be {problem}"):
            LearnerConfig.from_dict({"base_model": str(model_dir), "target_kl": bad})


def test_an_entropy_bonus_lifts_a_collapsed_policy(learner: Learner, model_dir: Path,
                                                   rollout, trained: Path) -> None:
    """A policy collapsed onto what it sampled (REINFORCE on all-positive advantages) and a
    batch whose advantages are all 0 (every reward of the group equal, after normalization):
    without a bonus nothing trains and the entropy stays down; with entropy_coef the same
    batch raises it step by step."""
    batch = decisions(rollout, advantages=torch.ones(len(model_rows(rollout))))
    learner.configure(learner_config(model_dir, learning_rate=1e-2))
    learner.start(trained)
    before = learner.update(batch)["entropy_mean"]
    for _ in range(11):
        learner.update(batch)
    flat = decisions(rollout, advantages=torch.zeros(len(model_rows(rollout))))
    assert learner.update(flat)["rows_trained"] == 0

    learner.configure(learner_config(model_dir, learning_rate=1e-2, entropy_coef=1.0))
    entropies = [learner.update(flat)["entropy_mean"] for _ in range(4)]
    assert entropies[0] < 0.3 * before, "REINFORCE on its own samples should have collapsed it"
    assert entropies == sorted(entropies) and entropies[-1] > 1.5 * entropies[0]


def test_entropy_coef_must_be_a_non_negative_number(model_dir: Path) -> None:
    for bad, problem in ((-0.1, "greater than or equal to 0"), (float("nan"), "a finite number")):
        with pytest.raises(UbError, match=f"^learner.entropy_coef: Input should be {problem}"):
            LearnerConfig.from_dict({"base_model": str(model_dir), "entropy_coef": bad})


def test_a_minibatch_of_zero_advantages_is_a_zero_step_not_a_crash(learner: Learner,
                                                                    model_dir: Path) -> None:
    """Small rounds of drawn mirror games give minibatches whose advantages are all zero (seen
    in a 300-round soak: a KeyError ended the run). Such a step trains no row and reports no
    token means; the update's means are those of the steps that trained."""
    learner.configure(learner_config(model_dir, minibatches=4, algorithm="ppo"))
    learner.start(None)
    batch = synthetic_batch(8, vocab_size=500, seed=3)
    batch.advantages[1:] = 0.0  # one row to train: three of the four minibatches have none
    metrics = learner.update(batch)
    assert metrics["optimizer_steps"] == 4 and metrics["rows_trained"] == 1
    learner.start(None)
    alone = learner.update(synthetic_batch(8, vocab_size=500, seed=3).select([0]))
    assert metrics["logprob_mean"] == pytest.approx(alone["logprob_mean"])


def test_warmup_ramps_the_learning_rate_over_optimizer_steps(learner: Learner,
                                                             model_dir: Path) -> None:
    learner.configure(learner_config(model_dir, minibatches=2, warmup_steps=4,
                                     learning_rate=1e-2))
    learner.start(None)
    batch = synthetic_batch(16, vocab_size=500, seed=3)
    first = learner.update(batch)  # steps 0 and 1: 1/4 and 2/4 of the rate
    assert first["learning_rate"] == pytest.approx((0.25e-2 + 0.5e-2) / 2)
    learner.update(batch)
    assert learner.update(batch)["learning_rate"] == pytest.approx(1e-2)  # steps 4, 5


def test_decay_lowers_the_learning_rate_linearly_to_its_floor(learner: Learner,
                                                              model_dir: Path) -> None:
    learner.configure(learner_config(model_dir, warmup_steps=2, decay_steps=6,
                                     final_lr_fraction=0.2, learning_rate=1e-2))
    learner.start(None)
    batch = synthetic_batch(8, vocab_size=500, seed=3)
    rates = [learner.update(batch)["learning_rate"] for _ in range(8)]
    # Warm-up over steps 0-1, full rate at 2, down by a fifth of the way per step to 0.2 at 6.
    assert rates == pytest.approx([0.5e-2, 1e-2, 1e-2, 0.8e-2, 0.6e-2, 0.4e-2, 0.2e-2, 0.2e-2])


def test_decay_must_end_after_the_warmup(model_dir: Path) -> None:
    with pytest.raises(UbError, match=r"^learner: decay_steps \(8\) must be larger than "
                                      r"warmup_steps"):
        LearnerConfig.from_dict({"base_model": str(model_dir), "warmup_steps": 8,
                                 "decay_steps": 8})


# ------------------------------------------------------------------------------------------
# The KL penalty to the base model
# ------------------------------------------------------------------------------------------


def base_logprobs(model_dir: Path, batch: Batch) -> torch.Tensor:
    """(B, T) logprobs of the batch's tokens under the base model alone (plain transformers,
    no PEFT), 0 outside completions."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits.float()
    scored = torch.log_softmax(logits[:, :-1], -1).gather(
        -1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(scored, (1, 0)) * batch.completion_mask


def test_kl_coef_pulls_a_drifted_adapter_back_to_the_base_model(
        learner: Learner, model_dir: Path, rollout, trained: Path) -> None:
    """With every advantage zero, only the KL term trains: it reports the k3 estimate of
    KL(current || base) against the base model loaded on its own, and its steps bring the
    adapter's logprobs back toward the base's. Without it the same batch trains nothing."""
    batch = decisions(rollout, advantages=torch.zeros(len(model_rows(rollout))))
    mask = batch.completion_mask.bool()
    base = base_logprobs(model_dir, batch)[mask]

    learner.configure(learner_config(model_dir))
    learner.start(trained)
    assert learner.update(batch)["rows_trained"] == 0

    learner.configure(learner_config(model_dir, kl_coef=1.0, learning_rate=5e-3))
    learner.start(trained)
    current = learner.token_logprobs(batch)[mask]
    d = base - current
    expected = float((torch.exp(d) - d - 1).mean())
    metrics = learner.update(batch)
    assert metrics["rows_trained"] == len(batch)
    assert metrics["kl_to_base"] == pytest.approx(expected, rel=1e-3)
    assert expected > 0.05, "the trained adapter should have moved the model"

    for _ in range(4):
        last = learner.update(batch)
    after = learner.token_logprobs(batch)[mask]
    assert float((after - base).abs().mean()) < 0.5 * float((current - base).abs().mean())
    assert last["kl_to_base"] < 0.5 * expected


def test_kl_coef_must_be_a_non_negative_number(model_dir: Path) -> None:
    for bad, problem in ((-0.1, "greater than or equal to 0"), (float("nan"), "a finite number"),
                         ("0.1", "a valid number"), (True, "a valid number")):
        with pytest.raises(UbError, match=f"^learner.kl_coef: Input should be {problem}"):
            LearnerConfig.from_dict({"base_model": str(model_dir), "kl_coef": bad})
