"""What several commands share: argument types, output-folder checks, ``--config`` sections, and
the run a command names."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ub.errors import UbError
from ub.numbers import NumberError, first_non_finite, parse_float, parse_int, parse_port
from ub.run.folder.urls import DEFAULT_RUNS_ROOT, is_url

T = TypeVar("T")

MAX_WAIT_S = 86_400.0
"""Most seconds a command waits between two steps (``--refresh``): select() and sleep() refuse
a timeout that does not fit the C types under them, long after the command started."""


def argument_type(parse: Callable[[str], T], name: str) -> Callable[[str], T]:
    """An argparse ``type`` from a parser of :mod:`ub.numbers`: its message, not argparse's
    "invalid value"."""
    def typed(text: str) -> T:
        try:
            return parse(text)
        except NumberError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    typed.__name__ = name
    return typed


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum`` (and <= ``maximum``)."""
    return argument_type(lambda text: parse_int(text, minimum, maximum), "int")


whole_number = argument_type(parse_int, "int")
positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
port_number = argument_type(parse_port, "port")
non_negative_float = argument_type(lambda text: parse_float(text, 0), "float")
wait_seconds = argument_type(lambda text: parse_float(text, 0, MAX_WAIT_S), "seconds")


class HelpWhenPrinted(str):
    """An argparse help text made when help is printed, not when the parser is built: ``ub``
    starts without importing what the text lists (the learner's algorithms import torch)."""

    make: Callable[[], str]

    def __new__(cls, make: Callable[[], str]) -> HelpWhenPrinted:
        text = super().__new__(cls, "(made when help is printed)")
        text.make = make
        return text

    def __mod__(self, params: object) -> str:  # argparse fills in %(default)s and the like
        return self.make() % params


def round_number(minimum: int = 0) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum`` that the data's ``round`` column
    holds (a round, or a count of rounds)."""
    def parse(text: str) -> int:
        from ub.data.schema import int_column_range  # (pyarrow: only when the option is given)

        return int_at_least(minimum, int_column_range("games", "round")[1])(text)
    parse.__name__ = "int"
    return parse


def add_batch_options(parser: argparse.ArgumentParser, *, rounds: bool = True) -> None:
    """The batch settings ``ub batch``, ``ub learn`` and ``ub sft`` take over their
    ``--config``: ``--batch-size``, ``--rounds`` (unless ``rounds`` is false), ``--seed`` and
    ``--max-train-len``."""
    parser.add_argument("--batch-size", type=positive_int)
    if rounds:
        parser.add_argument("--rounds", help="window of rounds, A:B inclusive (A: or :B open)")
    parser.add_argument("--seed", type=whole_number)
    parser.add_argument("--max-train-len", type=positive_int)


def add_learner_options(parser: argparse.ArgumentParser, *, records: str,
                        init_adapter_help: str) -> None:
    """The learner settings ``ub learn`` and ``ub sft`` take over their ``--config``:
    ``--learning-rate``, ``--base-model`` (by default the one ``records`` names) and
    ``--init-adapter``."""
    parser.add_argument("--learning-rate", type=non_negative_float)
    parser.add_argument("--base-model", help=f"base model directory (default: the one {records} "
                        "records, else the tiny model)")
    parser.add_argument("--init-adapter", help=init_adapter_help)


def add_checkpoint_io(parser: argparse.ArgumentParser) -> None:
    """What ``ub learn`` and ``ub sft`` read and write: ``--shards``, ``--out``,
    ``--overwrite``."""
    parser.add_argument("--shards", required=True, help="data folder with the decisions")
    parser.add_argument("--out", required=True, help="checkpoint folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")


def checkpoint_choice(text: str) -> int | str:
    """An argparse ``type``: a checkpoint's update (>= 0), ``latest`` or ``all``."""
    if text in ("latest", "all"):
        return text
    return non_negative_int(text)


def game_count(text: str) -> int:
    from ub.run.config.load import MAX_GAMES

    value = positive_int(text)
    if value > MAX_GAMES:
        raise argparse.ArgumentTypeError(f"at most {MAX_GAMES} games per call, got {value} "
                                         "(play more as several calls)")
    return value


def yaml_section(path_text: str | None, section: str) -> dict:
    """The ``section:`` mapping of a YAML file (or the whole file if it has no such key)."""
    loaded = yaml_document(path_text)
    value = loaded.get(section, loaded)
    if not isinstance(value, dict):
        raise UbError(f"{path_text}: `{section}` must be a mapping of settings")
    found = first_non_finite(value)
    if found:
        raise UbError(f"{path_text}: {found[0]}: expected a finite number, got {found[1]}")
    return dict(value)


def yaml_document(path_text: str | None) -> dict:
    """The whole mapping of a YAML settings file (empty without a file)."""
    if not path_text:
        return {}
    import yaml

    from ub.run.config.load import read_text
    from ub.settings import load_yaml

    path = Path(path_text)
    try:
        loaded = load_yaml(read_text(path, "config")) or {}
    except yaml.YAMLError as exc:
        raise UbError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(loaded, dict):
        raise UbError(f"{path} must hold a mapping of settings")
    return loaded


def add_root_argument(parser: argparse.ArgumentParser) -> None:
    """``--root`` of a command that takes a run by name (:func:`run_dir`)."""
    parser.add_argument("--root", default=None,
                        help=f"folder of runs (default: {DEFAULT_RUNS_ROOT}); given, RUN is "
                        "always a run's name under it")


def named_run(run: str, root: str | None) -> tuple[str, str]:
    """The runs root and the name of the run a command's RUN names, one way for every command:
    a name under ``root`` (``--root``, default ``runs``), or, without ``--root``, a path to the
    run's folder (``runs/demo``, ``/data/runs/demo``, a run's folder ``demo`` here). An
    explicit ``--root`` always wins: ``ROOT/NAME``, even where a run ``NAME`` is here."""
    from ub.run.folder.layout import is_run

    if root is not None:
        return root, run
    path = Path(run).expanduser()
    if not is_url(run) and (len(path.parts) > 1 or is_run(path)):
        return str(path.parent), path.name
    return DEFAULT_RUNS_ROOT, run


def run_dir(args: argparse.Namespace) -> Path:
    """The folder of the run ``args.run`` names (:func:`named_run`), which must exist."""
    from ub.run.folder.layout import RunPaths, check_run_name, no_such_run

    given, name = named_run(args.run, args.root)
    if is_url(given):  # a run in a store: this machine's working copy of it
        root = RunPaths.of(given, name).root
        if not root.is_dir():
            raise UbError(f"this machine has no copy of run {name!r} of {given}: "
                          f"`ub sql {given.rstrip('/')}/{name}` reads it in place")
        return root
    root = Path(given) / check_run_name(name)
    if not root.is_dir():
        raise no_such_run(given, name)
    return root
