"""A Spark Connect client session: the CPU stages as a thin client of a long-lived cluster driver.

With ``HYBRIDFLOW_SPARK_REMOTE=sc://host:port`` a flow run starts no JVM of its own: it joins a
session on the Spark Connect server (about a second, against 5-36 s for a local driver JVM on a
busy 2-core box), sets the session's SQL settings and ships the project's Python to the executors
as one zip (``addArtifacts(..., pyfile=True)``), so executors run exactly the code of the client
that asked, whatever copy of hybridflow is installed next to them. Clients of one code version
share one server-side session, and with it its warm Python workers.

A Connect session has no ``sparkContext``: no accumulators, no RDDs. Helpers here answer the
questions the stages used to ask the SparkContext (parallelism, "is this a cluster?").
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.errors import HybridflowInputError
from infra.settings import HybridflowSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# the packages Python code on executors imports (scoring, the store for executor-side I/O)
SHIPPED_PACKAGES = ("tasks", "infra")
ARCHIVE_PREFIX = "hybridflow-code-"
SESSION_NAMESPACE = uuid.UUID("5f0c6a53-2f1e-4c3e-9a54-6b1f0e7d2a10")  # hybridflow's sessions


def project_root() -> Path:
    """The folder holding the project's top-level packages."""
    return Path(__file__).resolve().parents[2]


def _package_files(root: Path) -> list[Path]:
    files = [
        f
        for package in SHIPPED_PACKAGES
        for f in (root / package).rglob("*.py")
        if "__pycache__" not in f.parts
    ]
    return sorted(files)


def code_archive(out_dir: Path, root: Path | None = None) -> Path:
    """A zip of the shipped packages, named by the sha256 of its contents (built once per code
    version). Holds folder entries too, so namespace packages (no ``__init__.py``) import from it.
    """
    root = root or project_root()
    files = _package_files(root)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    target = out_dir / f"{ARCHIVE_PREFIX}{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{time.time_ns()}.tmp")
    folders = sorted({p.as_posix() for f in files for p in f.relative_to(root).parents} - {"."})
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for folder in folders:
            archive.writestr(zipfile.ZipInfo(folder + "/", date_time=(1980, 1, 1, 0, 0, 0)), "")
        for f in files:
            info = zipfile.ZipInfo(f.relative_to(root).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(info, f.read_bytes(), zipfile.ZIP_DEFLATED)
    tmp.replace(target)
    return target


def shared_session_url(remote: str, archive: Path) -> str:
    """``remote`` with a session id shared by every client of this code version (unless the URL
    names one): the server keeps that session's Python workers warm between flow runs."""
    if "session_id=" in remote:
        return remote
    session = uuid.uuid5(SESSION_NAMESPACE, f"{remote}|{archive.name}")
    base = remote if "/;" in remote else remote.rstrip("/") + "/"
    return f"{base};session_id={session}"


def connect_session(settings: HybridflowSettings, conf: dict[str, str]) -> SparkSession:
    """This process's Spark Connect session on ``settings.spark_remote`` (created once): the
    modifiable entries of ``conf`` applied, the project's code shipped with it.

    Every client of the same code version joins one server-side session (see
    :func:`shared_session_url`): Spark gives each session its own Python workers on every
    executor, so a session per flow run would start them cold each time (and leave a Python
    daemon behind per session). A session the server closed (idle timeout, restart) is replaced
    by a fresh one."""
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    remote = settings.spark_remote or ""
    if not remote.startswith("sc://"):
        raise HybridflowInputError(
            f"HYBRIDFLOW_SPARK_REMOTE must be a Spark Connect URL sc://host:port, got {remote!r}"
        )
    started = time.perf_counter()
    archive = code_archive(settings.work_dir.expanduser() / "spark")
    spark = SparkSession.builder.remote(shared_session_url(remote, archive)).getOrCreate()
    if getattr(spark, "_hybridflow_ready", False):
        return spark
    try:
        modifiable = {k: v for k, v in conf.items() if spark.conf.isModifiable(k)}
    except PySparkException as exc:
        if "SESSION_CLOSED" not in str(exc):
            raise
        log.warning("the shared Spark Connect session was closed; opening a new one")
        spark = SparkSession.builder.remote(remote).create()
        modifiable = {k: v for k, v in conf.items() if spark.conf.isModifiable(k)}
    for key, value in modifiable.items():
        spark.conf.set(key, value)
    spark.addArtifacts(str(archive), pyfile=True)  # a no-op when the session has it already
    spark._hybridflow_ready = True  # type: ignore[attr-defined]
    log.info("Spark Connect session on %s ready in %.1fs", remote, time.perf_counter() - started)
    return spark


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (no sparkContext, no accumulators)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return isinstance(spark, ConnectSession)


def default_parallelism(spark: Any) -> int:
    """Cores the session's executors offer: the SparkContext's figure, or on Spark Connect the
    server's ``spark.default.parallelism`` (``hybridflow up`` sets it), else the shuffle
    partitions."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    value = spark.conf.get("spark.default.parallelism", None) or spark.conf.get(
        "spark.sql.shuffle.partitions", "2"
    )
    return max(1, int(value))


def runs_on_cluster(spark: Any) -> bool:
    """True when executors are separate processes (a Connect server, or a non-local master)."""
    if is_connect(spark):
        return True
    return not str(spark.sparkContext.master).startswith("local")
