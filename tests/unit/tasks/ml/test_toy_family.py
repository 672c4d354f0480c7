"""Adding a family is one module and one registration: a toy family defined only here is
trained by the train stage, registered, batch-scored and served without touching another module."""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from infra.compute.spark import SparkOnDemand
from infra.layout import scoring_features_prefix
from infra.settings import HybridflowSettings, TrainingSettings
from infra.storage.datasets import find_dataset, publish_dataset
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore
from serving.holder import ModelHolder
from serving.metrics import ServingMetrics
from tasks.ml.calibration import Calibration
from tasks.ml.logistic import fit_logistic
from tasks.ml.models import (
    CONFIG_FILE,
    CostHints,
    FamilySpec,
    FitJob,
    FitOutcome,
    FittedModel,
    ModelFamily,
    get_family,
    predict_proba,
    register_family,
    split_arrays,
    unregister_family,
)
from tasks.ml.normalizer import Normalizer
from tasks.stages.batch_inference import batch_inference_stage
from tasks.stages.train import TrainingOptions, train_stage
from tests.fixtures.synthetic_snapshot import AS_OF, publish_synthetic_snapshot


class ToySpec(FamilySpec):
    kind: Literal["toy"] = "toy"
    l2: float = 1e-3


class ToyModel(FittedModel):
    kind = "toy"

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.normalizer = Normalizer.model_validate(config["normalizer"])

    @property
    def features(self) -> list[str]:
        return list(self.config["normalizer"]["features"])

    @property
    def calibration(self) -> Calibration:
        return Calibration.model_validate(self.config.get("calibration", {}))

    def with_calibration(self, calibration: Calibration) -> ToyModel:
        self.config = self.config | {"calibration": calibration.model_dump()}
        return self

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self.normalizer.transform(x) @ np.asarray(self.config["w"]) + self.config["b"]

    def bundle_files(self) -> dict[str, bytes]:
        return {CONFIG_FILE: json.dumps(self.config | {"kind": "toy"}).encode()}

    @property
    def n_parameters(self) -> int:
        return len(self.config["w"]) + 1


class ToyFamily(ModelFamily):
    kind = "toy"
    spec_type = ToySpec

    def fit(self, spec: FamilySpec, job: FitJob) -> FitOutcome:
        assert isinstance(spec, ToySpec)
        started = time.perf_counter()
        x, y = split_arrays(job.data, "train")
        w, b = fit_logistic(job.normalizer.transform(x), y, l2=spec.l2)
        config = {"normalizer": job.normalizer.model_dump(), "w": w.tolist(), "b": b}
        return FitOutcome(model=ToyModel(config), seconds=time.perf_counter() - started)

    def load(self, config: dict[str, Any], files: dict[str, bytes]) -> ToyModel:
        return ToyModel(config)

    def cost_hints(
        self,
        spec: FamilySpec,
        n_features: int,
        settings: TrainingSettings,
        sequence_length: int = 0,
    ):
        return CostHints(
            parameters=n_features + 1,
            train_flops_per_row=10.0 * n_features,
            score_flops_per_row=2.0 * n_features,
            network=False,
        )


@pytest.fixture
def toy():
    family = register_family(ToyFamily())
    yield family
    unregister_family("toy")


def _publish_scoring_features(store, features: list[str], rows: int) -> pa.Table:
    rng = np.random.default_rng(3)
    table = pa.table(
        {"customer_id": [f"s{i:05d}" for i in range(rows)]}
        | {f: rng.lognormal(1.0, 1.0, rows) - 1.0 for f in features}
    )
    folder = store.staging_dir()
    pq.write_table(table, folder / "part-00000.parquet")
    publish_dataset(store, folder, scoring_features_prefix(AS_OF), rows=rows)
    return table


def test_a_toy_family_trains_registers_batch_scores_and_serves(toy, tmp_path):
    torch.set_num_threads(1)
    store = LocalFolderStore(tmp_path / "store")
    features, prepared = publish_synthetic_snapshot(store, "toy-run", rows=3000, seed=3)
    settings = HybridflowSettings(checkpoint={"every_steps": 0, "every_seconds": 0})
    output = train_stage(
        store,
        prepared,
        settings,
        as_of=features.as_of,
        horizon_days=90,
        device_preference="cpu",
        options=TrainingOptions(families=["toy"]),
    )
    assert output is not None
    result = output.result
    assert result.family == "toy" and result.promoted, result.decision_reason
    assert [r.family for r in result.leaderboard] == ["toy"] and result.leaderboard[0].champion
    manifest = ModelRegistry(store).get(result.model_version)
    assert manifest.kind == "toy" and manifest.leaderboard[0]["family"] == "toy"
    assert get_family("toy") is toy

    table = _publish_scoring_features(store, features.features, rows=500)
    scored = batch_inference_stage(SparkOnDemand(settings), store, AS_OF, in_process_rows=10_000)
    assert scored.model_version == result.model_version and scored.rows_scored == 500
    predictions = pq.read_table(
        store.local_path(find_dataset(store, scored.predictions_prefix).data_prefix)
    )
    _, files = ModelRegistry(store).read_files(result.model_version)
    model = ToyModel(json.loads(files[CONFIG_FILE]))
    x = np.column_stack([table.column(f).to_numpy() for f in features.features]).astype(np.float32)
    expected = dict(
        zip(table.column("customer_id").to_pylist(), predict_proba(model, x), strict=True)
    )
    got = dict(
        zip(
            predictions.column("customer_id").to_pylist(),
            predictions.column("score").to_pylist(),
            strict=True,
        )
    )
    assert got.keys() == expected.keys()
    np.testing.assert_allclose(
        [got[k] for k in expected], list(expected.values()), rtol=0, atol=1e-12
    )

    holder = ModelHolder(store, ServingMetrics())
    holder.refresh()
    served = holder.state.model
    assert served is not None and served.version == result.model_version
    np.testing.assert_allclose(served.score(x[:5]), predict_proba(model, x[:5]), rtol=0, atol=1e-12)
