"""The environment vLLM reads: ub's defaults, never overriding a value the user exported.

:func:`configure_vllm_environment` sets them before anything imports vLLM (the engine fills in
the same defaults when it starts); :func:`vllm_server_environment` is the environment of a vLLM
server process (``ub serve``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

# Environment variables that configure_vllm_environment set (not the user): the engine may
# override its own defaults, never the user's.
SET_BY_UB: dict[str, str] = {}


def all_cores() -> str:
    """The cores this process may run on, as a vLLM CPU list such as ``"0-1"`` or ``"0-3,8"``."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return core_list(cores or list(range(os.cpu_count() or 1)))


def core_list(cores: list[int]) -> str:
    """Sorted core numbers as a vLLM CPU list: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    ranges: list[str] = []
    start = prev = cores[0]
    for core in [*cores[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        ranges.append(f"{start}-{prev}" if prev > start else str(start))
        if core is not None:
            start = prev = core
    return ",".join(ranges)


def configure_vllm_environment(cache_dir: Path | None = None, threads: str | None = None) -> None:
    """Set the environment vLLM reads at import and start-up, leaving any value the user set.

    Call it before anything imports vLLM (the engine fills in the same defaults when it starts,
    which is enough when nothing imported vLLM earlier). A later call updates the values of an
    earlier one, never a variable the user exported.

    Args:
        cache_dir: where vLLM may write its cache (``VLLM_CACHE_ROOT = cache_dir/vllm``). ``None``
            leaves vLLM's default (``~/.cache/vllm``).
        threads: CPU cores for vLLM's compute threads (``VLLM_CPU_OMP_THREADS_BIND``), e.g.
            ``"0-3"``; ``"auto"`` is vLLM's own choice (which reserves a core); ``None`` = all cores
            this process may use.
    """
    set_env_defaults(env_defaults(cache_dir, threads), replace_ours=True)


def env_defaults(cache_dir: Path | None, threads: str | None) -> dict[str, str]:
    """ub's defaults for every platform (those that depend on the platform and the model are
    :func:`engine_env_defaults`'s, applied when the engine starts)."""
    defaults = {
        # Without an explicit KV cache size vLLM-CPU wants a fraction of *total* RAM and refuses to
        # start when that much is not free. The engine passes EngineConfig.kv_cache_gib instead.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": threads or all_cores(),
        # Quiet: no usage reporting, no tokenizer fork warnings. (Offline only for a local
        # model folder: engine_env_defaults.)
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # vLLM logs dozens of INFO lines per start; warnings and errors still show.
        "VLLM_LOGGING_LEVEL": "WARNING",
        # vLLM's own logging set-up (a logging.config.dictConfig at every engine start) closes
        # every handler of the process, which blocks ~5 s flushing Prefect's API log handler
        # inside a flow, and replaces the handlers of the `vllm` logger (RUN/logs/engine.log
        # stayed empty). ub applies VLLM_LOGGING_LEVEL itself: apply_vllm_log_level().
        "VLLM_CONFIGURE_LOGGING": "0",
        # vLLM's CPU GEMMs keep 32 oneDNN primitives per layer, one per batch size; oneDNN's
        # own global cache (1,024 by default) kept every evicted one alive too, ~0.5 MB each:
        # memory grew with each new batch size for hundreds of rounds (~3 MB a round).
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0",
    }
    if cache_dir is not None:
        defaults["VLLM_CACHE_ROOT"] = str(Path(cache_dir).expanduser().resolve() / "vllm")
    return defaults


ENGINE_DEFAULTS = ("VLLM_ENABLE_V1_MULTIPROCESSING", "HF_HUB_OFFLINE")
"""The variables :func:`engine_env_defaults` decides per engine: ub's values of them belong to
the process whose engine they were set for (another process's platform or model may differ)."""


def engine_env_defaults(on_cpu: bool, model: str) -> dict[str, str]:
    """ub's defaults that depend on the platform and the model, set when an engine starts
    (vLLM reads them then; it reads its ``VLLM_*`` variables lazily).

    - On the CPU the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): it
      starts in 3-5 s instead of 25-30 s and takes ~1 GB less memory, and a separate engine
      process would gain nothing, since it competes for the same few cores. On a GPU vLLM's
      own default stays: its engine core in a process of its own, which schedules and runs
      the model on the GPU while this process detokenizes and steps the games, so CPU work
      overlaps GPU work; a second process costs little next to a GPU model's start.
    - ``HF_HUB_OFFLINE=1`` when the model is a local folder (the tiny model, a folder, or a
      hub model's snapshot fetched by :func:`ub.model.hub.local_model`): nothing about it is
      on the hub, and a machine without network must not wait on look-ups. A hub id left
      as it is (``ub play --model ORG/NAME``) stays online: vLLM downloads it.
    """
    defaults = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if on_cpu else {}
    if Path(model).expanduser().is_dir():
        defaults["HF_HUB_OFFLINE"] = "1"
    return defaults


def apply_vllm_log_level() -> None:
    """Give the ``vllm`` logger the level ``VLLM_LOGGING_LEVEL`` asks for, as vLLM would have
    had it configured its logging (unless the user turned that back on)."""
    if os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        logging.getLogger("vllm").setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())


def set_env_defaults(defaults: dict[str, str], replace_ours: bool) -> None:
    for name, value in defaults.items():
        # Never touch a user's value; one set by an earlier call here may be updated.
        ours = name in os.environ and SET_BY_UB.get(name) == os.environ[name]
        if name not in os.environ or (replace_ours and ours):
            os.environ[name] = value
            SET_BY_UB[name] = value


@contextlib.contextmanager
def without_our_default(name: str) -> Iterator[None]:
    """Hide an environment default that we set (not the user) for the duration of the block."""
    value = os.environ.get(name)
    ours = value is not None and SET_BY_UB.get(name) == value
    if ours:
        del os.environ[name]
    try:
        yield
    finally:
        if ours and value is not None:
            os.environ[name] = value


def vllm_server_environment(cache_dir: Path | None = None) -> dict[str, str]:
    """The environment for a vLLM server process (``ub serve``): this process's, plus ub's
    defaults (:func:`configure_vllm_environment`) where the user set nothing.

    Two of ub's defaults are left out: the KV cache size, as the engine leaves it out at its
    start (the server gets ``kv_cache_memory_bytes`` from
    :func:`ub.inference.patches.vllm_engine_args`, which our whole-GiB default would override),
    and the logging switch (the server's output is vLLM's). The in-process switch is not
    passed either (vLLM's server always runs its engine in a process of its own; the switch
    would only add a warning).
    """
    env = dict(os.environ)
    for name, value in env_defaults(cache_dir, None).items():
        env.setdefault(name, value)
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING",
                 "VLLM_CONFIGURE_LOGGING"):
        if os.environ.get(name) is None or SET_BY_UB.get(name) == os.environ[name]:
            env.pop(name, None)  # (not the user's)
    return env

