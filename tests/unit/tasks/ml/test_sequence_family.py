"""The ``sequence`` family: it learns from the events (a label the aggregate features cannot see,
``tests/fixtures/sequence_snapshot.py``),
round-trips through the registry with identical scores in batch scoring, after reload and from
the endpoint's snapshot, runs the CUDA path's bf16 autocast and ``torch.compile`` on the CPU,
and masks padding (no NaN for a customer without events)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from infra.layout import scoring_features_prefix
from infra.settings import TrainingSettings
from infra.storage.datasets import publish_dataset
from infra.storage.store import LocalFolderStore, sha256_bytes
from serving.snapshot import load_snapshot
from tasks.ml.metrics import classification_metrics
from tasks.ml.model_inputs import input_matrix
from tasks.ml.models import FitJob, family_specs, get_family, load_model, predict_proba
from tasks.ml.models.sequence import SequenceConfig, SequenceModel, SequenceNet
from tasks.ml.normalizer import Normalizer
from tasks.ml.scoring_worker import feature_matrix
from tasks.ml.snapshot_reader import SnapshotStream
from tests.fixtures.sequence_snapshot import FEATURES, sequence_table, write_sequence_snapshot
from tests.fixtures.sequence_snapshot import SEQUENCE_COLUMNS as COLUMNS

N = 6


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> SnapshotStream:
    root = write_sequence_snapshot(tmp_path_factory.mktemp("seq-snapshot") / "snap", 4000, N)
    return SnapshotStream(root, FEATURES, chunk_rows=1024)


def _job(snapshot: SnapshotStream, **settings) -> FitJob:
    normalizer = Normalizer(features=FEATURES, mean=[2.0, 1.0], std=[1.0, 1.0])
    train = TrainingSettings(**({"max_epochs": 8, "patience": 3, "batch_size": 128} | settings))
    return FitJob(data=snapshot, normalizer=normalizer, settings=train)


@pytest.mark.parametrize("encoder", ["gru", "transformer"])
def test_it_learns_what_only_the_events_say_and_round_trips(snapshot, encoder):
    (spec,) = family_specs(["sequence"], {"sequence": {"encoder": encoder, "width": 16}})
    model = get_family("sequence").fit(spec, _job(snapshot)).model
    assert isinstance(model, SequenceModel)
    assert model.features[:2] == FEATURES and model.features[2] == "seq_gap_days[0]"
    assert len(model.features) == len(FEATURES) + len(COLUMNS) * N
    test = snapshot.with_features(model.features)
    x, y = next(test.chunks("test"))
    assert classification_metrics(y, predict_proba(model, x))["auc"] > 0.9

    files = model.bundle_files()
    loaded = load_model(files, {k: sha256_bytes(v) for k, v in files.items()})
    np.testing.assert_array_equal(predict_proba(model, x), predict_proba(loaded, x))
    # batch scoring reads the list columns of a features file into the same matrix
    table = pq.read_table(snapshot.root / "split=test")
    batch = table.combine_chunks().to_batches()[0]
    np.testing.assert_array_equal(
        feature_matrix(batch, model.features), input_matrix(table, model.features)
    )
    np.testing.assert_array_equal(
        predict_proba(loaded, feature_matrix(batch, model.features))[: len(y)],
        predict_proba(model, x),
    )


def test_the_endpoints_snapshot_holds_every_sequence_position(snapshot, tmp_path):
    (spec,) = family_specs(["sequence"], {"sequence": {"width": 8}})
    model = get_family("sequence").build(spec, _job(snapshot))  # type: ignore[attr-defined]
    fitted = SequenceModel(model)
    store = LocalFolderStore(tmp_path / "store")
    table = pq.read_table(snapshot.root / "split=val").drop_columns(["label"])
    staging = store.staging_dir()
    pq.write_table(table, staging / "part-0.parquet")
    prefix = scoring_features_prefix(dt.date(2025, 12, 31))
    manifest = publish_dataset(store, staging, prefix, rows=table.num_rows)
    served = load_snapshot(store, manifest)
    rows = served.values[:, served.column_indices(fitted.features)]
    np.testing.assert_array_equal(rows, input_matrix(table, fitted.features))
    np.testing.assert_allclose(
        predict_proba(fitted, rows), predict_proba(fitted, input_matrix(table, fitted.features))
    )


@pytest.mark.parametrize("encoder", ["gru", "transformer"])
def test_the_cuda_paths_bf16_autocast_and_compile_run_on_the_cpu(snapshot, encoder):
    """What the training loop does on CUDA (bf16 autocast, ``torch.compile``), on the CPU:
    forward and backward in bf16 give finite gradients; the compiled graph (dynamo with the
    ahead-of-time autograd, no C++ toolchain needed) gives the eager logits."""
    config = SequenceConfig(
        features=FEATURES,
        sequence_columns=COLUMNS,
        length=N,
        encoder=encoder,
        width=16,
        layers=2,
        heads=2,
        hidden_sizes=[8],
        dropout=0.0,
        norm_mean=[0.0, 0.0],
        norm_std=[1.0, 1.0],
    )
    torch.manual_seed(0)
    network = SequenceNet(config)
    x = torch.from_numpy(input_matrix(pq.read_table(snapshot.root / "split=val"), config.inputs()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = network(x)
    assert logits.dtype == torch.bfloat16
    logits.float().mean().backward()
    grads = [p.grad for p in network.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    network.eval()
    compiled = torch.compile(network, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), network(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("encoder", ["gru", "transformer"])
def test_a_customer_without_events_gets_a_finite_score(encoder):
    config = SequenceConfig(
        features=FEATURES,
        sequence_columns=COLUMNS[:3],
        length=N,
        encoder=encoder,
        width=8,
        layers=1,
        heads=2,
        hidden_sizes=[4],
        dropout=0.0,
        norm_mean=[0.0, 0.0],
        norm_std=[1.0, 1.0],
    )
    model = SequenceModel(SequenceNet(config))
    x = np.zeros((2, len(model.features)), dtype=np.float32)
    x[1, 2 : 2 + N] = 3.0  # the second customer has events (gaps) but the first none
    x[1, 2 + 2 * N] = 1.0
    assert np.isfinite(predict_proba(model, x)).all()


def test_without_sequences_in_the_snapshot_the_family_says_what_to_set(tmp_path):
    for split in ("train", "val", "test"):
        (tmp_path / f"split={split}").mkdir()
        table = sequence_table(10, N, 0).drop_columns(COLUMNS + ["seq_length"])
        pq.write_table(table, tmp_path / f"split={split}" / "part-0.parquet")
    (spec,) = family_specs(["sequence"], {})
    with pytest.raises(Exception, match="HYBRIDFLOW_SEQUENCE_LENGTH"):
        get_family("sequence").fit(spec, _job(SnapshotStream(tmp_path, FEATURES)))


def test_the_cost_estimate_grows_with_customers_events_and_width(monkeypatch):
    """What the router sizes the train stage by: FLOPs per customer grow with N x width (a
    transformer's also with N x N), and every training origin adds an example per customer."""
    from infra.settings import HybridflowSettings
    from tasks.ml.models.sequence import SequenceSpec, sequence_flops_per_row
    from tasks.policy.planning import model_cost

    gru, wide = SequenceSpec(width=32), SequenceSpec(width=64)
    assert 1.9 < sequence_flops_per_row(gru, 46, 64) / sequence_flops_per_row(gru, 46, 32) < 2.1
    assert sequence_flops_per_row(wide, 46, 32) > 3 * sequence_flops_per_row(gru, 46, 32)
    attention = SequenceSpec(encoder="transformer", width=32)
    assert sequence_flops_per_row(attention, 46, 128) > sequence_flops_per_row(gru, 46, 128)
    one = HybridflowSettings(training_origins=1)
    two = one.model_copy(update={"training_origins": 2})
    assert model_cost(["sequence"], 46, two).train_flops_per_row == pytest.approx(
        2 * model_cost(["sequence"], 46, one).train_flops_per_row
    )
    costs = {}
    monkeypatch.setenv("HYBRIDFLOW_SEQUENCE_LENGTH", "128")  # the run's settings decide, not this
    for n in (16, 64):  # the events the features stage publishes decide N
        with_length = one.model_copy(update={"sequence_length": n})
        costs[n] = model_cost(["sequence"], 46, with_length).train_flops_per_row
    assert costs[64] > 3 * costs[16] > 3 * model_cost(["mlp"], 46, one).train_flops_per_row


def test_an_interrupted_fit_resumes_from_its_checkpoint_to_the_same_weights(snapshot, tmp_path):
    """Checkpoints and resume as the MLP has them: a fit stopped after 30 steps and run again
    ends with the weights of a fit that was never stopped."""
    from tasks.ml.checkpoints import CheckpointPolicy, CheckpointStore

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (spec,) = family_specs(["sequence"], {"sequence": {"width": 8}})
        family = get_family("sequence")
        straight = family.fit(spec, _job(snapshot, max_epochs=2)).model
        store = LocalFolderStore(tmp_path / "store")
        policy = CheckpointPolicy(every_steps=10, every_seconds=0)

        def job(stop: int | None) -> FitJob:
            return FitJob(
                **{
                    **_job(snapshot, max_epochs=2).__dict__,
                    "checkpoints": CheckpointStore(store, "seq-resume", keep=2),
                    "checkpoint_policy": policy,
                    "stop_after_steps": stop,
                }
            )

        first = family.fit(spec, job(30))
        assert first.interrupted
        resumed = family.fit(spec, job(None))
        assert resumed.record["resumed_from_step"] == 30 and not resumed.interrupted
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(
        straight.network.state_dict().values(),  # type: ignore[attr-defined]
        resumed.model.network.state_dict().values(),  # type: ignore[attr-defined]
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
