"""`ub model tiny`'s build: transcripts, tokenizer, random model, pre-training, legality check,
manifest; and :func:`build_tiny_model`, which reuses a finished build or publishes a new one."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ub.data.atomic import publishable, removed_on_failure
from ub.errors import UbError
from ub.model.builder import init_model, save_model, train_tokenizer
from ub.model.tiny.cache import (
    build_lock,
    cache_key,
    check_replaceable,
    is_complete,
    lock_path,
    replace_dir,
    textarena_version,
    tiny_model_path,
    write_manifest,
)
from ub.model.tiny.config import DEFAULT_CONFIG, RECIPE_VERSION, TinyModelConfig
from ub.model.tiny.legality import measure_legality
from ub.model.tiny.pretrain import encode_examples, pretrain, silent
from ub.model.transcripts import TranscriptStep, iter_transcripts
from ub.seeding import derive_seed

Log = Callable[[str], None]


def build_tiny_model(
    out_dir: Path | None = None,
    *,
    seed: int = 0,
    config: TinyModelConfig = DEFAULT_CONFIG,
    verbose: bool = True,
) -> Path:
    """Build (or reuse) the tiny model for ``seed`` and ``config``; return its directory.

    With no ``out_dir`` the model lives in the cache (:func:`tiny_model_path`). A directory that
    already holds a complete build with the same key is returned at once; a partial or damaged
    one is rebuilt. Progress goes to stderr unless ``verbose`` is False.

    :raises UbError: ``out_dir`` exists and is not a tiny-model build, or the config is invalid.
    """
    key = cache_key(seed, config)
    target = Path(out_dir).expanduser().absolute() if out_dir else tiny_model_path(seed, config)
    if is_complete(target, key):
        return target
    check_replaceable(target)
    config.check_games()  # (before anything is created: a refused build leaves nothing)
    log = _stderr_logger("ub model tiny") if verbose else silent
    # A build that fails takes its lock file, and the folders made for it, with it.
    with removed_on_failure(lock_path(target), keep=target.exists):
        target.parent.mkdir(parents=True, exist_ok=True)
        with build_lock(target):
            if is_complete(target, key):  # another process finished it while we waited
                return target
            check_replaceable(target)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
            try:
                _build_into(tmp, seed=seed, config=config, key=key, log=log)
                publishable(tmp)
                replace_dir(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    log(f"ready: {target}")
    return target


def _stderr_logger(prefix: str) -> Log:
    def log(message: str) -> None:
        print(f"[{prefix}] {message}", file=sys.stderr, flush=True)

    return log


@contextlib.contextmanager
def _torch_settings(num_threads: int) -> Iterator[None]:
    """Fixed threads and deterministic kernels for the build; the caller's settings come back."""
    import torch

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch.set_num_threads(num_threads)
    except RuntimeError as error:  # e.g. an in-process vLLM engine has pinned the threads
        raise UbError(
            f"cannot set torch to {num_threads} threads here ({error}); "
            "build the tiny model in a separate process (`ub model tiny`)"
        ) from None
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)


@dataclass
class _Trained:
    model: Any
    tokenizer: Any
    params: int
    examples: int


def _build_into(out: Path, *, seed: int, config: TinyModelConfig, key: str, log: Log) -> None:
    """Build the model into ``out`` and write its manifest last."""
    start = time.perf_counter()
    with _torch_settings(config.num_threads):
        trained = _train(seed, config, log)
        save_model(trained.model, trained.tokenizer, out)
        legality = _check_legality(trained.model, trained.tokenizer, seed, config, log)
    manifest = {
        "key": key,
        "recipe_version": RECIPE_VERSION,
        "seed": seed,
        "config": config.to_dict(),
        "textarena": textarena_version(),
        "param_count": trained.params,
        "vocab_size": len(trained.tokenizer),
        "train_examples": trained.examples,
        "legality": legality,
        "files": {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()},
        "build_seconds": round(time.perf_counter() - start, 1),
    }
    write_manifest(out, manifest)
    log(f"built in {manifest['build_seconds']:.0f} s")


def _train(seed: int, config: TinyModelConfig, log: Log) -> _Trained:
    """Transcripts, then a tokenizer trained on them, then a random model pre-trained on them."""
    steps = list(iter_transcripts(config.env_ids, config.positions_per_env, seed))
    log(f"transcripts: {len(steps)} positions from {len(config.env_ids)} games")

    tokenizer = train_tokenizer(_tokenizer_corpus(steps), config.vocab_size)
    log(f"tokenizer: {len(tokenizer)} tokens")

    model = init_model(tokenizer, config.shape, derive_seed("init", seed))
    params = sum(p.numel() for p in model.parameters())
    log(f"model: Qwen3, {params / 1e6:.2f} M parameters")

    examples = encode_examples(steps, tokenizer, config.max_position_embeddings)
    if not examples:
        raise UbError(f"TinyModelConfig.max_position_embeddings {config.max_position_embeddings} "
                      "holds no pre-training example (a prompt and its move, ~50-150 tokens): "
                      "raise it")
    from ub.progress_bar import progress_bar

    with progress_bar("pre-training", config.train_steps, "steps",
                      enabled=log is not silent) as bar:
        pretrain(model, examples, config, seed, log, progress=bar)
    return _Trained(model, tokenizer, params, len(examples))


def _tokenizer_corpus(steps: Sequence[TranscriptStep]) -> Iterator[str]:
    # Prompts and completions are encoded separately everywhere (rollouts tokenize the prompt, the
    # model generates the rest), so they are separate texts here too: no merge may straddle them.
    for step in steps:
        yield step.prompt
        yield step.completion


def _check_legality(
    model: Any, tokenizer: Any, seed: int, config: TinyModelConfig, log: Log
) -> dict[str, Any]:
    """The legal-move rates on fresh positions that go into the manifest (none if skipped)."""
    if config.eval_positions_per_env <= 0:
        return {}
    legality = measure_legality(
        model,
        tokenizer,
        env_ids=config.env_ids,
        positions_per_env=config.eval_positions_per_env,
        seed=seed,
        max_new_tokens=config.eval_max_new_tokens,
    )
    for env_id, row in legality.items():
        log(
            f"legal moves {env_id}: greedy {row['greedy']['legal']:.0%}, "
            f"sampled (T=1) {row['sampled']['legal']:.0%}"
        )
    return legality
