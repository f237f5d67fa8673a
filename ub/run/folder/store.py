"""A run's durable copy at an fsspec URL (``s3://``, ``gs://``, ``file://``, ...).

A run whose root is a URL works in a local copy (``$UB_WORK_DIR``, default
``$UB_CACHE_DIR/runs``): every file is first written there with the guarantees of
:mod:`ub.data.atomic`, then published to the store by the process that wrote it (a rollout
worker its shard, the learner its checkpoint, the driver the ratings and the round manifest).
Nothing passes through the driver, and a worker fetches what it lacks (a checkpoint to play, a
shard to learn from) from the store itself.

Object stores cannot rename, so each file is put once under its final key (an object appears
whole or not at all) in the order that commits it, the same order as on disk:

- a shard: ``steps`` first, ``games`` last (``games`` is the commit marker);
- a checkpoint: its files, ``ub_checkpoint.json`` last (it lists their sizes and sha256, checked
  when a checkpoint is fetched);
- a round: its shards, checkpoint, reward state, ratings and metrics, ``rounds/round-N.json``
  last.

A reader of the store therefore trusts exactly what a reader of the local directory trusts, and
a resume on another machine (an empty local copy) pulls the committed rounds and carries on.
On ``file://`` the last step of a put is a rename within the folder instead of a PUT; the rest
(listing, order, fetch and verification) is the one code path every fsspec filesystem takes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ub.data.atomic import write_atomic
from ub.errors import UbError
from ub.faults import fault_point
from ub.run.folder.layout import RunPaths

# What a run's durable copy holds (the rest, a lock, logs, reports, is the working copy's).
DURABLE = ("config.yaml", "ub-run.json", "steps", "games", "eval", "checkpoints", "state",
           "ratings", "metrics", "rounds")
CHECKPOINT_MANIFEST = "ub_checkpoint.json"
_ROUND_MANIFEST = re.compile(r"^rounds/round-(\d{6,})\.json$")
_SHARD_KEY = re.compile(r"^round[-=]\d{6,}/shard-\d{4,}\.parquet$")  # (run formats 2 and 1)


def publish_rank(key: str) -> tuple[int, str]:
    """The order files are published in: what commits a thing comes after the thing."""
    parts = key.split("/")
    head = parts[1] if parts[0] == "eval" and len(parts) > 1 else parts[0]
    if parts[0] == "rounds":
        return 6, key
    if parts[0] == "checkpoints":
        return (4 if parts[-1] == CHECKPOINT_MANIFEST else 3), key
    if head == "steps":
        return 1, key
    if head == "games":
        return 2, key
    if parts[0] in ("state", "ratings", "metrics"):
        return 5, key
    return 0, key  # config.yaml, ub-run.json


@dataclass
class RunStore:
    """The durable copy of one run at ``url``; keys are paths relative to the run root."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def _fs_and_root(self) -> tuple[Any, str]:
        import fsspec

        try:
            fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        except (ImportError, ValueError) as exc:
            scheme = self.url.partition("://")[0]
            raise UbError(f"cannot open run store {self.url}: {exc} (for {scheme}:// install "
                          "its fsspec package, e.g. `pip install s3fs` or `gcsfs`)") from None
        return fs, root.rstrip("/")

    @property
    def fs(self) -> Any:
        return self._fs_and_root[0]

    def path(self, key: str) -> str:
        return f"{self._fs_and_root[1]}/{key}"

    def _is_local(self) -> bool:
        from fsspec.implementations.local import LocalFileSystem

        return isinstance(self.fs, LocalFileSystem)

    def _error(self, doing: str, exc: Exception) -> UbError:
        return UbError(f"run store {self.url}: cannot {doing}: {exc}. Check the URL, the "
                       "credentials and the network; what this machine wrote is kept in its "
                       "working copy and is published when the run resumes")

    # ---- listing ---------------------------------------------------------------------------

    def files(self, prefix: str = "") -> dict[str, int]:
        """Every published file under ``prefix`` (a key folder) with its size, hidden names
        (unfinished puts) left out."""
        base = self.path(prefix).rstrip("/")
        try:
            found = self.fs.find(base, detail=True) if self.fs.exists(base) else {}
        except OSError as exc:
            raise self._error(f"list {prefix or 'the run'}", exc) from None
        root = self._fs_and_root[1] + "/"
        out = {}
        for name, info in found.items():
            key = name[len(root):] if name.startswith(root) else None
            if key and info.get("islink"):  # (a local store's: fsspec lists a link unfollowed)
                raise UbError(f"run store {self.url} holds a symbolic link at {key!r}: ub "
                              "reads and republishes nothing through a link (its target, "
                              "outside the store, would be copied into the run). Remove the "
                              "link, or put the file itself there (docs/security.md)")
            if not key or info.get("type") == "directory":
                continue
            self.check_key(key)
            if not any(part.startswith(".") for part in key.split("/")):
                out[key] = int(info.get("size") or 0)
        return out

    def check_key(self, key: str) -> None:
        """Refuse a key that is no plain relative path: an empty, ``.`` or ``..`` segment or a
        leading ``/`` (object stores allow ``//`` in keys; joined to a local folder such a key
        names a path outside it). Whoever can write to a shared store could otherwise make
        every machine that reads the run write where they chose (docs/security.md)."""
        if any(part in ("", ".", "..") for part in key.split("/")):
            raise UbError(f"run store {self.url} holds an object under the key {key!r}, which is "
                          "no plain relative path (an empty, '.' or '..' segment, or a leading "
                          "'/'): ub reads nothing from this run. Remove that object from the "
                          "store; if you did not put it there, someone else who can write to "
                          "the store did (docs/security.md)")

    def probe(self) -> None:
        """One round trip to the store; :class:`OSError` when nothing answers (``exists``, which
        :meth:`files` asks first, says False then on some filesystems, HTTP's). A missing run
        folder is fine: a new run."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.ls(self._fs_and_root[1], detail=False)

    def committed_rounds(self, listing: dict[str, int] | None = None) -> list[int]:
        """The rounds whose manifest is published (from ``listing``, :meth:`files`, if the
        caller has it already)."""
        keys = self.files("rounds") if listing is None else listing
        found = (_ROUND_MANIFEST.match(k) for k in keys)
        return sorted(int(m.group(1)) for m in found if m)

    # ---- publishing ------------------------------------------------------------------------

    def put(self, local_root: Path, keys: list[str]) -> None:
        """Publish ``keys`` (files under ``local_root``) in commit order."""
        for key in sorted(keys, key=publish_rank):
            self._put_file(Path(local_root) / key, key)

    def _put_file(self, local: Path, key: str) -> None:
        target = self.path(key)
        fault_point("store.put")
        try:
            if self._is_local():
                # A rename within the folder: readers of a local store never see half a file.
                folder, name = target.rsplit("/", 1)
                tmp = f"{folder}/.{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                self.fs.makedirs(folder, exist_ok=True)
                self.fs.put_file(str(local), tmp)
                self.fs.mv(tmp, target)
            else:
                self.fs.put_file(str(local), target)  # one PUT: the object appears whole
        except OSError as exc:
            raise self._error(f"publish {key}", exc) from None

    def publish_missing(self, local_root: Path, listing: dict[str, int] | None = None
                        ) -> list[str]:
        """Publish every durable file of the working copy the store lacks (or holds at
        another size), in commit order; the config is always republished. ``listing``: the
        store's :meth:`files`, if the caller has listed them already. Returns the keys."""
        local_root = Path(local_root)
        published = self.files() if listing is None else listing
        keys = []
        for key, size in local_files(local_root).items():
            if key in ("config.yaml", "ub-run.json") or published.get(key) != size:
                keys.append(key)
        self.put(local_root, keys)
        return sorted(keys, key=publish_rank)

    # ---- reading in place ------------------------------------------------------------------

    def shard_dataset(self, table: str, prefix: str = "") -> Any:
        """An Arrow dataset over ``table``'s committed shards in the store (``prefix``:
        ``"eval"`` for the evaluation shards), read in place through fsspec, as DuckDB's views
        of a local run are (see :mod:`ub.data.sql`)."""
        import pyarrow as pa
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        from ub.data.sql import shards_dataset

        base = f"{prefix}/" if prefix else ""
        shards = [{k[len(f"{base}{t}/"):] for k in self.files(f"{base}{t}")
                   if _SHARD_KEY.match(k[len(f"{base}{t}/"):])} for t in ("steps", "games")]
        files = [self.path(f"{base}{table}/{rel}") for rel in sorted(shards[0] & shards[1])]
        try:
            # (the files' schema versions are not read: a footer per file is slow in a store)
            return shards_dataset(table, files, filesystem=PyFileSystem(FSSpecHandler(self.fs)))
        except (OSError, pa.ArrowInvalid) as exc:
            raise self._error(f"read the {base}{table} shards", exc) from None

    def pull_records(self, local_root: Path) -> None:
        """Fetch the run's records (config, round manifests, ratings, metrics, checkpoint
        manifests, benchmark scores, exploitability), not its shards, samples or weights:
        what the run's tables are built from."""
        for key in self.files():
            top, name = key.split("/")[0], key.rsplit("/", 1)[-1]
            if top in ("config.yaml", "ub-run.json", "rounds", "ratings", "metrics") or (
                    top == "checkpoints" and name in (CHECKPOINT_MANIFEST, "metrics.json")) or (
                    top in ("benchmarks", "exploitability") and name.endswith(".parquet")):
                self._get_file(key, Path(local_root))

    # ---- fetching --------------------------------------------------------------------------

    def _get_file(self, key: str, within: Path, rel: str | None = None) -> None:
        """Fetch ``key`` to ``within / rel`` (default ``within / key``), once that is proven
        to lie inside ``within``."""
        self.check_key(key)
        rel = key if rel is None else rel
        self.check_key(rel)
        local = Path(within) / rel
        inside = Path(within).resolve()
        if not local.resolve().is_relative_to(inside):  # (a link in the working copy, say)
            raise UbError(f"run store {self.url}: the object {key!r} would be written to "
                          f"{local.resolve()}, outside {inside}: nothing was fetched. Check "
                          f"for a symbolic link under {inside}")
        try:
            with self.fs.open(self.path(key), "rb") as source:
                write_atomic(local, lambda handle: shutil.copyfileobj(source, handle, 1 << 20))
        except (OSError, ValueError) as exc:
            raise self._error(f"fetch {key}", exc) from None

    def pull(self, local_root: Path, prefix: str = "",
             listing: dict[str, int] | None = None) -> list[str]:
        """Fetch the store's durable files under ``prefix`` (or in ``listing``, the store's
        :meth:`files` if the caller has listed them already) that the working copy lacks, in
        commit order, except checkpoints (:meth:`fetch_checkpoint` fetches one when it is
        needed). What the working copy has is kept. Returns the keys fetched."""
        local_root = Path(local_root)
        fetched = []
        for key in sorted(self.files(prefix) if listing is None else listing, key=publish_rank):
            if (key.split("/")[0] in DURABLE and not key.startswith("checkpoints/")
                    and not (local_root / key).exists()):
                self._get_file(key, local_root)
                fetched.append(key)
        return fetched

    def fetch_checkpoint(self, folder: Path) -> bool:
        """Fetch checkpoint ``checkpoints/NAME`` into ``folder`` (its local place) if the store
        has it complete; verified against its manifest, moved into place whole. Returns
        whether the checkpoint is now local."""
        from ub.learner.checkpoint import read_manifest, verify_files

        folder = Path(folder)
        if folder.exists():
            return True
        prefix = f"checkpoints/{folder.name}"
        files = self.files(prefix)
        if f"{prefix}/{CHECKPOINT_MANIFEST}" not in files:
            return False  # not published, or its manifest not yet: not a checkpoint
        tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            for key in files:
                self._get_file(key, tmp, key[len(prefix) + 1:])
            verify_files(tmp, read_manifest(tmp))
            os.replace(tmp, folder)
        except UbError as exc:
            raise UbError(f"checkpoint {self.path(prefix)} in the run store is damaged ({exc})"
                          ) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return True


def local_files(local_root: Path) -> dict[str, int]:
    """The durable files of a working copy with their sizes (unfinished writes left out)."""
    out = {}
    for top in DURABLE:
        start = Path(local_root) / top
        candidates = [start] if start.is_file() or start.is_symlink() else sorted(
            start.rglob("*"))
        for path in candidates:
            rel = path.relative_to(local_root)
            if path.is_symlink():
                raise UbError(f"the working copy {local_root} holds a symbolic link at "
                              f"{rel.as_posix()}: ub publishes nothing through a link (its "
                              "target, outside the run, would be copied into the store). "
                              "Remove the link, or put the file itself there")
            if path.is_file() and not any(p.startswith(".") for p in rel.parts) and (
                    "quarantine" not in rel.parts):
                out[rel.as_posix()] = path.stat().st_size
    return out


# ---- a run's paths and its store ----------------------------------------------------------
# Each is a no-op for a run without a store, so the steps of a round call them unconditionally.


def publish(paths: RunPaths, *files: Path) -> None:
    """Publish ``files`` of the working copy (in commit order) to the run's store."""
    if paths.store:
        RunStore(paths.store).put(paths.root, [paths.key(f) for f in files])


def publish_checkpoint(paths: RunPaths, folder: Path) -> None:
    """Publish a checkpoint folder: its files, then its manifest."""
    if not paths.store:
        return
    key = paths.key(folder)
    if f"{key}/{CHECKPOINT_MANIFEST}" not in RunStore(paths.store).files(key):
        publish(paths, *(f for f in sorted(Path(folder).iterdir()) if f.is_file()))


def fetch_checkpoint(paths: RunPaths, folder: Path) -> None:
    """Make checkpoint ``folder`` local, from the store when this machine lacks it."""
    if paths.store and not Path(folder).exists():
        RunStore(paths.store).fetch_checkpoint(Path(folder))


def fetch_missing(paths: RunPaths, folder: Path) -> list[str]:
    """Fetch the store's files under ``folder`` (a folder of the run) this machine lacks."""
    if not paths.store:
        return []
    return RunStore(paths.store).pull(paths.root, paths.key(folder))


def fetch_round(paths: RunPaths, data_root: Path, table: str, round_: int) -> list[str]:
    """Fetch ``table``'s shards of round ``round_`` under ``data_root`` that this machine
    lacks, whichever run format's folder name the store has them under."""
    from ub.data.shards import round_dir_names

    return [key for name in round_dir_names(round_)
            for key in fetch_missing(paths, Path(data_root) / table / name)]


def sync(paths: RunPaths) -> tuple[list[str], list[str]]:
    """Bring a driver's working copy and the run's store together before a run (re)starts:
    fetch what the store has (another machine may have driven the run) and the latest
    committed checkpoint, then publish what only this machine has (a publish the last process
    did not finish). Returns (fetched, published) keys.

    :raises UbError: the working copy and the store disagree about a committed round (two
        machines drove the run apart).
    """
    if not paths.store:
        return [], []
    store = RunStore(paths.store)
    listing = store.files()  # one listing serves the check, the fetch and the publish
    ours, theirs = paths.committed_rounds(), store.committed_rounds(listing)
    common = min(len(ours), len(theirs))
    if common:
        key = paths.key(paths.manifest(common - 1))
        try:
            stored = store.fs.cat_file(store.path(key))
        except OSError as exc:
            raise store._error(f"read {key}", exc) from None
        if stored != paths.manifest(common - 1).read_bytes():
            raise UbError(f"the working copy {paths.root} and the run store {paths.store} hold "
                          f"different round {common - 1}s: two machines drove this run. Move "
                          "the working copy aside to continue from the store")
    fetched = store.pull(paths.root, listing=listing)
    # (what was just fetched came from the listing, so it is not published back)
    published = store.publish_missing(paths.root, listing)
    # The latest checkpoint, which the next round plays and `ub eval` defaults to.
    fetch_checkpoint(paths, paths.checkpoint(len(paths.committed_rounds())))
    return fetched, published


def check_store(paths: RunPaths) -> None:
    """A run in a store: its URL opens and answers (known scheme, package installed, a port
    that is one, endpoint reachable) before anything is written locally."""
    if not paths.store:
        return
    from ub.numbers import NumberError, url_port

    try:
        url_port(paths.store)
    except NumberError as exc:
        raise UbError(f"run store {paths.store}: {exc}") from None
    try:
        store = RunStore(paths.store)
        store.files("rounds")
        store.probe()
    except OSError as exc:  # (some filesystems connect when they are opened)
        raise UbError(f"run store {paths.store} is unreachable ({exc}): check the URL, "
                      "the credentials and the network") from None


def catch_up(paths: RunPaths) -> None:
    """A run in a store (``--root s3://...``): bring this machine's copy up to date first."""
    if paths.store:
        from ub.run.folder.lock import RunLock

        check_store(paths)  # (before the lock creates the working copy)
        with RunLock(paths.lock):
            sync(paths)
