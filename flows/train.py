"""Flow ``train`` (gpu-pool): fine-tune/train on the snapshot, register, apply the gate."""

from __future__ import annotations

from typing import Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import BaseModel

from flows._glue import publish_stage_table, stage_context
from tasks.model_card import model_card_markdown
from tasks.stage_records import (
    FeaturesResult,
    PreprocessResult,
    TrainResult,
    read_stage_manifest,
    write_stage_manifest,
)
from tasks.train import EpochRecord
from tasks.training_stage import train_stage


class TrainParams(BaseModel):
    """Parameters of the train stage."""

    run_id: str
    device: Literal["auto", "cuda", "cpu"] = "auto"
    store: str | None = None


@flow(name="train")
def train_flow(params: TrainParams) -> TrainResult:
    """Train the purchase model on the run's snapshot and promote it if it beats production."""
    settings, store = stage_context(params.store)
    features = read_stage_manifest(store, params.run_id, "features", FeaturesResult)
    prepared = read_stage_manifest(store, params.run_id, "preprocess", PreprocessResult)
    epochs: list[EpochRecord] = []
    result, decision = train_stage(
        store,
        prepared,
        settings,
        as_of=features.as_of,
        horizon_days=features.horizon_days,
        device_preference=params.device,
        on_epoch=epochs.append,
    )
    write_stage_manifest(store, params.run_id, "train", result)
    create_table_artifact(
        table=[vars(e) for e in epochs], key="train-epochs", description="per-epoch metrics"
    )
    create_markdown_artifact(
        markdown=model_card_markdown(result, decision, features, store.key_uri("models/versions")),
        key="model-card",
        description=f"model {result.model_version}",
    )
    publish_stage_table(result.report, model_version=result.model_version, promoted=result.promoted)
    return result
