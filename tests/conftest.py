"""Shared fixtures. Tests run offline: nothing is downloaded, W&B is disabled, and the tiny CPU
model is built once per machine (cached by content key under ``UB_CACHE_DIR``)."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from ub.vllm_environment import configure_vllm_environment

# One compute thread per process (torch's and vLLM's CPU engine's): the two pytest workers
# and the processes they start share the machine's cores, and with every process's OpenMP
# threads pinned to every core (ub's default for one run on a machine) they spin-wait on each
# other. Two `ub train` runs side by side took 16% less time so on two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
# Before anything imports vllm, transformers or wandb.
configure_vllm_environment()
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # (datasets reads it at its import)
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls out

LEDGER = pytest.StashKey[Counter]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[LEDGER] = Counter()


# The slowest scopes (about, in seconds of `make test` on 2 busy cores: faults 680 with its Ray
# module, Prefect server 160, train flow 145, ub serve 145, learning 140, Prefect outages
# 125, engine process 120, data parallel 80, own components 75, vLLM engine 60, benchmarks 50)
# start first, so the two workers end together instead of one running a long module alone at
# the end. (The others are queued by their number of tests, most first: a slow module with few
# tests left out of this list would start last.)
SLOWEST_FIRST = ("tests/faults", "tests/test_serve.py",
                 "tests/test_train_flow.py", "tests/test_prefect_server.py",
                 "tests/test_learning.py", "tests/test_prefect_outage.py",
                 "tests/test_engine_process.py", "tests/test_data_parallel.py",
                 "tests/test_benchmarks.py", "tests/test_own_components.py",
                 "tests/test_vllm_engine.py")


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``make test`` runs on two workers (``-n 2``): each test module goes to one worker, and the
    ``faults`` package as a whole, so module- and package-scoped fixtures (an engine, a Prefect
    server, the faults' reference run, which the Ray module compares with too) start once.
    (``--dist loadgroup`` would say this with marks, but it renames node ids in a way pytest 9
    ignores.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module.startswith("tests/faults/") and module not in SLOWEST_FIRST:
                return "tests/faults"
            return module

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the queue is complete at the first assignment
                for scope in reversed(SLOWEST_FIRST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
                self.ordered = True
            super()._assign_work_unit(node)

    return ByModule(config, log)


@pytest.fixture(scope="session")
def ledger(request) -> Counter:
    """Counts the reliability suites report at the end of the run (see below)."""
    return request.config.stash[LEDGER]


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    counts = config.stash.get(LEDGER, Counter())
    if counts["faults injected"]:
        terminalreporter.write_line(
            f"faults: {counts['faults injected']} injected, {counts['faults survived']} "
            f"survived, {counts['faults lost']} lost")
    if counts["bad inputs tried"]:
        terminalreporter.write_line(
            f"bad inputs: {counts['bad inputs tried']} tried, {counts['bad inputs clear']} "
            "clear errors")


@pytest.fixture(scope="session")
def prefect_api():
    """One Prefect test server for the pytest worker's session (a start takes 15-60 s on two
    busy cores); yields its URL, which subprocesses (``ub train`` as a user runs it) take as
    ``PREFECT_API_URL``. From the first test that asks for it on, the worker's in-process flows
    report to it, as they would to a temporary server of their own."""
    from servers import prefect_test_server

    with prefect_test_server() as api:
        yield api


@pytest.fixture(scope="session")
def tiny_model():
    """The default tiny CPU model directory (built on first use, then cached)."""
    from ub.model.tiny import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def small_qwen3(tmp_path_factory):
    """A random Qwen3 of two layers, 64 wide, a 1,000-token vocabulary (seconds to build):
    the learner's tests that need a real forward and backward but no game."""
    from ub.learner.testing import build_qwen3

    return build_qwen3(tmp_path_factory.mktemp("model") / "qwen3", vocab_size=1000,
                       hidden_size=64, intermediate_size=128, num_hidden_layers=2)


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
    from ub.inference.types import EngineConfig, SamplingConfig
    from ub.run.processes.worker import process_worker

    # The CLI's default engine settings, so in-process `ub play` tests reuse this engine.
    return process_worker().engine(EngineConfig(model=str(tiny_model)),
                                   SamplingConfig(temperature=1.0, max_tokens=16))


@pytest.fixture()
def own_worker():
    """A worker of the test's own (as a Ray actor has), the process's engine closed first: one
    in-process vLLM engine at a time. Closing an engine tears down vLLM's process-wide parallel
    state, which an engine kept alive beside it would be left without ("pipeline model
    parallel group is not initialized" in the next test that used the process's)."""
    from ub.run.processes.worker import Worker, process_worker

    process_worker().close_engine()
    worker = Worker()
    try:
        yield worker
    finally:
        worker.close()


@pytest.fixture(scope="module")
def bad_server():
    """A misbehaving OpenAI-compatible server on loopback (see ``stub_openai.py``)."""
    import threading

    from stub_openai import MisbehavingServer

    server = MisbehavingServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()  # (waits for requests still being answered)


@pytest.fixture(scope="session")
def rollout():
    """30 games of TicTacToe between two random players, played as run ``run`` plays them:
    real games and real shard tables, for the tests of what is written and read."""
    from ub.actors.spec import parse_actor
    from ub.games.specs import GameSpec
    from ub.rollout import assign_games, play_games

    actors = [parse_actor("random"), parse_actor("random")]
    return play_games(assign_games(GameSpec("TicTacToe-v0-train"), actors, 30, base_seed=3),
                      run="run", base_seed=3)
