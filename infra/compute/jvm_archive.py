"""A class-data-sharing archive of the local Spark driver's classes (the JDK's dynamic AppCDS),
mapped by every Spark JVM of this installation: local and client-mode drivers, and the master,
workers, Spark Connect server and executors of the cluster ``hybridflow up`` starts
(:mod:`infra.stack.spark_cluster`), which Spark's launcher gives the same class path.

Loading and linking Spark's classes is most of a local session's start and of its first
queries. Recorded once per installation (``hybridflow jvm-archive``; ``make install`` runs it),
the archive lets the JVM map them instead: on a 2-core box a session 4.3 -> 2.4 s, the first
validate of 8,265 CSV rows 5.5 -> 3.3 s. An archive is valid for one JDK, one set of Spark jars
and one class path: its name carries a key of the first two, and every local driver of this
installation runs with the same class path (an empty ``SPARK_CONF_DIR``: the JDK archives no
class path with a non-empty folder in it; the log configuration is passed as a system property
instead). A missing archive costs nothing but the time; a stale or broken one is refused by the JVM
(at most one warning line) and the run goes on without it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class ClassSharing:
    """How a local driver JVM starts: its ``SPARK_CONF_DIR`` and the options that go with it."""

    conf_dir: Path
    java_options: str


def java_binary() -> Path | None:
    """The ``java`` Spark will run (``JAVA_HOME`` first, like Spark's launcher)."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.exists():
        which = shutil.which("java")
        found = Path(which) if which else None
    return found.resolve() if found is not None else None


def archive_key() -> str:
    """What an archive is valid for: the JDK binary and the Spark jars (names and sizes)."""
    import pyspark

    digest = hashlib.sha256()
    java = java_binary()
    if java is not None:
        st = java.stat()
        digest.update(f"{java}:{st.st_size}:{int(st.st_mtime)}".encode())
    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else []:
        digest.update(f"{jar.name}:{jar.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def archive_path(folder: Path, key: str | None = None) -> Path:
    """Where the archive for this JDK and these jars lives in ``folder`` (it may not exist)."""
    return folder / f"spark-classes-{key or archive_key()}.jsa"


def conf_dir(folder: Path) -> Path:
    """The empty ``SPARK_CONF_DIR`` of every driver that records or maps an archive."""
    return folder / "conf"


def class_sharing(folder: Path, log4j_config: Path, record_to: Path | None = None) -> ClassSharing:
    """The driver's conf folder and JVM options: the archive in ``folder`` when there is one
    (or, with ``record_to``, record one there at the JVM's exit, quietly: the JDK warns about
    every class it cannot archive)."""
    conf = conf_dir(folder)
    conf.mkdir(parents=True, exist_ok=True)
    options = [f"-Dlog4j.configurationFile=file:{log4j_config}"]
    if record_to is not None:
        options += [
            f"-XX:ArchiveClassesAtExit={record_to}",
            "-Xlog:cds=off",
            "-Xlog:cds+dynamic=off",
        ]
    elif (archive := archive_path(folder)).exists():
        options.append(f"-XX:SharedArchiveFile={archive}")
    return ClassSharing(conf_dir=conf, java_options=" ".join(options))


def record_archive(
    folder: Path,
    start_session: Callable[[Path], SparkSession],
    workload: Callable[[SparkSession], None],
) -> Path:
    """Record the archive: a driver started by ``start_session(partial_path)`` runs ``workload``
    and exits, which writes the partial file; it becomes the archive by an atomic rename, so a
    concurrent run never maps half a file. Must run in a process without a Spark session."""
    final = archive_path(folder)
    partial = final.with_name(f"{final.name}.{os.getpid()}.partial")
    spark = start_session(partial)
    try:
        try:
            workload(spark)
        finally:
            jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
            spark.stop()
            jvm.stdin.close()  # the gateway exits at the end of its input: the archive is written
            jvm.wait(timeout=300)
        if not partial.exists() or partial.stat().st_size == 0:
            code = jvm.returncode
            raise RuntimeError(f"the JVM wrote no class archive at {partial} (exit code {code})")
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)  # a failed recording leaves nothing behind
    return final
