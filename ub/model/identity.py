"""Which base model an adapter belongs to, in a form that resolves on any machine.

A base model is loaded from a machine-specific place (``~/.cache/ub/models/tiny-2adb6167eaa1``,
``/data/models/x``), so that path is no identity to write into a checkpoint. ub records instead:

- ``{"kind": "tiny", "key", "seed", "recipe_version", "textarena", "config"}`` for a tiny build
  (:mod:`ub.model.tiny`): the content key and every input of the recipe, so another machine
  finds the same build in its own cache, or builds it (:func:`resolve_tiny_build`);
- ``{"kind": "hub", "id"}`` for a Hugging Face id;
- ``{"kind": "path", "path"}`` for any other local folder (portable only to a machine with the
  same folder).

:func:`portable_name` is what goes into ``adapter_config.json``'s ``base_model_name_or_path``:
the hub id, the path, or for a tiny build its cache folder's name ``tiny-KEY12`` (which plain
PEFT resolves from the folder holding the build: see docs/training.md).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.model.hub import HUB_ID, hub_id_of_snapshot

TINY_NAME = re.compile(r"^tiny-([0-9a-f]{12})$")


def tiny_identity(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The identity of the tiny build in ``path`` (from its ``ub_model.json``), or ``None``
    when ``path`` is not a tiny build."""
    from ub.model.tiny import read_manifest

    manifest = read_manifest(Path(path).expanduser())
    if manifest is None or not isinstance(manifest.get("key"), str):
        return None
    return {"kind": "tiny", "key": manifest["key"], "seed": manifest.get("seed"),
            "recipe_version": manifest.get("recipe_version"),
            "textarena": manifest.get("textarena"), "config": manifest.get("config")}


def current_tiny_identity(seed: int = 0) -> dict[str, Any]:
    """The identity of what ``build_tiny_model(seed=seed)`` builds with this ub and textarena
    (computed: nothing is built)."""
    from ub.model.tiny import RECIPE_VERSION, TinyModelConfig, cache_key, textarena_version

    config = TinyModelConfig()
    return {"kind": "tiny", "key": cache_key(seed, config), "seed": seed,
            "recipe_version": RECIPE_VERSION, "textarena": textarena_version(),
            "config": config.to_dict()}  # (as a build's manifest has it)


def same_tiny_build(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True if two tiny identities name one build (a key may be a 12-digit prefix)."""
    ka, kb = str(a.get("key") or ""), str(b.get("key") or "")
    n = min(len(ka), len(kb))
    return n >= 12 and ka[:n] == kb[:n]


def describe_tiny(identity: dict[str, Any]) -> str:
    """``tiny build 2adb6167eaa1 (recipe version 2, textarena 0.7.4, seed 0)``."""
    key = str(identity.get("key") or "?")[:12]
    if identity.get("recipe_version") is None:
        return f"tiny build {key}"
    return (f"tiny build {key} (recipe version {identity.get('recipe_version')}, textarena "
            f"{identity.get('textarena')}, seed {identity.get('seed')})")


def describe_difference(recorded: dict[str, Any], current: dict[str, Any]) -> str:
    """The first recipe input that differs between two tiny identities, e.g.
    ``recipe version 2 -> 3``."""
    for field, label in (("recipe_version", "recipe version"), ("textarena", "textarena"),
                         ("seed", "seed")):
        if recorded.get(field) is not None and recorded.get(field) != current.get(field):
            return f"{label} {recorded.get(field)} -> {current.get(field)}"
    old, new = recorded.get("config") or {}, current.get("config") or {}
    if not old:
        return "its recipe inputs are not recorded"
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            return f"config.{name} {old.get(name)!r} -> {new.get(name)!r}"
    return "same recipe inputs"


def resolve_tiny_build(identity: dict[str, Any], *, verbose: bool = True) -> Path:
    """The local folder of the tiny build ``identity`` names: this machine's cached build, else
    built here when this ub reproduces it (same recipe version and textarena; the recorded seed
    and config then give the same key).

    :raises UbError: no recipe here produces that build; the message names it, what differs
        from this ub's recipe, and what to do.
    """
    from ub.model.tiny import (
        TinyModelConfig,
        build_tiny_model,
        cache_dir,
        cache_key,
        is_complete,
        read_manifest,
    )

    key = str(identity.get("key") or "")
    if not re.fullmatch(r"[0-9a-f]{12}([0-9a-f]{52})?", key):
        raise UbError(f"tiny build key {key!r} is not 12 or 64 hex digits")
    folder = cache_dir() / "models" / f"tiny-{key[:12]}"
    found = read_manifest(folder)
    if found is not None and str(found.get("key", "")).startswith(key) and is_complete(
            folder, found["key"]):
        return folder
    seed = int(identity.get("seed") or 0)
    candidates = []
    recorded = identity.get("config")
    if isinstance(recorded, dict) and set(recorded) == set(TinyModelConfig.model_fields):
        with contextlib.suppress(UbError):
            candidates.append(TinyModelConfig.from_dict(recorded))
    candidates.append(TinyModelConfig())
    for config in candidates:
        if cache_key(seed, config).startswith(key):
            return build_tiny_model(seed=seed, config=config, verbose=verbose)
    now = current_tiny_identity(seed)
    raise UbError(
        f"{describe_tiny(identity)} is not in this machine's cache ({folder}) and this ub "
        f"cannot build it: it builds {describe_tiny(now)} ({describe_difference(identity, now)}"
        "). Use the ub and textarena versions that built it, or copy that build's folder into "
        f"{folder.parent}")


def base_identity(base_model: str | os.PathLike[str]) -> dict[str, Any]:
    """The portable identity of a base model given as a local folder or a hub id."""
    path = Path(base_model).expanduser()
    if path.is_dir():
        # A hub model is loaded from its snapshot in this machine's Hugging Face cache
        # (ub.model.hub.local_model): it is still that hub model.
        hub_id = hub_id_of_snapshot(path.absolute())
        if hub_id is not None:
            return {"kind": "hub", "id": hub_id}
        return tiny_identity(path) or {"kind": "path", "path": str(path.resolve())}
    return {"kind": "hub", "id": str(base_model)}


def identity_from_name(name: str) -> dict[str, Any]:
    """The identity behind a recorded base model name or path (an old checkpoint's absolute
    path, or ``base_model_name_or_path``): a tiny build's folder name ``tiny-KEY12`` gives its
    key even when the folder is on another machine."""
    path = Path(name).expanduser()
    if path.is_dir():
        return base_identity(path)
    match = TINY_NAME.match(path.name)
    if match:
        return {"kind": "tiny", "key": match.group(1)}
    if HUB_ID.match(name) and not name.startswith(("/", ".", "~")):
        return {"kind": "hub", "id": name}
    return {"kind": "path", "path": name}


def portable_name(identity: dict[str, Any]) -> str:
    """The ``base_model_name_or_path`` an adapter records: the hub id, ``tiny-KEY12`` (the tiny
    build's folder name in any machine's cache), or a local folder's path."""
    kind = identity.get("kind")
    if kind == "tiny":
        return f"tiny-{str(identity['key'])[:12]}"
    if kind == "hub":
        return str(identity["id"])
    return str(identity.get("path"))


def resolve_base(identity: dict[str, Any], *, verbose: bool = True) -> str:
    """What to load the base model an identity names from, on this machine: a tiny build's
    folder (found or built, :func:`resolve_tiny_build`), the hub id, or the local folder.

    :raises UbError: the tiny build cannot be produced here, or the local folder is missing.
    """
    kind = identity.get("kind")
    if kind == "tiny":
        return str(resolve_tiny_build(identity, verbose=verbose))
    if kind == "hub":
        return str(identity["id"])
    path = Path(str(identity.get("path"))).expanduser()
    if not (path / "config.json").is_file():
        raise UbError(f"the base model folder {path} is not on this machine: give the base "
                      "model explicitly (--model / --base-model / model.base)")
    return str(path)
