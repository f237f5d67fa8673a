"""The config schema documents itself: docs/config.md and `ub config show` come from it."""

from __future__ import annotations

import pytest
import yaml

from ub.errors import UbError
from ub.flows.cli import main
from ub.run.config.docs import (
    DOC,
    REGENERATE,
    command_settings,
    load_any,
    markdown,
    sections,
    show,
    type_text,
)
from ub.run.config.load import load_config, preset_names, validate_config
from ub.settings import load_yaml


def test_docs_config_md_is_generated_from_the_schema():
    assert DOC.read_text(encoding="utf-8") == markdown(), (
        f"{DOC} differs from the config schema: regenerate it with `{REGENERATE}`")


def test_every_key_has_a_description_and_is_in_the_doc():
    text = DOC.read_text(encoding="utf-8")
    for path, model in sections():
        for name, info in model.model_fields.items():
            key = f"{path}.{name}".lstrip(".")
            assert info.description, f"{key} has no description"
            assert f"| `{key}` |" in text, f"{key} is missing from {DOC}"
    for title, _, model, names in command_settings():
        for name in names:
            info = model.model_fields[name]
            assert info.description, f"{title}: {name} has no description"
            assert f"| `{info.alias or name}` |" in text, f"{title}: {name} is missing"


def test_a_bound_shows_where_it_applies_and_each_section_says_where_it_is_declared():
    from ub.learner import LearnerSection

    fields = LearnerSection.model_fields
    assert type_text(fields["temperature"].annotation) == "float (> 0) | null"
    assert type_text(fields["betas"].annotation) == "list[float (>= 0, < 1)]"
    text = DOC.read_text(encoding="utf-8")
    learner = text[text.index("## `learner`\n"):]
    assert learner.index("Declared in `ub/learner/config.py` (`LearnerSection`).") < 300


@pytest.mark.parametrize("name", preset_names())
def test_show_reads_back_as_the_same_config(name):
    config = load_config(name)
    text = show(config, f"preset {name}")
    assert validate_config(load_yaml(text)) == config
    assert "# Decisions to sample" in text  # each key's meaning above it


def test_show_a_run_folder(tmp_path, capsys):
    config = load_config("tiny-cpu", ["rounds=3"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"),
                                                         sort_keys=False))
    assert load_any(str(tmp_path))[0] == config
    assert main(["config", "show", str(tmp_path), "--set", "seed=5"]) == 0
    shown = load_yaml(capsys.readouterr().out)
    assert shown["rounds"] == 3 and shown["seed"] == 5
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UbError, match=r"without config\.yaml"):
        load_any(str(empty))


def test_show_says_how_each_eval_env_is_prompted():
    config = load_config("qwen3-1.7b-simpletak", [
        "eval.envs=[SimpleTak-v0-train, KuhnPoker-v0-train, "
        "{env_id: Nim-v0-train, template: plain}]"])
    text = " ".join(line.strip("# ") for line in show(config, "x").splitlines())
    assert ("prompted as: SimpleTak-v0-train: template qwen3-zs, extractor boxed (as it "
            "trains); KuhnPoker-v0-train: template qwen3-zs, extractor boxed (the training "
            "envs' format); Nim-v0-train: template plain, extractor bracket (its entry's)") in text
    assert validate_config(load_yaml(show(config, "x"))) == config
