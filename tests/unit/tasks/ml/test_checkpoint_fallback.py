"""A checkpoint whose manifest checks out but whose state cannot be used (missing, foreign, of
another architecture or family, a pickle with a blocked global) is skipped like a checksum
failure: a warning names it, training resumes from the one before, else starts fresh and says so;
torch's advice to load with ``weights_only=False`` never reaches the log."""

from __future__ import annotations

import argparse
import io
import logging

import pytest
import torch

from infra.layout import CHECKPOINT_STATE, checkpoint_manifest_key, checkpoint_state_key
from infra.settings import TrainingSettings
from infra.storage.store import LocalFolderStore, sha256_bytes
from tasks.ml.checkpoints import CheckpointManifest, CheckpointPolicy, CheckpointStore
from tasks.ml.models import FitJob
from tasks.ml.models.mlp import CustomerMLP, MLPFamily, MLPSpec, ModelConfig
from tasks.ml.models.sequence import SequenceConfig, SequenceNet
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot, synthetic_stream

TID = "t-fallback"


@pytest.fixture
def setup(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    store = LocalFolderStore(tmp_path / "store")
    _, prepared = publish_synthetic_snapshot(store, "r", rows=3000, seed=2)
    data, normalizer = synthetic_stream(store, prepared, chunk_rows=700)
    settings = TrainingSettings(batch_size=64, max_epochs=3, patience=5, threads=1)
    first = _fit(store, data, normalizer, settings, stop_after_steps=50)
    assert first.interrupted
    assert [m.step for m in CheckpointStore(store, TID).manifests()] == [50, 40, 20]
    yield store, data, normalizer, settings
    torch.set_num_threads(threads)


def _fit(store, data, normalizer, settings, stop_after_steps=None):
    job = FitJob(
        data=data,
        normalizer=normalizer,
        settings=settings,
        checkpoints=CheckpointStore(store, TID, keep=3),
        checkpoint_policy=CheckpointPolicy(every_steps=20, every_seconds=0),
        stop_after_steps=stop_after_steps,
    )
    return MLPFamily().fit(MLPSpec(), job)


def _state(store, step):
    data = store.get_bytes(checkpoint_state_key(TID, step))
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _replace(store, step, payload) -> str:
    """Overwrite checkpoint ``step``'s state with ``payload`` (torch.save'd unless bytes) and
    make its manifest's sha256 match, so only loading can tell."""
    if not isinstance(payload, bytes):
        buf = io.BytesIO()
        torch.save(payload, buf)
        payload = buf.getvalue()
    key = checkpoint_state_key(TID, step)
    store.put_bytes(key, payload)
    mkey = checkpoint_manifest_key(TID, step)
    manifest = CheckpointManifest.model_validate_json(store.get_bytes(mkey))
    manifest.files[CHECKPOINT_STATE] = sha256_bytes(payload)
    store.put_bytes(mkey, manifest.model_dump_json().encode())
    return store.key_uri(key)


def _missing(state):
    return {k: v for k, v in state.items() if k != "model"}


def _foreign(state):
    return {"weights": torch.zeros(3), "note": "not a hybridflow training state"}


def _architecture(state):
    config = dict(state["model_config"], hidden_sizes=[16])
    other = CustomerMLP(ModelConfig.model_validate(config))
    return dict(state, model_config=config, model=other.state_dict())


def _feature_list(state):
    config = dict(state["model_config"])
    config["features"] = [f"other_{f}" for f in config["features"]]
    return dict(state, model_config=config)


def _family(state):
    mlp = state["model_config"]
    config = SequenceConfig(
        features=mlp["features"],
        sequence_columns=["amount"],
        length=4,
        encoder="gru",
        width=8,
        layers=1,
        heads=1,
        hidden_sizes=[8],
        dropout=0.0,
        norm_mean=mlp["norm_mean"],
        norm_std=mlp["norm_std"],
    )
    return dict(state, model_config=config.model_dump(), model=SequenceNet(config).state_dict())


def _blocked_global(state):
    return dict(state, extra=argparse.Namespace(payload="runs code on load"))


def _optimizer(state):
    return dict(state, optimizer={"state": {}, "param_groups": []})


def _not_a_state(state):
    return [1, 2, 3]


def _garbage(state):
    return b"PK\x03\x04 not a zip archive at all"


DAMAGE = {
    "state without its weights": (_missing, "lacks 'model'"),
    "foreign state": (_foreign, "lacks 'model_config'"),
    "another architecture": (_architecture, "hidden_sizes"),
    "another feature list": (_feature_list, "features"),
    "another family": (_family, "ValidationError"),
    "pickle with a blocked global": (_blocked_global, "argparse.Namespace"),
    "optimiser of another network": (_optimizer, "ValueError"),
    "not a training state": (_not_a_state, "not a training state"),
    "not a torch file": (_garbage, "not a readable torch file"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_an_unusable_newest_checkpoint_falls_back_to_the_one_before(setup, damage, caplog):
    store, data, normalizer, settings = setup
    change, reason = DAMAGE[damage]
    uri = _replace(store, 50, change(_state(store, 50)))
    with caplog.at_level(logging.INFO):
        outcome = _fit(store, data, normalizer, settings)
    assert outcome.record["resumed_from_step"] == 40
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    skipped = [w for w in warnings if "checkpoint step 50" in w]
    assert len(skipped) == 1 and uri in skipped[0] and reason in skipped[0], warnings
    assert "weights_only" not in caplog.text
    assert "resumed from checkpoint step 40" in caplog.text


def test_no_usable_checkpoint_starts_fresh_and_says_so(setup, caplog):
    store, data, normalizer, settings = setup
    _replace(store, 50, _blocked_global(_state(store, 50)))
    _replace(store, 40, _architecture(_state(store, 40)))
    _replace(store, 20, _missing(_state(store, 20)))
    with caplog.at_level(logging.INFO):
        outcome = _fit(store, data, normalizer, settings)
    assert outcome.record["resumed_from_step"] is None
    assert not outcome.interrupted and outcome.record["steps"] > 50
    assert f"training {TID} starts fresh at step 0" in caplog.text
    assert "steps 50, 40, 20 skipped" in caplog.text
    assert "weights_only" not in caplog.text
