"""When checkpoints are due."""

from __future__ import annotations

import time

from tasks.ml.checkpoints import CheckpointPolicy


def test_checkpoint_policy_fires_on_steps_and_on_elapsed_time():
    by_steps = CheckpointPolicy(every_steps=50, every_seconds=0)
    assert [s for s in range(1, 151) if by_steps.due(s)] == [50, 100, 150]
    by_time = CheckpointPolicy(every_steps=0, every_seconds=0.05)
    assert not by_time.due(1)
    time.sleep(0.06)
    assert by_time.due(2)
    by_time.mark(2)
    assert not by_time.due(3) and by_time.last_step_saved == 2


def test_by_default_checkpoints_follow_training_time_not_steps(monkeypatch):
    from infra.settings import CheckpointSettings
    from tasks.ml import checkpoints

    clock = [1000.0]
    monkeypatch.setattr(checkpoints.time, "monotonic", lambda: clock[0])
    policy = CheckpointPolicy.of(CheckpointSettings())
    # thousands of fast steps within the interval write nothing (2,000 steps did before)
    assert not any(policy.due(step) for step in range(1, 10_001))
    clock[0] += CheckpointSettings().every_seconds
    assert policy.due(10_001)
    policy.mark(10_001)
    assert not policy.due(10_002)
    clock[0] += CheckpointSettings().every_seconds - 1
    assert not policy.due(50_000)
    clock[0] += 1
    assert policy.due(50_001)
