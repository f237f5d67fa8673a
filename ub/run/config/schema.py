"""The training config's schema: one typed, documented pydantic model per section.

Every field's type, default and one line of meaning (its ``description``) are here or in
the package that uses the section (``engine``, ``sampling``: :mod:`ub.inference.types`;
``opponents``, ``rating``: :mod:`ub.pool`; ``batch``: :class:`ub.batch.BatchConfig`;
``learner``: :class:`ub.learner.LearnerSection`; ``envs[]`` extends
:class:`ub.games.specs.GameSpec`), and nowhere else: ``docs/config.md`` and ``ub config show``
are generated from them (:mod:`ub.run.config.docs`). Loading, and the checks across sections
and against what the settings feed (the games, the engine, the data's columns), are in
:mod:`ub.run.config.load`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ub.batch.config import BatchConfig
from ub.benchmarks import BenchmarksSection
from ub.branching import BranchConfig
from ub.games.specs import GameSpec, LegalMoveMode
from ub.inference.types import EngineSection, SamplingConfig, SamplingTemperature
from ub.learner.config import LearnerConfig, LearnerSection, run_given, with_run_given
from ub.pool.ratings import RatingConfig
from ub.pool.sampling import OpponentConfig
from ub.seeding import DEFAULT_SEED
from ub.settings import EXECUTION, Section, is_execution, same_setting

MAX_GAMES = 100_000
"""Most games one call plans at once (a round, an evaluation, ``ub play``): games are planned
up front, so a mistyped count must be refused, not run until memory runs out."""


class ModelSection(Section):
    """Which base model plays and learns."""

    base: str = Field("tiny", description="tiny: the locally built CPU model (ub model tiny); "
                      "or a model directory (e.g. a tiny model of another size, `ub model tiny "
                      "--set num_layers=6 --out DIR`) or hub id (a hub id downloads).")
    tiny_seed: int = Field(0, description="Seed of the tiny model build (when base is tiny).")


class EnvSection(GameSpec):
    """One game of the training mix."""

    weight: float = Field(1.0, gt=0, description="Share of the round's games (normalized over "
                          "the envs).")

    def game(self) -> GameSpec:
        """The game this entry plays: its spec without the mix's weight (checked anew: an eval
        env's entry may have given it another template or extractor)."""
        return GameSpec.from_dict(self.model_dump(exclude={"weight"}))


class RolloutSection(Section):
    """How many games a round plays, how they are split into shards, and where they branch."""

    games_per_round: int = Field(128, ge=1, le=MAX_GAMES, description="Games played per round.")
    shards: int = Field(1, ge=1, description="Rollout tasks per round, one shard each, at most "
                        "games_per_round (parallel on a Ray cluster; a round a process left "
                        "unfinished keeps its own).", json_schema_extra=EXECUTION)
    concurrency: int = Field(128, ge=1, description="Most games in flight at once per shard.",
                             json_schema_extra=EXECUTION)
    branch: BranchConfig = Field(default_factory=BranchConfig, description="Dynamic "
                                 "branching: more moves sampled from chosen positions, each "
                                 "copy of the game played to its end (docs/branching.md).")

    @model_validator(mode="after")
    def _a_game_per_shard(self) -> RolloutSection:
        # The round's games are split into `shards` shards of ceil(games / shards) games each
        # (ub.run.steps.plan.plan_round): more shards than that fills would write empty shard
        # files after the real ones.
        if self.shards > self.games_per_round:
            raise ValueError(f"shards {self.shards} is more than games_per_round "
                             f"{self.games_per_round} (each shard plays at least one game of "
                             f"the round): set shards to {self.games_per_round} or fewer")
        per_shard = -(-self.games_per_round // self.shards)
        used = -(-self.games_per_round // per_shard)
        if used < self.shards:
            raise ValueError(f"shards {self.shards} with games_per_round {self.games_per_round} "
                             f"leaves {self.shards - used} shards without a game (each takes "
                             f"{per_shard} games, in order): set shards to {used}, or to a "
                             f"divisor of {self.games_per_round}")
        return self


class EvalEnvSection(Section):
    """An eval env with its own prompt format (``eval.envs`` entries may be env ids or these).

    ``env_id`` is the game's own (:class:`~ub.games.specs.GameSpec`'s declaration, not
    another). ``template`` and ``extractor`` are the eval's overrides of the game's: null
    means the training env's (:meth:`TrainConfig.eval_env`), so they are settings of their own.
    """

    env_id: str = same_setting(GameSpec, "env_id")
    # (Names checked when the game is made: a check here would read twice in the union's error.)
    template: str | None = Field(None, description="Prompt template; null: its training env's, "
                                 "or else the training envs' (when they share one).")
    extractor: str | None = Field(None, description="Move extractor; null: with template "
                                  "null, the training env's or the training envs'; else the "
                                  "template's.")


class ExploitabilitySection(Section):
    """Exact exploitability of each evaluated checkpoint (docs/exploitability.md): what a best
    response wins against it in each seat, in the eval envs whose game has a solver
    (TicTacToe, Nim, KuhnPoker), played as evaluated, under the mask and free."""

    enabled: bool = Field(False, description="Measure it at every evaluation (the greedy "
                          "policy of an eval at temperature 0 takes seconds).")
    sampled: bool = Field(False, description="Also the policy as it trains "
                          "(sampling.temperature), over the whole tree up to the cut: "
                          "minutes to hours a checkpoint on a CPU.")
    cut: float = Field(1e-3, ge=0, le=1, description="A sampled policy's lines whose "
                       "probability falls below this are cut and bounded (the figures become "
                       "an interval); 0: none (exact, and slowest).")


class EvalSection(Section):
    """Evaluation: the learner's checkpoint against fixed opponents, seats balanced."""

    every: int = Field(0, ge=0, description="Evaluate every N rounds (and the first and final "
                       "checkpoints); 0: never.")
    games: int = Field(64, ge=2, le=MAX_GAMES, description="Games per (env, opponent), even, "
                       "split evenly over the seats.")
    opponents: list[str] = Field(default_factory=lambda: ["random"], description="Fixed "
                                 "opponents (actor names).")
    envs: list[str | EvalEnvSection] | None = Field(
        None, description="Eval envs: env ids, or {env_id, template, extractor}; null: the "
        "training envs. An env not trained on is prompted as the training envs are (their "
        "template and extractor) unless its entry says otherwise.")
    temperature: SamplingTemperature = Field(0.0, description="Sampling temperature of the "
                                             "learner in eval games (0: greedy).")
    legal_moves: LegalMoveMode | None = Field(
        None, description="The legal-move mode of eval games (envs[].legal_moves); null: "
        "each env as it trains (an env not trained on: free). free on a masked run shows how "
        "often its policy would still play an illegal move.")
    exploitability: ExploitabilitySection = Field(
        default_factory=ExploitabilitySection, description="Exact best responses to each "
        "evaluated checkpoint (docs/exploitability.md).")
    benchmarks: BenchmarksSection = Field(
        default_factory=BenchmarksSection, description="Reasoning benchmarks "
        "(lm-evaluation-harness tasks) scored on checkpoints as the run goes "
        "(docs/training.md).")

    @property
    def env_ids(self) -> list[str] | None:
        """The eval envs' ids (``None``: the training envs)."""
        if self.envs is None:
            return None
        return [e if isinstance(e, str) else e.env_id for e in self.envs]

    @field_validator("games")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"must be even so both seats get the same number of games, "
                             f"got {value}")
        return value


class PipelineSection(Section):
    """How rollouts and learning overlap."""

    max_staleness: Literal[0, 1] = Field(0, description="0: synchronous rounds. 1: round r+1 "
                                         "plays checkpoint r while round r trains (use ppo).")


class TrackingSection(Section):
    """Where metrics go besides ``metrics/`` in the run (see :mod:`ub.run.steps.tracking`)."""

    wandb: Literal["disabled", "offline", "online"] = Field("offline", description="Weights & "
                                                            "Biases mode.")
    project: str = Field("ub", description="Weights & Biases project.")
    alert_invalid_move_rate: float = Field(0.2, ge=0, le=1, description="Warn (round line, "
                                           "dashboard) when an env's invalid-move rate in a "
                                           "round's games passes this, in [0, 1].")
    alert_entropy: float = Field(0.05, ge=0, description="Warn when an env's sampled entropy "
                                 "(nats per completion token) falls below this (>= 0; 0: never).")


class WorkerResources(Section):
    """What one Ray worker of a role holds for its lifetime (Ray's ``num_cpus``/``num_gpus``)."""

    num_cpus: float = Field(1.0, ge=0, description="CPUs per worker (Ray's num_cpus).")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per worker (Ray's num_gpus).")


class ClusterSection(Section):
    """Where the round's work runs (see docs/scaling.md)."""

    address: str | None = Field(None, description="null: in the ub train process; or a Ray "
                                "address: auto, HOST:PORT or ray://HOST:10001.")
    rollout_workers: int = Field(2, ge=1, description="Engine workers on Ray; a round's shards "
                                 "are spread over them.")
    learner_workers: int = Field(1, ge=1, description="Data-parallel learner ranks on Ray "
                                 "(gradients summed).")
    rollout: WorkerResources = Field(default_factory=WorkerResources, description="Resources of "
                                     "a rollout worker.")
    learner: WorkerResources = Field(default_factory=WorkerResources, description="Resources of "
                                     "a learner worker.")


class TrainConfig(Section):
    """A whole run. Plain data: ``model_dump()`` is what ``config.yaml`` in the run holds."""

    seed: int = Field(DEFAULT_SEED, description="The run's seed: every random choice derives "
                      "from it (0 to 2**32 - 1: it is also vLLM's engine seed).")
    rounds: int = Field(8, ge=1, description="Rounds to train (more extends a finished run).",
                        json_schema_extra=EXECUTION)
    model: ModelSection = Field(default_factory=ModelSection, description="The base model.")
    engine: EngineSection = Field(default_factory=EngineSection, description="vLLM engine "
                                  "settings.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="How "
                                      "rollouts sample.")
    envs: list[EnvSection] = Field(min_length=1, description="The training mix (at least one "
                                   "env).")
    rollout: RolloutSection = Field(default_factory=RolloutSection, description="Games per "
                                    "round and shards.")
    opponents: OpponentConfig = Field(default_factory=OpponentConfig, description="Who the "
                                      "learner plays (a mixture of modes).")
    rating: RatingConfig = Field(default_factory=RatingConfig, description="TrueSkill "
                                 "ratings of the pool.")
    batch: BatchConfig = Field(default_factory=BatchConfig, description="What goes into a "
                               "round's training batch.")
    learner: LearnerSection = Field(default_factory=LearnerSection, description="How the "
                                    "learner trains.")
    eval: EvalSection = Field(default_factory=EvalSection, description="Evaluation against "
                              "fixed opponents.", json_schema_extra=EXECUTION)
    pipeline: PipelineSection = Field(default_factory=PipelineSection, description="Rollout / "
                                      "learning overlap.")
    tracking: TrackingSection = Field(default_factory=TrackingSection, description="Metrics "
                                      "tracking.", json_schema_extra=EXECUTION)
    cluster: ClusterSection = Field(default_factory=ClusterSection, description="Where the "
                                    "work runs.", json_schema_extra=EXECUTION)

    def eval_env(self, env: str | EvalEnvSection) -> EnvSection:
        """How an eval env is played: a training env as it trains, unless its entry gives a
        template or extractor; another env with two seats (the checkpoint and an opponent)
        and the training envs' prompt format, which the policy learned to answer (another
        format would score its moves invalid), unless its entry gives its own."""
        entry = EvalEnvSection(env_id=env) if isinstance(env, str) else env
        trained = next((e for e in self.envs if e.env_id == entry.env_id), None)
        mode = {} if self.eval.legal_moves is None else {"legal_moves": self.eval.legal_moves}
        if entry.template is not None:  # the entry's format: its extractor, or the template's
            base = trained or EnvSection(env_id=entry.env_id)
            return base.model_copy(update={"template": entry.template,
                                           "extractor": entry.extractor, **mode})
        if trained is None:
            template, extractor = self.prompt_format(entry.env_id)
            trained = EnvSection(env_id=entry.env_id, template=template, extractor=extractor)
        if entry.extractor is not None:
            return trained.model_copy(update={"extractor": entry.extractor, **mode})
        return trained.model_copy(update=mode) if mode else trained

    def prompt_format(self, env_id: str) -> tuple[str, str | None]:
        """The training envs' (template, extractor), which an eval env not trained on takes;
        a ValueError naming ``env_id`` when the training envs use several."""
        formats = dict.fromkeys((e.template, e.extractor) for e in self.envs)
        if len(formats) > 1:
            shown = ", ".join(f"{t}/{x or 'its own'}" for t, x in formats)
            raise ValueError(f"eval.envs: {env_id} is not a training env, and the training "
                             f"envs use several prompt formats ({shown}): give its own, e.g. "
                             f"{{env_id: {env_id}, template: {next(iter(formats))[0]}}}")
        return next(iter(formats))

    @model_validator(mode="after")
    def _eval_envs_have_a_format(self) -> TrainConfig:
        for env in self.eval.envs or []:
            self.eval_env(env)
        return self

    @model_validator(mode="after")
    def _room_for_the_prompt(self) -> TrainConfig:
        # The learner divides by max_tokens (Dr. GRPO's constant normaliser): a value the engine
        # can never generate only shrinks every update towards zero, silently.
        if self.sampling.max_tokens >= self.engine.max_model_len:
            raise ValueError(f"sampling.max_tokens {self.sampling.max_tokens} must be below "
                             f"engine.max_model_len {self.engine.max_model_len} (the engine's "
                             "context holds the prompt and the completion): lower it")
        return self

    @property
    def engine_sleeps_during_updates(self) -> bool:
        """Whether the engine beside the learner sleeps through each update, its GPU memory
        lent to the learner: sleep mode on, rounds not pipelined (the engine would be playing
        the next round), and engine and learner in one process (no cluster)."""
        return (self.engine.sleep_mode and not self.pipeline.max_staleness
                and self.cluster.address is None)

    @property
    def learner_device_share(self) -> float | None:
        """The fraction of the GPU the learner may use beside the awake engine of its process
        (``1 - engine.gpu_memory_utilization``; while the engine sleeps the process's worker
        lifts it: :class:`ub.run.processes.worker.Worker`); ``None`` on a cluster, where the learner
        has a worker, and a GPU, of its own."""
        if self.cluster.address is not None:
            return None
        return round(1.0 - self.engine.gpu_memory_utilization, 6)

    def learner_config(self, base_model: str) -> LearnerConfig:
        """What the run's learner runs with: the ``learner`` section, ``base_model``, the GPU
        share beside the engine, and the run's settings where the section says null (seed,
        sampling: :func:`ub.learner.config.with_run_given`)."""
        data = with_run_given(dict(self.learner), run_given(self.seed, self.sampling))
        if self.learner_device_share is not None:
            data["device_share"] = self.learner_device_share
        return LearnerConfig.from_dict({**data, "base_model": base_model})

    def training_settings(self) -> dict[str, Any]:
        """The settings a run's data depends on (every field not marked
        :data:`~ub.settings.EXECUTION`). Changing one of these on an existing run is
        refused: its data would mix two setups."""
        return _split(self)[0]

    def execution_settings(self) -> dict[str, Any]:
        """How the work is executed (the fields marked :data:`~ub.settings.EXECUTION`:
        ``rounds``, ``eval``, ``tracking``, ``cluster``, the engine's memory and batching,
        ``rollout.shards`` and ``concurrency``, the learner's micro-batching, checkpointing,
        kernels, attention and threads). They may change when a run resumes: they change
        nothing in its games or adapters beyond float summation order. Each round's manifest
        records them."""
        return _split(self)[1]


def _split(section: Section) -> tuple[dict[str, Any], dict[str, Any]]:
    """``section``'s settings as (locked, execution) nested mappings."""
    locked: dict[str, Any] = {}
    execution: dict[str, Any] = {}
    for name, info in type(section).model_fields.items():
        value = getattr(section, name)
        if is_execution(info):
            execution[name] = section.model_dump(mode="json", include={name})[name]
        elif isinstance(value, Section) and not isinstance(value, OpponentConfig):
            inner_locked, inner_execution = _split(value)
            locked[name] = inner_locked
            if inner_execution:
                execution[name] = inner_execution
        else:
            locked[name] = section.model_dump(mode="json", include={name})[name]
    return locked, execution

