"""Batch inference on real Spark + Prefect: contract, parity with plain torch, re-scoring with
an older registry version through the CLI, progress reporting, one model load per worker."""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from infra.compute.spark_io import SparkJobs
from infra.storage.datasets import read_dataset_manifest
from infra.storage.registry import ModelRegistry
from infra.storage.store import ObjectStore, open_store
from tasks.ml.models import load_model, predict_proba
from tasks.ml.models.mlp import CustomerMLP, MLPModel, ModelConfig

pytestmark = pytest.mark.integration
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller")


class _ContextSeen:
    """A row tally that records the context variable and the threads it is added from."""

    def __init__(self) -> None:
        self.values: set[str | None] = set()
        self._threads: set[int] = set()

    def add(self, term: int) -> None:
        self.values.add(CALLER.get(None))
        self._threads.add(threading.get_ident())

    @property
    def threads(self) -> int:
        return len(self._threads)


def _register(registry: ModelRegistry, features: list[str], seed: int) -> str:
    """An untrained but deterministic model version (scoring does not care how it was fitted)."""
    torch.manual_seed(seed)
    model = CustomerMLP(
        ModelConfig(
            features=features,
            hidden_sizes=[16, 8],
            dropout=0.0,
            norm_mean=[1.0] * len(features),
            norm_std=[2.0] * len(features),
        )
    )
    return registry.register(MLPModel(model).bundle_files(), features=features).version


def _read_published(store: ObjectStore, prefix: str) -> pa.Table:
    manifest = read_dataset_manifest(store, prefix)
    root = store.local_path(manifest.data_prefix)
    return pa.concat_tables(pq.read_table(root / f.split("/")[-1]) for f in manifest.files)


def _plain_torch_scores(store: ObjectStore, version: str, features_prefix: str) -> dict[str, float]:
    """Score the published feature rows with the model in this process, all cores."""
    manifest, files = ModelRegistry(store).read_files(version)
    model = load_model(files, manifest.files)
    table = _read_published(store, features_prefix)
    x = np.column_stack([table.column(f).to_numpy().astype(np.float32) for f in manifest.features])
    torch.set_num_threads(os.cpu_count() or 1)
    scores = predict_proba(model, x)
    return dict(zip(table.column("customer_id").to_pylist(), scores.tolist(), strict=True))


def _check_predictions(
    table: pa.Table, version: str, as_of: dt.date, expected: dict[str, float]
) -> np.ndarray:
    assert table.schema.field("customer_id").type == pa.string()
    assert table.schema.field("score").type == pa.float64()
    assert table.schema.field("model_version").type == pa.string()
    assert table.schema.field("as_of").type == pa.date32()
    ids = table.column("customer_id").to_pylist()
    assert len(ids) == len(set(ids)) == len(expected)
    assert set(table.column("model_version").to_pylist()) == {version}
    assert set(table.column("as_of").to_pylist()) == {as_of}
    scores = table.column("score").to_numpy()
    assert np.all((scores >= 0.0) & (scores <= 1.0))
    plain = np.array([expected[i] for i in ids])
    np.testing.assert_allclose(scores, plain, rtol=0, atol=1e-6)
    return scores


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _progress_artifacts(key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )


@pytest.mark.slow(
    reason="prepare-data and batch inference flows on Spark, then the CLI's batch scoring"
)
def test_batch_inference_end_to_end(
    spark, prefect_harness, demo_events, tmp_path, monkeypatch, capsys
):
    from cli.main import main
    from flows.batch_inference import batch_inference_flow
    from flows.params import StageParams
    from flows.prepare import prepare_flow
    from infra.layout import predictions_prefix
    from infra.settings import get_settings
    from tasks.engines.spark.scoring import score_dataset
    from tasks.ml.scoring_model import load_scoring_model
    from tasks.ml.scoring_worker import ScoringModel
    from tasks.reporting.records import FeaturesResult, read_stage_manifest

    store_uri = str(tmp_path / "store")
    monkeypatch.setenv("HYBRIDFLOW_STORE", store_uri)
    monkeypatch.setenv("HYBRIDFLOW_PROGRESS_INTERVAL_S", "0.2")
    get_settings.cache_clear()
    try:
        prepared = prepare_flow(StageParams(events=str(demo_events), store=store_uri))
        store = open_store(store_uri)
        feats = read_stage_manifest(store, prepared.run_id, "features", FeaturesResult)
        registry = ModelRegistry(store)
        old = _register(registry, feats.features, seed=1)
        new = _register(registry, feats.features, seed=2)
        registry.set_alias(new, "test")
        features_prefix = feats.scoring_prefix

        # 1. The flow scores with production: contract, parity with plain torch, progress.
        stage_log, stage_logger = _ListHandler(), logging.getLogger("tasks.stages.batch_inference")
        level = stage_logger.level
        stage_logger.addHandler(stage_log)
        stage_logger.setLevel(logging.INFO)
        try:
            result = batch_inference_flow(StageParams(as_of=feats.as_of, store=store_uri))
        finally:
            stage_logger.removeHandler(stage_log)
            stage_logger.setLevel(level)
        assert result.model_version == new
        assert result.rows_scored == feats.n_scoring
        # one task's worth of rows, local mode: scored in this process, no Spark job
        assert result.report.spark_jobs == 0
        assert result.report.rows_in == feats.n_scoring
        new_scores = _check_predictions(
            _read_published(store, predictions_prefix(feats.as_of)),
            new,
            feats.as_of,
            _plain_torch_scores(store, new, features_prefix),
        )
        progress = _progress_artifacts("progress-batch-inference")
        assert progress and float(progress[-1].data) == pytest.approx(100.0)
        assert any(
            f"{feats.n_scoring:,} rows done of {feats.n_scoring:,} (100%)" in r.getMessage()
            for r in stage_log.records
        )

        # 2. The CLI re-scores the same as-of with the older version: predictions replaced.
        capsys.readouterr()
        assert main(["infer", "--as-of", feats.as_of.isoformat(), "--model-version", old]) == 0
        assert old in capsys.readouterr().out
        published = read_dataset_manifest(store, predictions_prefix(feats.as_of))
        assert published.metadata["model_version"] == old
        old_scores = _check_predictions(
            _read_published(store, predictions_prefix(feats.as_of)),
            old,
            feats.as_of,
            _plain_torch_scores(store, old, features_prefix),
        )
        assert not np.allclose(np.sort(old_scores), np.sort(new_scores))

        # 3. A version the registry lacks is the user's error: exit 2, one line.
        assert main(["infer", "--as-of", feats.as_of.isoformat(), "--model-version", "m-x"]) == 2
        assert "model version not found: m-x" in capsys.readouterr().err

        # 4. The model is loaded once per Python worker, not once per task (the same file listed
        # 4x per core, one file per task).
        tasks = 4 * spark.sparkContext.defaultParallelism
        published = read_dataset_manifest(store, features_prefix)
        many = published.model_copy(update={"files": published.files[:1] * tasks})
        loads = spark.sparkContext.accumulator(0)
        fresh = _register(registry, feats.features, seed=3)  # not cached in any worker yet
        folder, keys, rows = score_dataset(
            spark,
            store,
            many,
            load_scoring_model(store, fresh),
            feats.as_of,
            "scratch/many",
            rows_per_task=1,
            model_loads=loads,
        )
        first_file = pq.read_table(store.local_path(published.files[0]))
        assert rows == tasks * first_file.num_rows and len(set(keys)) == tasks
        # the Spark tasks score as this process does (to the same 1e-6)
        task_scores = pq.read_table(store.local_path(keys[-1]))
        expected = _plain_torch_scores(store, fresh, features_prefix)
        expected = {c: expected[c] for c in first_file.column("customer_id").to_pylist()}
        _check_predictions(task_scores, fresh, feats.as_of, expected)
        assert all(k.startswith(f"{folder}/") for k in keys)
        assert 1 <= loads.value < tasks

        # 4b. Up to in_process_rows in local mode the same units are scored in this process, a
        # thread per core: no Spark job, the model loaded once, the same scores. The threads
        # count rows in the caller's context (where a progress sink finds the flow run's API:
        # without it Prefect starts an API of its own, and leaves it running).
        here_loads = spark.sparkContext.accumulator(0)
        here = _register(registry, feats.features, seed=5)
        seen = _ContextSeen()
        token = CALLER.set("the caller")
        with SparkJobs(spark) as jobs:
            _, here_keys, here_rows = score_dataset(
                spark,
                store,
                many,
                load_scoring_model(store, here),
                feats.as_of,
                "scratch/here",
                rows_per_task=1,
                in_process_rows=10**9,
                rows_done=seen,
                model_loads=here_loads,
            )
        CALLER.reset(token)
        assert seen.values == {"the caller"} and seen.threads > 1
        assert jobs.count == 0 and here_loads.value == 1
        assert here_rows == rows and len(set(here_keys)) == tasks
        expected = _plain_torch_scores(store, here, features_prefix)
        for key in (here_keys[0], here_keys[-1]):
            expected_file = {c: expected[c] for c in first_file.column("customer_id").to_pylist()}
            _check_predictions(
                pq.read_table(store.local_path(key)), here, feats.as_of, expected_file
            )

        # 5. Bundle bytes that do not match their sha256 are refused by the workers (a version
        # no worker has cached; a cached one was verified when it was loaded).
        good = load_scoring_model(store, _register(registry, feats.features, seed=4))
        tampered = ScoringModel(
            version=good.version,
            files={**good.files, "model.pt": good.files["model.pt"] + b"x"},
            sha256=good.sha256,
            features=good.features,
        )
        with pytest.raises(Exception, match="sha256"):
            score_dataset(spark, store, published, tampered, feats.as_of, "scratch/tampered")

        # 6. Features that lack a column the model needs: the task says which.
        lacking = good.__class__(
            version=good.version,
            files=good.files,
            sha256=good.sha256,
            features=[*good.features[:-1], "no_such_feature"],
        )
        with pytest.raises(Exception, match="lack column.*no_such_feature"):
            score_dataset(spark, store, published, lacking, feats.as_of, "scratch/lacking")
    finally:
        get_settings.cache_clear()
