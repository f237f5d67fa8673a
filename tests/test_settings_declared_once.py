"""Each setting is declared once (issue 71): the config's sections hold a setting where it is
used, but its type, bounds, default and meaning are written in one place.

What "declared" means here: a section class *declares* a setting when its own class body (its
own annotations, not a base class's) gives the field a description. Fields with the same name,
description, bounds and default are one declaration, written once and taken as it is by the
other sections (``same_setting``: the same ``FieldInfo``; eval.envs[]'s ``env_id`` is
:class:`~ub.games.specs.GameSpec`'s). A section that inherits the field (``envs[]``'s
``env_id``, ``ppo``'s ``tis_cap``), or only narrows an inherited field's type without a
description (:class:`~ub.learner.LearnerConfig`'s never-null ``seed``), holds it without
declaring it. Two settings that share a name but mean different things (the run's ``seed``
and ``batch.seed``) are two settings, each declared once: the table below lists them, with
what tells them apart. (Two declarations written twice, word for word, would count as one:
a copy's description is what a reader would see drift first, and this test does not read
source text.)
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Iterator

from pydantic import BaseModel

from ub.learner import LearnerConfig, LearnerSection
from ub.learner.config import RUN_GIVEN, run_given, with_run_given
from ub.run.config.docs import algorithm_sections, sections
from ub.run.config.schema import TrainConfig
from ub.settings import Section

# The settings issue 71 found declared several times: each one declaration of a setting of
# that name, as the section classes that hold it in their own class body.
DECLARED_ONCE: dict[str, set[frozenset[str]]] = {
    # The run's seed; the learner's (null: the run's); the batch sample's (ub train derives it
    # from the run's, per round).
    "seed": {frozenset({"TrainConfig"}), frozenset({"LearnerSection"}),
             frozenset({"BatchConfig"})},
    # Training games' (the learner scores at it unless learner.temperature says otherwise),
    # the learner's (null: sampling's), eval games'.
    "temperature": {frozenset({"SamplingConfig"}), frozenset({"LearnerSection"}),
                    frozenset({"EvalSection"})},
    "length_normalizer": {frozenset({"LearnerSection"})},
    "env_id": {frozenset({"GameSpec", "EvalEnvSection"})},  # one declaration, taken
    # A game's, and an eval env's override of it (null: the training env's).
    "template": {frozenset({"GameSpec"}), frozenset({"EvalEnvSection"})},
    "extractor": {frozenset({"GameSpec"}), frozenset({"EvalEnvSection"})},
    # A game's, and the eval's override of every eval env's (null: each as it trains).
    "legal_moves": {frozenset({"GameSpec"}), frozenset({"EvalSection"})},
    "tis_cap": {frozenset({"ReinforceParams"})},  # (ppo's and a2c's sections extend it)
}


def _section_classes() -> Iterator[type[BaseModel]]:
    """Every class of a config section: the run's tree, the learner's runtime config and each
    registered algorithm's parameters, with the section classes they extend."""
    seen: set[type] = set()
    tree = [model for _, model in sections()]
    for section in [*tree, LearnerConfig, *(params for _, params in algorithm_sections())]:
        for cls in section.__mro__:
            if (isinstance(cls, type) and issubclass(cls, BaseModel)
                    and cls not in (BaseModel, Section) and cls not in seen):
                seen.add(cls)
                yield cls


def declarations() -> dict[str, set[frozenset[str]]]:
    """Per setting name of :data:`DECLARED_ONCE`, its declarations (module docstring), each as
    the classes that hold it in their own body."""
    holders: dict[str, dict[tuple[str, str, str], set[str]]] = defaultdict(
        lambda: defaultdict(set))
    for cls in _section_classes():
        own = inspect.get_annotations(cls)
        for name in DECLARED_ONCE:
            info = cls.model_fields.get(name)
            if name in own and info is not None and info.description:
                declaration = (info.description, repr(info.metadata), repr(info.default))
                holders[name][declaration].add(cls.__name__)
    return {name: {frozenset(classes) for classes in found.values()}
            for name, found in holders.items()}


def test_each_setting_is_declared_once():
    assert declarations() == DECLARED_ONCE


def test_the_learners_run_given_settings_are_resolved_in_one_place():
    """"null means the run's": a run's learner, and a LearnerConfig built without a run (a
    default run's), take them from the same function, so a default run's learner and a
    learner built without a run agree."""
    default_run = TrainConfig.from_dict({"envs": [{"env_id": "TicTacToe-v0-train"}]})
    from_run = default_run.learner_config("m")
    alone = LearnerConfig(base_model="m")
    for key in RUN_GIVEN:
        assert LearnerSection.model_fields[key].default is None  # null: the run's
        assert getattr(from_run, key) == getattr(alone, key) == run_given()[key]
    run = TrainConfig.from_dict({"seed": 7, "envs": [{"env_id": "TicTacToe-v0-train"}],
                                 "sampling": {"temperature": 0.5, "max_tokens": 12},
                                 "learner": {"temperature": 0.7}})
    learner = run.learner_config("m")
    assert (learner.seed, learner.temperature, learner.length_normalizer) == (7, 0.7, 12)
    assert with_run_given({"seed": None, "temperature": 0.7}, run_given(7, run.sampling)) == {
        "seed": 7, "temperature": 0.7, "length_normalizer": 12}


def test_an_algorithms_parameters_are_declared_in_its_section_and_shown_with_their_ranges():
    from ub.run.config.docs import DOC

    text = DOC.read_text(encoding="utf-8")
    for name, params in algorithm_sections():
        assert f"## `learner.algorithm_params` ({name})" in text
        for field in params.model_fields:
            assert f"| `learner.algorithm_params.{field}` |" in text
    ppo = text[text.index("## `learner.algorithm_params` (ppo)"):]
    assert "| `learner.algorithm_params.clip_eps` | float, > 0, < 1 | `0.2` |" in ppo


def test_a_sections_key_is_where_it_sits_in_the_config():
    """A section validated on its own (``BatchConfig.from_dict`` in ``ub learn``, a learner's
    ``LearnerConfig``) names a bad setting by its ``key``, which says where the section sits in
    a run's config: the position the schema gives it, written where the section is declared
    (its package sits below the schema, which places it), so checked here against the tree."""
    from ub.learner.algorithms import AlgorithmParams

    positions: dict[type[BaseModel], set[str]] = defaultdict(set)
    for path, model in sections():
        positions[model].add(path)
    keyed = [(model, paths) for model, paths in positions.items()
             if getattr(model, "key", "")]
    assert len(keyed) >= 9  # engine, sampling, rollout.branch, opponents, ..., learner.lora
    for model, paths in keyed:
        assert paths == {model.key}, model.__name__  # type: ignore[attr-defined]
    assert LearnerConfig.key == LearnerSection.key
    assert AlgorithmParams.key == f"{LearnerSection.key}.algorithm_params"
    assert "algorithm_params" in LearnerSection.model_fields


def test_a_bad_algorithm_parameter_is_refused_with_the_config_by_its_path():
    """A built-in algorithm's parameters are validated as its section when the config is (so at
    preflight, before a model loads); one of one's own without a ``Params`` section takes the
    mapping as keyword arguments, its keys checked against its ``__init__``."""
    import pytest

    from ub.errors import UbError
    from ub.run.config.load import validate_config

    def config(algorithm: str, params: dict) -> dict:
        return {"envs": [{"env_id": "TicTacToe-v0-train"}], "batch": {"sampling": []},
                "learner": {"algorithm": algorithm, "algorithm_params": params}}

    with pytest.raises(UbError, match=r"learner\.algorithm_params\.clip_eps: Input should be "
                                      r"less than 1 \(got 2\)"):
        validate_config(config("ppo", {"clip_eps": 2}))
    with pytest.raises(UbError, match=r"learner\.algorithm_params\.normalize: Input should be "
                                      r"a valid boolean"):
        validate_config(config("a2c", {"normalize": "yes"}))
    assert validate_config(config("ppo", {"clip_eps": 0.3})).learner.algorithm_params == {
        "clip_eps": 0.3}  # (kept as written: config.yaml stores what was given)
    own = "own_components:AsymmetricClip"
    assert validate_config(config(own, {"clip_high": 0.3})).learner.algorithm == own
    with pytest.raises(UbError, match=r"learner\.algorithm_params: algorithm "
                                      r"'own_components:AsymmetricClip' has no parameter\(s\) "
                                      r"clip; valid: clip_high, clip_low"):
        validate_config(config(own, {"clip": 0.3}))
