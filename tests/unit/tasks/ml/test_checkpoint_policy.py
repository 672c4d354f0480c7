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
