"""Flow ``train`` (gpu-pool): fine-tune/train on the snapshot, register, apply the gate.

Retries of this flow (and re-runs with the same inputs) resume from the training's newest
checkpoint: the training id derives from the snapshot's content and the parameters. With
``HYBRIDFLOW_TRAIN__DDP_PROCESSES`` > 1 the stage runs under torchrun (one process per GPU).
"""

from __future__ import annotations

from prefect.runtime import flow_run

from flows.artifacts import publish_stage_table, publish_training_artifacts
from flows.context import current_pool, record_stage_result, resolve_run_id
from flows.dag import TRAIN, upstream_results
from flows.params import StageParams, resolve
from flows.params_flow import params_flow
from infra.layout import VERSIONS
from infra.storage.registry import ModelRegistry
from tasks.reporting.records import TrainResult
from tasks.stages.train import TrainingOptions, launch_training


@params_flow(name=TRAIN.flow_name, retries=1, retry_delay_seconds=5)
def train_flow(params: StageParams) -> TrainResult:
    """Train the purchase model on the run's snapshot and promote it if it beats production."""
    run = resolve(params)
    run_id = resolve_run_id(params.run_id)
    # a retry resumes what the first attempt checkpointed, so fresh applies to attempt 1 only
    fresh = params.fresh and (flow_run.run_count or 1) <= 1
    upstream = upstream_results(run.store, run_id, TRAIN)
    output = launch_training(
        run.store,
        run_id,
        run.settings,
        device_preference=params.device,
        options=TrainingOptions(
            fresh=fresh, scratch=params.scratch, families=params.families, pool=current_pool("")
        ),
        **upstream,
    )
    result = record_stage_result(run.store, run_id, TRAIN.name, output.result)
    publish_training_artifacts(
        output,
        ModelRegistry(run.store).get(result.model_version),
        run.store.key_uri(VERSIONS),
        **upstream,
    )
    publish_stage_table(result.report, model_version=result.model_version, promoted=result.promoted)
    return result
