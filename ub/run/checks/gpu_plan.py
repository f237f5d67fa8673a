"""A run's GPU memory plan from the base model's ``config.json`` alone (``ub train --dry-run``).

Before a GPU run loads a byte, the arithmetic of its shapes says whether it fits: per GPU, the
vLLM engine's share (``engine.gpu_memory_utilization``) less the weights, the LoRA slots and a
reserve is its KV cache, in tokens, against what the run's sequences ask of it; the learner's
part (the GPU less what a sleeping engine keeps while it updates, or less an awake engine's
share) less its weights and optimizer state is its activation budget, which sets the
micro-batch (``learner.micro_batch_tokens: auto``, as :mod:`ub.learner.memory` sizes it) and
bounds the longest row it trains (a longer one it refuses before its update). Nothing reads
weights or a tokenizer.

Estimates, not measurements: the learner's bytes per token are calibrated on the H200 figures
of GPU.md (Qwen3 1.7B and 0.6B, with and without gradient checkpointing: within 5%); the
engine's reserve is vLLM's CUDA context, workspaces and profiling peak, assumed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ub.errors import UbError

GIB = 2**30
DEFAULT_GPU_GIB = 80.0
"""The card a machine without a GPU plans for (an 80 GB H100 or A100)."""
ENGINE_RESERVE_GIB = 2.0
"""What vLLM takes from its share beyond weights, LoRA slots and KV cache: the CUDA context,
cuBLAS workspaces and the activations of its profiling run; also what it keeps while it sleeps
(level 1 moves the weights to host memory and drops the KV cache; the context and CUDA graphs
stay). Assumed, not measured."""
LAYER_BYTES_PER_WIDTH = 10.0
"""Learner activation bytes per token, per layer and per unit of the layer's width (hidden +
intermediate + the query, key and value heads' dims): about five bf16 tensors of each, fp32
norm and LoRA inputs included (calibrated: GPU.md's H200 measurements)."""
OUTPUT_BYTES_PER_VOCAB = 12.0
"""Learner bytes per token and vocabulary entry of the output layer (fp32 logits and
log-softmax, a bf16 copy), charged on every token: an upper bound (only completions need it)."""
LEARNER_BYTES_PER_LORA_PARAM = 16
"""fp32 LoRA weight, gradient and Adam's two moments."""
ENGINE_ALONE_UTILIZATION = 0.9
"""What an engine alone on its GPU (a Ray worker's) may take of it: vLLM's own default."""
ENGINE_ALONE_UNUSED = 0.2
"""An engine alone on its GPU that leaves more than this share of it unused is warned about
(the one-GPU presets' 0.6 would leave 40% of it idle)."""
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes per weight as the engine holds them on a GPU (``auto``: bfloat16)."""


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a (Qwen3-style, dense) transformer that memory depends on."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, data: dict[str, Any], source: str) -> ModelShape:
        """From a transformers ``config.json`` mapping; one clear error naming what is
        missing."""
        data = data.get("text_config", data)  # (a multimodal config's language model)
        keys = ("num_hidden_layers", "hidden_size", "intermediate_size",
                "num_attention_heads", "vocab_size")
        missing = [k for k in keys if not isinstance(data.get(k), int)]
        if missing:
            raise UbError(f"{source} has no {', '.join(missing)}: ub plans a dense "
                          "transformer's memory from these")
        heads = data["num_attention_heads"]
        return cls(layers=data["num_hidden_layers"], hidden=data["hidden_size"],
                   intermediate=data["intermediate_size"], heads=heads,
                   kv_heads=int(data.get("num_key_value_heads") or heads),
                   head_dim=int(data.get("head_dim") or data["hidden_size"] // heads),
                   vocab=data["vocab_size"], tied=bool(data.get("tie_word_embeddings", False)))

    def projections(self) -> dict[str, tuple[int, int]]:
        """Each LoRA-able projection's (in, out) features."""
        h, i, q, kv = self.hidden, self.intermediate, self.heads * self.head_dim, \
            self.kv_heads * self.head_dim
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def params(self) -> int:
        per_layer = sum(a * b for a, b in self.projections().values()) \
            + 2 * self.hidden + 2 * self.head_dim  # (two norms, q and k norms)
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * per_layer + embeddings + self.hidden

    def lora_params(self, rank: int, modules: tuple[str, ...] | list[str]) -> int:
        shapes = self.projections()
        return self.layers * rank * sum(sum(shapes[m]) for m in modules if m in shapes)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def learner_bytes_per_token(self, checkpointing: bool) -> float:
        """Peak activation bytes per token of an update (see the module's constants), in the
        terms of :func:`ub.learner.memory.activation_bytes_per_token`: what forward keeps
        (every layer's activations, or with checkpointing only each layer's bf16 input) plus
        the transient layers of backward."""
        from ub.learner.memory import BACKWARD_LAYERS

        width = self.hidden + self.intermediate + (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer = LAYER_BYTES_PER_WIDTH * width
        kept = (self.layers * 2 * self.hidden if checkpointing else self.layers * per_layer)
        transient = per_layer * (BACKWARD_LAYERS + (1 if checkpointing else 0))
        return kept + transient + OUTPUT_BYTES_PER_VOCAB * self.vocab


@dataclass(frozen=True)
class EnginePlan:
    """One vLLM engine on a GPU, in GiB and tokens."""

    gpu_gib: float
    share_gib: float
    weights_gib: float
    lora_gib: float
    reserve_gib: float
    kv_gib: float
    kv_tokens: int
    kv_bytes_per_token: int
    sequences: int
    max_tokens: int
    max_model_len: int

    @property
    def demand_tokens(self) -> int:
        """Completion tokens of the sequences in flight, before their prompts (as the run's
        own check at the engine's start: :func:`ub.run.steps.play.kv_cache_problem`)."""
        return self.sequences * self.max_tokens


@dataclass(frozen=True)
class LearnerPlan:
    """The learner on a GPU, in GiB and tokens.

    ``share_gib`` is what it has of the GPU: all of it on a GPU of its own, all but what a
    sleeping engine keeps (``engine_asleep``), else what an awake engine leaves it."""

    share_gib: float
    engine_asleep: bool
    weights_gib: float
    lora_gib: float
    budget_gib: float
    bytes_per_token: float
    micro_batch_tokens: int | None
    micro_batch_setting: int | str | None
    longest_row: int

    def activation_gib(self, tokens: int) -> float:
        return tokens * self.bytes_per_token / GIB

    @property
    def row_limit(self) -> int:
        """The longest row the learner trains: longer ones it refuses before the update."""
        from ub.learner.memory import longest_row_tokens

        return longest_row_tokens(self.budget_gib * GIB, self.bytes_per_token)


@dataclass(frozen=True)
class GpuPlan:
    """What runs on which GPU; ``problems``: each a line naming what to change."""

    gpu_gib: float
    gpus: list[tuple[str, EnginePlan | None, LearnerPlan | None]]
    problems: list[str]
    warnings: list[str]


def plan_gpus(config: Any, model_config: dict[str, Any], gpu_gib: float,
              source: str = "config.json") -> GpuPlan:
    """The plan of run ``config`` (a :class:`ub.run.config.load.TrainConfig`) on GPUs of
    ``gpu_gib`` GiB, from the base model's ``config.json`` mapping."""
    if gpu_gib <= 0:
        raise UbError(f"--gpu-memory must be > 0 GiB, got {gpu_gib:g}")
    shape = ModelShape.from_config(model_config, source)
    e, learner = config.engine, config.learner
    dtype_bytes = DTYPE_BYTES.get(e.dtype, 2)
    cluster = config.cluster.address is not None
    weights = shape.params * dtype_bytes / GIB
    slots = e.max_loras * shape.lora_params(e.max_lora_rank, list(shape.projections()))
    engine = _engine_plan(shape, config, gpu_gib, weights, slots * dtype_bytes / GIB)
    asleep = config.engine_sleeps_during_updates
    # What the GPU has free for the learner during an update, as the learner reads it.
    engine_holds = 0.0 if cluster else ENGINE_RESERVE_GIB if asleep else engine.share_gib
    own_lora = shape.lora_params(learner.lora.rank, learner.lora.target_modules)
    max_train = config.batch.max_train_len
    plan = LearnerPlan(
        share_gib=gpu_gib - engine_holds, engine_asleep=asleep,
        weights_gib=shape.params * 2 / GIB,  # (bf16 on a GPU)
        lora_gib=own_lora * LEARNER_BYTES_PER_LORA_PARAM / GIB, budget_gib=0.0,
        bytes_per_token=shape.learner_bytes_per_token(learner.gradient_checkpointing),
        micro_batch_tokens=None, micro_batch_setting=learner.micro_batch_tokens,
        longest_row=min(max_train, e.max_model_len) if max_train else e.max_model_len)
    own = plan.weights_gib + plan.lora_gib
    # The learner's own rule (ub.learner.memory): an awake engine's share bounds it, a
    # sleeping one's does not (the run's learner gets no device_share then:
    # ub.run.processes.worker).
    from ub.learner.memory import learner_budget_bytes

    share = None if asleep else config.learner_device_share
    plan = _with_budget(plan, learner_budget_bytes(free=plan.share_gib - own, total=gpu_gib,
                                                   own=own, device_share=share))

    if cluster:  # (Ray workers with a GPU each, as the presets' cluster sections give them)
        engines, learners = config.cluster.rollout_workers, config.cluster.learner_workers
        gpus: list[tuple[str, EnginePlan | None, LearnerPlan | None]] = [
            (_gpus(0, engines, "rollout worker"), engine, None),
            (_gpus(engines, learners, "learner rank"), None, plan)]
    else:
        gpus = [("GPU 0 (engine and learner" + (", engine asleep during updates)"
                                                 if asleep else ")"), engine, plan)]
    problems, warnings = _engine_problems(engine), []
    from ub.run.steps.play import kv_cache_problem

    short = kv_cache_problem(engine.kv_tokens, engine.sequences, engine.max_tokens)
    if short and engine.kv_tokens > 0:
        warnings.append(short)
    if cluster:
        warnings += _cluster_warnings(config, engine)
    problems += _learner_problems(plan, config)
    return GpuPlan(gpu_gib, gpus, problems, warnings)


def _cluster_warnings(config: Any, engine: EnginePlan) -> list[str]:
    """What leaves a cluster's GPUs idle, for a plan that gives each Ray worker a GPU of its
    own: shards that idle engines, GPU requests other than one per worker (the plan's
    layout), an engine that leaves much of its GPU unused, synchronous rounds."""
    from ub.run.processes.cluster import idle_engines

    cluster = config.cluster
    warnings = [w for w in [idle_engines(config)] if w]
    for role, what in (("rollout", "an engine"), ("learner", "a learner rank")):
        gpus = getattr(cluster, role).num_gpus
        if gpus == 1:
            continue
        if gpus > 1:
            why = f"{what} uses one GPU: {gpus - 1:g} of each worker's {gpus:g} idle"
        elif gpus > 0:
            why = (f"Ray may put {int(1 // gpus)} workers on one GPU, where their memory adds "
                   "up (the plan gives each a GPU of its own)")
        else:
            why = ("the workers ask for no GPU: on a cluster with GPUs the run refuses them "
                   "before they start (each would run on GPU 0)")
        warnings.append(f"cluster.{role}.num_gpus {gpus:g}: {why}; set it to 1")
    unused = (1 - config.engine.gpu_memory_utilization) * engine.gpu_gib
    if cluster.rollout.num_gpus >= 1 and unused > ENGINE_ALONE_UNUSED * engine.gpu_gib:
        warnings.append(
            f"each engine alone on its GPU leaves {unused:.1f} GiB of it unused "
            f"(engine.gpu_memory_utilization {config.engine.gpu_memory_utilization:g}): raise "
            f"it to {ENGINE_ALONE_UTILIZATION:g} for more KV cache")
    if not config.pipeline.max_staleness:
        warnings.append("rounds are synchronous (pipeline.max_staleness 0): the engines' GPUs "
                        "wait for each update and the learner's for each round's games; "
                        "pipeline.max_staleness: 1 overlaps them")
    return warnings


def _gpus(first: int, count: int, what: str) -> str:
    if count == 1:
        return f"GPU {first} ({what} 0)"
    return f"GPUs {first}-{first + count - 1} ({what}s 0-{count - 1}, one each)"


def _engine_plan(shape: ModelShape, config: Any, gpu_gib: float, weights: float,
                 lora: float) -> EnginePlan:
    e = config.engine
    share = e.gpu_memory_utilization * gpu_gib
    kv_gib = share - weights - lora - ENGINE_RESERVE_GIB
    per_token = shape.kv_bytes_per_token(DTYPE_BYTES.get(e.dtype, 2))
    kv_tokens = max(0, int(kv_gib * GIB // per_token))
    return EnginePlan(gpu_gib=gpu_gib, share_gib=share, weights_gib=weights, lora_gib=lora,
                      reserve_gib=ENGINE_RESERVE_GIB, kv_gib=kv_gib, kv_tokens=kv_tokens,
                      kv_bytes_per_token=per_token,
                      sequences=min(e.max_num_seqs, config.rollout.concurrency),
                      max_tokens=config.sampling.max_tokens, max_model_len=e.max_model_len)


def _with_budget(plan: LearnerPlan, budget: float) -> LearnerPlan:

    from ub.learner.memory import auto_micro_batch_tokens

    setting = plan.micro_batch_setting
    if setting == "auto":
        tokens: int | None = auto_micro_batch_tokens(budget * GIB, plan.bytes_per_token)
    else:
        tokens = setting if isinstance(setting, int) else None
    return replace(plan, budget_gib=budget, micro_batch_tokens=tokens)


def _engine_problems(engine: EnginePlan) -> list[str]:
    if engine.kv_tokens >= engine.max_model_len:
        return []
    need = (engine.weights_gib + engine.lora_gib + engine.reserve_gib
            + engine.max_model_len * engine.kv_bytes_per_token / GIB) / engine.gpu_gib
    raise_it = (f"raise engine.gpu_memory_utilization to at least {need:.2f}" if need <= 1
                else "use a GPU with more memory")
    return [f"the engine's share (engine.gpu_memory_utilization: {engine.share_gib:.1f} GiB) "
            f"holds {engine.kv_tokens:,} tokens of KV cache after weights "
            f"{engine.weights_gib:.1f} GiB, LoRA slots {engine.lora_gib:.1f} and reserve "
            f"{engine.reserve_gib:.1f}, less than one sequence (engine.max_model_len "
            f"{engine.max_model_len:,}; vLLM refuses to start): {raise_it}, or lower "
            "engine.max_model_len, engine.max_loras or engine.max_lora_rank"]


def _learner_problems(plan: LearnerPlan, config: Any) -> list[str]:
    advice = ("set learner.gradient_checkpointing: true" if not
              config.learner.gradient_checkpointing else "use a GPU with more memory")
    # (beside a sleeping engine, its share does not bound the learner)
    lower_engine = config.cluster.address is None and not plan.engine_asleep
    if lower_engine:
        advice += ", or lower engine.gpu_memory_utilization"
    if plan.budget_gib <= 0:
        return [f"the learner's weights and LoRA optimizer state "
                f"({plan.weights_gib + plan.lora_gib:.1f} GiB) do not fit its "
                f"{plan.share_gib:.1f} GiB: "
                + ("lower engine.gpu_memory_utilization, or " if lower_engine else "")
                + "use a GPU with more memory"]
    fits = int(plan.budget_gib * GIB / plan.bytes_per_token)
    problems = []
    tokens = plan.micro_batch_tokens
    if tokens is not None and plan.activation_gib(tokens) > plan.budget_gib:
        problems.append(
            f"learner.micro_batch_tokens {tokens:,} needs {plan.activation_gib(tokens):.1f} "
            f"GiB of activations, the learner has {plan.budget_gib:.1f}: lower it to "
            f"{fits:,} (or auto), or {advice}")
    if plan.longest_row > plan.row_limit:
        # (the learner refuses such a row before its update: ub.learner.Learner)
        problems.append(
            f"a row of up to {plan.longest_row:,} tokens (engine.max_model_len, "
            f"batch.max_train_len {config.batch.max_train_len or 'null'}) needs "
            f"{plan.activation_gib(plan.longest_row):.1f} GiB of activations in one "
            f"micro-batch, the learner has {plan.budget_gib:.1f} (rows up to "
            f"{plan.row_limit:,} tokens): set batch.max_train_len to at most "
            f"{plan.row_limit:,}, or {advice}")
    return problems


def describe(plan: GpuPlan) -> list[str]:
    """The plan as lines for a terminal."""
    lines = []
    for label, engine, learner in plan.gpus:
        lines.append(f"{label}, {plan.gpu_gib:g} GiB each:" if label.startswith("GPUs")
                     else f"{label}, {plan.gpu_gib:g} GiB:")
        if engine is not None:
            lines.append(
                f"  engine   {engine.share_gib:.1f} GiB: weights {engine.weights_gib:.1f}, "
                f"LoRA slots {engine.lora_gib:.1f}, reserve {engine.reserve_gib:.1f} -> KV "
                f"cache {max(engine.kv_gib, 0):.1f} GiB = {engine.kv_tokens:,} tokens")
            lines.append(
                f"           demand {engine.sequences} sequences x {engine.max_tokens:,} "
                f"completion tokens = {engine.demand_tokens:,} tokens before their prompts "
                f"({'fits' if engine.demand_tokens <= engine.kv_tokens else 'short'})")
        if learner is not None:
            micro = learner.micro_batch_tokens
            micro_text = (f"{micro:,} tokens = {learner.activation_gib(micro):.1f} GiB"
                          if micro is not None else "no limit")
            whose = (f" (what the sleeping engine's {ENGINE_RESERVE_GIB:.1f} leaves)"
                     if learner.engine_asleep else "")
            lines.append(
                f"  learner  {learner.share_gib:.1f} GiB{whose}: weights "
                f"{learner.weights_gib:.1f}, LoRA + optimizer {learner.lora_gib:.1f} -> "
                f"{learner.budget_gib:.1f} GiB for activations at "
                f"{learner.bytes_per_token / 2**20:.2f} MiB/token")
            lines.append(
                f"           micro-batch ({learner.micro_batch_setting}) {micro_text}; longest "
                f"row {learner.longest_row:,} tokens = "
                f"{learner.activation_gib(learner.longest_row):.1f} GiB (fits up to "
                f"{learner.row_limit:,})")
    lines += [f"warning: {w}" for w in plan.warnings]
    return lines


def shape_line(model_config: dict[str, Any]) -> str:
    """A model's size and shape in one line."""
    s = ModelShape.from_config(model_config, "config.json")
    size = f"{s.params / 1e9:.2f} B" if s.params >= 1e9 else f"{s.params / 1e6:.1f} M"
    return (f"{size} parameters, {s.layers} layers, hidden {s.hidden}, "
            f"{s.heads} heads ({s.kv_heads} KV) of {s.head_dim}, intermediate "
            f"{s.intermediate}, vocabulary {s.vocab:,}"
            + (", tied embeddings" if s.tied else ""))


def plan_model_config(config: Any) -> dict[str, Any] | None:
    """The base model's ``config.json`` for a plan: a model folder's own file (no weights
    needed), else what :func:`ub.run.config.base_model.base_model_config` finds without downloading
    (the tiny build, a hub id in the Hugging Face cache); ``None`` where this machine has none."""
    import json
    from pathlib import Path

    from ub.run.config.base_model import base_model_config

    folder = Path(config.model.base).expanduser()
    if config.model.base != "tiny" and folder.is_dir():
        path = folder / "config.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UbError(f"cannot read {path}: {exc}") from None
        return data if isinstance(data, dict) else None
    return base_model_config(config)


def this_machines_gpu() -> tuple[float, str] | None:
    """This process's first GPU: its memory in GiB (to 0.1) and its name; ``None`` without
    one. (On a GPU it initialises CUDA in this process, so vLLM starts a later engine's
    process by spawn rather than fork, as it does by itself once the learner has run.)"""
    import torch

    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(0)
    return round(properties.total_memory / GIB, 1), properties.name


def cannot_fit(plan: GpuPlan, more: str) -> UbError | None:
    """The one line a plan that cannot fit is refused with (its first problem; ``more`` says
    where the others are), or ``None`` when it fits."""
    if not plan.problems:
        return None
    others = len(plan.problems) - 1
    return UbError(plan.problems[0] + (f" ({others} more {more})" if others else ""))


def check_run_fits_gpu(config: Any) -> str | None:
    """At a run's start, ``ub train --dry-run``'s plan for this machine's GPU: a plan that
    cannot fit is refused with the line the dry run ends with.

    A run with no GPU here plays and learns on the CPU, where the model-fit check applies
    (:func:`ub.run.config.base_model.check_fits_base_model`): nothing to plan. A run on a Ray
    cluster is planned for GPUs of this machine's size (its GPU nodes alike, as the
    presets' single-node clusters are). Returns why the plan was not checked, for the run's
    log, where a GPU run cannot be planned here (no GPU on a cluster's driver, a hub model's
    ``config.json`` not fetched yet); else ``None``.
    """
    gpu = this_machines_gpu()
    cluster = config.cluster
    if gpu is None:
        if cluster.address is not None and (cluster.rollout.num_gpus or cluster.learner.num_gpus):
            return ("GPU plan not checked: this machine has no GPU to size the cluster's by "
                    "(`ub train CONFIG --dry-run --gpu-memory GIB` plans it)")
        return None
    base = config.model.base
    model_config = plan_model_config(config)
    if model_config is None or "num_hidden_layers" not in model_config:
        return (f"GPU plan not checked: model.base {base} has no config.json on this machine "
                "yet (`ub train CONFIG --dry-run` plans it once it has)")
    gpu_gib, name = gpu
    plan = plan_gpus(config, model_config, gpu_gib, f"model.base {base}'s config.json")
    refusal = cannot_fit(plan, f"for this machine's {name}: `ub train CONFIG --dry-run` "
                         "lists them")
    if refusal is not None:
        raise refusal
    return None
