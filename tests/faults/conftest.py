"""Fixtures of the reliability suite: one Prefect test server and one uninterrupted reference
run for the whole folder, with a census of the fault points it reached."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import yaml

from faults.runs import CONFIG


@pytest.fixture(scope="package")
def fault_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "faults.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture(scope="package")
def reference(prefect_api, fault_config, tiny_model, tmp_path_factory) -> tuple[Path, Counter]:
    """The uninterrupted run ``run`` and how often it reached each fault point."""
    from ub.flows.selfplay import selfplay

    root = tmp_path_factory.mktemp("reference")
    census = root / "census.txt"
    os.environ["UB_FAULT_LOG"] = str(census)
    try:
        selfplay(run_name="run", config=str(fault_config), root=str(root), quiet=True)
    finally:
        del os.environ["UB_FAULT_LOG"]
    return root / "run", Counter(census.read_text().split())
