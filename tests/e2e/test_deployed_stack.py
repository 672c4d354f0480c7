"""The deployed mode end to end on the production-shaped stack: `hybridflow up --s3` (Prefect on
PostgreSQL, a two-worker Spark cluster with a Spark Connect server, an S3 server, both workers),
a pipeline run dispatched over both pools — its contenders as separate flow runs side by side,
the tabular family on cpu-pool and the network on gpu-pool — a GPU worker killed mid-training,
the resumed re-run whose CPU stages ran on the cluster's executors, the UI in a real browser,
`hybridflow down`.

One test on purpose: the stack costs a minute or two to start, and every check below needs it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.e2e.stack_driver import (
    FINAL,
    assert_cluster_maps_class_archive,
    chromium,
    cli,
    keep_logs,
    stack_state,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

# long enough to be killed after its first checkpoint: 40 small-batch epochs, no early stop (the
# patience is the epochs), the first checkpoint at step 200, in the first two epochs; the kill
# follows it within a poll (0.5 s), while the fit has over 38 epochs ahead and the contender's
# run a second fit of 40 after it (its backtest). 200 epochs, as before, was five times the
# training in each of the network's four fits: run 1's, run 2's resumed fit and their backtests.
TRAINING = {
    "HYBRIDFLOW_TRAIN__BATCH_SIZE": "8",
    "HYBRIDFLOW_TRAIN__MAX_EPOCHS": "40",
    "HYBRIDFLOW_TRAIN__PATIENCE": "40",
    "HYBRIDFLOW_CHECKPOINT__EVERY_STEPS": "200",
    # a tabular contender (cpu-pool) beside the network (gpu-pool), whose checkpoints get killed
    "HYBRIDFLOW_TRAIN__FAMILIES": "logistic,mlp",
}


@pytest.fixture
def stack_env(stack_base_env) -> dict[str, str]:
    # crash detection at the default 90 s (three 30 s heartbeats): at 50 s one heartbeat late by
    # 20 s on a loaded 2-core box marked run 2's pipeline Crashed while it was still working
    return stack_base_env | {"HYBRIDFLOW_STACK_CRASH_AFTER_SECONDS": "90", **TRAINING}


def _children(client, parent_id) -> dict[str, object]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    runs = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])
        )
    )
    names = {d.id: d.name for d in client.read_deployments()}
    return {names.get(r.deployment_id, "in-process"): r for r in runs if r.deployment_id}


def _final(client, run_id, timeout: float):
    def probe():
        run = client.read_flow_run(run_id)
        return run if run.state_type.value in FINAL else None

    return wait_for(f"flow run {run_id} to finish", probe, timeout, every=2.0)


def _artifacts(client, flow_run_ids) -> dict[str, object]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    found = client.read_artifacts(
        artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=list(flow_run_ids)))
    )
    return {a.key: a for a in found if a.key}


@pytest.mark.slow(
    reason="the production-shaped stack (PostgreSQL, a two-worker Spark cluster with Connect, moto S3, both workers) and two pipeline runs dispatched over it, one killed mid-training"
)
def test_deployed_pipeline_over_pools_survives_a_killed_gpu_worker(stack_env, tmp_path, output_dir):
    from infra.stack.processes import ProcessRecord, is_alive, kill_tree

    stack_dir = Path(stack_env["HYBRIDFLOW_STACK_DIR"])
    up = ["up", "--s3", "--port", stack_env["PORT"], "--demo-customers", "2000"]
    recorded: list[ProcessRecord] = []
    try:
        out = cli(up, stack_env)
        assert "started Prefect server" in out and "started S3 server" in out, out
        assert "started PostgreSQL" in out and "started Spark cluster" in out, out
        state = stack_state(stack_dir)
        recorded = [ProcessRecord.model_validate(p) for p in state["processes"].values()]
        assert state["store"].startswith("s3://")
        assert state["database"]["kind"] == "postgres"
        assert {"spark-master", "spark-worker-1", "spark-worker-2", "spark-connect"} <= set(
            state["processes"]
        )
        assert "AWS_SECRET_ACCESS_KEY" not in out and "hybridflow-local" not in out
        run_id, run_name = _drive_pipeline(stack_env, stack_dir, up, output_dir)
        _ran_on_the_clusters_executors(state["spark"])
        cluster = [
            p["pid"]
            for k, p in stack_state(stack_dir)["processes"].items()
            if k.startswith("spark-")
        ]
        assert_cluster_maps_class_archive(cluster, stack_dir)
        _check_ui(stack_env, run_id, run_name, tmp_path, output_dir)
        status = cli(["status"], stack_env)
        assert "NOT RUNNING" not in status and "worker-gpu-pool" in status, status
        assert "2 of 2 workers alive" in status and state["spark"]["master_ui"] in status
        assert "database PostgreSQL" in status, status
        _password_stays_secret(stack_dir, [out, status])
    finally:
        if (stack_dir / "stack.json").exists():
            recorded += [
                ProcessRecord.model_validate(p)
                for p in stack_state(stack_dir)["processes"].values()
            ]
        down = cli(["down"], stack_env, timeout=120)
        leftovers = [r for r in recorded if is_alive(r)]
        for record in leftovers:
            kill_tree(record)
        keep_logs(stack_dir, output_dir)
    assert "server" in down and "postgres" in down and "spark-connect" in down, down
    assert not leftovers, f"still running after down: {leftovers}"


def _ran_on_the_clusters_executors(spark: dict) -> None:
    """The CPU stages' Spark work ran in executors the two workers launched (the Connect
    application's executor list), not in a JVM inside a flow run. At this size that is the
    scoring: validate, features and preprocess run in the flow run's process (the cluster
    run in ``test_cluster_run.py`` sends them to executors)."""
    from infra.stack.spark_cluster import application_executors, master_status

    executors = application_executors(spark["app_ui"])
    assert len(executors) == 2, executors
    assert sum(e["completedTasks"] for e in executors) > 0, executors
    apps = master_status(spark["master_ui"])["activeapps"]
    assert [a["name"] for a in apps] == ["hybridflow-connect"], apps


def _password_stays_secret(stack_dir: Path, outputs: list[str]) -> None:
    """The generated PostgreSQL password: in its 0600 file and the server's environment only."""
    secret = (stack_dir / "postgres" / "password").read_text().strip()
    assert oct((stack_dir / "postgres" / "password").stat().st_mode & 0o777) == "0o600"
    texts = [*outputs, (stack_dir / "stack.json").read_text()]
    texts += [f.read_text(errors="replace") for f in (stack_dir / "logs").glob("*.log")]
    commands = [p["command"] for p in stack_state(stack_dir)["processes"].values()]
    assert not any(secret in t for t in texts), "the password leaked into output, state or logs"
    assert not any(secret in part for command in commands for part in command)


def _drive_pipeline(stack_env, stack_dir, up, output_dir) -> tuple[str, str]:
    """Both pipeline runs and every API check; returns the completed run's id and name."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra.stack.processes import ProcessRecord, kill_tree

    api = f"http://127.0.0.1:{stack_env['PORT']}/api"
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        pipeline = client.read_deployment_by_name("pipeline/pipeline")
        assert pipeline.work_pool_name == "cpu-pool"
        assert [s.schedule.cron for s in pipeline.schedules] == ["0 2 * * *"]
        refresh = client.read_deployment_by_name("model-refresh/model-refresh")
        # deployed paused: nothing in this test may depend on the time of day
        assert not any(s.active for s in [*pipeline.schedules, *refresh.schedules])
        assert client.read_deployment_by_name("train/train").work_pool_name == "gpu-pool"
        gpu_contender = "contender-on-gpu-pool"
        assert client.read_deployment_by_name("contender/contender").work_pool_name == "cpu-pool"
        assert (
            client.read_deployment_by_name(f"contender/{gpu_contender}").work_pool_name
            == "gpu-pool"
        )
        assert client.read_work_pool("gpu-pool").concurrency_limit == 1
        _wrong_parameters_are_refused(client, pipeline)

        # run 1: the GPU worker (and its training process) dies in the middle of training
        first = client.create_flow_run_from_deployment(pipeline.id)
        train_run = wait_for(
            "the network's contender to run",
            lambda: (
                (r := _children(client, first.id).get(gpu_contender))
                and r.state_type.value == "RUNNING"
                and r
            ),
            timeout=400,
            every=1.0,
        )
        # crash detection starts with a run's first heartbeat: kill after it reached the server
        wait_for(
            "the train run's first heartbeat",
            lambda: _heartbeats(api, train_run.id),
            timeout=60,
        )
        s3 = _s3_client(stack_state(stack_dir))
        wait_for(
            "the first training checkpoint",
            lambda: any(k.endswith(".json") for k in _keys(s3, "store/checkpoints/")),
            timeout=120,
            every=0.5,
        )
        gpu_worker = ProcessRecord.model_validate(
            stack_state(stack_dir)["processes"]["worker-gpu-pool"]
        )
        assert len(kill_tree(gpu_worker)) >= 2, "the worker and its flow-run process"
        # `up` again restarts only what died
        again = cli([*up, "--no-deploy"], stack_env)
        assert "Prefect server already running" in again and "started gpu-pool worker" in again
        assert "cpu-pool worker already running" in again
        assert "PostgreSQL already running" in again and "Spark cluster already running" in again

        crashed = _final(client, train_run.id, timeout=240)
        assert crashed.state_type.value == "CRASHED", crashed.state
        failed = _final(client, first.id, timeout=120)
        assert failed.state_type.value == "FAILED", failed.state
        assert f"contender/{gpu_contender}" in failed.state.message
        assert "Crashed" in failed.state.message
        assert f"/runs/flow-run/{train_run.id}" in failed.state.message
        _contenders_ran_side_by_side(client, first.id, output_dir)

        # run 2: same parameters -> same run key: data preparation is not run again
        second = client.create_flow_run_from_deployment(pipeline.id)
        # a safety net, not a speed claim: three units dispatched one after another (the
        # network's contender, train, batch-inference), each waiting for a worker on a busy box
        done = _final(client, second.id, timeout=900)
        assert done.state_type.value == "COMPLETED", done.state
        children = _children(client, second.id)
        # the tabular contender finished in run 1 and is not run again; the network resumes
        assert set(children) == {gpu_contender, "train", "batch-inference"}, children
        assert children[gpu_contender].work_pool_name == "gpu-pool"
        assert children["train"].work_pool_name == "gpu-pool"
        assert children["batch-inference"].work_pool_name == "cpu-pool"
        assert _children(client, first.id)["prepare-data"].work_pool_name == "cpu-pool"

        prepare_id = _children(client, first.id)["prepare-data"].id
        arts = _artifacts(client, [second.id, prepare_id, *(c.id for c in children.values())])
        arts |= _artifacts(client, _in_process_children(client, prepare_id))
        expected = {
            "pipeline-stages",
            "stage-validate",
            "stage-features",
            "stage-preprocess",
            "stage-train",
            "stage-contender-mlp",
            "stage-batch-inference",
            "model-card",
            "predictions",
            "pipeline-predictions",
            "pipeline-model-version",
        }
        assert expected <= set(arts), sorted(arts)
        stages = {row["stage"]: row for row in json.loads(arts["pipeline-stages"].data)}
        assert stages["validate"]["cached"] and stages["preprocess"]["cached"]
        assert not stages["train"]["cached"] and stages["train"]["pool"] == "gpu-pool"
        assert stages["contender-logistic"]["cached"]
        assert stages["contender-logistic"]["pool"] == "cpu-pool"
        assert not stages["contender-mlp"]["cached"]
        assert stages["contender-mlp"]["pool"] == "gpu-pool"
        assert stages["batch_inference"]["pool"] == "cpu-pool"
        train_table = {r["metric"]: r["value"] for r in json.loads(arts["stage-train"].data)}
        assert train_table["pool"] == "gpu-pool"
        _outputs_are_in_s3(s3, arts["predictions"].data)
        (train_manifest,) = [k for k in _keys(s3, "store/runs/") if k.endswith("/train.json")]
        trained = json.loads(s3.get_object(Bucket="hybridflow", Key=train_manifest)["Body"].read())
        board = {row["family"]: row for row in trained["leaderboard"]}
        assert board["logistic"]["pool"] == "cpu-pool" and board["mlp"]["pool"] == "gpu-pool"
        if trained["family"] == "mlp":
            assert "train-epochs" in arts, sorted(arts)
        (mlp_key,) = [k for k in _keys(s3, "store/runs/") if k.endswith("/contender-mlp.json")]
        mlp = json.loads(s3.get_object(Bucket="hybridflow", Key=mlp_key)["Body"].read())
        resumed = mlp["manifest"]["training"].get("resumed_from_step")
        assert resumed, "the re-run did not resume the network's fit from a checkpoint"
        return str(done.id), done.name


def _contenders_ran_side_by_side(client, pipeline_id, output_dir: Path) -> None:
    """Run 1's contenders: one flow run per family under the pipeline run, the tabular one on
    cpu-pool and the network on gpu-pool, both dispatched before either ended (their times go
    to contenders.json in the test's output folder)."""
    children = _children(client, pipeline_id)
    cpu, gpu = children["contender"], children["contender-on-gpu-pool"]
    assert cpu.work_pool_name == "cpu-pool" and gpu.work_pool_name == "gpu-pool"
    assert cpu.parameters["params"]["families"] == ["logistic"]
    assert gpu.parameters["params"]["families"] == ["mlp"]
    assert cpu.name.startswith("contender-logistic") and gpu.name.startswith("contender-mlp")
    assert cpu.state_type.value == "COMPLETED", cpu.state
    assert max(cpu.created, gpu.created) < min(cpu.end_time, gpu.end_time), "not side by side"
    times = {
        run.name: {
            "pool": run.work_pool_name,
            "state": run.state_type.value,
            "created": run.created.isoformat(),
            "start": run.start_time.isoformat() if run.start_time else None,
            "end": run.end_time.isoformat(),
            "seconds": run.total_run_time.total_seconds(),
        }
        for run in (cpu, gpu)
    }
    (output_dir / "contenders.json").write_text(json.dumps(times, indent=2))


def _heartbeats(api: str, flow_run_id) -> int:
    import httpx

    body = {
        "filter": {
            "event": {"name": ["prefect.flow-run.heartbeat"]},
            "resource": {"id": [f"prefect.flow-run.{flow_run_id}"]},
        },
        "limit": 5,
    }
    return len(httpx.post(f"{api}/events/filter", json=body, timeout=10).json()["events"])


def _in_process_children(client, parent_id) -> list:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    runs = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])
        )
    )
    return [r.id for r in runs]


def _wrong_parameters_are_refused(client, pipeline) -> None:
    events = pipeline.parameters["params"]["events"]
    for bad, field in (({"horizon_days": 0}, "horizon_days"), ({"epochz": 3}, "epochz")):
        with pytest.raises(Exception) as refused:
            client.create_flow_run_from_deployment(
                pipeline.id, parameters={"params": {"events": events, **bad}}
            )
        assert field in str(refused.value), str(refused.value)


def _s3_client(state):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=state["s3_endpoint"],
        region_name="us-east-1",
        aws_access_key_id="hybridflow-local",
        aws_secret_access_key="hybridflow-local",
    )


def _keys(s3, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="hybridflow", Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def _outputs_are_in_s3(s3, predictions_link: str) -> None:
    keys = _keys(s3, "store/")
    assert any(k.startswith("store/predictions/") and k.endswith(".parquet") for k in keys)
    assert any(k.startswith("store/models/versions/") for k in keys), keys[:20]
    assert "s3://hybridflow/store/predictions/" in predictions_link


def _check_ui(stack_env, flow_run_id: str, run_name: str, tmp_path, output_dir) -> None:
    url = f"http://127.0.0.1:{stack_env['PORT']}/runs/flow-run/{flow_run_id}"
    profile = tmp_path / f"chromium-{uuid.uuid4().hex[:6]}"
    shot = output_dir / "flow-run.png"
    # one browser start for both: the DOM and the screenshot after the page's scripts ran
    dom = chromium(url, profile, "--dump-dom", f"--screenshot={shot}")
    (output_dir / "flow-run.html").write_text(dom)
    assert "Completed" in dom, "the run page does not show the Completed state"
    assert run_name in dom, f"the run page does not name the run {run_name}"
    assert shot.stat().st_size > 10_000
