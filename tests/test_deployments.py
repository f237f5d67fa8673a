"""prefect.yaml: every deployment names an existing flow, with parameters it accepts and a valid
schedule on the process work pool."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENTS = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_deployment_names_a_flow_and_valid_parameters(deployment):
    from prefect import Flow
    from prefect.client.schemas.schedules import CronSchedule

    path, _, name = deployment["entrypoint"].partition(":")
    spec = importlib.util.spec_from_file_location(f"_deploy_{name}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    flow = getattr(module, name)
    assert isinstance(flow, Flow)
    # The parameters bind to the flow's signature (no unknown or missing ones).
    inspect.signature(flow.fn).bind(**deployment["parameters"])
    for schedule in deployment["schedules"]:
        CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])
    assert deployment["work_pool"]["name"] == "ub-process"


def test_the_nightly_training_deployment_continues_a_named_run():
    train = next(d for d in DEPLOYMENTS if d["entrypoint"].endswith(":selfplay"))
    params = train["parameters"]
    assert params["run_name"] and params["add_rounds"] >= 1
    from ub.run.config.load import load_config

    load_config(params["config"])  # the preset exists and validates


def test_the_nightly_training_deployment_keeps_the_runs_own_config():
    """The schedule passes `config` every night: without keep_run_config a run that was started
    with any override (or another config) is refused on the second night."""
    train = next(d for d in DEPLOYMENTS if d["entrypoint"].endswith(":selfplay"))
    assert train["parameters"]["keep_run_config"] is True


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_every_flow_parameter_has_a_description(deployment):
    """What `prefect deploy` sends as the parameter schema: the UI shows each description."""
    from prefect.utilities.callables import parameter_schema_from_entrypoint

    schema = parameter_schema_from_entrypoint(deployment["entrypoint"])
    missing = [name for name, prop in schema.properties.items() if not prop.get("description")]
    assert schema.properties and not missing
