"""The pipeline run key: same inputs and parameters -> same key; any change -> a new key."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from flows.pipeline import PipelineParams, deployed_run_key
from infra.errors import HybridflowInputError
from tasks.policy.run_key import events_fingerprint, pipeline_run_key


@pytest.fixture
def events(tmp_path):
    folder = tmp_path / "events"
    (folder / "day=1").mkdir(parents=True)
    (folder / "day=1" / "part-0.parquet").write_bytes(b"a" * 10)
    return folder


def test_fingerprint_follows_the_files(events):
    first = events_fingerprint(str(events))
    assert events_fingerprint(str(events)) == first
    part = events / "day=1" / "part-0.parquet"
    st = part.stat()
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched = events_fingerprint(str(events))
    assert touched != first
    (events / "day=1" / "part-1.parquet").write_bytes(b"b")
    assert events_fingerprint(str(events)) not in (first, touched)
    assert events_fingerprint(str(part)) != first
    with pytest.raises(HybridflowInputError, match="no such file"):
        events_fingerprint(str(events / "missing"))


def test_run_key_hashes_what_changes_outputs(events):
    params = PipelineParams(events=str(events))
    key = deployed_run_key(params, "/store")
    assert key.startswith("run-") and key == deployed_run_key(params, "/store")
    same_outputs = params.model_copy(update={"mode": "deployed"})
    assert deployed_run_key(same_outputs, "/store") == key
    assert deployed_run_key(params.model_copy(update={"horizon_days": 30}), "/store") != key
    assert deployed_run_key(params, "s3://bucket/store") != key
    assert deployed_run_key(params.model_copy(update={"run_id": "run-mine"}), "/s") == "run-mine"
    assert pipeline_run_key({"a": 1}, "fp") != pipeline_run_key({"a": 1}, "fp2")


def test_unknown_pipeline_parameters_are_refused_by_name(events):
    with pytest.raises(ValidationError, match="epochz"):
        PipelineParams(events=str(events), epochz=3)
