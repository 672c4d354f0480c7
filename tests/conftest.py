"""Shared fixtures: a real local Spark session, Prefect's test harness, small demo data."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from infra.prefect_env import configure_prefect_defaults  # noqa: E402 - before Prefect loads

configure_prefect_defaults(Path(tempfile.mkdtemp(prefix="hf-test-prefect-")))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# a command under test starts a temporary Prefect API and stops it at its exit, never a warm one
# that outlives it (the warm API's own tests enable it with a home of their own, and stop it)
os.environ["HYBRIDFLOW_WARM_API"] = "false"
os.environ.setdefault("HYBRIDFLOW_SPARK_DRIVER_MEMORY", "2g")
os.environ.setdefault("HYBRIDFLOW_SPARK_SHUFFLE_PARTITIONS", "4")

OUTPUT_DIR = Path(__file__).parent / "output"
# the order test files are handed to the test processes in: longest first
FILE_ORDER_BY_MARKER = ("e2e", "integration")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Hand the stack test files out first, then the integration files, then the rest (a file
    ranks by its slowest marker; its tests keep their order): with ``--dist loadfile
    --no-loadscope-reorder`` (``make test``) the minutes-long stack files start at once and the
    short files fill in around them, so both processes finish together. (xdist's own order,
    files with the most tests first, left the stacks for the end.)"""

    def marker_rank(item: pytest.Item) -> int:
        marks = {m.name for m in item.iter_markers()}
        return next(
            (i for i, m in enumerate(FILE_ORDER_BY_MARKER) if m in marks),
            len(FILE_ORDER_BY_MARKER),
        )

    file_rank: dict[Path, int] = {}
    for item in items:
        file_rank[item.path] = min(
            file_rank.get(item.path, len(FILE_ORDER_BY_MARKER)), marker_rank(item)
        )
    items.sort(key=lambda item: file_rank[item.path])


@pytest.fixture(scope="session")
def settings():
    """Settings as the tests run them (small Spark)."""
    from infra.settings import HybridflowSettings

    return HybridflowSettings()


@pytest.fixture(scope="session")
def spark(settings):
    """One local SparkSession for the whole test session."""
    from infra.spark import get_spark

    session = get_spark(settings)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API (SQLite) for every flow run in the session."""
    from prefect.testing.utilities import prefect_test_harness

    from infra.prefect_env import heartbeats_only_for_a_server

    with heartbeats_only_for_a_server(), prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def local_store(tmp_path):
    """A fresh folder store."""
    from infra.store import LocalFolderStore

    return LocalFolderStore(tmp_path / "store")


@pytest.fixture(scope="session")
def demo_events(tmp_path_factory) -> Path:
    """Small synthetic events (3,000 customers, two years) with the planted signal."""
    from tasks.data.demo_events import DemoDataParams, generate_demo_events

    out = tmp_path_factory.mktemp("demo") / "events"
    generate_demo_events(DemoDataParams(customers=3000, days=730, seed=11), out)
    return out


@pytest.fixture
def output_dir(request) -> Path:
    """A folder under tests/output for files a person may want to look at after the run."""
    path = OUTPUT_DIR / request.node.name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def passable_tmp():
    """A temporary folder other users may pass (0711): PostgreSQL runs as ``postgres`` when we
    are root, and pytest's own tmp is 0700."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="hf-"))
    os.chmod(base, 0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)
