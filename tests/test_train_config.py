"""Training configs: presets validate, overrides apply, and every bad field is one clear line."""

from __future__ import annotations

import pytest
import yaml

from ub.batch import BatchConfig
from ub.errors import UbError
from ub.run.config.load import PRESETS_DIR, load_config, preset_names, validate_config
from ub.settings import apply_overrides

MINIMAL = {"envs": [{"env_id": "TicTacToe-v0-train"}]}


def test_every_preset_is_in_the_documented_table():
    table = (PRESETS_DIR.parents[1] / "docs" / "training.md").read_text()
    assert len(preset_names()) == 5
    for name in preset_names():
        assert f"\n| `{name}`" in table, f"preset {name} is missing from docs/training.md"


@pytest.mark.parametrize("name", preset_names())
def test_presets_validate(name):
    config = load_config(name)
    # What the preset file says is what a run of it gets.
    raw = yaml.safe_load((PRESETS_DIR / f"{name}.yaml").read_text())
    assert config.rounds == raw["rounds"]
    assert [e.env_id for e in config.envs] == [e["env_id"] for e in raw["envs"]]
    assert config.rollout.games_per_round == raw["rollout"]["games_per_round"]
    # The nested sections are the same validated settings `ub batch` / `ub learn` take.
    assert isinstance(config.batch, BatchConfig)
    assert config.batch.batch_size == raw["batch"]["batch_size"]
    lora = config.learner_config("base").lora
    assert (lora.rank, lora.alpha) == (raw["learner"]["lora"]["rank"],
                                       raw["learner"]["lora"]["alpha"])
    assert lora.rank <= config.engine.max_lora_rank


def test_seeds_example_preset_matches_the_seeds():
    config = load_config("qwen3-1.7b-simpletak")
    assert config.model.base == "Qwen/Qwen3-1.7B-Base"
    assert [e.env_id for e in config.envs] == ["SimpleTak-v0-train"]
    assert config.batch.batch_size == 384
    lora = config.learner_config("base").lora
    assert lora.rank == 32 and len(lora.target_modules) == 7
    assert config.eval.envs == ["SimpleTak-v0-train", "KuhnPoker-v0-train"]


def test_overrides_parse_values_as_yaml():
    config = load_config("tiny-cpu", ["rollout.games_per_round=64", "learner.learning_rate=2e-4",
                                      "eval.opponents=[random]", "seed=3"])
    assert config.rollout.games_per_round == 64
    assert config.learner.learning_rate == 2e-4
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
    ({"rollout": {"games_per_round": 96, "shards": 100000}},
     r"rollout: shards 100000 is more than games_per_round 96 \(each shard plays at least one "
     r"game of the round\): set shards to 96 or fewer$"),
    ({"rollout": {"games_per_round": 96, "shards": 64}},
     r"rollout: shards 64 with games_per_round 96 leaves 16 shards without a game \(each takes "
     r"2 games, in order\): set shards to 48, or to a divisor of 96$"),
    ({"pipeline": {"max_staleness": 2}}, r"pipeline.max_staleness: got 2; input should be 0 or 1"),
    ({"envs": []}, r"envs: List should have at least 1 item"),
    ({"envs": [{"env_id": "TicTacToe-v0-train", "template": "fancy"}]},
     r"envs.0.template: unknown prompt template 'fancy'"),
    ({"engine": {"max_lora_rank": 12}},
     r"engine.max_lora_rank: 12 is not supported by vLLM: use one of 1, 8, 16"),
    ({"learner": {"lora": {"rank": 64}}}, r"learner.lora.rank: 64 exceeds engine.max_lora_rank"),
    ({"learner": {"algorithm": "sarsa"}}, r"learner: .*sarsa"),
    ({"batch": {"batch_size": -1}},
     r"batch.batch_size: Input should be greater than or equal to 1 \(got -1\)"),
    ({"batch": {"first_round": 2, "last_round": 1}},
     r"batch: the rounds window is empty: first_round 2 > last_round 1"),
    ({"batch": {"final": [{"name": "nope"}]}}, r"batch: unknown final reward transform 'nope'"),
    ({"eval": {"games": 7}}, r"eval.games: .*must be even"),
    ({"opponents": [{"mode": "telepathy"}]}, r"opponents\.modes\.0\.mode: got 'telepathy'; "
     r"input should be 'mirror'"),
    ({"cluster": {"rollout_workers": 0}}, r"cluster.rollout_workers: .*greater than or equal"),
    ({"cluster": {"learner": {"num_gpus": -1}}}, r"cluster.learner.num_gpus: .*greater"),
    # every section is typed: a bool is not a count, a string is not a number
    ({"batch": {"batch_size": True}}, r"batch.batch_size: Input should be a valid integer"),
    ({"learner": {"epochs": "2"}}, r"learner.epochs: Input should be a valid integer"),
    ({"learner": {"dtype": "float8"}}, r"learner.dtype: got 'float8'; input should be 'auto'"),
    ({"learner": {"lora": {"rnak": 8}}}, r"learner.lora.rnak: unknown setting"),
    ({"rating": {"beta": "wide"}}, r"rating.beta: Input should be a valid number"),
    ({"rating": {"beta": 0}}, r"rating\.beta: Input should be greater than 0 \(got 0\)"),
    ({"opponents": [{"mode": "lagged", "k": True}]}, r"opponents.modes.0.k: Input should be"),
    ({"opponents": [{"mode": "mirror", "k": 2}]}, r"opponents\.modes\.0: mode mirror has no "
     r"parameter k; it takes: weight$"),
    ({"opponents": "mirror"}, r"opponents: must be a list of modes, e.g. "),
    ({"opponents": [{"mode": "fixed", "names": ["nobody"]}]},
     r"opponents\.modes\.0\.names: unknown actor 'nobody'; valid actors: model"),
    ({"batch": {"drop_zero_advantage": True, "drop_zero_reward": False}},
     r"batch: drop_zero_advantage is the old name of drop_zero_reward: give only "
     "drop_zero_reward"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[str(c) for c, _ in BAD])
def test_bad_fields_name_the_field_and_what_is_allowed(change, message):
    with pytest.raises(UbError, match=message) as info:
        validate_config({**MINIMAL, **change}, "test.yaml")
    text = str(info.value)
    assert text.startswith("invalid config test.yaml: ") and "\n" not in text


# Issue 38: valid in type, refused for what it feeds; each passed validation before and failed
# once a run had begun (after its first round, at the engine's start, or in the learner).
FED = [
    ({"envs": [{"env_id": "TicTacToe-v0-train", "num_players": 3}]},
     r"envs.0.num_players: env 'TicTacToe-v0-train' failed to start with 3 player\(s\): "
     r"AssertionError: The number of players has to be 2"),
    ({"envs": [{"env_id": "KuhnPoker-v0-train", "num_players": 1}]}, r"envs.0.num_players: "),
    ({"envs": [{"env_id": "TowerOfHanoi-v0-train"}]},
     r"envs.0.num_players: .*The number of players has to be 1, received 2"),
    ({"eval": {"envs": ["TowerOfHanoi-v0-train"]}},
     r"eval.envs: .* \(an env not trained on is evaluated with two seats"),
    ({"seed": 2**64}, r"seed: got 18446744073709551616; it is also vLLM's engine seed, which "
     r"takes 0 to 4294967295"),
    ({"seed": -1}, r"seed: got -1"),
    ({"rounds": 2**31}, r"rounds: got 2147483648; the data's round column holds round numbers "
     r"up to 2147483647"),
    ({"engine": {"dtype": "float8"}},
     r"engine.dtype: got 'float8'; input should be 'auto', 'float32'"),
    ({"batch": {"pad_token_id": 2**31}}, r"batch.pad_token_id: Input should be less than or "
     r"equal to 2147483647 \(got 2147483648\)"),
    ({"sampling": {"temperature": 0.0}}, r"learner.temperature: null takes "
     r"sampling.temperature, 0 \(greedy\), but the learner scores tokens at a temperature > 0"),
    ({"learner": {"seed": 2**64}}, r"learner.seed: Input should be less than "
     r"18446744073709551616 \(got 18446744073709551616\)"),
]


@pytest.mark.parametrize(("change", "message"), FED, ids=[str(c) for c, _ in FED])
def test_a_setting_is_checked_against_what_it_feeds(change, message):
    with pytest.raises(UbError, match=message) as info:
        validate_config({**MINIMAL, **change}, "test.yaml")
    assert str(info.value).startswith("invalid config test.yaml: ")


def test_the_base_model_bounds_the_context_and_the_pad_id(tmp_path):
    """The engine's context and the batch's pad id against the model's config.json (vLLM
    refused the first at its start, the learner's embedding the second mid-round)."""
    from ub.run.config.base_model import check_fits_base_model

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 256, "vocab_size": 100}')
    (model / "model.safetensors").write_bytes(b"")
    base = {**MINIMAL, "model": {"base": str(model)}, "sampling": {"max_tokens": 8}}
    check_fits_base_model(validate_config({**base, "engine": {"max_model_len": 256}}))
    with pytest.raises(UbError, match=r"engine.max_model_len 512 exceeds the model's context "
                       r"of 256 tokens"):
        check_fits_base_model(validate_config({**base, "engine": {"max_model_len": 512}}))
    with pytest.raises(UbError, match=r"batch.pad_token_id 100 is not a token id of the model "
                       r"\(its vocabulary has ids 0 to 99\)"):
        check_fits_base_model(validate_config({**base, "engine": {"max_model_len": 256},
                                               "batch": {"pad_token_id": 100}}))


def test_unknown_preset_lists_the_presets():
    with pytest.raises(UbError, match=r"unknown preset 'tiny-gpu'; did you mean 'tiny-cpu'\? "
                                      r"Presets: .*tiny-cpu"):
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


def test_an_override_reaches_an_entry_of_a_list_by_its_position():
    data = {"envs": [{"env_id": "A"}, {"env_id": "B"}]}
    out = apply_overrides(data, ["envs.1.legal_moves=mask", "envs.0.weight=2"])
    assert out["envs"] == [{"env_id": "A", "weight": 2}, {"env_id": "B", "legal_moves": "mask"}]
    assert data["envs"][1] == {"env_id": "B"}  # (a copy)
    for bad in ("envs.2.weight=1", "envs.x.weight=1", "envs.-1.weight=1"):
        with pytest.raises(UbError, match=r"is not a position in a list of 2 \(0 to 1\)"):
            apply_overrides(data, [bad])


def test_stop_strings_reach_training_and_evaluation_sampling():
    from ub.run.steps.play import rollout_sampling

    config = load_config("tiny-cpu", ["sampling.stop=[']', ';']", "eval.temperature=0"])
    train, evaluation = rollout_sampling(config), rollout_sampling(config, evaluation=True)
    assert train.stop == evaluation.stop == ("]", ";")
    assert (train.temperature, evaluation.temperature) == (1.0, 0.0)
    assert train.max_tokens == evaluation.max_tokens == config.sampling.max_tokens
    assert load_config("tiny-cpu").sampling.stop == ("]",)  # the demo plays one move per turn
    with pytest.raises(UbError, match=r"sampling.stop.0: String should have at least 1"):
        load_config("tiny-cpu", ["sampling.stop=['']"])


def test_sections_are_typed_and_dump_as_written():
    config = load_config("tiny-cpu")
    assert config.batch.batch_size == 512
    assert config.learner.algorithm == "ppo" and config.learner.seed is None
    learner = config.learner_config("base")  # the run fills what the section leaves null
    assert (learner.seed, learner.temperature, learner.length_normalizer) == (0, 1.0, 8)
    data = config.model_dump(mode="json")
    assert data["opponents"] == [{"mode": "mirror", "weight": 0.4},
                                 {"mode": "lagged", "weight": 0.2, "k": 3},
                                 {"mode": "fixed", "weight": 0.4, "names": ["random"]}]
    assert validate_config(data) == config  # config.yaml reads back as the same config


def test_old_config_forms_still_load(caplog):
    old = {**MINIMAL, "opponents": ["mirror", {"mode": "lagged", "k": 2, "weight": 0.5}],
           "batch": {"drop_zero_advantage": True}, "learner": {"learning_rate": 1}}
    with caplog.at_level("WARNING", logger="ub.config"):
        config = validate_config(old)
    assert "drop_zero_advantage is deprecated" in caplog.text
    assert config.batch.drop_zero_reward is True
    assert config.opponents.modes[1].k == 2
    assert config.learner_config("base").learning_rate == 1.0
    mapping = validate_config({**MINIMAL, "opponents": {"modes": ["mirror"],
                                                         "max_active_lora": 2}})
    assert mapping.opponents.max_active_lora == 2
    assert mapping.model_dump()["opponents"] == {"modes": [{"mode": "mirror", "weight": 1.0}],
                                                 "max_active_lora": 2}
    assert validate_config(MINIMAL).model_dump()["opponents"] == [{"mode": "mirror",
                                                                   "weight": 1.0}]


def test_the_library_takes_the_sections_themselves():
    # One declaration per setting: a run's config holds the library's own config types, with
    # no mirror that re-reads them; a library object adds to its section only what the run
    # supplies.
    from ub.inference.types import EngineConfig, EngineSection, SamplingConfig
    from ub.learner import LearnerConfig
    from ub.learner.config import LearnerSection
    from ub.model.lora import LoraSettings
    from ub.pool import OpponentConfig, RatingConfig
    from ub.run.config.load import TrainConfig

    taken = {"engine": EngineSection, "sampling": SamplingConfig, "opponents": OpponentConfig,
             "rating": RatingConfig, "batch": BatchConfig, "learner": LearnerSection}
    assert {name: TrainConfig.model_fields[name].annotation for name in taken} == taken
    assert LearnerSection.model_fields["lora"].annotation is LoraSettings
    assert set(LearnerConfig.model_fields) - set(LearnerSection.model_fields) == {
        "base_model", "device_share"}
    assert set(EngineConfig.model_fields) - set(EngineSection.model_fields) == {
        "model", "enable_lora", "seed"}
    from ub.games.specs import GameSpec
    from ub.run.config.schema import EnvSection

    assert TrainConfig.model_fields["envs"].annotation == list[EnvSection]
    assert set(EnvSection.model_fields) - set(GameSpec.model_fields) == {"weight"}
    assert issubclass(EnvSection, GameSpec)
    # ... and the defaults are the section's: the run's resolved learner differs only there.
    config = validate_config(MINIMAL)
    assert BatchConfig() == config.batch
    assert type(config.rating) is RatingConfig and config.rating == RatingConfig()
    assert LoraSettings() == config.learner_config("base").lora
    run_side = config.learner_config("base")
    # device_share is the run's: the GPU share the engine leaves the learner in its process.
    assert run_side.device_share == pytest.approx(1 - config.engine.gpu_memory_utilization)
    assert LearnerConfig(base_model="base") == run_side.replace(device_share=None)
    seed = TrainConfig.model_fields["seed"].default
    assert seed == LearnerConfig.model_fields["seed"].default == LearnerConfig(base_model="m").seed
