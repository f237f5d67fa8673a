"""Where tiny builds live and how one is published: the content key, the manifest that marks a
directory as a finished build, the per-target lock, and the atomic rename into place.

A build is made in a hidden sibling directory and renamed into place, so a killed build never
leaves anything that looks finished; ``ub_model.json`` is written last.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ub.errors import UbError
from ub.model.tiny.config import DEFAULT_CONFIG, RECIPE_VERSION, TinyModelConfig

MANIFEST = "ub_model.json"

# Files a build writes besides the manifest: anything else in a directory means it is not ours.
MODEL_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        MANIFEST,
    }
)


def textarena_version() -> str:
    """The installed textarena's version (its observation text is the training data)."""
    from importlib.metadata import version

    return version("textarena")


def cache_key(seed: int = 0, config: TinyModelConfig = DEFAULT_CONFIG) -> str:
    """The content key of a build: sha256 of config, seed, recipe version and textarena version.

    textarena is in the key because its observation text is the training data.
    """
    payload = {
        "config": config.to_dict(),
        "seed": seed,
        "recipe_version": RECIPE_VERSION,
        "textarena": textarena_version(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def cache_dir() -> Path:
    """``$UB_CACHE_DIR`` or ``~/.cache/ub``, as an absolute path."""
    root = os.environ.get("UB_CACHE_DIR")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "ub").absolute()


def tiny_model_path(seed: int = 0, config: TinyModelConfig = DEFAULT_CONFIG) -> Path:
    """Where the cached build for ``seed`` and ``config`` lives (whether or not it exists yet)."""
    return cache_dir() / "models" / f"tiny-{cache_key(seed, config)[:12]}"


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a complete build in ``path``, or None if it is missing or unreadable."""
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def is_complete(path: Path, key: str) -> bool:
    """True if ``path`` holds a finished build for ``key`` whose files are all there, full size."""
    manifest = read_manifest(path)
    if manifest is None or manifest.get("key") != key:
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for name, size in files.items():
        try:
            if (Path(path) / name).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def check_replaceable(path: Path) -> None:
    """Refuse to replace a directory that is not (a damaged copy of) a tiny-model build."""
    if not path.exists():
        return
    if not path.is_dir():
        raise UbError(f"{path} exists and is not a directory; choose another output path")
    foreign = sorted(p.name for p in path.iterdir() if p.name not in MODEL_FILES)
    if foreign:
        raise UbError(
            f"{path} exists and does not look like a tiny-model build (it has {foreign[0]!r}); "
            "choose another output path or remove it"
        )


def lock_path(target: Path) -> Path:
    """The file :func:`build_lock` locks for ``target``."""
    return target.parent / f".{target.name}.lock"


@contextlib.contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """An exclusive lock per target, so concurrent builds of one key run once, not twice."""
    with open(lock_path(target), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def replace_dir(new: Path, target: Path) -> None:
    """Move the finished ``new`` into ``target``; an old (damaged) ``target`` is moved aside first.

    ``os.replace`` cannot replace a non-empty directory, so the old one goes to a hidden sibling
    and is deleted only after the new one is in place.
    """
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / "dir")
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)



def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Write ``out``'s manifest last, flushed and renamed: its presence is what makes the
    directory a finished build."""
    tmp_manifest = out / f".{MANIFEST}.tmp"
    with open(tmp_manifest, "w") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp_manifest, out / MANIFEST)
