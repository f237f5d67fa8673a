"""API keys come from the environment and are never written anywhere in a run: not in its
config, shards, manifests, metrics, logs or W&B files."""

from __future__ import annotations

import shutil

import yaml

from faults.runs import CONFIG, train

SECRET = "sk-test-never-store-7f3a9c"


def test_a_hosted_opponents_key_is_used_but_never_written(reference, prefect_api, bad_server,
                                                          tmp_path):
    ref, _ = reference
    shutil.copytree(ref, tmp_path / "run")
    hosted = f"hosted:m@{bad_server}/ok/v1?key=UB_TEST_HOSTED_KEY"
    config = tmp_path / "with-hosted.yaml"
    config.write_text(yaml.safe_dump({
        **CONFIG, "rounds": 3, "tracking": {"wandb": "offline"},
        "eval": {**CONFIG["eval"], "opponents": ["random", hosted]}}))
    result = train(config, tmp_path, prefect_api,
                   env={"UB_TEST_HOSTED_KEY": SECRET, "WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-2000:]

    manifest = yaml.safe_load((tmp_path / "run" / "rounds" / "round-000002.json").read_text())
    [row] = [r for r in manifest["evals"]["3"] if r["opponent"] == hosted]
    assert row["games"] == CONFIG["eval"]["games"] and row["errors"] == 0
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files)
    leaks = [str(p) for p in files if SECRET.encode() in p.read_bytes()]
    assert not leaks
    assert "UB_TEST_HOSTED_KEY" in (tmp_path / "run" / "config.yaml").read_text()
