"""The stack's Spark cluster: a standalone master, its workers and a Spark Connect server, all
from the pyspark wheel (``bin/spark-class``, ``jars/spark-connect_*.jar``), on 127.0.0.1.

The Connect server is the cluster's one long-lived driver: the cpu-pool's flow runs open client
sessions on it (``HYBRIDFLOW_SPARK_REMOTE``) instead of starting a JVM each, and its executors
(one per worker, launched by the workers) stay warm between runs. docs/cluster.md has the
measurements behind this choice.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

from infra.compute.jvm_archive import ClassSharing, class_sharing
from infra.compute.spark import CONF_DIR, QUICK_JIT_OPTIONS
from infra.errors import HybridflowInputError
from infra.routing.pools import CPU_POOL
from infra.settings import HybridflowSettings
from infra.stack.processes import Launcher, ProcessRecord, Ready, is_alive, stop
from infra.stack.services import free_port, wait_http_ok

MASTER, CONNECT = "spark-master", "spark-connect"
APP_NAME = "hybridflow-connect"
SPARK_POOL = CPU_POOL  # the work pool whose flow runs use the cluster
SESSION_TIMEOUT = "7d"
DAEMON_MEMORY = "256m"  # master and worker JVMs only schedule; executors get the worker memory
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DAEMON_PROPERTIES = {
    "spark.master.rest.enabled": "false",  # its fixed port 6066 would clash between stacks
    "spark.worker.cleanup.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
}


class SparkClusterSpec(BaseModel):
    """Size of the cluster `up` starts."""

    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    driver_memory: str = "1g"
    # every JVM of the cluster: master, workers, their executors, the Connect server; "" = the
    # JVM's defaults
    java_options: str = QUICK_JIT_OPTIONS
    # the installation's JVM class archive folder (infra.compute.jvm_archive): every JVM of the
    # cluster maps the archive its local drivers map; None = no archive, Spark's own class path
    class_archive_dir: Path | None = None

    def jvm(self) -> ClassSharing:
        """``SPARK_CONF_DIR`` and JVM options of every JVM of the cluster: ``java_options``, and
        the class archive's set-up when there is a folder for one. The daemons, the Connect
        server and the executors all run with the local driver's class path (the conf folder,
        Spark's jars), so they map the one archive ``hybridflow jvm-archive`` recorded."""
        if self.class_archive_dir is None:
            return ClassSharing(conf_dir=CONF_DIR, java_options=self.java_options)
        sharing = class_sharing(self.class_archive_dir, CONF_DIR / "log4j2.properties")
        options = f"{self.java_options} {sharing.java_options}".strip()
        return ClassSharing(conf_dir=sharing.conf_dir, java_options=options)

    @property
    def cores(self) -> int:
        """Cores of all workers together (the Connect server's default parallelism)."""
        return self.workers * self.worker_cores


def spark_spec(settings: HybridflowSettings, workers: int | None = None) -> SparkClusterSpec:
    """The cluster size from the settings (``workers`` overrides; 0: no cluster)."""
    if workers is not None and workers < 0:
        raise HybridflowInputError(f"--spark-workers must be 0 or more, got {workers}")
    return SparkClusterSpec(
        workers=settings.stack_spark_workers if workers is None else workers,
        worker_cores=settings.stack_spark_worker_cores,
        worker_memory=settings.stack_spark_worker_memory,
        driver_memory=settings.stack_spark_driver_memory,
        java_options=QUICK_JIT_OPTIONS
        if settings.stack_spark_java_options is None
        else settings.stack_spark_java_options,
        class_archive_dir=settings.class_archive_dir() if settings.spark_class_archive else None,
    )


class SparkEndpoints(BaseModel):
    """Where the cluster listens (all on 127.0.0.1)."""

    master_url: str
    master_ui: str
    remote: str
    app_ui: str
    workers: int
    store_env: str | None = None  # the S3 endpoint the executors were started with


def worker_key(index: int) -> str:
    """The stack-state key of the ``index``-th worker (1-based)."""
    return f"spark-worker-{index}"


def spark_home() -> Path:
    """The pyspark package folder: what the wheel ships (bin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def daemon_env(base: dict[str, str], spec: SparkClusterSpec) -> dict[str, str]:
    """Environment of the cluster's JVMs: loopback, quiet logs, this venv's Python for workers,
    the spec's JVM options for the master and workers (the executors inherit the conf folder)."""
    jvm = spec.jvm()
    return base | {
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": str(jvm.conf_dir),
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": jvm.java_options,
        "PYSPARK_PYTHON": sys.executable,
    }


def write_properties(stack_dir: Path) -> Path:
    """The daemons' Spark properties file (no secrets in it)."""
    path = stack_dir / "spark" / "daemons.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k} {v}\n" for k, v in DAEMON_PROPERTIES.items()))
    return path


def master_command(port: int, ui_port: int, properties: Path) -> list[str]:
    """The standalone master."""
    return [
        str(spark_home() / "bin" / "spark-class"),
        "org.apache.spark.deploy.master.Master",
        *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)),
        *("--properties-file", str(properties)),
    ]


def worker_command(
    master_url: str, spec: SparkClusterSpec, work_dir: Path, properties: Path
) -> list[str]:
    """One standalone worker (its executors are its child processes)."""
    return [
        str(spark_home() / "bin" / "spark-class"),
        "org.apache.spark.deploy.worker.Worker",
        *("--host", "127.0.0.1", "--webui-port", "0"),
        *("--cores", str(spec.worker_cores), "--memory", spec.worker_memory),
        *("--work-dir", str(work_dir), "--properties-file", str(properties)),
        master_url,
    ]


def connect_command(master_url: str, port: int, ui_port: int, spec: SparkClusterSpec) -> list[str]:
    """The Spark Connect server: a client-mode driver on the cluster, gRPC on loopback."""
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.port": str(ui_port),
        "spark.ui.showConsoleProgress": "false",
        "spark.executor.memory": spec.worker_memory,
        "spark.default.parallelism": str(spec.cores),
        "spark.python.worker.reuse": "true",
        # clients of one code version share a session (infra.compute.spark_connect), and with it the
        # Python workers Spark keeps per session: a week of idling before the server closes it
        "spark.connect.session.manager.defaultSessionTimeout": SESSION_TIMEOUT,
        "spark.pyspark.python": sys.executable,
        "spark.sql.session.timeZone": "UTC",
    }
    if java_options := spec.jvm().java_options:
        conf["spark.driver.extraJavaOptions"] = java_options
        conf["spark.executor.extraJavaOptions"] = java_options
    return [
        str(spark_home() / "bin" / "spark-submit"),
        *("--class", CONNECT_CLASS, "--name", APP_NAME, "--master", master_url),
        *("--driver-memory", spec.driver_memory),
        *[arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")],
        "spark-internal",
    ]


def master_status(master_ui: str, timeout_s: float = 3.0) -> dict[str, Any] | None:
    """The master's JSON status (workers, applications), None when it does not answer."""
    try:
        response = httpx.get(f"{master_ui}/json/", timeout=timeout_s)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def application_executors(app_ui: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The Connect application's executors (Spark's REST API), without the driver."""
    apps = httpx.get(f"{app_ui}/api/v1/applications", timeout=timeout_s).json()
    if not apps:
        return []
    url = f"{app_ui}/api/v1/applications/{apps[0]['id']}/executors"
    return [e for e in httpx.get(url, timeout=timeout_s).json() if e["id"] != "driver"]


def _wait(what: str, probe: Any, timeout_s: float, record: ProcessRecord) -> None:
    """Poll ``probe`` while ``record``'s process lives; errors carry its log's tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and is_alive(record):
        if probe():
            return
        time.sleep(0.5)
    text = Path(record.log_file).read_text(errors="replace").strip().splitlines()
    tail = [line for line in text if not line.lstrip().startswith(("at ", "..."))][-4:]
    state = "did not get ready" if is_alive(record) else "exited"
    raise RuntimeError(f"{what} {state} within {timeout_s:.0f}s: {' | '.join(tail)}")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _executors_up(app_ui: str, count: int) -> bool:
    try:
        return len(application_executors(app_ui, timeout_s=2.0)) >= count
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def _master_ready(master_ui: str) -> Ready:
    def ready(record: ProcessRecord) -> None:
        wait_http_ok(f"{master_ui}/json/", 120, "Spark master", Path(record.log_file))

    return ready


def _workers_registered(master_ui: str, count: int) -> Ready:
    def ready(record: ProcessRecord) -> None:
        _wait(
            f"Spark worker {count}",
            lambda: (master_status(master_ui) or {}).get("aliveworkers", 0) >= count,
            120,
            record,
        )

    return ready


def _connect_ready(port: int, app_ui: str, executors: int) -> Ready:
    def ready(record: ProcessRecord) -> None:
        _wait("Spark Connect server", lambda: _port_open(port), 180, record)
        _wait(
            "the Connect server's executors", lambda: _executors_up(app_ui, executors), 180, record
        )

    return ready


def start_standalone(
    launch: Launcher, stack_dir: Path, spec: SparkClusterSpec, env: dict[str, str]
) -> tuple[str, str]:
    """Start the master and ``spec.workers`` workers through ``launch`` (which records each
    process as it starts); returns the master URL and UI once every worker registered."""
    env, properties = daemon_env(env, spec), write_properties(stack_dir)
    port, ui_port = free_port(), free_port()
    master_url, master_ui = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}"
    launch(MASTER, master_command(port, ui_port, properties), env, _master_ready(master_ui))
    for i in range(1, spec.workers + 1):
        command = worker_command(master_url, spec, stack_dir / "spark" / f"work-{i}", properties)
        launch(worker_key(i), command, env, _workers_registered(master_ui, i))
    return master_url, master_ui


def start_connect_server(
    launch: Launcher, master_url: str, spec: SparkClusterSpec, env: dict[str, str]
) -> tuple[str, str]:
    """Start the Spark Connect server on the cluster; returns its sc:// URL and its driver UI
    once its executors run (so the first session finds them up)."""
    port, app_port = free_port(), free_port()
    app_ui = f"http://127.0.0.1:{app_port}"
    driver_env = {
        k: v for k, v in daemon_env(env, spec).items() if not k.startswith("SPARK_DAEMON_")
    }
    command = connect_command(master_url, port, app_port, spec)
    launch(CONNECT, command, driver_env, _connect_ready(port, app_ui, spec.workers))
    return f"sc://127.0.0.1:{port}", app_ui


def start_cluster(
    launch: Launcher, stack_dir: Path, spec: SparkClusterSpec, env: dict[str, str]
) -> SparkEndpoints:
    """Master, workers and the Connect server, each recorded by ``launch`` as it starts (a
    part that fails is stopped; those before it stay recorded for `down` or the next `up`)."""
    master_url, master_ui = start_standalone(launch, stack_dir, spec, env)
    remote, app_ui = start_connect_server(launch, master_url, spec, env)
    return SparkEndpoints(
        master_url=master_url,
        master_ui=master_ui,
        remote=remote,
        app_ui=app_ui,
        workers=spec.workers,
    )


def stop_rank(key: str) -> int:
    """Stopping order within the cluster: the driver, then the workers, the master last."""
    return 0 if key == CONNECT else 2 if key == MASTER else 1


def cluster_keys(processes: dict[str, ProcessRecord]) -> list[str]:
    """The stack-state keys of the cluster's processes, in stopping order."""
    return sorted((k for k in processes if k.startswith("spark-")), key=lambda k: (stop_rank(k), k))


def stop_cluster(processes: dict[str, ProcessRecord]) -> list[str]:
    """Stop the cluster's recorded processes (and their executors); a line per process."""
    return [
        f"{key} (pid {processes[key].pid}): {stop(processes[key], grace_s=10.0)}"
        for key in cluster_keys(processes)
    ]


def cluster_alive(processes: dict[str, ProcessRecord], workers: int) -> bool:
    """True when the master, ``workers`` workers and the Connect server all run."""
    wanted = [MASTER, CONNECT, *(worker_key(i) for i in range(1, workers + 1))]
    return all(k in processes and is_alive(processes[k]) for k in wanted)


def status_lines(endpoints: SparkEndpoints) -> list[str]:
    """What `hybridflow status` says about the cluster (from the master's JSON)."""
    status = master_status(endpoints.master_ui)
    head = f"Spark master {endpoints.master_url} (UI {endpoints.master_ui})"
    if status is None:
        return [f"{head}: NOT ANSWERING"]
    alive = status.get("aliveworkers", 0)
    apps = [f"{a['name']} ({a['cores']} cores)" for a in status.get("activeapps", [])]
    lines = [
        f"{head}: {alive} of {endpoints.workers} workers alive, {status.get('cores', 0)} cores",
        f"Spark Connect {endpoints.remote} (driver UI {endpoints.app_ui}); "
        f"applications: {', '.join(apps) or 'none'}",
    ]
    for worker in status.get("workers", []):
        lines.append(
            f"  spark worker {worker['host']}:{worker['port']} {worker['state']} "
            f"{worker['coresused']}/{worker['cores']} cores, UI {worker['webuiaddress']}"
        )
    return lines
