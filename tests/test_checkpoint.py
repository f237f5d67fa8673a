"""Learner checkpoints: layout, no pickle, exact resume, atomic writes, and bad input.

A tiny random Qwen3 model (loaded once for the module) trains on synthetic batches: no vLLM here
(the checkpoint-in-vLLM test is in test_learner.py, next to its engine).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ub.batch import Batch
from ub.errors import UbError
from ub.learner import (
    Learner,
    LearnerConfig,
    NonFiniteError,
    latest_checkpoint,
    learn_on_batch,
    plan_micro_batches,
    read_manifest,
    write_initial_checkpoint,
)
from ub.learner.algorithms import make_algorithm
from ub.learner.checkpoint import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    MANIFEST,
    METRICS,
    OPTIMIZER_STATE,
    RNG_STATE,
    read_checkpoint,
)
from ub.learner.checkpoint_writer import write_checkpoint
from ub.learner.testing import build_random_model, synthetic_batch
from ub.model.lora import LoraSettings, new_adapter
from ub.run.processes.worker import process_worker

LORA = LoraSettings(rank=8, alpha=16, dropout=0.0)
VOCAB = 500  # token ids of synthetic batches stay below the models' vocabulary


def config(model_dir: Path, **overrides) -> LearnerConfig:
    settings = dict(base_model=str(model_dir), lora=LORA, learning_rate=5e-3,
                    length_normalizer=16, micro_batch_tokens=512, seed=3)
    return LearnerConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def learner(model_dir: Path) -> Learner:
    # The process's learner: learn_on_batch is given the process's worker and reuses it (one
    # loaded base model).
    return process_worker().learner(config(model_dir))


@pytest.fixture
def fresh(learner: Learner, model_dir: Path) -> Learner:
    """The module's learner, reset to the default config and a cold start."""
    learner.configure(config(model_dir))
    learner.start(None)
    return learner


def batches(n: int = 2) -> list[Batch]:
    return [synthetic_batch(12, VOCAB, seed=10 + i) for i in range(n)]


def file_bytes(ckpt: Path, name: str = ADAPTER_WEIGHTS) -> bytes:
    return (ckpt / name).read_bytes()


# ------------------------------------------------------------------------------------------
# Layout
# ------------------------------------------------------------------------------------------


def test_layout_manifest_and_no_pickle(fresh: Learner, model_dir: Path, tmp_path: Path) -> None:
    metrics = fresh.update(batches(1)[0])
    ckpt = fresh.save(tmp_path / "update-1", metrics)
    names = {p.name for p in ckpt.iterdir()}
    assert {ADAPTER_WEIGHTS, ADAPTER_CONFIG, OPTIMIZER_STATE, RNG_STATE, METRICS,
            MANIFEST} <= names
    # Only safetensors, JSON (and PEFT's model card): nothing that would need unpickling.
    assert all(n.endswith((".safetensors", ".json", ".md")) for n in names), names

    manifest = read_manifest(ckpt)
    assert manifest["update"] == 1
    assert manifest["base_model"]["path"] == str(model_dir.resolve())
    assert len(manifest["base_model"]["fingerprint"]) == 16
    assert manifest["lora"] == {"rank": 8, "alpha": 16, "dropout": 0.0,
                                "target_modules": list(LORA.target_modules)}
    assert manifest["optimizer"]["lr"] == 5e-3
    assert set(manifest["files"]) == names - {MANIFEST}
    assert json.loads((ckpt / METRICS).read_text())["loss"] == pytest.approx(metrics["loss"])

    optimizer = load_file(str(ckpt / OPTIMIZER_STATE))
    assert {k.split("/", 1)[0] for k in optimizer} == {"step", "exp_avg", "exp_avg_sq"}
    assert all(float(v) == 1.0 for k, v in optimizer.items() if k.startswith("step/"))
    assert load_file(str(ckpt / RNG_STATE))["torch_cpu"].dtype == torch.uint8
    adapter_config = json.loads((ckpt / ADAPTER_CONFIG).read_text())
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (8, 16)


def test_checkpoint_loads_in_peft_with_the_learners_outputs(fresh: Learner, model_dir: Path,
                                                            tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    fresh.configure(config(model_dir, learning_rate=0.05))
    batch = batches(1)[0]
    fresh.update(batch)
    ckpt = fresh.save(tmp_path / "ckpt")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(ckpt)).eval()
    with torch.no_grad():
        logits = model(batch.input_ids).logits[:, :-1].float()
    expected = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    mask = batch.completion_mask[:, 1:].bool()
    got = fresh.token_logprobs(batch)[:, 1:]
    torch.testing.assert_close(got[mask], expected[mask], rtol=0, atol=1e-4)


def test_fresh_start_is_the_base_model_and_seeded(fresh: Learner, model_dir: Path) -> None:
    state = fresh.lora_state()
    assert all(float(v.abs().sum()) == 0 for k, v in state.items() if ".lora_B." in k)
    fresh.update(batches(1)[0])
    fresh.start(None)
    again = fresh.lora_state()
    assert all(torch.equal(state[k], again[k]) for k in state)
    fresh.configure(config(model_dir, seed=4))
    fresh.start(None)
    other = fresh.lora_state()
    assert not all(torch.equal(state[k], other[k]) for k in state)
    assert fresh.update_index == 0 and fresh.source is None


# ------------------------------------------------------------------------------------------
# Resume
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["reinforce", "ppo"])
def test_resume_reproduces_the_next_update_exactly(learner: Learner, model_dir: Path,
                                                   tmp_path: Path, algorithm: str) -> None:
    """Checkpoint k + update k+1 == an uninterrupted run, byte for byte (LoRA dropout on, so
    the RNG state must be restored too)."""
    settings = config(model_dir, algorithm=algorithm,
                      lora=LoraSettings(rank=8, alpha=16, dropout=0.2))
    b1, b2 = batches(2)
    learner.configure(settings)
    learner.start(None)
    learner.update(b1)
    first = learner.save(tmp_path / "update-1")
    learner.update(b2)
    straight = learner.save(tmp_path / "update-2")

    # Resume in a brand-new learner (a new process would do the same), after the process's
    # global RNG moved: the learner's streams are its own.
    torch.manual_seed(12345)
    random.seed(12345)
    resumed = Learner(settings)
    resumed.start(first)
    assert resumed.update_index == 1
    resumed.update(b2)
    again = resumed.save(tmp_path / "update-2-resumed")
    for name in (ADAPTER_WEIGHTS, OPTIMIZER_STATE, RNG_STATE):
        assert file_bytes(again, name) == file_bytes(straight, name), name
    assert read_manifest(again)["python_rng"] == read_manifest(straight)["python_rng"]

    # Without the RNG state (another seed's dropout masks) the bytes differ: the test is real.
    resumed.start(first)
    resumed.streams.torch = {"torch_cpu": torch.Generator().manual_seed(99).get_state()}
    resumed.update(b2)
    other = resumed.save(tmp_path / "update-2-other-rng")
    assert file_bytes(other) != file_bytes(straight)


def test_learner_leaves_the_process_rng_alone(fresh: Learner) -> None:
    before = torch.get_rng_state()
    fresh.update(batches(1)[0])
    assert torch.equal(torch.get_rng_state(), before)


def test_learn_on_batch_reuses_a_finished_output(fresh: Learner, model_dir: Path,
                                                 tmp_path: Path) -> None:
    b1, b2 = batches(2)
    settings = config(model_dir)
    first = learn_on_batch(b1, settings, None, tmp_path / "c1", worker=process_worker())
    assert first["update"] == 1 and first["from_checkpoint"] is None
    second = learn_on_batch(b2, settings, tmp_path / "c1", tmp_path / "c2", worker=process_worker())
    assert second["update"] == 2
    reused = learn_on_batch(b2, settings, tmp_path / "c1", tmp_path / "c2", worker=process_worker())
    assert reused["reused"] is True and reused["loss"] == pytest.approx(second["loss"])
    redone = learn_on_batch(b2, settings, tmp_path / "c1", tmp_path / "c2", overwrite=True,
                            worker=process_worker())
    assert "reused" not in redone and redone["loss"] == pytest.approx(second["loss"])
    with pytest.raises(UbError, match=r"c2 already exists and was trained from .*c1, not None"):
        learn_on_batch(b2, settings, None, tmp_path / "c2", worker=process_worker())
    assert latest_checkpoint(tmp_path) == tmp_path / "c2"
    (tmp_path / "junk").mkdir()
    with pytest.raises(UbError, match="exists and is not a finished ub checkpoint"):
        learn_on_batch(b2, settings, tmp_path / "c1", tmp_path / "junk", worker=process_worker())


def test_crash_while_writing_keeps_the_previous_checkpoint(fresh: Learner, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    fresh.update(batches(1)[0])
    good = fresh.save(tmp_path / "update-1")
    fresh.update(batches(2)[1])

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # a kill half-way through the adapter write

    monkeypatch.setattr(fresh.policy.model, "save_pretrained", crash)
    with pytest.raises(KeyboardInterrupt):
        fresh.save(tmp_path / "update-2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["update-1"]
    assert latest_checkpoint(tmp_path) == good
    # A temporary folder left by a killed process is never taken for a checkpoint.
    shutil.copytree(good, tmp_path / ".update-2.tmp-123-abc")
    assert latest_checkpoint(tmp_path) == good


def _folder_of(tmp_path: Path, kind: str) -> Path:
    """Something a mistyped ``--out`` may name: a folder of one's notes, a run, a file."""
    from ub.run.config.load import load_config
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import open_run

    if kind == "notes":
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "notes.txt").write_text("mine")
        return tmp_path / "notes"
    if kind == "run":
        paths = RunPaths.of(tmp_path / "runs", "demo")
        open_run(paths, load_config("tiny-cpu"))
        return paths.root
    (tmp_path / "a-file").write_text("mine")
    return tmp_path / "a-file"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"/"
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize(("kind", "what"), [("notes", "a folder holding notes.txt"),
                                            ("run", "a ub run"), ("file", "a file")])
@pytest.mark.parametrize("command", ["learn", "sft"])
def test_overwrite_replaces_only_a_checkpoint(fresh: Learner, tmp_path: Path, capsys, kind,
                                              what, command) -> None:
    """`ub learn/sft --out DIR --overwrite` replaced whatever was at DIR, a run too: now only a
    checkpoint (or an empty folder) is replaced, anything else is refused in one line before
    any work, and left as it was."""
    from ub.flows.cli import main

    target = _folder_of(tmp_path, kind)
    before = _tree(tmp_path)
    assert main([command, "--shards", str(tmp_path), "--out", str(target), "--overwrite"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"ub: error: --overwrite replaces only a ub checkpoint folder (or an empty folder), and "
        f"{target} is {what}: pick another --out, or move it aside yourself\n")
    assert _tree(tmp_path) == before
    # The learner's own writer refuses the same (a caller of the library, not the command).
    with pytest.raises(UbError, match=f"is {what}: pick another --out"):
        fresh.save(target, overwrite=True)
    assert _tree(tmp_path) == before


def test_overwrite_refuses_a_project_holding_a_copied_checkpoint_manifest(
        fresh: Learner, tmp_path: Path, capsys) -> None:
    """A project folder with a `ub_checkpoint.json` copied into it (to read it, say) was taken
    for a checkpoint by its manifest's `format` alone and replaced whole, `src/` and notes
    too: a checkpoint is what its manifest lists, at the sizes listed, and nothing else."""
    from ub.flows.cli import main

    manifest = fresh.save(tmp_path / "ckpt") / MANIFEST
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    (project / "NOTES.md").write_text("mine")
    shutil.copy(manifest, project / MANIFEST)
    before = _tree(project)
    assert main(["learn", "--shards", str(tmp_path), "--out", str(project), "--overwrite"]) == 2
    assert ("is a folder holding, beside a ub checkpoint's manifest, what that manifest does "
            "not list: NOTES.md, src: pick another --out") in capsys.readouterr().err
    assert _tree(project) == before
    # Every file a checkpoint lists, one of another size: not what ub wrote either.
    shutil.rmtree(project)
    shutil.copytree(tmp_path / "ckpt", project)
    (project / METRICS).write_text("{}")
    with pytest.raises(UbError, match="differ from the sizes its ub manifest lists: metrics"):
        fresh.save(project, overwrite=True)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_a_checkpoints_files_take_the_umask_as_the_runs_other_files_do(fresh: Learner,
                                                                       tmp_path: Path, umask,
                                                                       mode) -> None:
    """safetensors writes 0600 files: a checkpoint's weights were private while its manifest,
    and the run's shards, were not. Every file ub writes follows the umask (docs/security.md)."""
    previous = os.umask(umask)
    try:
        folder = fresh.save(tmp_path / "ckpt")
    finally:
        os.umask(previous)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in folder.iterdir()} == {
        p.name: oct(mode) for p in folder.iterdir()}
    assert folder.stat().st_mode & 0o777 == mode | 0o111 & ~umask


def test_overwrite_replaces_a_checkpoint_or_fills_an_empty_folder(fresh: Learner,
                                                                 tmp_path: Path) -> None:
    fresh.update(batches(1)[0])
    first = fresh.save(tmp_path / "ckpt")
    old = file_bytes(first)
    fresh.update(batches(2)[1])
    assert fresh.save(tmp_path / "ckpt", overwrite=True) == first
    assert file_bytes(first) != old and read_manifest(first)["update"] == 2
    (tmp_path / "empty").mkdir()
    assert read_manifest(fresh.save(tmp_path / "empty", overwrite=True))["update"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "empty"]


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------


def test_checkpoint_of_another_base_model_is_refused(fresh: Learner, tmp_path: Path) -> None:
    other_dir = build_random_model(tmp_path / "wide", hidden_size=64)
    other = Learner(LearnerConfig(base_model=str(other_dir), lora=LORA))
    foreign = other.save(tmp_path / "foreign")
    with pytest.raises(UbError) as info:
        fresh.start(foreign)
    message = str(info.value)
    assert str(other_dir.resolve()) in message and fresh.policy.base_identity["path"] in message
    assert other.policy.base_identity["fingerprint"] in message
    assert fresh.policy.base_identity["fingerprint"] in message


def test_checkpoint_of_another_rank_is_refused(fresh: Learner, model_dir: Path,
                                               tmp_path: Path) -> None:
    ckpt = fresh.save(tmp_path / "rank8")
    rank16 = Learner(config(model_dir, lora=LoraSettings(rank=16, alpha=16)))
    with pytest.raises(UbError, match=r"has LoRA rank 8, .* configured for rank 16"):
        rank16.start(ckpt)
    with pytest.raises(UbError, match=r"init adapter .* has LoRA rank 8, .* for rank 16"):
        rank16.configure(config(model_dir, lora=LoraSettings(rank=16, alpha=16),
                                init_adapter=str(ckpt)))
        rank16.start(None)


def test_nan_loss_stops_before_anything_changes(fresh: Learner, model_dir: Path,
                                                tmp_path: Path) -> None:
    good = learn_on_batch(batches(1)[0], config(model_dir), None, tmp_path / "c1",
                          worker=process_worker())
    weights = fresh.lora_state()
    bad = batches(2)[1]
    bad.advantages[3] = float("nan")
    with pytest.raises(NonFiniteError, match=r"update 2: the loss is nan .*nothing written"):
        learn_on_batch(bad, config(model_dir), tmp_path / "c1", tmp_path / "c2",
                       worker=process_worker())
    assert not (tmp_path / "c2").exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "c1"
    assert fresh.update_index == 1
    assert all(torch.equal(weights[k], v) for k, v in fresh.lora_state().items())
    assert all(p.grad is None for p in fresh.policy.params.values())
    # The learner is still usable: the same update on good data goes through.
    assert learn_on_batch(batches(2)[1], config(model_dir), tmp_path / "c1",
                          tmp_path / "c2", worker=process_worker())["update"] == good["update"] + 1


def test_missing_or_damaged_files_are_named(fresh: Learner, tmp_path: Path) -> None:
    good = fresh.save(tmp_path / "good")
    for name in (OPTIMIZER_STATE, ADAPTER_WEIGHTS, RNG_STATE, METRICS):
        broken = tmp_path / f"no-{name}"
        shutil.copytree(good, broken)
        os.remove(broken / name)
        with pytest.raises(UbError, match=rf"{broken} is missing {name}"):
            fresh.start(broken)

    no_manifest = tmp_path / "no-manifest"
    shutil.copytree(good, no_manifest)
    os.remove(no_manifest / MANIFEST)
    with pytest.raises(UbError, match=r"is a PEFT adapter, not a ub checkpoint .*init_adapter"):
        fresh.start(no_manifest)

    damaged = tmp_path / "damaged"
    shutil.copytree(good, damaged)
    data = bytearray((damaged / OPTIMIZER_STATE).read_bytes())
    data[-1] ^= 0xFF
    (damaged / OPTIMIZER_STATE).write_bytes(bytes(data))
    with pytest.raises(UbError, match=rf"{OPTIMIZER_STATE} does not match the size/sha256"):
        fresh.start(damaged)

    with pytest.raises(UbError, match="does not exist"):
        fresh.start(tmp_path / "nowhere")


def test_cold_start_from_a_game_tuned_adapter(fresh: Learner, model_dir: Path,
                                              tmp_path: Path) -> None:
    adapter = new_adapter(model_dir, tmp_path / "sft", LORA, seed=7, init_std=0.1)
    fresh.configure(config(model_dir, init_adapter=str(adapter)))
    fresh.start(None)
    stored = load_file(str(adapter / ADAPTER_WEIGHTS))
    state = fresh.lora_state()
    for name, value in state.items():
        assert torch.equal(value, stored[name.replace(".default.", ".")])
    assert fresh.update_index == 0 and fresh.source == str(adapter)

    pickled = tmp_path / "pickled"
    shutil.copytree(adapter, pickled)
    (pickled / ADAPTER_WEIGHTS).rename(pickled / "adapter_model.bin")
    fresh.configure(config(model_dir, init_adapter=str(pickled)))
    with pytest.raises(UbError, match="pickle files are not loaded"):
        fresh.start(None)


def test_empty_batches_are_refused(fresh: Learner) -> None:
    batch = synthetic_batch(4, VOCAB)
    empty = Batch(batch.input_ids[:0], batch.completion_mask[:0],
                       batch.behaviour_logprobs[:0], batch.advantages[:0], batch.lengths[:0])
    with pytest.raises(UbError, match="the training batch is empty"):
        fresh.update(empty)
    batch.completion_mask.zero_()
    with pytest.raises(UbError, match="has no completion tokens"):
        fresh.update(batch)
    assert fresh.update_index == 0


def test_zero_advantage_rows_are_skipped_but_still_a_step(fresh: Learner) -> None:
    batch = synthetic_batch(6, VOCAB)
    batch.advantages[:3] = 0.0
    metrics = fresh.update(batch)
    assert metrics["rows"] == 6 and metrics["rows_trained"] == 3
    batch.advantages.zero_()
    metrics = fresh.update(batch)
    assert metrics["rows_trained"] == 0 and metrics["update"] == 2


def test_config_errors(model_dir: Path) -> None:
    with pytest.raises(UbError, match=r"^learner: unknown algorithm 'a3c'; registered: a2c, ppo, "
                                      r"reinforce"):
        config(model_dir).replace(algorithm="a3c")
    with pytest.raises(UbError, match=r"^learner\.algorithm_params: algorithm 'ppo' has no "
                                      r"parameter.* clip; valid: clip_eps, clip_eps_high"):
        config(model_dir).replace(algorithm="ppo", algorithm_params={"clip": 0.1})
    with pytest.raises(UbError, match=r"^learner\.algorithm_params\.clip_eps: Input should be "
                                      r"less than 1 \(got 2\)$"):
        config(model_dir).replace(algorithm="ppo", algorithm_params={"clip_eps": 2})
    with pytest.raises(UbError, match=r"^learner\.algorithm_params\.clip_eps: Input should be "
                                      r"less than 1 \(got 2\)$"):
        make_algorithm("ppo", {"clip_eps": 2})
    with pytest.raises(UbError, match=r"^learner\.lr: unknown setting$"):
        LearnerConfig.from_dict({"base_model": "m", "lr": 1})
    with pytest.raises(UbError, match=r"^learner\.micro_batch_tokens: must be a positive "
                                      r"integer, auto or null, got 0$"):
        config(model_dir).replace(micro_batch_tokens=0)
    with pytest.raises(UbError, match=r"^learner\.base_model: is not set: give a model "
                                      r"directory"):
        LearnerConfig.from_dict({})
    with pytest.raises(UbError, match=r"^learner.lora.target_modules: List should have at least "
                                      r"1 item"):
        LearnerConfig.from_dict({"base_model": "m", "lora": {"target_modules": []}})
    loaded = LearnerConfig.from_dict({**config(model_dir).to_dict(), "betas": [0.9, 0.95]})
    assert loaded.lora == LORA and loaded.betas == [0.9, 0.95]


def test_micro_batch_plan() -> None:
    lengths = [10, 50, 20, 50, 30, 5]
    assert plan_micro_batches(lengths, None, None) == [[1, 3, 4, 2, 0, 5]]
    assert plan_micro_batches(lengths, 100, None) == [[1, 3], [4, 2, 0], [5]]
    assert plan_micro_batches(lengths, None, 4) == [[1, 3, 4, 2], [0, 5]]
    assert plan_micro_batches(lengths, 40, None) == [[1], [3], [4], [2, 0], [5]]
    assert plan_micro_batches([], 100, 2) == []


def test_initial_checkpoint_is_the_cold_start(fresh: Learner, model_dir: Path,
                                              tmp_path: Path) -> None:
    worker = process_worker()
    first = write_initial_checkpoint(config(model_dir), tmp_path / "update-0", worker=worker)
    assert read_manifest(first)["update"] == 0
    state = fresh.lora_state()
    fresh.update(batches(1)[0])
    fresh.start(first)
    assert fresh.update_index == 0
    assert all(torch.equal(state[k], v) for k, v in fresh.lora_state().items())
    # Kept, not redone.
    assert write_initial_checkpoint(config(model_dir), first, worker=worker) == first


def test_gradient_checkpointing_gives_the_same_gradient(fresh: Learner, model_dir: Path) -> None:
    batch = batches(1)[0]
    fresh.accumulate_gradients(batch)
    plain = fresh.lora_gradients()
    fresh.configure(config(model_dir, gradient_checkpointing=True))
    try:
        assert fresh.policy.causal_lm.is_gradient_checkpointing
        fresh.accumulate_gradients(batch)
        for key, g in fresh.lora_gradients().items():
            torch.testing.assert_close(g, plain[key], rtol=1e-5, atol=1e-7)
    finally:
        fresh.configure(config(model_dir))
    assert not fresh.policy.causal_lm.is_gradient_checkpointing


def test_prepare_does_not_change_the_callers_batch(fresh: Learner, model_dir: Path) -> None:
    from ub.learner import Algorithm, register_algorithm
    from ub.learner.algorithms import ALGORITHMS

    @register_algorithm
    class Doubled(Algorithm):
        name = "doubled_test"

        def prepare(self, batch, rng):
            batch.advantages = batch.advantages * 2 + rng.random()
            return batch

        def loss(self, tokens):
            return -(tokens.advantages * tokens.logprobs).sum() / tokens.normalizer, {}

    try:
        batch = batches(1)[0]
        before = batch.advantages.clone()
        fresh.configure(config(model_dir, algorithm="doubled_test"))
        fresh.update(batch)
        assert torch.equal(batch.advantages, before)
    finally:
        del ALGORITHMS["doubled_test"]
        fresh.configure(config(model_dir))


def test_adapter_config_bytes_do_not_depend_on_set_order(fresh: Learner, tmp_path: Path) -> None:
    """PEFT keeps target_modules as a set and writes it in hash order, which changes from
    process to process: the checkpoint writes one canonical form, so identical adapters (a run
    and its resumed twin) have identical bytes."""
    ckpt = fresh.save(tmp_path / "update-0", {})
    state = read_checkpoint(ckpt)
    adapter_config = json.loads((ckpt / ADAPTER_CONFIG).read_text())

    def writer(modules: list[str]):
        def write(folder: Path) -> None:
            shutil.copy(ckpt / ADAPTER_WEIGHTS, folder / ADAPTER_WEIGHTS)
            (folder / ADAPTER_CONFIG).write_text(
                json.dumps({**adapter_config, "target_modules": modules}))
        return write

    modules = sorted(LORA.target_modules)
    a = write_checkpoint(tmp_path / "a", state, writer(modules))
    b = write_checkpoint(tmp_path / "b", state, writer(modules[::-1]))
    assert file_bytes(a, ADAPTER_CONFIG) == file_bytes(b, ADAPTER_CONFIG)
    assert file_bytes(a, MANIFEST) == file_bytes(b, MANIFEST)
    assert json.loads(file_bytes(ckpt, ADAPTER_CONFIG))["target_modules"] == modules
