"""What every settings section of ub shares: the :class:`Section` base and its error format.

A section (``batch``, ``learner``, ``opponents``, ``rating``, the run's own in
:mod:`ub.run.config.schema`) is one pydantic model, declared once, in the package that uses it
(:class:`ub.batch.BatchConfig`, :class:`ub.learner.LearnerSection`, ...): each field's type,
default, range (``Field(gt=0)``) and one line of meaning live there and nowhere else, so
``docs/config.md``, ``ub config show`` and the error a user sees come from the same place. The
library takes the sections themselves; a bad value is refused when the section is built, with
one line naming the key (:meth:`Section.from_dict`).

Settings given as text are read here too, one way for all: YAML (:func:`load_yaml`: a config
file), and ``name=value`` items (:func:`apply_overrides`: ``--set`` of ``ub train``, ``ub config
show`` and ``ub model tiny``; :func:`setting_value`: a hosted actor's options), each value read
as YAML, so ``64`` is an int, ``1e-3`` a float and ``[a, b]`` a list.

This module imports nothing of ub but its errors: it sits below every package that reads it.
"""

from __future__ import annotations

import copy
import logging
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ub.errors import UbError

log = logging.getLogger("ub.config")

EXECUTION: dict[str, Any] = {"execution": True}
"""``json_schema_extra`` of a field that says how a run's work is executed (memory, batching,
kernels, where it runs), not what it computes: the run's data does not depend on it beyond
float summation order, so it may change when a run resumes; each round's manifest records the
values it ran with. Every other field is locked at the run's start
(:meth:`ub.run.config.schema.TrainConfig.training_settings`)."""


def is_execution(info: Any) -> bool:
    """Whether a field (its pydantic ``FieldInfo``) is marked :data:`EXECUTION`."""
    extra = getattr(info, "json_schema_extra", None)
    return isinstance(extra, dict) and bool(extra.get("execution"))


def names_components(kind: str) -> dict[str, Any]:
    """``json_schema_extra`` of a field that names components of ``kind`` (``algorithm``, or a
    reward stage: ``final``, ``step``, ``sampling``): docs/config.md and ``ub config show``
    list the registered names after its description, read from the registry itself
    (:func:`ub.run.config.docs.registered_names`), so no description lists them by hand."""
    return {"components": kind}


def components_of(info: Any) -> str | None:
    """The kind of components a field (its ``FieldInfo``) names, or ``None``."""
    extra = getattr(info, "json_schema_extra", None)
    return extra.get("components") if isinstance(extra, dict) else None


def format_errors(exc: ValidationError, section: str = "",
                  model: type[BaseModel] | None = None) -> str:
    """A pydantic error as one line: each bad field by its dotted path, with what was given
    (an unknown setting with the nearest name ``model``, the class validated, has there)."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in (section, *err["loc"]) if p != "") or "(top level)"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown setting" + _nearest_setting(model, err["loc"])
        elif err["type"] == "literal_error":
            message = f"got {err['input']!r}; {err['msg'].lower()}"
        elif err["type"] == "value_error" and not err["loc"] and not section:
            parts.append(str(err["ctx"]["error"]))  # a check across sections says it all
            continue
        elif err["type"] == "value_error":  # a validator's own words, without pydantic's prefix
            message = str(err["ctx"]["error"])
        elif "input" in err and err["type"] != "missing":
            message = f"{message} (got {err['input']!r})"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def _nearest_setting(model: type[BaseModel] | None, loc: Sequence[Any]) -> str:
    """``; did you mean NAME?`` for the unknown setting at ``loc`` of ``model`` (the field
    names of the section it is in), or nothing."""
    import difflib
    import types

    section: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or section is None:
            continue  # (an index into a list of sections)
        field = getattr(section, "model_fields", {}).get(part)
        kinds = [field.annotation] if field is not None else []
        section = None
        while kinds:  # the section class inside Optional[...], list[...], X | Y
            kind = kinds.pop(0)
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                section = kind
                break
            if typing.get_origin(kind) is not None or isinstance(kind, types.UnionType):
                kinds += list(typing.get_args(kind))
    names = list(getattr(section, "model_fields", {}))
    names += [f.alias for f in getattr(section, "model_fields", {}).values() if f.alias]
    # (0.75: `legal_move` finds legal_moves, `rnak` rank; `lr` is no `lora`)
    near = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.75) if loc else []
    return f"; did you mean {near[0]}?" if near else ""


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


def load_yaml(text: str) -> Any:
    """Safe YAML with numbers as people write them (``1e-5`` is a float); a key given twice
    in one mapping is refused (:class:`yaml.YAMLError`)."""
    return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass: no arbitrary objects


def setting_value(text: str) -> Any:
    """The value of a ``name=value`` setting given as text: YAML (:func:`load_yaml`), so
    ``64`` is an int, ``1e-3`` a float, ``[a, b]`` a list; empty is ``None``; text that is not
    valid YAML stays as it is."""
    try:
        return load_yaml(text) if text.strip() else None
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Sequence[str],
                    example: str = "rounds=4") -> dict[str, Any]:
    """``key.sub=value`` overrides (``--set``; each value read by :func:`setting_value`)
    applied to a copy of ``data``; ``example`` is the item a malformed one is shown."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UbError(f"--set {item!r}: expected key=value, e.g. --set {example}")
        value = setting_value(text)
        node: Any = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if isinstance(node, list):  # envs.0.legal_moves: an entry of a list, by position
                child = node[_list_index(node, part, item)]
            else:
                child = node.get(part)
                if child is None:
                    child = node[part] = {}
            if not isinstance(child, dict | list):
                raise UbError(f"--set {item!r}: {part} is not a section")
            node = child
        if isinstance(node, list):
            node[_list_index(node, parts[-1], item)] = value
        else:
            node[parts[-1]] = value
    return out


def _list_index(items: list[Any], part: str, item: str) -> int:
    """``part`` as a position in ``items`` (an override's path through a list)."""
    if not part.isdigit() or int(part) >= len(items):
        raise UbError(f"--set {item!r}: {part} is not a position in a list of {len(items)} "
                      f"(0 to {len(items) - 1})")
    return int(part)


class Section(BaseModel):
    """Base of every settings section: strict, frozen, no unknown keys.

    ``key`` is where the section sits in a run's config (``batch``, ``learner.lora``): the
    errors of :meth:`from_dict` name a bad setting by it. ``renamed`` maps deprecated keys still
    accepted to their new names (read under the new name, with a log line).
    """

    # strict: no YAML `true` for a count, no 2.0 for an int; finite: `.inf`/`.nan` in a weight
    # or a size would only fail later, deep inside the run.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    key: ClassVar[str] = ""
    renamed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if not cls.renamed or not isinstance(data, Mapping):
            return data
        out = dict(data)
        for old, new in cls.renamed.items():
            if old in out:
                if new in out:
                    raise ValueError(f"{old} is the old name of {new}: give only {new}")
                log.warning("config: %s.%s is deprecated, read as %s.%s (same meaning)",
                            cls.key, old, cls.key, new)
                out[new] = out.pop(old)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Self:
        """The section from plain data (a YAML mapping, or a section's other written form such
        as ``opponents``' list), or one :class:`UbError` line naming each bad key by its path
        in a run's config (e.g. ``batch.batch_size: Input should be greater than 0 (got 0)``)."""
        try:
            return cls.model_validate({} if data is None else dict(data) if isinstance(
                data, Mapping) else data)
        except ValidationError as exc:
            raise UbError(format_errors(exc, cls.key, cls)) from None

    def to_dict(self) -> Any:
        """The settings as plain YAML/JSON data, in the form they are written (what
        :meth:`from_dict` reads back): a mapping, or ``opponents``' list."""
        return self.model_dump(mode="json")

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes``, validated like the original (unlike pydantic's
        ``model_copy``, which checks nothing and would carry what a section built from its old
        values, such as a batch's transforms)."""
        # The fields only: dict(self) would also hold what a cached_property keeps in the
        # instance's __dict__ (a batch's transforms), which is no setting.
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        try:
            return type(self).model_validate({**fields, **changes})
        except ValidationError as exc:
            raise UbError(format_errors(exc, self.key, type(self))) from None


def same_setting(section: type[BaseModel], name: str) -> Any:
    """The declaration of ``section.name`` (its pydantic ``FieldInfo``: type bounds, default,
    description), for a section that holds the same setting without declaring it again:
    ``env_id: str = same_setting(GameSpec, "env_id")`` (typed ``Any`` so that it stands as
    the field's default for the type checker; pydantic reads it as the field's declaration)."""
    return section.model_fields[name]


def default_of(section: type[BaseModel], name: str) -> Any:
    """The default of ``section.name`` (a fresh copy: safe to mutate)."""
    return copy.deepcopy(section.model_fields[name].get_default(call_default_factory=True))
