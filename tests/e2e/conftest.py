"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def stack_dir(passable_tmp):
    """The stack's folder, where PostgreSQL's own user may pass."""
    return passable_tmp / "stack"


@pytest.fixture
def stack_base_env(tmp_path, stack_dir) -> dict[str, str]:
    """This process's environment for a stack of its own: no inherited API or AWS settings,
    the stack's folder and a free port for its Prefect server, small Spark. Each test adds its
    own settings on top."""
    from infra.stack.services import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "AWS_"))}
    env.update(
        HYBRIDFLOW_STACK_DIR=str(stack_dir),
        HYBRIDFLOW_WORK_DIR=str(tmp_path / "work"),
        HYBRIDFLOW_SPARK_DRIVER_MEMORY="2g",
        HYBRIDFLOW_SPARK_SHUFFLE_PARTITIONS="4",
        PORT=str(free_port()),
    )
    return env
