"""Portable adapters (issue 16 item 3): a checkpoint names its base model in a way that resolves
on another machine, for plain PEFT as docs/training.md shows and for ub; a run refuses to go on
with another tiny build than it started on.

"Another machine" is another ``UB_CACHE_DIR`` holding its own copy of the tiny build (what `ub
model tiny` makes there: same key, same folder name), with the first machine's folder moved
away. Checkpoints come from the real learner on the real tiny model (loads in a second).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager, redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from ub.errors import UbError
from ub.flows.cli import main
from ub.inference.validation import validate_adapter_dir
from ub.learner import Learner, LearnerConfig
from ub.learner.base_identity import resolve_checkpoint_base
from ub.learner.checkpoint import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    MANIFEST,
    OPTIMIZER_STATE,
    RNG_STATE,
    read_checkpoint,
)
from ub.learner.checkpoint_writer import write_checkpoint
from ub.learner.testing import synthetic_batch
from ub.model.identity import resolve_tiny_build
from ub.model.lora import LoraSettings
from ub.model.tiny import MANIFEST as TINY_MANIFEST
from ub.model.tiny import RECIPE_VERSION, cache_key

VOCAB = 500  # synthetic token ids stay inside the tiny model's vocabulary (~1.3k)


def settings(base: Path) -> LearnerConfig:
    return LearnerConfig(base_model=str(base),
                         lora=LoraSettings(rank=8, alpha=16, dropout=0.0), learning_rate=0.05,
                         length_normalizer=16, micro_batch_tokens=512, seed=3)


def install_build(tiny_model: Path, cache: Path) -> Path:
    """This machine's copy of the tiny build, where `ub model tiny` puts it in ``cache``."""
    folder = cache / "models" / tiny_model.name
    shutil.copytree(tiny_model, folder)
    return folder


def completion_logprobs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        logits = model(batch.input_ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return logp[batch.completion_mask[:, 1:].bool()]


@pytest.fixture(scope="module")
def machine_a(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Checkpoints 1 and 2 of a learner on machine A's copy of the tiny build."""
    root = tmp_path_factory.mktemp("machine-a")
    base = install_build(tiny_model, root / "cache")
    b1, b2 = (synthetic_batch(12, VOCAB, seed=s) for s in (10, 11))
    learner = Learner(settings(base))
    learner.update(b1)
    ckpt1 = learner.save(root / "run" / "ckpt-1", {})
    expected = learner.token_logprobs(b1)[:, 1:][b1.completion_mask[:, 1:].bool()]
    learner.update(b2)
    ckpt2 = learner.save(root / "run" / "ckpt-2", {})
    del learner
    return {"root": root, "base": base, "ckpt1": ckpt1, "ckpt2": ckpt2, "batches": (b1, b2),
            "expected": expected}


def test_checkpoint_records_no_machine_path(machine_a: dict, tiny_model: Path) -> None:
    ckpt, base = machine_a["ckpt1"], machine_a["base"]
    adapter_config = json.loads((ckpt / ADAPTER_CONFIG).read_text())
    assert adapter_config["base_model_name_or_path"] == tiny_model.name  # tiny-KEY12
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert manifest["base_model"]["source"]["key"] == cache_key()
    assert manifest["base_model"]["source"]["recipe_version"] == RECIPE_VERSION
    for name in (ADAPTER_CONFIG, MANIFEST, "README.md"):  # (README: PEFT's model card)
        assert str(base.name) in (ckpt / name).read_text(), name
        assert str(base.parent) not in (ckpt / name).read_text(), name


def test_checkpoint_loads_on_another_machine(machine_a: dict, tiny_model: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Copied elsewhere, with machine A's base folder gone: plain PEFT (both documented ways)
    and ub load it on machine B's own build, and B resuming it writes A's bytes."""
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    b1, b2 = machine_a["batches"]
    ckpt = Path(shutil.copytree(machine_a["ckpt1"], tmp_path / "copied" / "ckpt-1"))
    a_base = machine_a["base"]
    gone = a_base.with_name("moved-away")
    a_base.rename(gone)  # machine A's base model folder is unreachable from here on
    try:
        monkeypatch.setenv("UB_CACHE_DIR", str(tmp_path / "cache-b"))
        b_base = install_build(tiny_model, tmp_path / "cache-b")

        # Plain PEFT, as docs/training.md shows: `ub model tiny --for CKPT` prints the folder
        # of the build the checkpoint records (here, as `ub model tiny`, the current one).
        for argv in (["model", "tiny", "--for", str(ckpt)], ["model", "tiny"]):
            out = io.StringIO()
            with redirect_stdout(out):
                assert main(argv) == 0
            base_dir = out.getvalue().strip()
            assert base_dir == str(b_base), argv
        model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), str(ckpt))
        torch.testing.assert_close(completion_logprobs(model.eval(), b1), machine_a["expected"],
                                   rtol=0, atol=1e-4)
        # AutoPeftModel resolves base_model_name_or_path (tiny-KEY12) from the models folder.
        monkeypatch.chdir(Path(base_dir).parent)
        auto = AutoPeftModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32)
        torch.testing.assert_close(completion_logprobs(auto.eval(), b1), machine_a["expected"],
                                   rtol=0, atol=1e-4)

        # ub finds the build on this machine and resumes; the next checkpoint is A's, byte
        # for byte (adapter_config.json and the manifest included).
        assert resolve_checkpoint_base(ckpt) == str(b_base)
        learner = Learner(settings(Path(resolve_checkpoint_base(ckpt))))
        learner.start(ckpt)
        learner.update(b2)
        again = learner.save(tmp_path / "copied" / "ckpt-2", {})
        for name in (ADAPTER_CONFIG, MANIFEST, ADAPTER_WEIGHTS, OPTIMIZER_STATE, RNG_STATE,
                     "README.md"):
            assert (again / name).read_bytes() == (machine_a["ckpt2"] / name).read_bytes(), name
        validate_adapter_dir(ckpt, 16, None, b_base)  # the engine's check accepts it
    finally:
        gone.rename(a_base)


def test_checkpoint_with_an_absolute_base_path_still_loads(
        machine_a: dict, tiny_model: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint written before this change (machine A's absolute path in
    adapter_config.json and the manifest, no source) loads in ub and PEFT on machine B."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    src = machine_a["ckpt1"]
    state = read_checkpoint(src)
    old_path = "/home/someone/.cache/ub/models/" + tiny_model.name  # not on this machine
    state.base_model = {"path": old_path, "fingerprint": state.base_model["fingerprint"]}
    adapter_config = json.loads((src / ADAPTER_CONFIG).read_text())

    def old_writer(folder: Path) -> None:
        shutil.copy(src / ADAPTER_WEIGHTS, folder / ADAPTER_WEIGHTS)
        (folder / ADAPTER_CONFIG).write_text(
            json.dumps({**adapter_config, "base_model_name_or_path": old_path}))

    old = write_checkpoint(tmp_path / "old-ckpt", state, old_writer)
    assert json.loads((old / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == old_path
    assert "source" not in json.loads((old / MANIFEST).read_text())["base_model"]

    monkeypatch.setenv("UB_CACHE_DIR", str(tmp_path / "cache-b"))
    b_base = install_build(tiny_model, tmp_path / "cache-b")
    assert resolve_checkpoint_base(old) == str(b_base)  # the key from the folder name
    learner = Learner(settings(b_base))
    learner.start(old)
    assert learner.update_index == 1
    validate_adapter_dir(old, 16, None, b_base)
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(b_base, dtype=torch.float32), str(old))
    torch.testing.assert_close(completion_logprobs(model.eval(), machine_a["batches"][0]),
                               machine_a["expected"], rtol=0, atol=1e-4)


@contextmanager
def unreachable_hub():
    """A stand-in hub on a local port that answers every request 404 (nothing there, at
    once: no retries) and records what was asked; yields the list of paths asked for."""
    asked: list[str] = []

    class NotHere(BaseHTTPRequestHandler):
        def _none(self) -> None:
            asked.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_POST = _none

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotHere)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield asked, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_as_a_user(code: str, cwd: Path, hub: str) -> subprocess.CompletedProcess:
    """``code`` in a plain Python process as a user's shell runs it: not offline (no
    HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, which conftest sets), the hub at ``hub``, this
    ub's ``ub`` on the PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=hub, PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_documented_plain_peft_load_asks_no_hub(machine_a: dict, tmp_path: Path) -> None:
    """docs/serving.md's plain-PEFT block, run as written in a user's folder with the hub
    out of reach and offline mode unset, loads the checkpoint without asking the hub anything
    (AutoPeftModelForCausalLM on the same folder asks it for `tiny-KEY12` and, with no
    network, retried for ~50 s before it failed)."""
    doc = (Path(__file__).parents[1] / "docs" / "serving.md").read_text()
    section = doc.split("## A checkpoint in a plain script", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "docs/serving.md has no plain-PEFT block"
    ckpt = Path(shutil.copytree(machine_a["ckpt1"], tmp_path / "runs" / "demo" / "checkpoints"
                                / "ckpt-000016"))
    code = block.group(1)
    assert '"runs/demo/checkpoints/ckpt-000016"' in code
    # (what the child loaded: the checkpoint's LoRA weights, summed)
    report = ("print(type(model).__name__, len(tokenizer), sum(float(p.abs().sum()) for n, p "
              "in model.named_parameters() if 'lora_' in n))\n")
    from safetensors.torch import load_file

    saved = sum(float(t.abs().sum()) for t in load_file(ckpt / ADAPTER_WEIGHTS).values())
    with unreachable_hub() as (asked, hub):
        loaded = run_as_a_user(code + report, tmp_path, hub)
        assert loaded.returncode == 0, loaded.stderr[-3000:]
        kind, vocab, weights = loaded.stdout.split()[-3:]
        assert kind.startswith("PeftModel") and int(vocab) > 0
        assert float(weights) == pytest.approx(saved, rel=1e-5) and saved > 0
        assert asked == [], asked
        assert "Retrying" not in loaded.stderr
        # The control: the hub stand-in is the one PEFT would ask. AutoPeft reads the portable
        # name and asks the hub for it.
        auto = run_as_a_user("from peft import AutoPeftModelForCausalLM as A\n"
                             f"A.from_pretrained({str(ckpt)!r})\n", tmp_path, hub)
        assert auto.returncode != 0
        assert any(machine_a["base"].name in path for path in asked), asked


def other_build(tiny_model: Path, where: Path) -> Path:
    """The tiny build as another recipe version would make it: same config.json (so the same
    config fingerprint and shapes), another key."""
    folder = Path(shutil.copytree(tiny_model, where / "tiny-other"))
    manifest = json.loads((folder / TINY_MANIFEST).read_text())
    manifest.update(key="f" * 64, recipe_version=RECIPE_VERSION + 1)
    (folder / TINY_MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_checkpoint_of_another_tiny_build_is_refused(machine_a: dict, tiny_model: Path,
                                                     tmp_path: Path) -> None:
    other = other_build(tiny_model, tmp_path)
    learner = Learner(settings(other))
    with pytest.raises(UbError, match=rf"trained on tiny build {tiny_model.name[5:]} \(recipe "
                       rf"version {RECIPE_VERSION}.*tiny build ffffffffffff .*recipe version "
                       rf"{RECIPE_VERSION} -> {RECIPE_VERSION + 1}"):
        learner.start(machine_a["ckpt1"])
    with pytest.raises(UbError, match="serve it on its own build"):
        validate_adapter_dir(machine_a["ckpt1"], 16, None, other)


def test_a_build_this_ub_cannot_make_is_named(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UB_CACHE_DIR", str(tmp_path))
    identity = {"kind": "tiny", "key": "e" * 64, "seed": 0, "recipe_version": RECIPE_VERSION - 1,
                "textarena": "0.0.1", "config": {}}
    with pytest.raises(UbError, match=rf"tiny build eeeeeeeeeeee .* is not in this machine's "
                       rf"cache .*recipe version {RECIPE_VERSION - 1} -> {RECIPE_VERSION}\)"):
        resolve_tiny_build(identity)


def test_a_run_refuses_another_tiny_build(tmp_path: Path, machine_a: dict,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The run records its tiny build at start; after a recipe change `ub train --resume` and
    `ub eval` refuse with one line naming both builds, before anything is built or loaded."""
    from ub.run.config.load import load_config
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import open_run, resolve_run_config

    root = tmp_path / "runs"
    paths = RunPaths.of(root, "old")
    open_run(paths, load_config("tiny-cpu", []))
    marker = paths.root / "ub-run.json"
    record = json.loads(marker.read_text())
    assert record["base_model"]["key"] == cache_key()
    resolve_run_config(paths, None)  # the same build: fine

    record["base_model"].update(key="0" * 64, recipe_version=RECIPE_VERSION - 1)
    marker.write_text(json.dumps(record))
    for argv in (["train", "--resume", "old", "--root", str(root)],
                 ["eval", "old", "--root", str(root)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("ub: error: run old was trained on tiny "
                                                       "build 000000000000 (recipe version"), err
        assert f"is now tiny build {cache_key()[:12]}" in err
        assert f"recipe version {RECIPE_VERSION - 1} -> {RECIPE_VERSION}" in err

    # A run from before the record: its latest checkpoint names the build (old absolute path).
    del record["base_model"]
    marker.write_text(json.dumps(record))
    state = read_checkpoint(machine_a["ckpt1"])
    state.base_model = {"path": "/elsewhere/models/tiny-000000000000",
                        "fingerprint": state.base_model["fingerprint"]}
    src = machine_a["ckpt1"]

    def writer(folder: Path) -> None:
        for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
            shutil.copy(src / name, folder / name)

    write_checkpoint(paths.root / "checkpoints" / "ckpt-000000", state, writer)
    with pytest.raises(UbError, match="trained on tiny build 000000000000"):
        resolve_run_config(paths, None)


def test_ub_play_finds_the_base_of_a_copied_checkpoint(machine_a: dict, tiny_model: Path,
                                                       tmp_path: Path, engine, capsys) -> None:
    """`ub play` with a checkpoint from another machine and no --model plays it on the build it
    records (this machine's cached copy), with machine A's folder gone."""
    import duckdb

    ckpt = Path(shutil.copytree(machine_a["ckpt1"], tmp_path / "copied" / "ckpt-1"))
    a_base = machine_a["base"]
    gone = a_base.with_name("moved-away")
    a_base.rename(gone)
    try:
        out = tmp_path / "data"
        code = main(["play", "--env", "TicTacToe-v0-train", "--games", "2", "--players",
                     f"model:{ckpt},random", "--out", str(out)])
        assert code == 0, capsys.readouterr().err
    finally:
        gone.rename(a_base)
    from ub.run.processes.worker import process_worker

    # The engine ran this machine's build (the tiny_model fixture's cache), not A's folder.
    running = process_worker()._engine
    assert running is not None and running.config.model == str(tiny_model)
    played = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/steps/**/*.parquet') "
                        "WHERE actor_kind = 'model'").fetchall()[0][0]
    assert played > 0


def test_ub_play_refuses_a_checkpoint_of_a_build_it_cannot_make(
        machine_a: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: played on whatever `tiny` builds now. Now: one line, before any engine starts."""
    src = machine_a["ckpt1"]
    state = read_checkpoint(src)
    source = {**state.base_model["source"], "key": "f" * 64, "recipe_version": RECIPE_VERSION + 1}
    state.base_model = {**state.base_model, "path": "tiny-ffffffffffff", "source": source}

    def writer(folder: Path) -> None:
        for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
            shutil.copy(src / name, folder / name)

    ckpt = write_checkpoint(tmp_path / "ckpt", state, writer)
    out = tmp_path / "data"
    assert main(["play", "--env", "TicTacToe-v0-train", "--games", "2", "--players",
                 f"model:{ckpt},random", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ub: error: tiny build ffffffffffff (recipe version "
                          f"{RECIPE_VERSION + 1}") and "\n" not in err, err
    assert f"recipe version {RECIPE_VERSION + 1} -> {RECIPE_VERSION}" in err
    assert not out.exists()
    # The documented plain-PEFT helper refuses it the same way (never the current build).
    assert main(["model", "tiny", "--for", str(ckpt)]) == 2
    assert "tiny build ffffffffffff" in capsys.readouterr().err
