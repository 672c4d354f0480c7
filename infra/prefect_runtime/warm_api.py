"""A warm Prefect API that outlives one command: started once, found again by the next.

Without ``PREFECT_API_URL`` every command that runs flows used to start Prefect's temporary API
(a uvicorn subprocess: Prefect's server imports and its database checks, 4 s on an idle 2-core
box, 17-22 s on a busy one) and stop it at exit. The warm API is the same server (Prefect's
ephemeral mode: no UI, the same background services, on 127.0.0.1), started detached by the
first command and recorded in ``$PREFECT_HOME/warm-api/api.json`` (PID and its start time, port,
Prefect version, interpreter, a hash of the database URL); the next command finds it there,
checks it and uses it at once.

- One per Prefect home (so per database): every decision to reuse, replace or start one is
  taken under an exclusive ``flock`` on ``warm-api/api.lock``, so two commands racing start one.
- A recorded server whose process is gone, whose PID now names another process, or that runs
  another Prefect version, interpreter or database is replaced: stopped by its PID when it still
  runs and no running command holds it (else it stops by itself once they end: the record no
  longer names it); so is one that does not answer its health check once it is older than the
  start-up timeout, unless a running command holds it.
- Each command using it holds a lease (``warm-api/users/<pid>``, removed at exit; a dead
  holder's lease does not count). The server stops itself once no lease is live and it served
  no request for ``HYBRIDFLOW_WARM_API_IDLE_SECONDS`` (:mod:`infra.prefect_runtime.warm_server`);
  ``hybridflow down`` stops it (:func:`stop_warm_api`). Its output goes to ``warm-api/api.log``.
- ``HYBRIDFLOW_WARM_API=false``: a temporary API per command, as before (the test suite's
  default, so that no test leaves a server behind).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from infra.stack.processes import ProcessRecord, is_alive, start_ticks, stop

log = logging.getLogger(__name__)

STATE_DIR = "warm-api"
RECORD_FILE = "api.json"
LOCK_FILE = "api.lock"
LOG_FILE = "api.log"
USERS_DIR = "users"
SERVER_MODULE = "infra.prefect_runtime.warm_server"
HEALTH_PROBE_S = 5.0  # a busy box may take seconds to answer a health check


class WarmApiRecord(BaseModel):
    """What ``api.json`` says about the warm API: enough to find, check and stop it."""

    pid: int
    start_ticks: int | None
    port: int
    prefect_version: str
    python: str
    database: str
    started_at: float
    idle_seconds: float
    log_file: str

    @property
    def url(self) -> str:
        """The API's base URL."""
        return f"http://127.0.0.1:{self.port}/api"

    def process(self) -> ProcessRecord:
        """As the stack's process record (alive only while the PID names the same process)."""
        return ProcessRecord(
            name="warm-prefect-api",
            pid=self.pid,
            start_ticks=self.start_ticks,
            command=[],
            log_file=self.log_file,
        )


def prefect_home() -> Path:
    """The Prefect home this process's settings name (``PREFECT_HOME`` or the profile's)."""
    from prefect.settings import get_current_settings

    return Path(get_current_settings().home).expanduser().resolve()


def state_dir(home: Path | None = None) -> Path:
    """Where the warm API of ``home`` (default: this process's Prefect home) is recorded."""
    return (home or prefect_home()) / STATE_DIR


@contextlib.contextmanager
def locked(folder: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold the exclusive lock of ``folder``; with ``wait=False`` yields False at once when
    another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def read_record(folder: Path) -> WarmApiRecord | None:
    """The recorded warm API, None when none (or an unreadable record) is there."""
    try:
        return WarmApiRecord.model_validate_json((folder / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_record(folder: Path, record: WarmApiRecord) -> None:
    """Record ``record`` (whole or not at all)."""
    partial = folder / f".{RECORD_FILE}.{os.getpid()}"
    partial.write_text(record.model_dump_json())
    os.replace(partial, folder / RECORD_FILE)


def forget_record(folder: Path, pid: int) -> None:
    """Remove the record if it still names ``pid``."""
    record = read_record(folder)
    if record is not None and record.pid == pid:
        (folder / RECORD_FILE).unlink(missing_ok=True)


def database_key() -> str:
    """A hash of the database URL a server started from this process would open (no secret
    is written to the record)."""
    from prefect.settings import Settings

    url = Settings().server.database.connection_url
    value = url.get_secret_value() if url is not None else ""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def identity() -> dict[str, str]:
    """What a reusable server must share with this process."""
    return {
        "prefect_version": importlib.metadata.version("prefect"),
        "python": sys.executable,
        "database": database_key(),
    }


def answers(url: str, timeout_s: float = HEALTH_PROBE_S) -> bool:
    """Whether ``url``'s ``/health`` answers 200 within ``timeout_s``."""
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


# --- leases: the commands using the server -------------------------------------------------


def lease_path(folder: Path, pid: int) -> Path:
    """The lease file of process ``pid``."""
    return folder / USERS_DIR / str(pid)


def take_lease(folder: Path, server_pid: int) -> Path:
    """Record that this process (its PID and start time) uses the server ``server_pid``."""
    path = lease_path(folder, os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{start_ticks(os.getpid())} {server_pid}")
    return path


def live_leases(folder: Path, server_pid: int | None = None) -> list[int]:
    """PIDs of the processes holding a lease (on ``server_pid``, when given) that still run;
    dead holders' leases are removed."""
    live = []
    for path in sorted((folder / USERS_DIR).glob("*")):
        try:
            ticks, server = (int(v) for v in path.read_text().split())
            pid = int(path.name)
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        holder = ProcessRecord(name="lease", pid=pid, start_ticks=ticks, command=[], log_file="")
        if not is_alive(holder):
            path.unlink(missing_ok=True)
        elif server_pid is None or server == server_pid:
            live.append(pid)
    return live


# --- the server ------------------------------------------------------------------------------


def why_not_reuse(
    record: WarmApiRecord, wanted: dict[str, str], startup_timeout_s: float, folder: Path
) -> str | None:
    """Why the recorded server cannot serve this process (None: it can)."""
    if not is_alive(record.process()):
        return "its process is gone"
    for key, value in wanted.items():
        if getattr(record, key) != value:
            return f"it runs another {key.replace('_', ' ')} ({getattr(record, key)})"
    if answers(record.url):
        return None
    if time.time() - record.started_at < startup_timeout_s:
        return None  # still starting: the caller waits for it
    if live_leases(folder, record.pid):
        return None  # hung or busy, but in use: not ours to stop
    return "it did not answer its health check"


def launch(folder: Path, idle_seconds: float, wanted: dict[str, str]) -> WarmApiRecord:
    """Start the server detached (its own session, so that neither this process's end nor a
    Ctrl-C in its terminal stops it) on a socket bound here, so its port is known at once."""
    from infra.prefect_runtime.api import server_env

    log_file = folder / LOG_FILE
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)  # a request before the server accepts waits in the backlog
        port = int(sock.getsockname()[1])
        command = [
            sys.executable,
            "-m",
            SERVER_MODULE,
            "--fd",
            str(sock.fileno()),
            "--state-dir",
            str(folder),
            "--idle-seconds",
            str(idle_seconds),
        ]
        env = server_env() | {"PREFECT_HOME": str(folder.parent)}
        with open(log_file, "ab") as out:
            process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(sock.fileno(),),
                start_new_session=True,
            )
    log.info("started a warm Prefect API on http://127.0.0.1:%s (pid %s)", port, process.pid)
    return WarmApiRecord(
        pid=process.pid,
        start_ticks=start_ticks(process.pid),
        port=port,
        started_at=time.time(),
        idle_seconds=idle_seconds,
        log_file=str(log_file),
        **wanted,
    )


class WarmApi:
    """This process's use of the warm API: its URL, a wait until it answers, the lease."""

    def __init__(self, record: WarmApiRecord, folder: Path, started: bool) -> None:
        self.record = record
        self.folder = folder
        self.started = started
        self._ready = False

    @property
    def url(self) -> str:
        """The API's base URL."""
        return self.record.url

    def wait_ready(self, timeout_s: float) -> None:
        """Block until ``/health`` answers 200; a server that exits or never answers is an
        error naming its log."""
        deadline = time.monotonic() + timeout_s
        while not self._ready:
            self._ready = answers(self.url, timeout_s=2.0)
            if self._ready:
                return
            if not is_alive(self.record.process()):
                raise RuntimeError(
                    f"the warm Prefect API (pid {self.record.pid}) exited; its log is "
                    f"{self.record.log_file}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the warm Prefect API did not answer on {self.url} within {timeout_s:.0f} s "
                    f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); its log is "
                    f"{self.record.log_file}"
                )
            time.sleep(0.05)

    def release(self) -> None:
        """This process no longer uses the server (at exit; the server keeps running)."""
        lease_path(self.folder, os.getpid()).unlink(missing_ok=True)


def attach(idle_seconds: float, startup_timeout_s: float, home: Path | None = None) -> WarmApi:
    """The warm API of this Prefect home, reused or (re)started, with this process's lease."""
    from infra.prefect_runtime.database import configured_sqlite_file, seed_database, template_path

    folder = state_dir(home)
    wanted = identity()
    with locked(folder):
        record = read_record(folder)
        started = False
        reason = "none recorded" if record is None else None
        if record is not None:
            reason = why_not_reuse(record, wanted, startup_timeout_s, folder)
            if reason is not None:
                log.info("replacing the warm Prefect API (pid %s): %s", record.pid, reason)
                if not live_leases(folder, record.pid):  # else it stops when they end
                    stop(record.process(), grace_s=5.0)
        if reason is not None:
            seed_database(configured_sqlite_file(), template_path())
            record = launch(folder, idle_seconds, wanted)
            write_record(folder, record)
            started = True
        assert record is not None
        take_lease(folder, record.pid)
    return WarmApi(record, folder, started)


def stop_warm_api(home: Path | None = None) -> str:
    """Stop the warm API of ``home`` (by its recorded PID); one line saying what happened."""
    folder = state_dir(home)
    if not folder.is_dir():
        return "warm Prefect API: none recorded"
    with locked(folder):
        record = read_record(folder)
        if record is not None:
            (folder / RECORD_FILE).unlink(missing_ok=True)
    if record is None:
        return "warm Prefect API: none recorded"
    outcome = stop(record.process(), grace_s=10.0)
    return f"warm Prefect API (pid {record.pid}, {record.url}): {outcome}"


def running_record(home: Path | None = None) -> WarmApiRecord | None:
    """The recorded warm API when its process runs, else None."""
    record = read_record(state_dir(home))
    return record if record is not None and is_alive(record.process()) else None
