"""The ``train`` Prefect flow: the same inputs give the same training id (a re-run reuses or
resumes it), ``fresh`` starts over, and the model card artifact tells the gate's decision."""

from __future__ import annotations

import pytest

from infra.settings import get_settings
from infra.storage.store import LocalFolderStore
from tests.fixtures.synthetic_snapshot import publish_synthetic_snapshot

pytestmark = pytest.mark.integration


def test_train_flow_reuses_a_finished_training_and_publishes_the_model_card(
    prefect_harness, tmp_path, monkeypatch
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.params import StageParams
    from flows.train import train_flow

    store = LocalFolderStore(tmp_path / "store")
    publish_synthetic_snapshot(store, "flow-run", rows=3000, seed=31)
    for name, value in {
        "HYBRIDFLOW_TRAIN__BATCH_SIZE": "64",
        "HYBRIDFLOW_TRAIN__MAX_EPOCHS": "4",
        "HYBRIDFLOW_TRAIN__THREADS": "1",
        "HYBRIDFLOW_TRAIN__FAMILIES": "mlp",  # the network's checkpoints and resume
        "HYBRIDFLOW_CHECKPOINT__EVERY_STEPS": "40",
    }.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        params = StageParams(run_id="flow-run", store=store.uri, device="cpu", scratch=True)
        first = train_flow(params)
        again = train_flow(params)  # same snapshot, same parameters: same training id
        fresh = train_flow(params.model_copy(update={"fresh": True}))
    finally:
        get_settings.cache_clear()
    assert first.promoted and first.training_id.startswith("t-") and first.steps > 0
    assert store.list(f"checkpoints/{first.training_id}")
    assert again.model_version == first.model_version and again.training_id == first.training_id
    assert not again.promoted and "production already" in again.decision_reason
    assert fresh.model_version != first.model_version

    with get_client(sync_client=True) as client:
        cards = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["model-card"]))
        )
    texts = [str(c.data) for c in cards]
    first_cards = [t for t in texts if f"# Model {first.model_version}" in t]
    assert len(first_cards) == 2  # the training run and the re-run that reused its version
    card = next(t for t in first_cards if "**Promoted:** yes" in t)
    assert "**Promoted:** yes — first model: no production model yet" in card
    assert any("is production already" in t for t in first_cards)
    assert first.training_id in card and "sha256" in card and "## Promotion gate" in card
