"""What Prefect clients send to the deployments of prefect.yaml, checked as the Prefect server and
the flow engine check it, without a server: the deployment's default parameters merged with a
run's one name deep (the server's ``dict.update``), Prefect's own schema validation
(``prefect.utilities.schema_tools.validate`` on the schema ``prefect deploy`` generates), then
the flow's parameter validation at the run's start.

- every ``prefect deployment run`` line of docs/deployed-mode.md is accepted (before: the
  families example dropped ``events`` and the server refused it);
- values as clients get them wrong are refused naming the parameter: numbers and lists as text
  at creation, a date that does not parse at the run's start;
- a field of ``params`` given at the top level (``--param events=s3://...``) is read as that
  field, over the deployment's defaults (before: SignatureMismatchError at the run's start);
  another top-level name fails the run's start naming ``--param params='{...}'``;
- every deployment's parameter schema is valid JSON Schema (what the UI's run form renders).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from prefect.exceptions import ParameterTypeError
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import ValidationError, validate

from flows.dag import load_flow

ROOT = Path(__file__).resolve().parents[3]
DEPLOY_EVENTS = "/srv/hybridflow/events"  # what $HYBRIDFLOW_DEPLOY_EVENTS held at deploy time


@pytest.fixture(scope="module")
def deployments() -> dict[str, dict]:
    """``flow/deployment`` -> its entrypoint and default parameters (templates filled in)."""
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    flows = {d["entrypoint"]: load_flow(d["entrypoint"]) for d in spec["deployments"]}
    out = {}
    for d in spec["deployments"]:
        flow = flows[d["entrypoint"]]
        text = json.dumps(d.get("parameters", {}))
        defaults = json.loads(text.replace("{{ $HYBRIDFLOW_DEPLOY_EVENTS }}", DEPLOY_EVENTS))
        out[f"{flow.name}/{d['name']}"] = {"flow": flow, "defaults": defaults}
    return out


def _run_parameters(deployment: dict, given: dict) -> dict:
    """What the flow run gets: the server's merge, its schema check, the engine's check."""
    flow = deployment["flow"]
    merged = {**deployment["defaults"], **given}
    validate(merged, parameter_schema(flow).model_dump_for_openapi(), raise_on_error=True)
    return flow.validate_parameters(merged)


def _cli_parameters(args: list[str]) -> dict:
    """``--params JSON`` and ``--param key=value`` as ``prefect deployment run`` reads them
    (a value is JSON when it parses, else text)."""
    given: dict = {}
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "--params":
            given |= json.loads(value)
        elif flag in ("--param", "-p"):
            key, _, text = value.partition("=")
            try:
                given[key] = json.loads(text)
            except ValueError:
                given[key] = text
    return given


def _documented_runs() -> list[tuple[str, dict]]:
    text = (ROOT / "docs" / "deployed-mode.md").read_text()
    runs = []
    for line in re.findall(r"^prefect deployment run .*$", text, flags=re.MULTILINE):
        args = shlex.split(line, comments=True)[3:]
        runs.append((args[0], _cli_parameters(args[1:])))
    return runs


def test_the_documented_runs_are_accepted(deployments):
    runs = _documented_runs()
    assert len(runs) >= 4 and any(given for _, given in runs)
    for name, given in runs:
        params = _run_parameters(deployments[name], given)["params"]
        events = given.get("events", given.get("params", {}).get("events", DEPLOY_EVENTS))
        assert params.events == events


def test_parameters_as_ui_and_python_clients_send_them(deployments):
    pipeline = deployments["pipeline/pipeline"]
    params = _run_parameters(
        pipeline,
        {
            "params": {
                "events": "/data/events",
                "as_of": "2025-12-31",
                "horizon_days": 30,
                "families": ["logistic", "gbm"],
                "fresh": True,
                "input": {"purchase_event": "checkout"},
            }
        },
    )["params"]
    assert str(params.as_of) == "2025-12-31" and params.families == ["logistic", "gbm"]
    assert params.input.purchase_event == "checkout"
    refresh = deployments["model-refresh/model-refresh"]
    given = {"params": {"events": "/data/events", "promote": "always", "as_of": "2025-12-31"}}
    assert _run_parameters(refresh, given)["params"].promote == "always"


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"horizon_days": "30"}, "params.horizon_days"),
        ({"fresh": "true"}, "params.fresh"),
        ({"families": '["gbm"]'}, "params.families"),
        ({"epochz": 3}, "'epochz' was unexpected"),
        ({"input": {"purchase_event": "it's"}}, "params.input.purchase_event"),
    ],
)
def test_values_of_the_wrong_type_are_refused_at_creation_naming_them(deployments, given, named):
    with pytest.raises(ValidationError) as refused:
        _run_parameters(deployments["pipeline/pipeline"], {"params": {"events": "/x", **given}})
    assert named in str(refused.value)


def test_what_the_schema_cannot_check_fails_the_run_at_its_start_naming_it(deployments):
    pipeline = deployments["pipeline/pipeline"]
    with pytest.raises(ParameterTypeError, match="params.as_of: Input should be a valid date"):
        _run_parameters(pipeline, {"params": {"events": "/x", "as_of": "yesterday"}})
    with pytest.raises(ValidationError, match="'events' is a required property"):
        _run_parameters(pipeline, {"params": {"families": ["gbm"]}})


def test_every_deployments_parameter_schema_is_valid_json_schema(deployments):
    for name, deployment in deployments.items():
        schema = parameter_schema(deployment["flow"]).model_dump_for_openapi()
        Draft202012Validator.check_schema(schema)
        assert schema["required"] == ["params"], name
        if deployment["defaults"]:  # the pipeline and refresh: their events as deployed
            assert deployment["defaults"]["params"]["events"] == DEPLOY_EVENTS, name


def test_fields_given_at_the_top_level_are_read_as_fields_of_params(deployments):
    """``prefect deployment run pipeline/pipeline --param events=s3://...``: Prefect's server
    takes it (the schema has no ``additionalProperties: false``) and the run used to fail at
    its start with ``SignatureMismatchError: ... ['params', 'events']``."""
    pipeline = deployments["pipeline/pipeline"]
    args = ["--param", "events=s3://bucket/events", "--param", "horizon_days=30"]
    params = _run_parameters(pipeline, _cli_parameters(args))["params"]
    assert (params.events, params.horizon_days) == ("s3://bucket/events", 30)
    given = {"params": {"events": "/a", "horizon_days": 10}, "families": ["gbm"]}
    params = _run_parameters(pipeline, given)["params"]
    assert (params.events, params.horizon_days, params.families) == ("/a", 10, ["gbm"])
    with pytest.raises(ParameterTypeError) as refused:
        _run_parameters(pipeline, {"epochz": 3})
    message = str(refused.value)
    assert "'epochz' is not one of its fields" in message
    assert '--param params=\'{"events": "s3://bucket/events"' in message
    with pytest.raises(ParameterTypeError, match="params.horizon_days"):
        _run_parameters(pipeline, {"horizon_days": "soon"})
