"""The training run's configuration: typed, loaded from a preset or YAML, validated up front.

A config is plain YAML. ``ub train CONFIG`` takes a preset name (``ub/presets/NAME.yaml``) or a
path; ``--set key.sub=value`` overrides single fields (the value is parsed as YAML, so
``--set rollout.games_per_round=64`` is an int). Every field is checked before any work starts:
a bad value names its field and what is allowed, in one line.

The ``batch`` and ``learner`` sections are :class:`ub.batch.BatchConfig` and
:class:`ub.learner.LearnerConfig` (the same settings ``ub batch`` and ``ub learn`` take); the
``opponents`` and ``rating`` sections are the pool's (:mod:`ub.pool`).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ub.errors import UbError

PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"


class _YamlLoader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-5`` as a string (it wants ``1.0e-5``); configs mean a number."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _mapping_without_duplicates(loader: _YamlLoader, node: yaml.MappingNode,
                                deep: bool = False) -> dict[Any, Any]:
    """A YAML mapping; a key given twice is an error (YAML keeps the last one silently, so a
    setting written twice would be half ignored)."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, str | int | float | bool) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"setting {key!r} is given twice (line "
                f"{key_node.start_mark.line + 1}): keep one")  # (no mark: the snippet is noise)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_YamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                            _mapping_without_duplicates)

MAX_GAMES = 100_000
"""Most games one call plans at once (a round, an evaluation, ``ub play``): games are planned
up front, so a mistyped count must be refused, not run until memory runs out."""


def load_yaml(text: str) -> Any:
    """Safe YAML with numbers as people write them (``1e-5`` is a float); a key given twice
    in one mapping is refused (:class:`yaml.YAMLError`)."""
    return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass: no arbitrary objects


def read_text(path: Path, what: str) -> str:
    """A config file's text, or one line saying why it cannot be read (not UTF-8, unreadable)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UbError(f"{what} {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                      f"offset {exc.start}): save it as UTF-8") from None
    except OSError as exc:
        raise UbError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


class _Section(BaseModel):
    # strict: no YAML `true` for a count, no 2.0 for an int; finite: `.inf`/`.nan` in a weight
    # or a size would only fail later, deep inside the run.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelSection(_Section):
    """Which base model plays and learns."""

    base: str = "tiny"
    """``tiny`` = the locally built CPU default (``ub model tiny``), or a model directory or hub
    id (a hub id downloads: only when you configure one)."""
    tiny_seed: int = 0
    """Seed of the tiny model build (when ``base`` is ``tiny``)."""


class EngineSection(_Section):
    """vLLM settings (see :class:`ub.inference.EngineConfig`)."""

    dtype: str = "auto"
    max_model_len: int = Field(2048, ge=16)
    max_num_seqs: int = Field(256, ge=1)
    max_lora_rank: int = 16
    max_loras: int = Field(4, ge=1)
    kv_cache_gib: float = Field(1.0, gt=0)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)


class SamplingSection(_Section):
    """How rollouts sample (see :class:`ub.inference.SamplingConfig`)."""

    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(32, ge=1)
    stop: list[Annotated[str, Field(min_length=1)]] = []
    """Strings that end a completion, kept in it (training and evaluation alike). ``["]"]``
    ends a bracketed move as soon as it is complete, so a policy that stops emitting its
    end-of-sequence token still plays one move instead of running on to ``max_tokens``."""


class EnvSection(_Section):
    """One game of the training mix."""

    env_id: str
    weight: float = Field(1.0, gt=0)
    """Share of the round's games (weights are normalized over the envs)."""
    num_players: int = Field(2, ge=1)
    template: str = "plain"
    extractor: str | None = None
    max_turns: int = Field(200, ge=1)


class RolloutSection(_Section):
    """How many games a round plays, and how they are split into shards."""

    games_per_round: int = Field(128, ge=1, le=MAX_GAMES)
    shards: int = Field(1, ge=1)
    """Rollout tasks per round, one shard each (run in parallel on a Ray cluster)."""
    concurrency: int = Field(128, ge=1)
    """Most games in flight at once per shard."""


class EvalSection(_Section):
    """Evaluation: the learner's checkpoint against fixed opponents, seats balanced."""

    every: int = Field(0, ge=0)
    """Evaluate every ``every`` rounds (and the starting and final checkpoints); 0: never."""
    games: int = Field(64, ge=2, le=MAX_GAMES)
    """Games per (env, opponent), split evenly over the seats."""
    opponents: list[str] = ["random"]
    envs: list[str] | None = None
    """Eval env ids; ``None``: the training envs."""
    temperature: float = Field(0.0, ge=0)
    """Sampling temperature of the learner in eval games (0: greedy)."""

    @field_validator("games")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"must be even so both seats get the same number of games, "
                             f"got {value}")
        return value


class PipelineSection(_Section):
    max_staleness: Literal[0, 1] = 0
    """0: synchronous rounds (default). 1: round r+1's rollouts play checkpoint r while the
    learner trains round r (set ``learner.algorithm: ppo`` so the ratio corrects for it)."""


class TrackingSection(_Section):
    """Where metrics go besides ``metrics/`` in the run (see :mod:`ub.run.tracking`)."""

    wandb: Literal["disabled", "offline", "online"] = "offline"
    project: str = "ub"


class WorkerResources(_Section):
    """What one Ray worker of a role holds for its lifetime (Ray's ``num_cpus``/``num_gpus``)."""

    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)


class ClusterSection(_Section):
    """Where the round's work runs. ``address: null`` (the default): in the ``ub train``
    process. A Ray address: rollout and eval shards on ``rollout_workers`` Ray actors (one
    vLLM engine each, kept across rounds), the learner on ``learner_workers`` more (see
    docs/scaling.md)."""

    address: str | None = None
    """``auto`` (the cluster this machine belongs to), ``HOST:PORT`` or ``ray://HOST:10001``."""
    rollout_workers: int = Field(2, ge=1)
    """Engine workers: a round's shards are spread over them (set ``rollout.shards`` to a
    multiple)."""
    learner_workers: int = Field(1, ge=1)
    """Data-parallel learner ranks, each with the ``learner`` resources (e.g. one GPU): every
    rank takes a share of the batch's micro-batches and the gradients are summed
    (:mod:`ub.learner.distributed`). 1: one learner process."""
    rollout: WorkerResources = WorkerResources()
    learner: WorkerResources = WorkerResources()


class TrainConfig(_Section):
    """A whole run. Plain data: ``model_dump()`` is what ``config.yaml`` in the run holds."""

    seed: int = 0
    rounds: int = Field(8, ge=1)
    model: ModelSection = ModelSection()
    engine: EngineSection = EngineSection()
    sampling: SamplingSection = SamplingSection()
    envs: list[EnvSection] = Field(min_length=1)
    rollout: RolloutSection = RolloutSection()
    opponents: list[dict[str, Any]] = [{"mode": "mirror", "weight": 1.0}]
    rating: dict[str, Any] = {}
    batch: dict[str, Any] = {}
    learner: dict[str, Any] = {}
    eval: EvalSection = EvalSection()
    pipeline: PipelineSection = PipelineSection()
    tracking: TrackingSection = TrackingSection()
    cluster: ClusterSection = ClusterSection()

    @model_validator(mode="after")
    def _room_for_the_prompt(self) -> TrainConfig:
        # The learner divides by max_tokens (Dr. GRPO's constant normaliser): a value the engine
        # can never generate only shrinks every update towards zero, silently.
        if self.sampling.max_tokens >= self.engine.max_model_len:
            raise ValueError(f"sampling.max_tokens {self.sampling.max_tokens} must be below "
                             f"engine.max_model_len {self.engine.max_model_len} (the engine's "
                             "context holds the prompt and the completion): lower it")
        return self

    def batch_config(self, **overrides: Any):
        """The ``batch`` section as a validated :class:`ub.batch.BatchConfig`."""
        from ub.batch import BatchConfig

        return BatchConfig.from_dict({**self.batch, **overrides})

    def learner_config(self, base_model: str):
        """The ``learner`` section as a validated :class:`ub.learner.LearnerConfig`."""
        from ub.learner.config import LearnerConfig

        data = {"seed": self.seed, "temperature": self.sampling.temperature,
                "length_normalizer": self.sampling.max_tokens, **self.learner,
                "base_model": base_model}
        return LearnerConfig.from_dict(data)

    def training_settings(self) -> dict[str, Any]:
        """The settings a run's data depends on. Changing one of these on an existing run is
        refused; ``rounds``, ``eval``, ``tracking`` and ``cluster`` may change (more rounds extend
        a finished run; where the work runs does not change what it computes)."""
        data = self.model_dump(mode="json")
        for key in ("rounds", "eval", "tracking", "cluster"):
            data.pop(key)
        return data


def _format_error(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown setting"
        elif err["type"] == "literal_error":
            message = f"got {err['input']!r}; {err['msg'].lower()}"
        elif err["type"] == "value_error" and not err["loc"]:  # a check across sections
            parts.append(str(err["ctx"]["error"]))
            continue
        elif "input" in err and err["type"] != "missing":
            message = f"{message} (got {err['input']!r})"
        parts.append(f"{where}: {message}")
    return f"invalid config {source}: " + "; ".join(parts)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def read_config_data(name_or_path: str) -> tuple[dict[str, Any], str]:
    """The raw mapping of a preset name or YAML path, and a label saying which it was."""
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise UbError(f"config file {path} does not exist; presets: "
                          f"{', '.join(preset_names())}")
        label = str(path)
    else:
        path = PRESETS_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise UbError(f"unknown preset {name_or_path!r}; presets: "
                          f"{', '.join(preset_names())} (or give a YAML file path)")
        label = f"preset {name_or_path}"
    try:
        data = load_yaml(read_text(path, "config")) or {}
    except yaml.YAMLError as exc:
        raise UbError(f"{label} is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise UbError(f"{label} must be a YAML mapping of settings, got {type(data).__name__}")
    return data, label


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``key.sub=value`` overrides (values parsed as YAML) applied to a copy of ``data``."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UbError(f"--set {item!r}: expected key=value, e.g. --set rounds=4")
        try:
            value = load_yaml(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UbError(f"--set {item!r}: {part} is not a section")
            node = child
        node[parts[-1]] = value
    return out


def validate_config(data: dict[str, Any], source: str = "") -> TrainConfig:
    """A :class:`TrainConfig` from a mapping, with every section checked (batch, learner,
    opponents and rating by their own validators), or one :class:`UbError` line."""
    try:
        config = TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise UbError(_format_error(exc, source or "(from mapping)")) from None
    _check_sections(config, source)
    return config


def _check_sections(config: TrainConfig, source: str) -> None:
    from ub.games.specs import GameSpec, check_env_id
    from ub.inference.vllm_engine import VLLM_LORA_RANKS

    def fail(field: str, message: str) -> UbError:
        return UbError(f"invalid config {source}: {field}: {message}")

    if config.engine.max_lora_rank not in VLLM_LORA_RANKS:
        raise fail("engine.max_lora_rank", f"got {config.engine.max_lora_rank}; allowed: "
                   + ", ".join(map(str, VLLM_LORA_RANKS)))
    for i, env in enumerate(config.envs):
        try:
            GameSpec(env.env_id, env.num_players, env.template, env.extractor, env.max_turns)
            check_env_id(env.env_id)
        except UbError as exc:
            raise fail(f"envs.{i}", str(exc)) from None
    for env_id in config.eval.envs or []:
        try:
            check_env_id(env_id)
        except UbError as exc:
            raise fail("eval.envs", str(exc)) from None
    sections = {
        "batch": lambda: config.batch_config(),
        "learner": lambda: config.learner_config("(base model)"),
        "opponents": lambda: _opponents(config),
        "rating": lambda: _rating(config),
    }
    for name, check in sections.items():
        try:
            check()
        except UbError as exc:
            raise fail(name, str(exc)) from None
        except TypeError as exc:  # a wrong type inside a dataclass section
            raise fail(name, str(exc)) from None
    from ub.actors.expert import check_expert_supports
    from ub.actors.spec import parse_actor

    train_envs = [e.env_id for e in config.envs]
    seated = [("opponents", _opponents(config).fixed_names(), train_envs),
              ("eval.opponents", config.eval.opponents, config.eval.envs or train_envs)]
    for field, names, env_ids in seated:
        for name in names:
            try:
                parse_actor(name)
            except UbError as exc:
                raise fail(field, str(exc)) from None
        if "expert" in names:
            for env_id in env_ids:
                try:
                    check_expert_supports(env_id)
                except UbError as exc:
                    raise fail(field, str(exc)) from None
    lora = config.learner_config("(base model)").lora
    if lora.rank > config.engine.max_lora_rank:
        raise fail("learner.lora.rank", f"{lora.rank} exceeds engine.max_lora_rank "
                   f"{config.engine.max_lora_rank}: raise engine.max_lora_rank")


def _opponents(config: TrainConfig):
    from ub.pool.sampling import OpponentConfig

    return OpponentConfig.from_dict(config.opponents)


def _rating(config: TrainConfig):
    from ub.pool.ratings import RatingConfig

    return RatingConfig.from_dict(config.rating)


def load_config(name_or_path: str, overrides: list[str] | None = None) -> TrainConfig:
    """Load a preset or YAML file, apply ``--set`` overrides, validate."""
    data, label = read_config_data(name_or_path)
    return validate_config(apply_overrides(data, overrides or []), label)
