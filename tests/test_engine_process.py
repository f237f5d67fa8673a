"""The engine tests again with vLLM's engine in a separate process
(``VLLM_ENABLE_V1_MULTIPROCESSING=1``), as it runs on every GPU: generation, LoRA hot-swap,
abort and KV capacity on one shared engine (each start of the separate process costs ~30 s
on 2 cores: the engine core and its worker are spawned processes that import vLLM), then its
death, its replacement and its close.

The tests that only read run the bodies of ``test_vllm_engine.py`` (imported: pytest runs
them here with this module's ``engine``). The CPU engine keeps the separate process's layout:
this process renders and detokenizes, the engine core schedules, and (on the CPU only) a worker
process of its own runs the model, with ub's CPU LoRA ops (the mixed batch's test: vLLM's own
gave base-model rows an adapter's delta there, :mod:`ub.inference.cpu_lora_worker`).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_vllm_engine import (  # noqa: F401  (pytest collects what is imported)
    GREEDY,
    PROMPTS,
    adapters,
    engine_config,
    model_dir,
    req,
    test_aborted_requests_never_come_out,
    test_base_and_adapters_mixed_in_one_batch_match_alone,
    test_continuous_batching_step_loop,
    test_generation_tokens_text_and_logprobs,
    test_kv_cache_capacity_is_known_and_checked_against_the_run,
    test_lora_changes_output_and_hot_swaps,
    test_more_adapters_than_max_loras,
    test_same_seed_same_completion_and_different_seeds_differ,
    tokens,
)

from ub.errors import UbError
from ub.inference.handle import EngineHandle
from ub.inference.types import SamplingConfig
from ub.inference.watch import EngineDied
from ub.run.processes.worker import process_worker
from ub.vllm_environment import configure_vllm_environment

SEPARATE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


@pytest.fixture(scope="module")
def engine(model_dir: Path,  # noqa: F811  (the fixture imported above)
           tmp_path_factory: pytest.TempPathFactory):
    """The process's engine, in a separate process (a value the user exported: the engine's
    start keeps it), for the whole module."""
    configure_vllm_environment(cache_dir=tmp_path_factory.mktemp("cache"))
    worker = process_worker()
    worker.close_engine()  # (an earlier module's in-process engine)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SEPARATE_PROCESS.items():
            patch.setenv(name, value)
        handle = worker.engine(engine_config(model_dir), SamplingConfig(max_tokens=16))
        assert engine_processes(handle), "the engine runs in this process"
        yield handle
        worker.close_engine()


def test_masked_moves_are_sampled_in_the_engine_process(engine: EngineHandle,
                                                        model_dir: Path) -> None:  # noqa: F811
    """The legal-move mask's logits processor loads in vLLM's engine process (by its import
    path) and holds a reasoning completion's move to the legal ones there too."""
    from test_legal_moves import check_spelled_moves

    check_spelled_moves(engine, model_dir, "qwen3-zs")


def engine_processes(handle: EngineHandle) -> list:
    """The engine's separate processes (``multiprocessing.Process``), none when in-process."""
    core = handle.engine._engine.engine_core
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    return list(getattr(manager, "processes", None) or [])


def test_a_dead_engine_raises_then_is_replaced_and_a_closed_one_leaves_no_process(
        engine: EngineHandle) -> None:
    """Runs last: it kills the module's engine. The engine process SIGKILLed with requests in
    flight: the waiting step raises :class:`EngineDied` within seconds (never a hang), naming
    the process and its exit; every later use raises it too, and dropping the requests does
    not wait on the dead process. The worker replaces the engine on its next use (the same
    tokens as before), and closing that one ends its processes."""
    before = tokens(engine, [req(p, sampling=GREEDY) for p in PROMPTS[:3]])
    (core,) = engine_processes(engine)
    for request in (in_flight := [req(p, sampling=SamplingConfig(max_tokens=200))
                                  for p in PROMPTS]):
        engine.submit(request)
    os.kill(core.pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(EngineDied, match=rf"process .*\(pid {core.pid}\) exited"):
        while engine.has_unfinished():
            engine.step()
    assert time.monotonic() - started < 30
    assert engine.engine.death is not None
    with pytest.raises(EngineDied):
        engine.submit(req(PROMPTS[0]))
    with pytest.raises(EngineDied):
        _ = engine.resident_adapters  # (a call answered by the engine process)
    engine.abort([r.request_id for r in in_flight])
    assert not engine.has_unfinished()

    worker = process_worker()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SEPARATE_PROCESS.items():
            patch.setenv(name, value)
        replaced = worker.engine(engine.config, GREEDY)
    assert replaced.engine is not engine.engine and engine.engine.closed
    processes = engine_processes(replaced)
    assert processes and core.pid not in {p.pid for p in processes}
    assert tokens(replaced, [req(p) for p in PROMPTS[:3]]) == before

    worker.close_engine()
    assert replaced.engine.closed
    for process in processes:
        process.join(timeout=10)
        assert process.exitcode is not None, f"{process.name} still runs after close"
    with pytest.raises(UbError, match="was shut down"):
        replaced.submit(req(PROMPTS[0]))
