"""A component of one's own, named in a config by import path: ``package.module:Class``.

``learner.algorithm`` and the reward transforms of ``batch:`` take a registered name or such a
path, and ``envs[].position`` and ``envs[].rules`` such a path, so a user's algorithm,
transform, position key or whole game needs no fork of ub: the class lives in any module
Python can import (a package installed next to ub, or a folder on ``PYTHONPATH``). The run's
config keeps the path as written, so a resumed run imports the same class.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from ub.errors import UbError

T = TypeVar("T")

SEPARATOR = ":"


def is_import_path(name: str) -> bool:
    """Whether a component's name is an import path (``package.module:Class``) rather than a
    registered name (registered names hold no ``:``)."""
    return SEPARATOR in name


def own_components(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The settings of a config as written (a mapping, not yet validated) that name a
    component by import path, with the path: ``learner.algorithm``, the reward transforms of
    ``batch.final|step|sampling``, ``envs[].position``, ``envs[].rules`` and the actors of
    ``opponents`` and ``eval.opponents`` (an actor's name holds a ``:`` only as an import path,
    ``model:PATH`` or ``hosted:...``)."""
    found: list[tuple[str, Any]] = []
    learner, batch = config.get("learner") or {}, config.get("batch") or {}
    if isinstance(learner, Mapping):
        found.append(("learner.algorithm", learner.get("algorithm")))
    if isinstance(batch, Mapping):
        for stage in ("final", "step", "sampling"):
            for i, entry in enumerate(batch.get(stage) or []):
                name = entry.get("name") if isinstance(entry, Mapping) else entry
                found.append((f"batch.{stage}.{i}", name))
    for i, env in enumerate(config.get("envs") or []):
        if isinstance(env, Mapping):
            found += [(f"envs.{i}.{key}", env.get(key)) for key in ("position", "rules")]
    opponents = config.get("opponents")
    modes = opponents.get("modes") if isinstance(opponents, Mapping) else opponents
    for i, mode in enumerate(modes if isinstance(modes, list) else []):
        if isinstance(mode, Mapping):
            found += [(f"opponents.modes.{i}.names", name) for name in mode.get("names") or []]
    evaluation = config.get("eval") or {}
    if isinstance(evaluation, Mapping):
        found += [("eval.opponents", name) for name in evaluation.get("opponents") or []]
    return [(setting, path) for setting, path in found if isinstance(path, str)
            and is_import_path(path) and not path.startswith(("model:", "hosted:"))]


def import_problem(path: str) -> str | None:
    """Why the module of import path ``path`` cannot be imported in this process (``None``:
    it can)."""
    failure = _import_failure(path.partition(SEPARATOR)[0])
    return None if failure is None else failure[0]


def import_path(code: type | Callable[..., Any]) -> str:
    """The import path of a class or function: ``package.module:Name``."""
    return f"{code.__module__}{SEPARATOR}{code.__qualname__}"


def load_class(path: str, base: type[T], what: str, guide: str) -> type[T]:
    """The class ``path`` names, which must subclass ``base``; imported once per process.

    :param what: what the class is to the config, for the error line (``"algorithm"``,
        ``"step reward transform"``).
    :param guide: where to read how to write one (``"docs/algorithms.md"``).
    :raises UbError: one line naming the path, what failed and what to do.
    """
    found = _import(path, what, "class")
    if not isinstance(found, type):
        raise UbError(f"{what} {path!r} is a {type(found).__name__}, not a class: name a "
                      f"subclass of {public_name(base)} ({guide})")
    if not issubclass(found, base):
        raise UbError(f"{what} {path!r} does not subclass {public_name(base)}: make it a "
                      f"subclass ({guide})")
    return found


def load_function(path: str, what: str, guide: str) -> Callable[..., Any]:
    """The function (or other callable) ``path`` names, ``package.module:function``; imported
    once per process.

    :raises UbError: one line naming the path, what failed and what to do.
    """
    found = _import(path, what, "function")
    if isinstance(found, type) or not callable(found):
        kind = "class" if isinstance(found, type) else type(found).__name__
        raise UbError(f"{what} {path!r} is a {kind}, not a function: name a function ({guide})")
    return found


def public_name(cls: type) -> str:
    """``cls`` by the shortest module it is imported from (``ub.learner.Algorithm``, not
    ``ub.learner.algorithms.Algorithm``): as the docs and a user's import name it."""
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):
        module = ".".join(parts[:end])
        if getattr(sys.modules.get(module), cls.__name__, None) is cls:
            return f"{module}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.cache
def _import(path: str, what: str, kind: Literal["class", "function"]) -> object:
    """The object at ``path`` (cached: a run's every round and check uses the same class);
    ``kind``: what it should be, for the error's hint."""
    module_name, _, qualname = path.partition(SEPARATOR)
    if not module_name or not qualname or SEPARATOR in qualname:
        raise UbError(f"{what} {path!r}: an import path is package.module:Name, "
                      f"with one ':' between the module and the {kind}")
    failure = _import_failure(module_name)
    if failure is not None:
        problem, fix = failure
        raise UbError(f"{what} {path!r}: importing {module_name} failed ({problem}): {fix}")
    module = importlib.import_module(module_name)  # (imported by the check: from its cache)
    found: object = module
    for part in qualname.split("."):
        if not hasattr(found, part):
            where = getattr(module, "__file__", None) or module_name
            raise UbError(f"{what} {path!r}: {module_name} ({where}) has no {qualname}; "
                          f"its {'classes' if kind == 'class' else 'functions'}: "
                          f"{', '.join(_defined(module, kind)) or 'none'}")
        found = getattr(found, part)
    return found


def _import_failure(module_name: str) -> tuple[str, str] | None:
    """Why importing ``module_name`` fails, and what to do (``None``: it imports).

    A user's module may raise anything while it is imported, ``SystemExit`` too (a script's
    ``sys.exit()``), which ``except Exception`` lets through: the command would end with the
    script's code and no word. Only Ctrl-C goes on as the interrupt it is."""
    try:
        importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except ImportError as exc:  # (the module, or one it imports, is not found)
        return (f"{type(exc).__name__}: {_first_line(exc)}", "put the folder that holds it on "
                "PYTHONPATH or install its package, in every process of the run")
    except SystemExit as exc:
        code = "" if exc.code is None else repr(exc.code)
        return (f"it called sys.exit({code}) at import", "a module of components is imported, "
                "not run: put what it runs under `if __name__ == \"__main__\":`")
    except BaseException as exc:
        problem = f"it raised {type(exc).__name__} at import"
        if _first_line(exc):
            problem += f": {_first_line(exc)}"
        return problem, f"fix {module_name} so that it imports"
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


def _defined(module: object, kind: Literal["class", "function"]) -> list[str]:
    """The classes (or functions) a module defines itself, not those it imports, for a hint."""
    name = getattr(module, "__name__", "")
    wanted = inspect.isclass if kind == "class" else inspect.isfunction
    return sorted(n for n, v in vars(module).items()
                  if wanted(v) and getattr(v, "__module__", None) == name)
