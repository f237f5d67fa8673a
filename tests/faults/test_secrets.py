"""API keys come from the environment, are sent, and are never written anywhere: not in a
run's config, shards, manifests, metrics, logs or W&B files, not in what `ub train` prints, not
in Prefect's records."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from stub_openai import STUB_KEY

from faults.runs import CONFIG, train

SECRET = STUB_KEY  # (the stub's /keyed/v1 answers 401 to a request without it)


def _prefect_database() -> list[Path]:
    """The files of the Prefect test server's database (its flow runs, task runs, logs and
    artifacts)."""
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    url = PREFECT_API_DATABASE_CONNECTION_URL.value()
    assert url and url.startswith("sqlite"), url
    database = Path(url.split(":///", 1)[1])
    return [p for p in database.parent.glob(f"{database.name}*") if p.is_file()]


def test_a_hosted_opponents_key_is_used_but_never_written(reference, prefect_api, bad_server,
                                                          tmp_path):
    ref, _ = reference
    shutil.copytree(ref, tmp_path / "run")
    hosted = f"hosted:m@{bad_server}/keyed/v1?key=UB_TEST_HOSTED_KEY"
    config = tmp_path / "with-hosted.yaml"
    config.write_text(yaml.safe_dump({
        **CONFIG, "rounds": 3, "tracking": {"wandb": "offline"},
        "eval": {**CONFIG["eval"], "opponents": ["random", hosted]}}))
    result = train(config, tmp_path, prefect_api,
                   env={"UB_TEST_HOSTED_KEY": SECRET, "WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert SECRET not in result.stdout + result.stderr

    manifest = yaml.safe_load((tmp_path / "run" / "rounds" / "round-000002.json").read_text())
    [row] = [r for r in manifest["evals"]["3"] if r["opponent"] == hosted]
    assert row["games"] == CONFIG["eval"]["games"] and row["errors"] == 0
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files)
    leaks = [str(p) for p in files + _prefect_database() if SECRET.encode() in p.read_bytes()]
    assert not leaks
    assert "UB_TEST_HOSTED_KEY" in (tmp_path / "run" / "config.yaml").read_text()
