"""Hub models: fetched once per machine, before any engine or learner loads them, then read
from the local snapshot.

``model.base: Qwen/Qwen3-1.7B-Base`` names a model on the Hugging Face hub. vLLM and the
learner each read several of its files (config, weights, tokenizer, chat template, generation
config); left to themselves they would each download what they read, only in processes allowed
online, and possibly from two revisions if the hub moved in between. So every process that loads
the base model (the ``ub train`` process, each Ray worker) first calls :func:`local_model`,
which downloads every file vLLM and the learner read into the Hugging Face cache
(``snapshot_download``; a machine that has them fetches nothing but the revision) and returns
the snapshot folder: from then on the model is a local folder, and engines run offline
(:func:`ub.vllm_environment.engine_env_defaults`).

What the run and its checkpoints record stays the hub id
(:func:`ub.model.identity.base_identity` knows a snapshot folder's id), so checkpoints stay
portable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from ub.errors import UbError

log = logging.getLogger("ub.model")

HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken",
             "tokenizer*")
"""What vLLM and the learner read of a hub model: config, generation config, safetensors
weights and their index, tokenizer and chat template files. Not the .bin/.pt/.h5/.msgpack/.gguf
copies of the weights many repositories also hold (several GB each, read by neither)."""

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""``ORG/NAME``: the form of a model id on the Hugging Face hub."""

_FETCHED: dict[str, str] = {}  # hub id -> snapshot folder, once per process


def is_hub_id(base: str) -> bool:
    """``ORG/NAME`` that is not a folder on this machine: a model on the Hugging Face hub."""
    return (bool(HUB_ID.match(base)) and not base.startswith(("/", ".", "~"))
            and not Path(base).expanduser().is_dir())


def local_model(base: str) -> str:
    """``base`` as a folder vLLM and the learner load: a folder (or anything not a hub id) as
    it is; a hub id fetched (:func:`fetch_hub_model`, once per process) and its snapshot
    folder."""
    if not is_hub_id(base):
        return base
    if base not in _FETCHED:
        _FETCHED[base] = fetch_hub_model(base)
    return _FETCHED[base]


def fetch_hub_model(repo_id: str) -> str:
    """Download the files of hub model ``repo_id`` that vLLM and the learner read
    (:data:`HUB_FILES`) into the Hugging Face cache, unless they are there; returns the
    snapshot folder. With ``HF_HUB_OFFLINE`` set by the user, only the cache is looked at."""
    from huggingface_hub import snapshot_download

    started = time.perf_counter()
    offline = False
    try:
        with _online_unless_the_user_said_offline() as offline:
            folder = snapshot_download(repo_id, allow_patterns=list(HUB_FILES))
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        hint = ("HF_HUB_OFFLINE is set and the model is not in the Hugging Face cache: "
                f"download it first (hf download {repo_id}) or unset HF_HUB_OFFLINE"
                if offline else
                "check the id, the network and HF_TOKEN (for a gated model), or set model.base "
                "to a local model folder")
        raise UbError(f"cannot fetch model.base {repo_id} from the Hugging Face hub "
                      f"({type(exc).__name__}: {first[:200]}): {hint}") from None
    path = Path(folder)
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise UbError(f"model.base {repo_id} on the Hugging Face hub has no config.json or no "
                      "safetensors weights, which vLLM and the learner load: convert it "
                      "(save_pretrained) into a local folder and set model.base to that folder")
    log.info("model %s: snapshot %s (%.1f s)", repo_id, path, time.perf_counter() - started)
    return str(path)


@contextlib.contextmanager
def _online_unless_the_user_said_offline() -> Iterator[bool]:
    """huggingface_hub reads ``HF_HUB_OFFLINE`` once, at import: a process whose earlier engine
    set ub's offline default (for a local model folder) before that import would refuse the
    download the user asked for by naming a hub model. ub's own default is lifted for the
    fetch; a value the user exported is kept. Yields whether the fetch is offline."""
    from huggingface_hub import constants

    from ub.vllm_environment import SET_BY_UB

    def said(name: str) -> bool:  # (huggingface_hub's reading of a switch)
        value = os.environ.get(name)
        return value is not None and SET_BY_UB.get(name) != value and value.upper() in (
            "1", "ON", "YES", "TRUE")

    users = said("HF_HUB_OFFLINE") or said("TRANSFORMERS_OFFLINE")
    saved = constants.HF_HUB_OFFLINE
    if not users:
        constants.HF_HUB_OFFLINE = False
    try:
        yield bool(constants.HF_HUB_OFFLINE)
    finally:
        constants.HF_HUB_OFFLINE = saved


def hub_id_of_snapshot(path: Path) -> str | None:
    """The hub id of a Hugging Face cache snapshot folder
    (``.../models--ORG--NAME/snapshots/REVISION``), or ``None``."""
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        org_name = parts[-3].removeprefix("models--").split("--")
        if len(org_name) >= 2:
            return f"{org_name[0]}/{'--'.join(org_name[1:])}"
    return None
