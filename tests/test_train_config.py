"""Training configs: presets validate, overrides apply, and every bad field is one clear line."""

from __future__ import annotations

import pytest
import yaml

from ub.errors import UbError
from ub.run.config import (
    PRESETS_DIR,
    apply_overrides,
    load_config,
    preset_names,
    validate_config,
)

MINIMAL = {"envs": [{"env_id": "TicTacToe-v0-train"}]}


@pytest.mark.parametrize("name", ["tiny-cpu", "qwen3-1.7b-simpletak", "spiral-kuhn"])
def test_presets_validate(name):
    assert name in preset_names()
    config = load_config(name)
    # What the preset file says is what a run of it gets.
    raw = yaml.safe_load((PRESETS_DIR / f"{name}.yaml").read_text())
    assert config.rounds == raw["rounds"]
    assert [e.env_id for e in config.envs] == [e["env_id"] for e in raw["envs"]]
    assert config.rollout.games_per_round == raw["rollout"]["games_per_round"]
    # The nested sections are the same validated settings `ub batch` / `ub learn` take.
    assert config.batch_config().batch_size == raw["batch"]["batch_size"]
    lora = config.learner_config("base").lora
    assert (lora.rank, lora.alpha) == (raw["learner"]["lora"]["rank"],
                                       raw["learner"]["lora"]["alpha"])
    assert lora.rank <= config.engine.max_lora_rank


def test_seeds_example_preset_matches_the_seeds():
    config = load_config("qwen3-1.7b-simpletak")
    assert config.model.base == "Qwen/Qwen3-1.7B-Base"
    assert [e.env_id for e in config.envs] == ["SimpleTak-v0-train"]
    assert config.batch_config().batch_size == 384
    lora = config.learner_config("base").lora
    assert lora.rank == 32 and len(lora.target_modules) == 7
    assert config.eval.envs == ["SimpleTak-v0-train", "KuhnPoker-v0-train"]


def test_overrides_parse_values_as_yaml():
    config = load_config("tiny-cpu", ["rollout.games_per_round=64", "learner.learning_rate=2e-4",
                                      "eval.opponents=[random]", "seed=3"])
    assert config.rollout.games_per_round == 64
    assert config.learner["learning_rate"] == 2e-4
    assert config.seed == 3


def test_training_settings_exclude_what_may_change_on_resume():
    config = validate_config(MINIMAL)
    longer = validate_config({**MINIMAL, "rounds": 50, "eval": {"every": 3},
                              "cluster": {"address": "auto", "rollout_workers": 4}})
    assert config.training_settings() == longer.training_settings()
    assert validate_config({**MINIMAL, "seed": 1}).training_settings() != \
        config.training_settings()


BAD = [
    ({"rounds": 0}, r"rounds: Input should be greater than or equal to 1 \(got 0\)"),
    ({"rollout": {"games_per_round": "many"}}, r"rollout.games_per_round: .*\(got 'many'\)"),
    ({"rollout": {"gamez": 3}}, r"rollout.gamez: unknown setting"),
    ({"pipeline": {"max_staleness": 2}}, r"pipeline.max_staleness: got 2; input should be 0 or 1"),
    ({"envs": []}, r"envs: List should have at least 1 item"),
    ({"envs": [{"env_id": "TicTacToe-v0-train", "template": "fancy"}]},
     r"envs.0: unknown .*template 'fancy'"),
    ({"engine": {"max_lora_rank": 12}}, r"engine.max_lora_rank: got 12; allowed: 1, 8, 16"),
    ({"learner": {"lora": {"rank": 64}}}, r"learner.lora.rank: 64 exceeds engine.max_lora_rank"),
    ({"learner": {"algorithm": "sarsa"}}, r"learner: .*sarsa"),
    ({"batch": {"batch_size": -1}}, r"batch: batch_size must be a positive integer"),
    ({"batch": {"final": [{"name": "nope"}]}}, r"batch: unknown final reward transform 'nope'"),
    ({"eval": {"games": 7}}, r"eval.games: .*must be even"),
    ({"opponents": [{"mode": "telepathy"}]}, r"opponents: .*telepathy"),
    ({"cluster": {"rollout_workers": 0}}, r"cluster.rollout_workers: .*greater than or equal"),
    ({"cluster": {"learner": {"num_gpus": -1}}}, r"cluster.learner.num_gpus: .*greater"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[str(c) for c, _ in BAD])
def test_bad_fields_name_the_field_and_what_is_allowed(change, message):
    with pytest.raises(UbError, match=message) as info:
        validate_config({**MINIMAL, **change}, "test.yaml")
    text = str(info.value)
    assert text.startswith("invalid config test.yaml: ") and "\n" not in text


def test_unknown_preset_lists_the_presets():
    with pytest.raises(UbError, match=r"unknown preset 'tiny-gpu'; presets: .*tiny-cpu"):
        load_config("tiny-gpu")


def test_missing_or_malformed_yaml_file(tmp_path):
    with pytest.raises(UbError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(UbError, match="not valid YAML"):
        load_config(str(bad))
    bad.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(UbError, match="must be a YAML mapping"):
        load_config(str(bad))


def test_bad_override_syntax():
    with pytest.raises(UbError, match="expected key=value"):
        apply_overrides({}, ["rounds"])
    with pytest.raises(UbError, match="rounds is not a section"):
        apply_overrides({"rounds": 3}, ["rounds.x=1"])


def test_stop_strings_reach_training_and_evaluation_sampling():
    from ub.run.rounds import rollout_sampling

    config = load_config("tiny-cpu", ["sampling.stop=[']', ';']", "eval.temperature=0"])
    train, evaluation = rollout_sampling(config), rollout_sampling(config, evaluation=True)
    assert train.stop == evaluation.stop == ("]", ";")
    assert (train.temperature, evaluation.temperature) == (1.0, 0.0)
    assert train.max_tokens == evaluation.max_tokens == config.sampling.max_tokens
    assert load_config("tiny-cpu").sampling.stop == ["]"]  # the demo plays one move per turn
    with pytest.raises(UbError, match=r"sampling.stop.0: String should have at least 1"):
        load_config("tiny-cpu", ["sampling.stop=['']"])
