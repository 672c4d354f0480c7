"""A profiling run measures the pipeline on a sample and teaches the router about this pool."""

from __future__ import annotations

import pytest

from flows.dag import ROUTED_STAGES
from flows.profiling import ProfileParams, profile_flow
from infra.routing.profiles import read_profiles
from infra.settings import HybridflowSettings
from infra.storage.registry import ModelRegistry
from tasks.policy.planning import plan_pipeline

pytestmark = pytest.mark.integration


def test_profiling_run_records_profiles_and_leaves_no_model(
    prefect_harness, spark, demo_events, local_store
):
    before = plan_pipeline(
        str(demo_events), HybridflowSettings(), local_store, stages=ROUTED_STAGES
    )
    assert all(d.basis.startswith("rule:") for d in before.decisions)

    result = profile_flow(
        ProfileParams(events=str(demo_events), sample_fraction=0.4, store=local_store.uri)
    )
    families = HybridflowSettings().train.families  # one contender unit each, profiled too
    assert result.pool == "cpu-pool" and result.profiles == 5 + len(families)
    assert 0 < result.sample_rows
    profiles = read_profiles(local_store)
    assert sorted(p.stage for p in profiles) == sorted(
        ["validate", "features", "preprocess", "train", "batch_inference"]
        + [f"contender-{family}" for family in families]
    )
    assert {p.pool for p in profiles} == {"cpu-pool"} and all(p.seconds > 0 for p in profiles)
    assert ModelRegistry(local_store).list_versions() == []  # the sample run used a scratch store

    after = plan_pipeline(str(demo_events), HybridflowSettings(), local_store, stages=ROUTED_STAGES)
    for d in after.decisions:
        cpu = next(e for e in d.estimates if e.pool == "cpu-pool")
        assert cpu.from_profile and cpu.seconds > 0 and cpu.cost_usd > 0
        assert d.profile_missing_on == ["gpu-pool"]
