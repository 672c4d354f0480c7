"""The stack's PostgreSQL for the Prefect server, from the machine's server binaries.

``initdb`` into ``<stack dir>/postgres/data`` on the first `up` (a second `up` reuses it), the
server on 127.0.0.1 at a free port with no Unix socket, password authentication only. The
password is generated once and kept in ``<stack dir>/postgres/password`` (mode 0600); it reaches
``initdb`` through a 0600 file and the Prefect server through that process's environment only,
never a command line, ``stack.json``, a log or an artifact. PostgreSQL refuses to run as root:
then it runs as the ``postgres`` system user (Debian's package creates it).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import time
from pathlib import Path

from pydantic import BaseModel

from infra.errors import HybridflowInputError
from infra.stack.processes import Launcher, ProcessRecord
from infra.stack.services import free_port, port_in_use

KEY = "postgres"
ROLE = "hybridflow"
DATABASE = "prefect"
SYSTEM_USER = "postgres"
BIN_ROOT = Path("/usr/lib/postgresql")
INSTALL_HINT = (
    "install the PostgreSQL server (Debian/Ubuntu: apt-get install postgresql; `make up` does it) "
    "or start the stack on SQLite with --db sqlite"
)


class DatabaseInfo(BaseModel):
    """The Prefect server's database as recorded in stack.json (never the password)."""

    kind: str
    location: str
    port: int | None = None

    def describe(self) -> str:
        """One line for `hybridflow status`."""
        if self.kind == "postgres":
            return f"PostgreSQL {ROLE}@127.0.0.1:{self.port}/{DATABASE} (data {self.location})"
        return f"SQLite {self.location}"


def bin_dir() -> Path:
    """The newest installed PostgreSQL server's bin folder (needs initdb and postgres)."""
    versions = sorted(
        (p for p in BIN_ROOT.glob("*/bin") if re.fullmatch(r"\d+", p.parent.name)),
        key=lambda p: int(p.parent.name),
    )
    found = [p for p in versions if (p / "initdb").is_file() and (p / "postgres").is_file()]
    if found:
        return found[-1]
    initdb = shutil.which("initdb")
    if initdb and (Path(initdb).resolve().parent / "postgres").is_file():
        return Path(initdb).resolve().parent
    raise HybridflowInputError(
        f"PostgreSQL server binaries (initdb, postgres) not found: {INSTALL_HINT}"
    )


def run_as() -> str | None:
    """The OS user the server runs as: ``postgres`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise HybridflowInputError(
            f"PostgreSQL refuses to run as root and there is no {SYSTEM_USER!r} user: "
            f"{INSTALL_HINT}, or run `hybridflow up` as a regular user"
        ) from None
    return SYSTEM_USER


def unreachable_folder(path: Path, user: str) -> Path | None:
    """The first folder on ``path``'s way that ``user`` may not pass through, or None."""
    entry = pwd.getpwnam(user)
    groups = set(os.getgrouplist(user, entry.pw_gid))
    for folder in [*reversed(path.parents), path]:
        if not folder.exists():
            break
        st = folder.stat()
        if st.st_uid == entry.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return folder
    return None


def password(pg_dir: Path) -> str:
    """The server's generated password (created once, kept in a 0600 file)."""
    path = pg_dir / "password"
    if path.is_file():
        return path.read_text().strip()
    pg_dir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret)
    return secret


def _owned_by(path: Path, user: str | None, mode: int) -> None:
    os.chmod(path, mode)
    if user:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def initialize(pg_dir: Path, log_file: Path) -> bool:
    """``initdb`` the data folder unless it exists; True when it was created now."""
    data = pg_dir / "data"
    if (data / "PG_VERSION").is_file():
        return False
    user = run_as()
    pg_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(pg_dir, 0o711)  # the server's user passes through to data/, reads nothing here
    if user and (blocked := unreachable_folder(pg_dir, user)):
        raise HybridflowInputError(
            f"PostgreSQL runs as {user!r}, which cannot reach {pg_dir} ({blocked} is closed to "
            "it): pick a HYBRIDFLOW_STACK_DIR whose folders others may pass (chmod o+x)"
        )
    data.mkdir(mode=0o700, exist_ok=True)
    _owned_by(data, user, 0o700)
    pwfile = pg_dir / f"initdb-pw-{secrets.token_hex(4)}"
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password(pg_dir) + "\n")
    _owned_by(pwfile, user, 0o600)
    command = [
        str(bin_dir() / "initdb"),
        *("-D", str(data), "-U", ROLE, "--pwfile", str(pwfile), "-E", "UTF8", "--no-locale"),
        *("--auth-host", "scram-sha-256", "--auth-local", "scram-sha-256", "--no-instructions"),
    ]
    try:
        _run_logged(command, user, log_file)
    finally:
        pwfile.unlink(missing_ok=True)
    return True


def _run_logged(command: list[str], user: str | None, log_file: Path) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.run(
            command,
            user=user,
            group=pwd.getpwnam(user).pw_gid if user else None,
            extra_groups=[] if user else None,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            timeout=300,
        )
    if proc.returncode != 0:
        tail = " | ".join(log_file.read_text(errors="replace").strip().splitlines()[-5:])
        raise RuntimeError(f"{Path(command[0]).name} failed (exit {proc.returncode}): {tail}")


def server_command(pg_dir: Path, port: int) -> list[str]:
    """The server on 127.0.0.1:``port``, no Unix socket, small memory."""
    return [
        str(bin_dir() / "postgres"),
        *("-D", str(pg_dir / "data"), "-h", "127.0.0.1", "-p", str(port), "-k", ""),
        *("-c", "shared_buffers=64MB", "-c", "max_connections=60"),
    ]


async def _connect_and_create(port: int, secret: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(
        host="127.0.0.1", port=port, user=ROLE, password=secret, database="postgres", timeout=5
    )
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()


def wait_ready(port: int, secret: str, log_file: Path, timeout_s: float = 120) -> None:
    """Wait until the server accepts our role, then create the Prefect database if missing."""
    from asyncpg.exceptions import CannotConnectNowError

    deadline = time.monotonic() + timeout_s
    error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            asyncio.run(_connect_and_create(port, secret))
            return
        except (OSError, TimeoutError, CannotConnectNowError) as exc:  # not up yet
            error = exc
        time.sleep(0.3)
    tail = " | ".join(log_file.read_text(errors="replace").strip().splitlines()[-5:])
    raise RuntimeError(f"PostgreSQL not ready within {timeout_s:.0f}s ({error}): {tail}")


def start(
    launch: Launcher, pg_dir: Path, env: dict[str, str], log_file: Path, port: int | None = None
) -> DatabaseInfo:
    """Initialise if needed, start the server through ``launch`` (on ``port`` when still free)
    and wait until it accepts our role."""
    initialize(pg_dir, log_file)
    port = port if port and not port_in_use(port) else free_port()
    secret = password(pg_dir)

    def ready(record: ProcessRecord) -> None:
        wait_ready(port, secret, Path(record.log_file))

    launch(KEY, server_command(pg_dir, port), env, ready, user=run_as())
    return DatabaseInfo(kind="postgres", location=str(pg_dir / "data"), port=port)


def prefect_server_env(info: DatabaseInfo, secret: str) -> dict[str, str]:
    """What the Prefect server's process (and only it) needs to use the database."""
    return {
        "PREFECT_SERVER_DATABASE_DRIVER": "postgresql+asyncpg",
        "PREFECT_SERVER_DATABASE_HOST": "127.0.0.1",
        "PREFECT_SERVER_DATABASE_PORT": str(info.port),
        "PREFECT_SERVER_DATABASE_USER": ROLE,
        "PREFECT_SERVER_DATABASE_NAME": DATABASE,
        "PREFECT_SERVER_DATABASE_PASSWORD": secret,
    }
