"""Reasoning benchmarks through lm-evaluation-harness, on ub's own vLLM engine.

Does game play transfer? SPIRAL (arXiv 2506.24119) measured it on math and general reasoning
benchmarks. ub scores a checkpoint on tasks as the harness names them (``gsm8k``,
``minerva_math500``, ``mmlu_pro``, or a task folder of one's own) and returns one row per
(task, metric); :mod:`ub.run.steps.benchmarks` stores them with the run.

Design: the harness drives, ub generates. :class:`EngineLM` is a harness model
(``lm_eval.api.model.LM``) over ub's engine handle, the one a run's games use
(:func:`ub.run.steps.play.run_engine`: the run's dtype and context length, the CPU LoRA
patches, one engine kept across rounds), with the checkpoint's LoRA adapter on every request.
The alternative, the harness's own ``vllm`` model or its OpenAI client against ``ub serve``,
would start a second engine beside the run's (twice the memory on a GPU, minutes per start)
and bypass the CPU LoRA fixes; this class is a page of code instead.

- ``generate_until``: the requests go to the engine in one batch (vLLM's continuous
  batching), greedy unless the task asks ``do_sample`` with a temperature, at most
  ``max_gen_toks`` tokens; the completion is cut before the first of the task's ``until``
  strings (the engine keeps a stop string in its text; the harness expects it gone), and the
  format's end of turn ends it like EOS.
- Prompt format (:func:`chat_format`): the one the run plays in. A run whose games use a chat
  format (template ``chat`` or ``qwen3-zs``) is scored through the tokenizer's chat template
  (the harness's ``apply_chat_template``, few-shot examples as turns); a run that plays plain
  text gets the harness's prompts as they are. A chat format asked of a tokenizer without a
  chat template is refused.
- ``loglikelihood``: not served. ub's engine returns the logprobs of what it samples, not of a
  given continuation (that would need vLLM's prompt logprobs through ub's CPU LoRA path, which
  nothing here tests), and SPIRAL's tasks are all generative. Tasks that need it (multiple
  choice, perplexity) are refused before the engine starts, by name.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import io
import json
import logging
import math
import random
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from ub.errors import UbError
from ub.settings import Section

if TYPE_CHECKING:
    from ub.inference.protocols import InferenceEngine

log = logging.getLogger("ub.eval")

PromptFormat = Literal["auto", "chat", "plain"]
"""How a benchmark's prompts reach the model: ``auto`` (as the run plays: :func:`chat_format`),
``chat`` (the tokenizer's chat template) or ``plain`` (the harness's text as it is)."""

GENERATIVE = "generate_until"
"""The one output type :class:`EngineLM` serves (see the module docstring)."""

INSTALL = "pip install -e '.[benchmarks]' (or scripts/setup.sh)"


class BenchmarksSection(Section):
    """Reasoning benchmarks scored during training (``eval.benchmarks``; docs/training.md)."""

    key: ClassVar[str] = "eval.benchmarks"

    tasks: list[str] = Field(default_factory=list, description="lm-evaluation-harness task or "
                             "group names (e.g. gsm8k, minerva_math500, mmlu_pro; generative "
                             "tasks only); empty: none.")
    every: int = Field(10, ge=1, description="Score every N updates (and checkpoint 0 and the "
                       "final one).")
    limit: int | None = Field(None, ge=1, description="Examples per task (each task of a "
                              "group); null: all.")
    include_path: str | None = Field(None, description="A folder of one's own task YAML files "
                                     "(the harness's --include_path).")
    prompt_format: PromptFormat = Field("auto", description="auto: the chat template if the "
                                        "run plays in a chat format, else plain text; chat; "
                                        "plain.")

    @field_validator("tasks")
    @classmethod
    def _names(cls, tasks: list[str]) -> list[str]:
        for name in tasks:
            if not TASK_NAME.fullmatch(name) or ".." in name:
                raise ValueError(_bad_name(name))
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"a task is named twice in {tasks}")
        return tasks


TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A task's name, as the harness's are: it names the task's files in a run."""


def _bad_name(name: str) -> str:
    return (f"benchmark task {name!r} is not a harness task name: use the task's name "
            "(letters, digits, '.', '_' and '-'), not a path")


def check_task_name(name: str) -> str:
    """``name``, or a UbError if it could not be a harness task's (a path, a space)."""
    if not TASK_NAME.fullmatch(name or "") or ".." in name:
        raise UbError(_bad_name(name))
    return name


def benchmarks_due(section: BenchmarksSection, update: int, last: int) -> bool:
    """Checkpoints scored during training: 0, every ``every`` updates, and the last."""
    return bool(section.tasks) and (update % section.every == 0 or update == last)


# --------------------------------------------------------------------------------------------
# The harness: imported on use (it is an optional extra)
# --------------------------------------------------------------------------------------------


def harness_version() -> str:
    """The installed lm-evaluation-harness's version, or a UbError saying how to install it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        import lm_eval  # noqa: F401
    except Exception as exc:  # (a broken install raises more than ImportError)
        raise UbError(f"cannot import lm-evaluation-harness ({type(exc).__name__}: {exc}): "
                      f"install the benchmarks extra: {INSTALL}") from None
    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return "unknown"


@functools.lru_cache(maxsize=4)
def task_manager(include_path: str | None) -> Any:
    """The harness's task index (built-in tasks and ``include_path``'s): indexing its
    thousands of YAML files takes seconds, so a process builds it once per folder."""
    harness_version()
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        raise UbError(f"--include-path {include_path} is not a folder: give the folder that "
                      "holds your task YAML files")
    return TaskManager(include_path=include_path)


def check_task_names(names: Sequence[str], include_path: str | None) -> None:
    """Refuse names the harness does not know, each with the nearest known ones."""
    manager = task_manager(include_path)
    known = set(manager.all_tasks)
    for name in names:
        if name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f" (did you mean: {', '.join(near)}?)" if near else ""
            raise UbError(f"unknown benchmark task {name!r}{hint}: the harness's tasks are "
                          "named in lm_eval/tasks/README.md; a task of your own needs "
                          "--include-path (eval.benchmarks.include_path) with its YAML folder")


@contextlib.contextmanager
def _quiet_harness() -> Iterator[None]:
    """The harness logs every task's defaults at INFO and warnings ub already handles, and
    the datasets library draws a progress bar on stderr when it first reads a dataset (around
    a refusal's one line, too).

    The harness's own tqdm bars have no switch: one per task as it builds its requests
    (``lm_eval.api.task``'s module-level ``tqdm``) and one per bootstrapped stderr (a
    ``from tqdm import tqdm`` at the call, with a ``print`` to stdout before it). In the block
    both names are a tqdm that is off, and what the harness prints goes to ub's log."""
    import tqdm as tqdm_package
    from datasets.utils import logging as datasets_logging
    from lm_eval.api import task as harness_task

    class SilentTqdm(tqdm_package.tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    loggers = [logging.getLogger(name) for name in ("lm_eval", "lm-eval")]
    levels = [logger.level for logger in loggers]
    bars = datasets_logging.is_progress_bar_enabled()
    tqdms = [(module, module.tqdm) for module in (harness_task, tqdm_package)]
    printed = io.StringIO()
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    datasets_logging.disable_progress_bar()
    for module, _ in tqdms:
        module.tqdm = SilentTqdm
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        for module, original in tqdms:
            module.tqdm = original
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        if bars:
            datasets_logging.enable_progress_bar()
        for line in printed.getvalue().splitlines():
            if line.strip():
                log.info("lm-eval: %s", line.strip())


def load_task(name: str, include_path: str | None) -> dict[str, Any]:
    """The harness's loaded task (or group) ``name``, its datasets read: what
    ``lm_eval.evaluator.evaluate`` takes. Refused in one line: an unknown name, a task that
    is not generative, a dataset that cannot be fetched (offline, or not on the hub)."""
    check_task_names([name], include_path)
    manager = task_manager(include_path)
    try:
        with _quiet_harness():
            loaded = manager.load([name])
    except (ConnectionError, OSError) as exc:
        raise UbError(
            f"task {name}: its dataset cannot be fetched ({_one_line(exc)}): on a machine "
            "without network pre-fetch it into the Hugging Face cache on one with it (see "
            "docs/training.md, 'Reasoning benchmarks'), or give a local task with "
            "--include-path") from None
    except Exception as exc:  # the harness's own errors: a broken task file, a missing extra
        raise UbError(f"task {name}: the harness cannot load it ({type(exc).__name__}: "
                      f"{_one_line(exc)})") from None
    needs = sorted(t for t, task in loaded["tasks"].items()
                   if task.config.output_type != GENERATIVE)
    if needs:
        raise UbError(f"task {name}: {', '.join(needs)} need loglikelihood scores, which ub's "
                      f"engine does not serve: choose generative ({GENERATIVE}) tasks, e.g. "
                      "gsm8k, minerva_math500, mmlu_pro")
    for task in loaded["tasks"].values():  # as simple_evaluate does: zero-shot unless set
        if task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=FEWSHOT_SEED)
    return loaded


FEWSHOT_SEED = 1234
"""The harness's default seed for drawing few-shot examples (simple_evaluate's)."""


def _one_line(error: BaseException, limit: int = 240) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# The prompt format
# --------------------------------------------------------------------------------------------


def chat_format(asked: PromptFormat, run_templates: Sequence[str], tokenizer: Any) -> bool:
    """Whether prompts go through the tokenizer's chat template: ``auto`` as the run's games
    are prompted (a chat format, :attr:`ub.games.templates.PromptTemplate.chat`, for any of
    its training envs), else as asked. A chat format needs a chat template."""
    from ub.games.templates import get_template

    chat = (any(get_template(name).chat for name in run_templates) if asked == "auto"
            else asked == "chat")
    if chat and not getattr(tokenizer, "chat_template", None):
        why = ("the run plays in a chat format" if asked == "auto"
               else "a chat format was asked for")
        raise UbError(f"{why}, but the base model's tokenizer has no chat template: score "
                      "with plain prompts (--format plain; eval.benchmarks.prompt_format: "
                      "plain) or use a base model that has one")
    return chat


# --------------------------------------------------------------------------------------------
# The harness's model over ub's engine
# --------------------------------------------------------------------------------------------


def _lm_base() -> type:
    from lm_eval.api.model import LM

    return LM


@dataclass(frozen=True)
class Generated:
    """What :func:`generate` makes of one harness request: the text the harness scores."""

    text: str
    tokens: int
    truncated_prompt: bool


def generation_budget(prompt_tokens: int, max_gen: int, max_model_len: int) -> tuple[int, int]:
    """(prompt tokens kept, tokens to generate) within the engine's context: all of the
    prompt and ``max_gen`` tokens when they fit; else as many new tokens as the context leaves
    beside the whole prompt, but at least a quarter of it (or ``max_gen``, if smaller), the
    prompt then cut from the left as the harness's own models do."""
    room = max_model_len - 1  # (the engine refuses a prompt that fills its context)
    if prompt_tokens + max_gen <= room:
        return prompt_tokens, max_gen
    gen = max(min(max_gen, room // 4), room - prompt_tokens)
    return room - gen, gen


def until_cut(text: str, until: Sequence[str]) -> str:
    """``text`` up to the first of the stop strings (the harness's models drop it)."""
    cut = len(text)
    for stop in until:
        at = text.find(stop) if stop else -1
        if at >= 0:
            cut = min(cut, at)
    return text[:cut]


def generate(engine: InferenceEngine, adapter: str | None,
             requests: Sequence[tuple[str, dict[str, Any]]], *, stop_token_ids: tuple[int, ...],
             seed: int) -> list[Generated]:
    """The harness's ``generate_until`` requests ``(context, gen_kwargs)`` through ub's engine
    in one batch, with ``adapter`` (see the module docstring)."""
    from ub.inference.types import GenerationRequest, SamplingConfig

    tokenizer = engine.tokenizer
    max_len = engine.config.max_model_len
    batch, cuts, truncated = [], [], []
    for index, (context, kwargs) in enumerate(requests):
        kwargs = dict(kwargs or {})
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_gen = int(kwargs.get("max_gen_toks") or DEFAULT_MAX_GEN_TOKS)
        temperature = float(kwargs.get("temperature") or 0.0)
        if not kwargs.get("do_sample"):
            temperature = 0.0  # greedy, as the harness means it (do_sample false or absent)
        ids = tokenizer.encode(context)  # (as the rollout tokenizes a game's prompt)
        keep, gen = generation_budget(len(ids), max_gen, max_len)
        truncated.append(keep < len(ids))
        ids = ids[len(ids) - keep:]
        sampling = SamplingConfig(temperature=temperature, top_p=1.0, max_tokens=gen,
                                  stop=tuple(s for s in until if s))
        batch.append(GenerationRequest(f"bench-{seed}-{index}", ids, seed=seed + index,
                                       adapter=adapter, sampling=sampling,
                                       stop_token_ids=stop_token_ids))
        cuts.append(until)
    done = engine.generate(batch) if batch else []
    return [Generated(until_cut(g.text, cut), len(g.completion_token_ids), short)
            for g, cut, short in zip(done, cuts, truncated, strict=True)]


DEFAULT_MAX_GEN_TOKS = 256
"""Tokens per answer when a task gives no ``max_gen_toks`` (the harness's default)."""


def engine_lm(engine: InferenceEngine, adapter: str | None, *, chat: bool,
              seed: int = 0) -> Any:
    """A harness model (``lm_eval.api.model.LM``) generating with ``engine`` and
    ``adapter``; ``chat``: prompts through the tokenizer's chat template, the template's end
    of turn ending a completion like EOS."""
    from ub.games.templates import get_template

    base = _lm_base()
    stops = get_template("chat").end_token_ids(engine.tokenizer) if chat else ()

    class EngineLM(base):  # type: ignore[valid-type,misc]
        """See :mod:`ub.benchmarks`."""

        def __init__(self) -> None:
            super().__init__()
            self.generated_tokens = 0
            self.truncated_prompts = 0

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            out = generate(engine, adapter, [r.args for r in requests],
                           stop_token_ids=stops, seed=seed)
            self.generated_tokens += sum(g.tokens for g in out)
            self.truncated_prompts += sum(g.truncated_prompt for g in out)
            return [g.text for g in out]

        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> Any:
            raise UbError("ub's engine serves generative tasks only (no loglikelihood)")

        loglikelihood_rolling = loglikelihood

        @property
        def tokenizer_name(self) -> str:
            return str(getattr(engine.tokenizer, "name_or_path", "ub")).replace("/", "__")

        def chat_template(self, chat_template: bool | str = False) -> str | None:
            return engine.tokenizer.chat_template if chat else None

        def apply_chat_template(self, chat_history: list[dict[str, str]],
                                add_generation_prompt: bool = True) -> str:
            return engine.tokenizer.apply_chat_template(
                chat_history, tokenize=False, add_generation_prompt=add_generation_prompt)

    return EngineLM()


# --------------------------------------------------------------------------------------------
# Scoring and its rows
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scored:
    """One task (or group) scored: its rows, the harness's per-example samples, and cost."""

    rows: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    seconds: float
    generated_tokens: int
    truncated_prompts: int


def score_task(engine: InferenceEngine, adapter: str | None, name: str, *,
               loaded: dict[str, Any], limit: int | None, chat: bool) -> Scored:
    """Score ``adapter`` (``None``: the base model) on the loaded task ``name``
    (:func:`load_task`) through the harness's evaluator."""
    import numpy as np
    from lm_eval import evaluator

    # The harness's seeds, as simple_evaluate sets them (its few-shot draws use their own).
    random.seed(0)
    np.random.seed(1234)
    lm = engine_lm(engine, adapter, chat=chat)
    started = time.perf_counter()
    with _quiet_harness():
        results = evaluator.evaluate(lm=lm, task_dict=loaded, limit=limit, log_samples=True,
                                     apply_chat_template=chat, fewshot_as_multiturn=chat,
                                     bootstrap_iters=BOOTSTRAP_ITERS)
    seconds = time.perf_counter() - started
    if results is None:  # (only a non-zero rank of a distributed harness run gets None)
        raise UbError(f"task {name}: the harness returned no results")
    rows = result_rows(results, name, harness_version())
    samples = [{"task": task, **sample} for task, listed in results.get("samples", {}).items()
               for sample in listed]
    return Scored(rows, samples, seconds, lm.generated_tokens, lm.truncated_prompts)


BOOTSTRAP_ITERS = 1000
"""Resamples for the stderr of metrics the harness bootstraps (its default, 100,000, takes
longer than the scoring on small limits; the means are exact either way)."""


def config_hash(config: Any) -> str:
    """A task's config (as the harness reports it) as a short sha256: a row scored under
    another prompt, dataset or metric has another hash."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def result_rows(results: dict[str, Any], benchmark: str, version: str) -> list[dict[str, Any]]:
    """One row per (task, metric, filter) of the harness's ``results``: the requested
    ``benchmark`` and, for a group, each of its tasks and the group's aggregate."""
    configs = results.get("configs", {})
    counts = results.get("n-samples", {})
    subtasks = _group_tasks(results.get("group_subtasks", {}))
    rows = []
    for task, figures in sorted(results.get("results", {}).items()):
        members = subtasks.get(task, [task])
        n = sum(int(counts.get(t, {}).get("effective", 0)) for t in members)
        digest = config_hash([configs.get(t) for t in members])
        for key, value in sorted(figures.items()):
            metric, _, filter_ = key.partition(",")
            if metric.endswith("_stderr") or not _number(value) or key == "sample_len":
                continue
            stderr = figures.get(f"{metric}_stderr,{filter_}")
            rows.append({"benchmark": benchmark, "task": task, "metric": metric,
                         "filter": filter_ or None, "value": float(value),
                         "stderr": float(stderr) if _number(stderr) else None, "n": n,
                         "harness_version": version, "task_hash": digest})
    return rows


def _group_tasks(group_subtasks: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each group's leaf tasks (groups nest)."""
    def leaves(name: str) -> list[str]:
        members = group_subtasks.get(name)
        return [name] if not members else [t for m in members for t in leaves(m)]

    return {group: leaves(group) for group in group_subtasks if group_subtasks[group]}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
        float(value))


def json_line(sample: dict[str, Any]) -> str:
    """A harness sample as one JSON line (its numpy numbers as plain ones)."""
    return json.dumps(sample, default=_plain, ensure_ascii=False)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)

