"""The config schema, rendered: ``docs/config.md`` (every key) and ``ub config show`` (a resolved
config as YAML, each key's meaning as a comment above it). Both read :mod:`ub.run.config.schema`, so
the documentation cannot drift from the code (``tests/test_config_docs.py`` checks the doc).

Regenerate the doc with ``python -m ub.run.config.docs --write``.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
import yaml
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

from ub.errors import UbError
from ub.learner.config import LearnerSection
from ub.run.config.schema import TrainConfig
from ub.settings import Section, apply_overrides, components_of, is_execution

DOC = Path(__file__).resolve().parents[3] / "docs" / "config.md"
REGENERATE = "python -m ub.run.config.docs --write"
WIDTH = 100

# --------------------------------------------------------------------------------------------
# Types, constraints and defaults as text
# --------------------------------------------------------------------------------------------


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the section class, whether it is a list of them) of a field's annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item, True
    return None, False


def _section_in(annotation: Any) -> type[BaseModel] | None:
    """The section class among the item types of a list field such as ``list[str | Model] |
    None``, or ``None``."""
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is list:
            for item in typing.get_args(typing.get_args(arg)[0]) or typing.get_args(arg):
                if isinstance(item, type) and issubclass(item, BaseModel):
                    return item
    return None


def type_text(annotation: Any) -> str:
    """A field's type as written in YAML: ``int``, ``list[str] | null``, ``'a' | 'b'``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(f"'{a}'" if isinstance(a, str) else str(a) for a in args)
    if origin is typing.Annotated:  # (a bound on a union member or a list item: said there)
        bounds = _bounds_text(args[1:])
        return f"{type_text(args[0])} ({bounds})" if bounds else type_text(args[0])
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return f"list[{type_text(args[0])}]"  # (YAML writes a tuple as a list)
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"),
           (annotated_types.Le, "le", "<="), (annotated_types.Lt, "lt", "<"),
           (annotated_types.MinLen, "min_length", "length >="),
           (annotated_types.MaxLen, "max_length", "length <="))


def _bounds_text(metadata: typing.Iterable[Any]) -> str:
    """Bounds in pydantic metadata (``annotated_types`` objects, or a ``Field(...)`` holding
    them), e.g. ``>= 1, <= 100000``."""
    parts = []
    for meta in metadata:
        if isinstance(meta, FieldInfo):
            parts.append(_bounds_text(meta.metadata))
            continue
        for kind, attr, symbol in _BOUNDS:
            if isinstance(meta, kind):
                parts.append(f"{symbol} {getattr(meta, attr)}")
    return ", ".join(p for p in parts if p)


def constraint_text(info: FieldInfo) -> str:
    """The field's bounds, e.g. ``>= 1, <= 100000`` (checked by pydantic)."""
    return _bounds_text(info.metadata)


def flow_yaml(value: Any) -> str:
    """``value`` as one line of YAML (flow style), as a config file would hold it."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump(mode="json") for v in value]
    return flow_yaml(value)


# --------------------------------------------------------------------------------------------
# docs/config.md
# --------------------------------------------------------------------------------------------


def sections(model: type[BaseModel] = TrainConfig, path: str = ""
             ) -> Iterator[tuple[str, type[BaseModel]]]:
    """Every section of the schema with its dotted path (``envs[]`` for a list's items)."""
    yield path, model
    for name, info in model.model_fields.items():
        child, many = _model_of(info.annotation)
        if child is None:  # a list whose items may be sections (eval.envs: ids or entries)
            child, many = _section_in(info.annotation), True
        if child is not None:
            yield from sections(child, f"{path}.{name}".lstrip(".") + ("[]" if many else ""))


FREE_NOTE = "(may change on resume)"
"""Said of a setting of how the work is executed (:data:`ub.settings.EXECUTION`)."""


def free_sections(model: type[BaseModel] = TrainConfig, path: str = "",
                  free: bool = False) -> Iterator[str]:
    """The dotted paths of the sections whose every key may change on resume (those under an
    execution field, e.g. ``cluster``, ``cluster.rollout``)."""
    if free and path:
        yield path
    for name, info in model.model_fields.items():
        child, many = _model_of(info.annotation)
        if child is None:
            child, many = _section_in(info.annotation), True
        if child is not None:
            yield from free_sections(child, f"{path}.{name}".lstrip(".") + ("[]" if many
                                                                            else ""),
                                     free or is_execution(info))


def registered_names(kind: str) -> list[str]:
    """The registered names of a kind of component (``algorithm``, or a reward stage)."""
    if kind == "algorithm":
        from ub.learner.algorithms import algorithm_names

        return algorithm_names()
    from ub.rewards import available_transforms

    return available_transforms(kind)


def meaning(info: FieldInfo) -> str:
    """A field's description, with the registered names when it names components."""
    text = info.description or ""
    kind = components_of(info)
    return f"{text} Registered: {', '.join(registered_names(kind))}." if kind else text


def summary(docstring: str | None) -> str:
    """A section's docstring's first paragraph: what a config's reader needs; the paragraphs
    after it are notes for the Python reader of the class."""
    return (docstring or "").strip().split("\n\n")[0]


def _markdown_text(docstring: str) -> str:
    """A docstring as one Markdown paragraph: ``code`` as `code`, no Sphinx roles."""
    text = " ".join(docstring.split()).replace("``", "`")
    return re.sub(r":(?:class|mod|func|meth):`~?([^`]+)`", r"`\1`", text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def declared_in(model: type[BaseModel]) -> str:
    """Where a section is declared, as docs/config.md names it: ``ub/batch/config.py``
    (``BatchConfig``), and the section it extends, if any."""
    # (a section may extend another: EnvSection a GameSpec)
    own = [c for c in model.__mro__ if issubclass(c, BaseModel)
           and c not in (BaseModel, Section) and inspect.get_annotations(c)] or [model]
    return ", on ".join(f"`{c.__module__.replace('.', '/')}.py` (`{c.__name__}`)" for c in own)


def markdown() -> str:
    """``docs/config.md``: one table per section, every key's type, default and meaning."""
    out = ["# Training config reference", "",
           "<!-- Generated from the sections (each declared once, in the module named under "
           f"its title) by `{REGENERATE}`: do not edit by hand. -->", "",
           "Every key of a training config (`ub train CONFIG`, `--set key.sub=value`), its type, "
           "default and meaning. Types are strict: `true` is not a count and `2.0` is not an "
           "`int`. `ub config show PRESET|FILE|RUN` prints a resolved config with these "
           "meanings as comments. The presets are in `ub/presets/`; how a run uses the "
           "settings is in [training.md](training.md).", "",
           "A run's settings are locked when it starts, except those of how its work is "
           f"executed, marked \"{FREE_NOTE}\" (and whole sections said so): memory, batching, "
           "kernels and where the work runs. They change nothing in the run's games or "
           "adapters beyond float summation order, so `ub train CONFIG --run NAME` may resume "
           "a run with other values; each round's manifest records those it ran with "
           "(`execution`).", "",
           "The last sections are the settings of `ub model tiny --set` and of a `hosted:` "
           "actor's name, declared the same way.", ""]
    free = set(free_sections())
    for path, model in sections():
        title = f"`{path}`" if path else "Top level"
        doc = _markdown_text(summary(model.__doc__))
        if path in free:
            doc += " Every key here may change on resume."
        out += [f"## {title}", "", doc, "", f"Declared in {declared_in(model)}.", "",
                *_table(model, path, path in free), ""]
        if path == LearnerSection.key:  # (each algorithm's parameters, after the section)
            for name, params in algorithm_sections():
                out += [f"## `{path}.algorithm_params` ({name})", "",
                        f"{_markdown_text(summary(params.__doc__))} Given when "
                        f"`{path}.algorithm` is `{name}`.", "",
                        f"Declared in {declared_in(params)}.", ""]
                out += ([*_table(params, f"{path}.algorithm_params", False), ""]
                        if params.model_fields else [])
    for title, how, model, names in command_settings():
        out += [f"## {title}", "", f"{_markdown_text(summary(model.__doc__))} {how}", "",
                f"Declared in {declared_in(model)}.", "",
                "| key | type | default | meaning |",
                "| --- | --- | --- | --- |"]
        for name in names:
            info = model.model_fields[name]
            kind = type_text(info.annotation)
            if bounds := constraint_text(info):
                kind += f", {bounds}"
            out.append(f"| `{info.alias or name}` | {_cell(kind)} | "
                       f"`{_cell(default_text(info))}` | {_cell(meaning(info))} |")
        out.append("")
    return "\n".join(out)


def _table(model: type[BaseModel], path: str, free: bool) -> list[str]:
    """The Markdown table of a section's keys (at ``path``): type and bounds, default and
    meaning; ``free``: the whole section may change on resume (no note per key)."""
    out = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, info in model.model_fields.items():
        key = f"{path}.{name}".lstrip(".")
        kind = type_text(info.annotation)
        if bounds := constraint_text(info):
            kind += f", {bounds}"
        text = meaning(info)
        if is_execution(info) and not free:
            text += f" {FREE_NOTE}"
        out.append(f"| `{key}` | {_cell(kind)} | `{_cell(default_text(info))}` | "
                   f"{_cell(text)} |")
    return out


def algorithm_sections() -> list[tuple[str, type[Section]]]:
    """The registered algorithms that declare their parameters (``Algorithm.Params``), by
    name, with that section: docs/config.md shows each after the ``learner`` section."""
    from ub.learner.algorithms import ALGORITHMS, algorithm_names

    return [(name, params) for name in algorithm_names()
            if (params := ALGORITHMS[name].Params) is not None]


def command_settings() -> list[tuple[str, str, type[BaseModel], list[str]]]:
    """The settings sections outside a training config, each declared once like the config's
    own: (title, how they are given, the section, the fields shown)."""
    from ub.actors.hosted import OPTIONS, HostedSettings
    from ub.model.tiny.config import TinyModelConfig

    options = [name for name, info in HostedSettings.model_fields.items()
               if (info.alias or name) in OPTIONS]
    return [("`ub model tiny --set`", "Each key is one `--set KEY=VALUE` (the value read as "
             "YAML, as in a config's `--set`).", TinyModelConfig,
             list(TinyModelConfig.model_fields)),
            ("`hosted:` options", "Each key is an option of the actor's name, "
             "`hosted:MODEL@BASE_URL?KEY=VALUE&...` (the value read as YAML).", HostedSettings,
             options)]


# --------------------------------------------------------------------------------------------
# ub config show
# --------------------------------------------------------------------------------------------


def _comment(text: str, indent: int) -> list[str]:
    pad = " " * indent
    return textwrap.wrap(text, WIDTH - indent - 2, initial_indent=f"{pad}# ",
                         subsequent_indent=f"{pad}# ")


def _eval_formats(config: TrainConfig, indent: int) -> list[str]:
    """What prompt each eval env gets (:meth:`TrainConfig.eval_env`), as comment lines: an env
    not trained on takes the training envs' format, which ``eval.envs`` does not spell out."""
    from ub.games.templates import get_template

    lines = []
    for entry in config.eval.envs or []:
        env = config.eval_env(entry)
        extractor = env.extractor or get_template(env.template).extractor
        trained = any(e.env_id == env.env_id for e in config.envs)
        given = not isinstance(entry, str) and (entry.template or entry.extractor)
        source = ("its entry's" if given else "as it trains" if trained
                  else "the training envs' format")
        lines.append(f"{env.env_id}: template {env.template}, extractor {extractor} "
                     f"({source})")
    return _comment("prompted as: " + "; ".join(lines), indent) if lines else []


def _lines(model: BaseModel, indent: int, comments: bool = True,
           root: TrainConfig | None = None) -> list[str]:
    pad, out = " " * indent, []
    root = model if isinstance(model, TrainConfig) else root
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        if comments and info.description:
            free = f" {FREE_NOTE}" if is_execution(info) else ""
            out += _comment(meaning(info) + free, indent)
        child, many = _model_of(info.annotation)
        if child is not None and not many:
            out += [f"{pad}{name}:", *_lines(value, indent + 2, comments, root)]
        elif child is not None and value:
            out.append(f"{pad}{name}:")
            if comments:
                out += _comment(summary(child.__doc__), indent + 2)
                for item_name, item_info in child.model_fields.items():
                    out += _comment(f"{item_name}: {item_info.description}", indent + 2)
            for item in value:  # as written: a mode's unset parameters are left out
                for i, (key, item_value) in enumerate(item.model_dump(mode="json").items()):
                    out.append(f"{pad}  {'- ' if i == 0 else '  '}{key}: {flow_yaml(item_value)}")
        else:
            # (the field's own type: a list of ids or entries dumps as written)
            dumped = TypeAdapter(info.annotation or Any).dump_python(value, mode="json")
            out.append(f"{pad}{name}: {flow_yaml(dumped)}")
            if comments and root is not None and model is root.eval and name == "envs":
                out += _eval_formats(root, indent)
    return out


def show(config: TrainConfig, label: str) -> str:
    """``config`` as YAML that reads back as the same config, each key's meaning above it."""
    head = [f"# {label}, resolved: every setting, defaults included (docs/config.md)."]
    return "\n".join([*head, *_lines(config, 0)]) + "\n"


def load_any(what: str, overrides: list[str] | None = None) -> tuple[TrainConfig, str]:
    """A preset name, a YAML file or a run folder (its ``config.yaml``), validated."""
    from ub.run.config.load import load_config, read_config_data, validate_config

    path = Path(what).expanduser()
    if path.is_dir():
        stored = path / "config.yaml"
        if not stored.is_file():
            raise UbError(f"{path} is a folder without config.yaml: give a run folder, a preset "
                          "or a YAML file")
        data, label = read_config_data(str(stored))
        return validate_config(apply_overrides(data, overrides or []), label), label
    config = load_config(what, overrides)
    return config, (str(path) if path.suffix in (".yaml", ".yml") else f"preset {what}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="docs/config.md from the config schema")
    parser.add_argument("--write", action="store_true", help=f"rewrite {DOC}")
    args = parser.parse_args(argv)
    text = markdown()
    if args.write:
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
