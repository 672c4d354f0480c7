"""Shared fixtures: a real local Spark session, Prefect's test harness, small demo data."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from infra.prefect_runtime.env import configure_prefect_defaults  # noqa: E402 - before Prefect loads

configure_prefect_defaults(Path(tempfile.mkdtemp(prefix="hf-test-prefect-")))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# a command under test starts a temporary Prefect API and stops it at its exit, never a warm one
# that outlives it (the warm API's own tests enable it with a home of their own, and stop it)
os.environ["HYBRIDFLOW_WARM_API"] = "false"
os.environ.setdefault("HYBRIDFLOW_SPARK_DRIVER_MEMORY", "2g")
os.environ.setdefault("HYBRIDFLOW_SPARK_SHUFFLE_PARTITIONS", "4")

OUTPUT_DIR = Path(__file__).parent / "output"
# the order test files are handed to the test processes in: longest first (a file with a
# `slow` test before the other integration files: docs/testing.md lists them and why)
FILE_ORDER_BY_MARKER = ("e2e", "slow", "integration")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Hand the stack test files out first, then the files with a ``slow`` test, then the other
    integration files, then the rest (a file ranks by its slowest marker; its tests keep their
    order): with ``--dist loadfile --no-loadscope-reorder`` (``make test``) the minutes-long
    stack files start at once and the short files fill in around them, so both processes finish
    together. (xdist's own order, files with the most tests first, left the stacks for the
    end.) A ``slow`` marker must say why (``reason=``)."""

    def marker_rank(item: pytest.Item) -> int:
        marks = {m.name for m in item.iter_markers()}
        return next(
            (i for i, m in enumerate(FILE_ORDER_BY_MARKER) if m in marks),
            len(FILE_ORDER_BY_MARKER),
        )

    file_rank: dict[Path, int] = {}
    for item in items:
        for mark in item.iter_markers("slow"):
            if not mark.kwargs.get("reason"):
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.slow needs a reason=")
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
    from infra.compute.spark import get_spark

    session = get_spark(settings)
    yield session
    session.stop()


# Spark for tiny inputs whose cost is Spark's planning, not their rows: one shuffle partition, no
# adaptive re-planning, expressions interpreted instead of compiled (a wide examples query at three
# origins: about 9 -> 4 s of CPU each). The answers are Spark's either way; the stage, pipeline,
# parity-at-stage and job-budget tests run Spark as hybridflow configures it.
TINY_INPUT_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


@pytest.fixture
def tiny_spark(spark):
    """The session's Spark with :data:`TINY_INPUT_SPARK_CONF` for one test (restored after)."""
    before = {key: spark.conf.get(key, None) for key in TINY_INPUT_SPARK_CONF}
    for key, value in TINY_INPUT_SPARK_CONF.items():
        spark.conf.set(key, value)
    try:
        yield spark
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API (SQLite) for every flow run in the session."""
    from prefect.testing.utilities import prefect_test_harness

    from infra.prefect_runtime.env import heartbeats_only_for_a_server

    with heartbeats_only_for_a_server(), prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def session_api_url(prefect_harness) -> str:
    """The URL of the session's Prefect API (:func:`prefect_harness`), for a ``hybridflow``
    subprocess whose test is not about the command's own API: with ``PREFECT_API_URL`` set the
    command starts none (a temporary API costs it ~8-10 s of CPU). Tests about the temporary
    API (it starts, it stops, it dies with the command) leave it unset."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "prefect_harness set no API URL"
    return url


@pytest.fixture
def local_store(tmp_path):
    """A fresh folder store."""
    from infra.storage.store import LocalFolderStore

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
