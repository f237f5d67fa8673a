"""`ub model tiny`: the locally built CPU default model.

Most tests use a SMALL config (a few training steps, seconds to build) for the mechanics:
determinism, caching, atomic builds, the saved tokenizer, PEFT. One test uses the default model
(``build_tiny_model()``, cached after its first build) to check it actually plays legal moves.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import pytest

from ub.cli import model as model_command
from ub.cli.parser import build_parser, run
from ub.errors import UbError
from ub.model import tiny as tiny_package
from ub.model.tiny import (
    MANIFEST,
    TinyModelConfig,
    build_tiny_model,
    measure_legality,
    read_manifest,
    tiny_model_path,
)
from ub.model.tiny import build as tiny_build
from ub.model.tiny.pretrain import soft_targets
from ub.model.transcripts import DEFAULT_ENV_IDS, iter_transcripts, transcript_pairs

# Every mechanism of the real recipe, at a size that builds in a few seconds.
SMALL = TinyModelConfig(
    positions_per_env=40,
    num_layers=2,
    intermediate_size=256,
    train_steps=4,
    batch_tokens=1024,
    warmup_steps=2,
    eval_positions_per_env=4,
)

def tiny_main(argv: list[str]) -> int:
    """``ub model tiny ARGV``: its exit code (2 for a refusal, printed on stderr)."""
    return run(build_parser([model_command]), ["model", "tiny", *argv])


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("UB_CACHE_DIR", str(root))
    return root


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("small") / "model", config=SMALL, verbose=False)


def _file_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != MANIFEST}


def _manifest_without_timing(path: Path) -> dict:
    manifest = read_manifest(path)
    assert manifest is not None
    manifest.pop("build_seconds")
    return manifest


# --- transcripts --------------------------------------------------------------------------


def test_transcripts_are_seeded_and_leave_global_random_alone() -> None:
    import textarena  # noqa: F401  (importing it draws from the global random once)

    random.seed(1234)
    before = random.getstate()
    first = list(iter_transcripts(DEFAULT_ENV_IDS, positions_per_env=30, seed=5))
    assert random.getstate() == before
    random.seed(99)  # a different global state must not change the games
    assert list(iter_transcripts(DEFAULT_ENV_IDS, positions_per_env=30, seed=5)) == first
    assert list(iter_transcripts(DEFAULT_ENV_IDS, positions_per_env=30, seed=6)) != first

    assert {s.env_id for s in first} == set(DEFAULT_ENV_IDS)
    assert all(sum(s.env_id == e for s in first) == 30 for e in DEFAULT_ENV_IDS)
    for step in first:
        assert step.prompt.endswith("Your action:")
        assert step.completion[0] == " " and step.completion[1:] in step.legal
    pairs = list(transcript_pairs(DEFAULT_ENV_IDS, positions_per_env=30, seed=5))
    assert pairs == [s.pair for s in first]


def test_eval_stream_is_disjoint_from_training() -> None:
    train = {s.prompt for s in iter_transcripts(["KuhnPoker-v0-train"], 50, seed=0)}
    evals = list(
        iter_transcripts(["KuhnPoker-v0-train"], 50, seed=0, stream="eval", positions_per_game=1)
    )
    assert len({s.game_seed for s in evals}) == 50  # one position from each of 50 games
    assert {s.game_seed for s in evals}.isdisjoint(
        {s.game_seed for s in iter_transcripts(["KuhnPoker-v0-train"], 50, seed=0)}
    )
    assert train  # (prompts may coincide for identical early positions; seeds may not)


def test_unsupported_game_is_a_clear_error() -> None:
    with pytest.raises(UbError, match="legal-move"):
        next(iter_transcripts(["NoSuchGame-v0"], 1))


def test_soft_targets_are_the_random_players_distribution() -> None:
    # Legal completions " [1]", " [12]", " [2]" as token ids: 5=" [", 1/2 digits, 9="]", 0=EOS.
    legal = [[5, 1, 9, 0], [5, 1, 2, 9, 0], [5, 2, 9, 0]]
    targets = soft_targets([5, 1, 2, 9, 0], legal)
    assert targets[0] == ((5, 1.0),)
    assert targets[1] == ((1, pytest.approx(2 / 3)), (2, pytest.approx(1 / 3)))
    assert targets[2] == ((2, 0.5), (9, 0.5))  # after " [1": "]" or "2", equally
    assert targets[3] == ((9, 1.0),)
    assert targets[4] == ((0, 1.0),)


# --- build mechanics (small config) ---------------------------------------------------------


def test_build_is_deterministic(tmp_path: Path) -> None:
    first = build_tiny_model(tmp_path / "a", config=SMALL, verbose=False)
    second = build_tiny_model(tmp_path / "b", config=SMALL, verbose=False)
    assert _file_bytes(first) == _file_bytes(second)
    assert _manifest_without_timing(first) == _manifest_without_timing(second)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(_file_bytes(first))
    # No temporary or replaced directories are left next to the builds.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        "a",
        "b",
    ]


def test_cache_hit_returns_same_path_without_rebuilding(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = build_tiny_model(config=SMALL, seed=3, verbose=False)
    assert path == tiny_model_path(seed=3, config=SMALL)
    assert path.parent == cache_root / "models" and path.name.startswith("tiny-")
    manifest_mtime = (path / MANIFEST).stat().st_mtime_ns

    def no_rebuild(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a cached model was rebuilt")

    monkeypatch.setattr(tiny_build, "_build_into", no_rebuild)
    start = time.perf_counter()
    assert build_tiny_model(config=SMALL, seed=3, verbose=False) == path
    assert time.perf_counter() - start < 1.0
    assert (path / MANIFEST).stat().st_mtime_ns == manifest_mtime

    # Another seed or config is another key, another directory.
    assert tiny_model_path(seed=4, config=SMALL) != path
    other = SMALL.replace(train_steps=5)
    assert tiny_model_path(seed=3, config=other) != path


@pytest.mark.parametrize("damage", ["no-manifest", "truncated-weights", "other-key"])
def test_partial_or_damaged_build_is_rebuilt(cache_root: Path, small_model: Path,
                                             damage: str) -> None:
    # The module's build, copied to where the cache keeps it, then damaged.
    path = Path(shutil.copytree(small_model, tiny_model_path(config=SMALL)))
    reference = _file_bytes(path)
    if damage == "no-manifest":
        (path / MANIFEST).unlink()
    elif damage == "truncated-weights":
        with open(path / "model.safetensors", "r+b") as handle:
            handle.truncate(1000)
    else:
        manifest = json.loads((path / MANIFEST).read_text())
        manifest["key"] = "0" * 64
        (path / MANIFEST).write_text(json.dumps(manifest))

    assert build_tiny_model(config=SMALL, verbose=False) == path
    assert read_manifest(path) is not None
    assert _file_bytes(path) == reference


def test_failed_build_leaves_nothing_that_looks_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt  # as if the build were killed mid-training

    monkeypatch.setattr(tiny_build, "pretrain", crash)
    with pytest.raises(KeyboardInterrupt):
        build_tiny_model(tmp_path / "model", config=SMALL, verbose=False)
    assert not (tmp_path / "model").exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_refuses_to_overwrite_a_foreign_directory(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(UbError, match="does not look like a tiny-model build"):
        build_tiny_model(out, config=SMALL, verbose=False)
    assert (out / "notes.txt").read_text() == "keep me"


def test_main_prints_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = {}

    def fake_build(out_dir: Path | None, *, seed: int, config: TinyModelConfig) -> Path:
        seen.update(out_dir=out_dir, seed=seed, config=config)
        return tmp_path

    monkeypatch.setattr(tiny_package, "build_tiny_model", fake_build)
    argv = ["--seed", "7", "--out", str(tmp_path / "x"), "--set", "num_layers=6",
            "--set", "env_ids=TicTacToe-v0-train, Nim-v0-train", "--set", "learning_rate=1e-3"]
    assert tiny_main(argv) == 0
    assert seen == {"out_dir": tmp_path / "x", "seed": 7, "config": TinyModelConfig().replace(
        num_layers=6, env_ids=("TicTacToe-v0-train", "Nim-v0-train"), learning_rate=1e-3)}
    assert capsys.readouterr().out.strip() == str(tmp_path)


@pytest.mark.parametrize(("override", "message"), [
    ("layers=6", "invalid tiny model settings: layers: unknown setting"),
    ("num_layers=six", "num_layers: Input should be a valid integer (got 'six')"),
    ("num_layers", "expected key=value, e.g. --set num_layers=6"),
    ("num_heads=3", "hidden_size must equal num_heads * head_dim, got 256 != 3 * 64"),
    ("env_ids=", "env_ids: Input should be a valid tuple"),
    ("env_ids=,", "env_ids: Tuple should have at least 1 item"),
])
def test_a_bad_setting_is_refused_before_building(
    override: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tiny_main(["--out", str(tmp_path / "x"), "--set", override]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_build_with_settings_records_them(tmp_path: Path) -> None:
    settings = {name: value for name, value in SMALL if value != getattr(TinyModelConfig(), name)}
    out = tmp_path / "model"
    argv = ["--out", str(out)] + [arg for name, value in settings.items()
                                  for arg in ("--set", f"{name}={value}")]
    assert tiny_main(argv) == 0
    assert read_manifest(out)["config"] == SMALL.to_dict()


# --- what a build contains ----------------------------------------------------------------------


def test_tokenizer_loads_round_trips_and_has_a_chat_template(small_model: Path) -> None:
    from transformers import AutoTokenizer

    from ub.games.templates import get_template

    tokenizer = AutoTokenizer.from_pretrained(small_model)
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert tokenizer.convert_tokens_to_ids(special) in (0, 1, 2)

    step = next(iter_transcripts(["TicTacToe-v0-train"], 1, seed=11))
    for text in (step.prompt, step.completion, "Ünïcødé ✓ 世界\t[12]\r\n  x", ""):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    # Digits are single tokens, so moves are written (and copied) digit by digit.
    assert len(tokenizer(" [12]", add_special_tokens=False)["input_ids"]) >= 4

    chat = get_template("chat").render("Board: [4]", tokenizer)
    assert chat.startswith("<|im_start|>system\n") and chat.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nBoard: [4]<|im_end|>\n" in chat
    ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_model_loads_with_generation_config_and_takes_lora(small_model: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(small_model)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.float32
    assert model.config.tie_word_embeddings
    generation = GenerationConfig.from_pretrained(small_model)
    assert 0 in generation.eos_token_id  # <|endoftext|>

    manifest = read_manifest(small_model)
    assert manifest is not None
    assert manifest["param_count"] == sum(p.numel() for p in model.parameters())
    assert set(manifest["legality"]) == set(SMALL.env_ids)

    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS)
    )
    wrapped = {
        name.rsplit(".", 1)[-1]
        for name, module in peft_model.named_modules()
        if hasattr(module, "lora_A")
    }
    assert wrapped == set(LORA_TARGETS)
    out = peft_model(input_ids=torch.tensor([[5, 6, 7]]))
    assert out.logits.shape[:2] == (1, 3)


# --- the default model ------------------------------------------------------------------------


def test_default_model_plays_legal_moves() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model()  # cached after the first build (a few minutes on 2 cores)
    assert path == tiny_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    # Positions from games neither the build's training nor its own check played (other seed).
    # The demo's games: greedy play (evaluation) must be legal at least 99% of the time.
    rates = measure_legality(model, tokenizer, env_ids=("TicTacToe-v0-train", "Nim-v0-train"),
                             positions_per_env=200, seed=2024)
    greedy = {env: row["greedy"]["legal"] for env, row in rates.items()}
    sampled = {env: row["sampled"]["legal"] for env, row in rates.items()}
    assert min(greedy.values()) >= 0.99, greedy
    # Sampled play (the rollouts') only has a floor: its rate moves with the build's bytes, which
    # depend on the CPU's kernels. On these positions 82.5-93.5% across the 4-layer 1400-step
    # builds measured before issue 42; the lowest (Nim) was built with torch held to AVX2
    # kernels (docs/learning-log.md).
    assert min(sampled.values()) >= 0.75, sampled
