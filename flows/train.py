"""Flow ``train`` (gpu-pool): fine-tune/train on the snapshot, register, apply the gate.

Retries of this flow (and re-runs with the same inputs) resume from the training's newest
checkpoint: the training id derives from the snapshot's content and the parameters. With
``HYBRIDFLOW_TRAIN__DDP_PROCESSES`` > 1 the stage runs under torchrun (one process per GPU).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel

from flows._glue import publish_stage_table, stage_context
from infra.registry import ModelRegistry
from tasks.ddp import launch_ddp_training
from tasks.model_card import model_card_markdown
from tasks.promotion import PromotionDecision
from tasks.stage_records import (
    FeaturesResult,
    PreprocessResult,
    TrainResult,
    read_stage_manifest,
    write_stage_manifest,
)
from tasks.training_stage import TrainingOptions, train_stage


class TrainParams(BaseModel):
    """Parameters of the train stage."""

    run_id: str
    device: Literal["auto", "cuda", "cpu"] = "auto"
    store: str | None = None
    fresh: bool = False
    scratch: bool = False


@flow(name="train", retries=1, retry_delay_seconds=5)
def train_flow(params: TrainParams) -> TrainResult:
    """Train the purchase model on the run's snapshot and promote it if it beats production."""
    settings, store = stage_context(params.store)
    features = read_stage_manifest(store, params.run_id, "features", FeaturesResult)
    prepared = read_stage_manifest(store, params.run_id, "preprocess", PreprocessResult)
    # a retry resumes what the first attempt checkpointed, so --fresh applies to attempt 1 only
    fresh = params.fresh and (flow_run.run_count or 1) <= 1
    if settings.train.ddp_processes > 1:
        args = ["--run-id", params.run_id, "--store", store.uri, "--device", params.device]
        args += ["--fresh"] * fresh + ["--scratch"] * params.scratch
        with tempfile.TemporaryDirectory(prefix="hf-ddp-") as tmp:
            result_file = Path(tmp) / "result.json"
            launch_ddp_training(settings.train.ddp_processes, args, result_file)
            payload = json.loads(result_file.read_text())
        result = TrainResult.model_validate(payload["result"])
        decision = PromotionDecision.model_validate(payload["decision"])
        history = payload["history"]
    else:
        output = train_stage(
            store,
            prepared,
            settings,
            as_of=features.as_of,
            horizon_days=features.horizon_days,
            device_preference=params.device,
            options=TrainingOptions(fresh=fresh, scratch=params.scratch),
        )
        assert output is not None  # a single process is rank 0
        result, decision = output.result, output.decision
        history = [vars(e) for e in output.history]
    write_stage_manifest(store, params.run_id, "train", result)
    if history:
        create_table_artifact(table=history, key="train-epochs", description="per-epoch metrics")
    manifest = ModelRegistry(store).get(result.model_version)
    create_markdown_artifact(
        markdown=model_card_markdown(
            result, decision, features, manifest, store.key_uri("models/versions")
        ),
        key="model-card",
        description=f"model {result.model_version}",
    )
    publish_stage_table(result.report, model_version=result.model_version, promoted=result.promoted)
    return result
