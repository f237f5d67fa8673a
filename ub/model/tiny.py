"""`ub model tiny`: build the CPU default model locally, with no model hub.

The recipe, in order:

1. **Transcripts** (:mod:`ub.model.transcripts`): seeded random-vs-random games of the supported
   games; every decision is a ``plain``-template prompt, the move played, and all legal moves.
2. **Tokenizer**: a byte-level BPE trained on the transcript text, saved as a
   ``PreTrainedTokenizerFast`` with a Qwen-style chat template and ``<|endoftext|>`` as EOS and pad.
3. **Model**: a few-million-parameter ``Qwen3ForCausalLM`` (so vLLM and PEFT treat it like any
   Qwen3 checkpoint), randomly initialised from the seed.
4. **Pre-training**: a short AdamW run on the transcripts so the model writes a legal move in the
   ``[...]`` format followed by EOS. The target of each completion token is the random player's
   whole next-token distribution (every legal move, uniformly), not the one move it happened to
   play: the same expected gradient, far less noise, so a CPU minute goes much further.
5. **Legality check**: greedy and temperature-1 completions on fresh positions; the rates per game
   go into the manifest.

The output directory is a function of (config, seed, :data:`RECIPE_VERSION`, textarena version),
byte-identical for the same inputs (apart from the timing in ``ub_model.json``), built in a hidden
sibling directory and renamed into place, so a killed build never leaves anything that looks
finished. ``ub_model.json`` is written last and is what marks a directory as complete.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.model.transcripts import DEFAULT_ENV_IDS, TranscriptStep, iter_transcripts
from ub.seeding import derive_seed

# Bump whenever the recipe changes what gets built (code, not config): it is part of the cache
# key, so old cached models are never mistaken for new ones.
RECIPE_VERSION = 2

MANIFEST = "ub_model.json"
EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END)  # ids 0, 1, 2

# Qwen-style chat template (no tools, no default system prompt): what template "chat" renders.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Pre-tokenizer split: a bracketed move ("[4]", "[0 3]", "[check]") is one piece, so BPE makes
# each frequent move one token, and choosing a legal move is copying one token from the prompt's
# move list (or, in Nim, one class from the pile counts): greedy legality on fresh positions went
# from 95-97% to 98.7-100%. Other digits stay alone, and any other run of text up to a line end
# is one piece: BPE merges across spaces, so a recurring rule sentence or board row becomes one
# token and prompts are ~3x shorter than with word-level tokens. Any text still encodes
# (byte-level alphabet); a lone "[" is its own piece.
_SPLIT_PATTERN = r"\[[^\[\]\r\n]{1,16}\]|\p{N}|[^\p{N}\r\n\[]+[\r\n]*|[\r\n]+|\["

# Files a build writes besides the manifest: anything else in a directory means it is not ours.
_MODEL_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        MANIFEST,
    }
)


@dataclass(frozen=True)
class TinyModelConfig:
    """Everything that decides what `ub model tiny` builds (all of it is in the cache key)."""

    # --- data ---
    env_ids: tuple[str, ...] = DEFAULT_ENV_IDS
    """TextArena ids whose random-play transcripts the model is pre-trained on."""
    positions_per_env: int = 2000
    """Decisions taken from each game's transcripts (training set size is this times #envs)."""

    # --- tokenizer ---
    vocab_size: int = 4096
    """Upper bound for the BPE vocabulary; the default games' text runs out of merges first
    (~1.3k tokens), so this only bites with many more games."""

    # --- model (Qwen3 shape) ---
    hidden_size: int = 256
    """Width of the residual stream."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = 4
    """Query heads per block."""
    num_kv_heads: int = 2
    """Key/value heads per block (grouped-query attention, as in Qwen3)."""
    head_dim: int = 64
    """Width of each attention head."""
    intermediate_size: int = 768
    """Width of the SwiGLU MLP."""
    max_position_embeddings: int = 2048
    """Longest sequence the model is configured for (prompts here are ~50-150 tokens)."""
    rope_theta: float = 10_000.0
    """RoPE base; 1e4 suits a 2k context (Qwen3's 1e6 is for 32k+)."""

    # --- pre-training ---
    train_steps: int = 1000
    """Optimizer steps (~0.12 s each on 2 idle AVX-512 cores at the default sizes). From 800 to
    1000 Nim's greedy legal moves rose from 98.7% to 100% (300 fresh positions); 1200 gained
    nothing more."""
    batch_tokens: int = 1024
    """Token budget per batch, padding included (batches are bucketed by length). Small batches
    and more steps learned faster per CPU second than 2k or 4k-token batches."""
    learning_rate: float = 3e-3
    """Peak AdamW learning rate (after warm-up; cosine decay to ``min_lr_ratio`` of it)."""
    warmup_steps: int = 30
    """Linear warm-up steps."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    weight_decay: float = 0.01
    """AdamW weight decay (matrices only; not norms)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""
    prompt_loss_weight: float = 0.5
    """Weight of the plain LM loss on prompt tokens, relative to the completion loss. Predicting
    the listed moves from the board trains the same attend-and-copy skill the move needs; it
    lifted TicTacToe/SimpleTak legality by ~10-25 points at equal compute."""
    num_threads: int = 2
    """Torch CPU threads; fixed because float sums (and so the bytes) depend on it."""

    # --- legality check after training ---
    eval_positions_per_env: int = 100
    """Fresh positions per game for the greedy and the sampled legality check (0 skips it)."""
    eval_max_new_tokens: int = 12
    """Generation budget per move in the check (the longest move is ~6 tokens plus EOS)."""

    def __post_init__(self) -> None:
        if not self.env_ids:
            raise UbError("TinyModelConfig.env_ids is empty: name at least one game")
        if self.hidden_size != self.num_heads * self.head_dim:
            # Qwen3 allows it, but vLLM's CPU attention and this recipe are only checked for it.
            raise UbError("TinyModelConfig: hidden_size must equal num_heads * head_dim")
        if self.num_heads % self.num_kv_heads:
            raise UbError("TinyModelConfig: num_heads must be a multiple of num_kv_heads")
        for name in ("positions_per_env", "train_steps", "batch_tokens", "num_threads"):
            if getattr(self, name) < 1:
                raise UbError(f"TinyModelConfig.{name} must be >= 1")


# --------------------------------------------------------------------------------------------
# Cache location and key
# --------------------------------------------------------------------------------------------


def _textarena_version() -> str:
    from importlib.metadata import version

    return version("textarena")


def cache_key(seed: int = 0, config: TinyModelConfig = TinyModelConfig()) -> str:
    """The content key of a build: sha256 of config, seed, recipe version and textarena version.

    textarena is in the key because its observation text is the training data.
    """
    payload = {
        "config": dataclasses.asdict(config),
        "seed": seed,
        "recipe_version": RECIPE_VERSION,
        "textarena": _textarena_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cache_dir() -> Path:
    """``$UB_CACHE_DIR`` or ``~/.cache/ub``, as an absolute path."""
    root = os.environ.get("UB_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "ub").absolute()


def tiny_model_path(seed: int = 0, config: TinyModelConfig = TinyModelConfig()) -> Path:
    """Where the cached build for ``seed`` and ``config`` lives (whether or not it exists yet)."""
    return cache_dir() / "models" / f"tiny-{cache_key(seed, config)[:12]}"


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a complete build in ``path``, or None if it is missing or unreadable."""
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _is_complete(path: Path, key: str) -> bool:
    """True if ``path`` holds a finished build for ``key`` whose files are all there, full size."""
    manifest = read_manifest(path)
    if manifest is None or manifest.get("key") != key:
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for name, size in files.items():
        try:
            if (Path(path) / name).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def _check_replaceable(path: Path) -> None:
    """Refuse to replace a directory that is not (a damaged copy of) a tiny-model build."""
    if not path.exists():
        return
    if not path.is_dir():
        raise UbError(f"{path} exists and is not a directory; choose another output path")
    foreign = sorted(p.name for p in path.iterdir() if p.name not in _MODEL_FILES)
    if foreign:
        raise UbError(
            f"{path} exists and does not look like a tiny-model build (it has {foreign[0]!r}); "
            "choose another output path or remove it"
        )


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """An exclusive lock per target, so concurrent builds of one key run once, not twice."""
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------


def build_tiny_model(
    out_dir: Path | None = None,
    *,
    seed: int = 0,
    config: TinyModelConfig = TinyModelConfig(),
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
    if _is_complete(target, key):
        return target
    _check_replaceable(target)
    log = _stderr_logger("ub model tiny") if verbose else _silent
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target):
        if _is_complete(target, key):  # another process finished it while we waited
            return target
        _check_replaceable(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            _build_into(tmp, seed=seed, config=config, key=key, log=log)
            _publishable(tmp)
            _replace_dir(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log(f"ready: {target}")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """``ub model tiny [--seed N] [--out DIR]``: build or reuse the model, print its path."""
    parser = argparse.ArgumentParser(
        prog="ub model tiny", description="Build (or reuse) the tiny CPU default model."
    )
    parser.add_argument("--seed", type=int, default=0, help="build seed (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: cache)")
    args = parser.parse_args(argv)
    try:
        path = build_tiny_model(args.out, seed=args.seed)
    except UbError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


# --------------------------------------------------------------------------------------------
# The build
# --------------------------------------------------------------------------------------------


def _stderr_logger(prefix: str) -> Callable[[str], None]:
    def log(message: str) -> None:
        print(f"[{prefix}] {message}", file=sys.stderr, flush=True)

    return log


def _silent(_message: str) -> None:
    pass


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No transformers progress bars (e.g. "Writing model shards") in our concise log."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _publishable(path: Path) -> None:
    """Give the build the permissions of a normal mkdir under the umask (mkdtemp makes it 0700)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o777 & ~umask)
    for child in path.iterdir():
        child.chmod(0o666 & ~umask)


def _replace_dir(new: Path, target: Path) -> None:
    """Move the finished ``new`` into ``target``; an old (damaged) ``target`` is moved aside first.

    ``os.replace`` cannot replace a non-empty directory, so the old one goes to a hidden sibling
    and is deleted only after the new one is in place.
    """
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / "dir")
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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


def _build_into(
    out: Path, *, seed: int, config: TinyModelConfig, key: str, log: Callable[[str], None]
) -> None:
    start = time.perf_counter()
    with _torch_settings(config.num_threads):
        steps = list(iter_transcripts(config.env_ids, config.positions_per_env, seed))
        log(f"transcripts: {len(steps)} positions from {len(config.env_ids)} games")

        tokenizer = train_tokenizer(_tokenizer_corpus(steps), config.vocab_size)
        log(f"tokenizer: {len(tokenizer)} tokens")

        model = init_model(tokenizer, config, seed)
        params = sum(p.numel() for p in model.parameters())
        log(f"model: Qwen3, {params / 1e6:.2f} M parameters")

        examples = encode_examples(steps, tokenizer, config.max_position_embeddings)
        from ub.run.progress import progress_bar

        with progress_bar("pre-training", config.train_steps, "steps",
                          enabled=log is not _silent) as bar:
            pretrain(model, examples, config, seed, log, progress=bar)

        with _quiet_transformers():
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
        _write_generation_config(model, tokenizer, out)

        legality: dict[str, Any] = {}
        if config.eval_positions_per_env > 0:
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

    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    manifest = {
        "key": key,
        "recipe_version": RECIPE_VERSION,
        "seed": seed,
        "config": dataclasses.asdict(config),
        "textarena": _textarena_version(),
        "param_count": params,
        "vocab_size": len(tokenizer),
        "train_examples": len(examples),
        "legality": legality,
        "files": files,
        "build_seconds": round(time.perf_counter() - start, 1),
    }
    # Written last, flushed and renamed: its presence is what makes the directory a finished build.
    tmp_manifest = out / f".{MANIFEST}.tmp"
    with open(tmp_manifest, "w") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp_manifest, out / MANIFEST)
    log(f"built in {manifest['build_seconds']:.0f} s")


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def _tokenizer_corpus(steps: Sequence[TranscriptStep]) -> Iterator[str]:
    # Prompts and completions are encoded separately everywhere (rollouts tokenize the prompt, the
    # model generates the rest), so they are separate texts here too: no merge may straddle them.
    for step in steps:
        yield step.prompt
        yield step.completion


def train_tokenizer(texts: Iterator[str] | Sequence[str], vocab_size: int) -> Any:
    """Train a byte-level BPE on ``texts``; return it as a ``PreTrainedTokenizerFast``.

    Deterministic for the same texts: the BPE trainer breaks count ties by the pair itself.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: any text encodes
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=2048,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


def init_model(tokenizer: Any, config: TinyModelConfig, seed: int) -> Any:
    """A randomly initialised float32 ``Qwen3ForCausalLM`` sized by ``config``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    # Rounded up to a multiple of 64 (as Qwen does): friendlier matmul shapes; extra ids unused.
    vocab = 64 * math.ceil(len(tokenizer) / 64)
    qwen_config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        torch_dtype="float32",
    )
    torch.manual_seed(derive_seed("init", seed))
    model = Qwen3ForCausalLM(qwen_config)
    return model.to(torch.float32)


def _write_generation_config(model: Any, tokenizer: Any, out: Path) -> None:
    from transformers import GenerationConfig

    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    # Both ends stop generation: <|endoftext|> after a plain completion, <|im_end|> in chat.
    GenerationConfig(
        bos_token_id=eos, eos_token_id=[eos, im_end], pad_token_id=eos, max_new_tokens=64
    ).save_pretrained(out)


# --------------------------------------------------------------------------------------------
# Pre-training
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One tokenized decision with its soft targets.

    :param ids: prompt token ids followed by the played completion's ids and EOS.
    :param prompt_len: how many of ``ids`` are the prompt.
    :param targets: for each completion position ``j``, the random player's next-token
        distribution given the prompt and ``completion[:j]``: ``((token, prob), ...)``.
    """

    ids: tuple[int, ...]
    prompt_len: int
    targets: tuple[tuple[tuple[int, float], ...], ...]


def _soft_targets(
    played: Sequence[int], legal: Sequence[Sequence[int]]
) -> tuple[tuple[tuple[int, float], ...], ...]:
    """Per position of ``played``: the distribution of the next token over the legal sequences
    that share ``played``'s prefix so far (every legal move equally likely, as the random player).
    """
    targets = []
    alive = [seq for seq in legal]
    for j in range(len(played)):
        counts: dict[int, int] = {}
        for seq in alive:
            if len(seq) > j:
                counts[seq[j]] = counts.get(seq[j], 0) + 1
        total = sum(counts.values())
        targets.append(tuple((tok, n / total) for tok, n in sorted(counts.items())))
        alive = [seq for seq in alive if len(seq) > j and seq[j] == played[j]]
    return tuple(targets)


def encode_examples(
    steps: Sequence[TranscriptStep], tokenizer: Any, max_len: int
) -> list[Example]:
    """Tokenize prompts and completions separately (as rollouts do) and attach soft targets."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    cache: dict[str, list[int]] = {}

    def completion_ids(text: str) -> list[int]:
        if text not in cache:
            cache[text] = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        return cache[text]

    examples = []
    for step in steps:
        prompt = tokenizer(step.prompt, add_special_tokens=False)["input_ids"]
        played = completion_ids(step.completion)
        if len(prompt) + len(played) > max_len:
            continue  # cannot happen with the default games (prompts ~50-150 tokens)
        legal = [completion_ids(" " + action) for action in step.legal]
        examples.append(
            Example(tuple(prompt + played), len(prompt), _soft_targets(played, legal))
        )
    return examples


def _batches(
    examples: Sequence[Example], batch_tokens: int, generator: Any, window: int = 1024
) -> list[list[int]]:
    """One epoch of batches: shuffled, then bucketed by length within windows to cut padding."""
    import torch

    order = torch.randperm(len(examples), generator=generator).tolist()
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: len(examples[i].ids))
        batch: list[int] = []
        for index in chunk:
            longest = len(examples[index].ids)  # sorted: the newest is the longest
            if batch and longest * (len(batch) + 1) > batch_tokens:
                batches.append(batch)
                batch = []
            batch.append(index)
        if batch:
            batches.append(batch)
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffled]


def _batch_loss(model: Any, examples: Sequence[Example], prompt_weight: float) -> Any:
    """Soft cross-entropy on the completion tokens (+ weighted LM loss on the prompt tokens)."""
    import torch

    eos = model.config.pad_token_id
    width = max(len(ex.ids) for ex in examples)
    # Right padding needs no attention mask: causal attention never looks at later (pad) tokens.
    ids = torch.full((len(examples), width), eos, dtype=torch.long)
    for row, ex in enumerate(examples):
        ids[row, : len(ex.ids)] = torch.tensor(ex.ids)
    hidden = model.model(input_ids=ids).last_hidden_state

    rows, cols, tok_index, tok_prob = [], [], [], []
    for row, ex in enumerate(examples):
        for j, dist in enumerate(ex.targets):
            position = len(rows)
            rows.append(row)
            cols.append(ex.prompt_len - 1 + j)  # the hidden state that predicts completion[j]
            for tok, prob in dist:
                tok_index.append((position, tok))
                tok_prob.append(prob)
    # Only positions with a loss go through the LM head: it is a third of the model's compute.
    logp = torch.log_softmax(model.lm_head(hidden[rows, cols]).float(), dim=-1)
    target = torch.zeros_like(logp)
    index = torch.tensor(tok_index)
    target[index[:, 0], index[:, 1]] = torch.tensor(tok_prob)
    loss = -(target * logp).sum(-1).mean()

    if prompt_weight > 0:
        p_rows, p_cols, p_next = [], [], []
        for row, ex in enumerate(examples):
            for t in range(ex.prompt_len - 1):
                p_rows.append(row)
                p_cols.append(t)
                p_next.append(ex.ids[t + 1])
        logits = model.lm_head(hidden[p_rows, p_cols]).float()
        loss = loss + prompt_weight * torch.nn.functional.cross_entropy(
            logits, torch.tensor(p_next)
        )
    return loss


def pretrain(
    model: Any,
    examples: Sequence[Example],
    config: TinyModelConfig,
    seed: int,
    log: Callable[[str], None] = _silent,
    progress: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Train the whole model on ``examples`` for ``config.train_steps`` steps; return the losses.
    ``progress`` is called with (steps done, steps) after each step."""
    import torch

    generator = torch.Generator().manual_seed(derive_seed("batches", seed))
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.learning_rate,
        betas=(0.9, 0.95),
        foreach=False,  # the plain loop: same bytes whatever torch picks as fastest
    )

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return config.learning_rate * (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.train_steps - config.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return config.learning_rate * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)

    # float32 on every CPU: bf16 autocast was no faster on AVX-512/AMX here and falls back to a
    # ~10x slower reference kernel on AVX2-only CPUs; one recipe gives one model everywhere.
    log("pre-training in float32")
    model.train()
    losses: list[float] = []
    pending: list[list[int]] = []
    start = time.perf_counter()
    for step in range(config.train_steps):
        if not pending:
            pending = _batches(examples, config.batch_tokens, generator)
        batch = [examples[i] for i in pending.pop()]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = _batch_loss(model, batch, config.prompt_loss_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
        if progress is not None:
            progress(step + 1, config.train_steps)
        if (step + 1) % 50 == 0 or step + 1 == config.train_steps:
            recent = losses[-50:]
            log(
                f"step {step + 1}/{config.train_steps} loss {sum(recent) / len(recent):.3f} "
                f"({time.perf_counter() - start:.0f} s)"
            )
    model.eval()
    return losses


# --------------------------------------------------------------------------------------------
# Legality check
# --------------------------------------------------------------------------------------------


def measure_legality(
    model: Any,
    tokenizer: Any,
    env_ids: Sequence[str] = DEFAULT_ENV_IDS,
    positions_per_env: int = 100,
    seed: int = 0,
    max_new_tokens: int = 12,
    batch_size: int = 64,
) -> dict[str, dict[str, dict[str, float]]]:
    """Legal-move rates of ``model`` on fresh positions (games no training stream plays).

    For each env, greedy and temperature-1 (no top-k/top-p) completions of the ``plain`` prompt:
    ``legal`` = the bracketed action the rollout would extract is a legal move; ``exact`` = the
    completion is exactly ``" [move]"`` then EOS, as in training; ``eos`` = it ended with EOS.
    Sampling is seeded and the caller's torch RNG is left untouched.
    """
    import torch

    from ub.games.actions import extract_bracket

    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    results: dict[str, dict[str, dict[str, float]]] = {}
    model.eval()
    for env_id in env_ids:
        # One position per game, at a random turn: many different games, early and late.
        steps = list(
            iter_transcripts([env_id], positions_per_env, seed, stream="eval", positions_per_game=1)
        )
        results[env_id] = {}
        for mode in ("greedy", "sampled"):
            counts = {"legal": 0, "exact": 0, "eos": 0}
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(derive_seed("eval", seed, env_id, mode))
                for start in range(0, len(steps), batch_size):
                    chunk = steps[start : start + batch_size]
                    outputs = _generate(
                        model, tokenizer, [s.prompt for s in chunk], mode, max_new_tokens, eos
                    )
                    for step, out in zip(chunk, outputs, strict=True):
                        ended = eos in out
                        text = tokenizer.decode(out[: out.index(eos)] if ended else out)
                        action, format_ok = extract_bracket(text)
                        counts["legal"] += format_ok and action in step.legal
                        counts["exact"] += ended and text.startswith(" ") and (
                            text[1:] in step.legal
                        )
                        counts["eos"] += ended
            results[env_id][mode] = {k: v / len(steps) for k, v in counts.items()}
    return results


def _generate(
    model: Any, tokenizer: Any, prompts: list[str], mode: str, max_new_tokens: int, eos: int
) -> list[list[int]]:
    """New token ids per prompt (transformers ``generate``, left-padded batch)."""
    import torch

    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(len(ids) for ids in encoded)
    ids = torch.full((len(encoded), width), eos, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, seq in enumerate(encoded):
        ids[row, width - len(seq) :] = torch.tensor(seq)
        mask[row, width - len(seq) :] = 1
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    output = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=eos,
        **(sampling if mode == "sampled" else {"do_sample": False}),
    )
    return [row[width:].tolist() for row in output]


if __name__ == "__main__":
    sys.exit(main())
