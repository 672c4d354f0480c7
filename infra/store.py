"""One artifact store addressed by URI: a local folder or ``s3://bucket/prefix`` (boto3).

Every write is atomic: a reader sees the previous complete object or the new complete one.
Folder backend: write a temporary file beside the target, fsync, ``os.replace``.
S3 backend: a PUT is atomic per object; directories are published as data objects first and a
small manifest written last (see :mod:`infra.datasets`).
"""

from __future__ import annotations

import abc
import hashlib
import io
import json
import logging
import os
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from infra.errors import StoreError
from infra.layout import STAGING

log = logging.getLogger(__name__)
T = TypeVar("T")


class PreconditionFailed(StoreError):
    """A conditional write lost: the object exists already or changed since it was read."""


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class ObjectStore(abc.ABC):
    """Keys are ``/``-separated relative paths; values are bytes."""

    uri: str

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key`` atomically, replacing what was there."""

    @abc.abstractmethod
    def put_bytes_if(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        """Conditional write: create only (``if_none_match``) or compare-and-swap on ``if_match``
        (the token from :meth:`get_with_token`). Returns the new token; raises PreconditionFailed."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Read ``key``; FileNotFoundError when absent."""

    @abc.abstractmethod
    def get_with_token(self, key: str) -> tuple[bytes, str]:
        """Read ``key`` with a change token (ETag / content hash) for :meth:`put_bytes_if`."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """True when ``key`` holds an object."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """All keys under ``prefix`` (recursive), sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""

    @abc.abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file atomically (multipart for large files on S3)."""

    @abc.abstractmethod
    def get_file(self, key: str, path: Path) -> None:
        """Download ``key`` to a local file (written beside, then renamed)."""

    @abc.abstractmethod
    def staging_dir(self) -> Path:
        """A fresh local folder to write outputs into before :meth:`publish_dir`."""

    @abc.abstractmethod
    def publish_dir(self, local_dir: Path, prefix: str) -> list[str]:
        """Move/upload every file of ``local_dir`` under ``prefix``; returns the keys written."""

    @abc.abstractmethod
    def local_path(self, key: str) -> Path | None:
        """The key's path on the local filesystem when the backend is a folder, else None."""

    def key_uri(self, key: str) -> str:
        """The URI a user (or pandas/pyarrow) can open for ``key``."""
        return f"{self.uri.rstrip('/')}/{key}"

    def delete_prefix(self, prefix: str) -> None:
        """Remove every key under ``prefix``."""
        for key in self.list(prefix):
            self.delete(key)

    def put_json(self, key: str, obj: Any) -> None:
        """Atomically write a JSON document."""
        self.put_bytes(key, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    def get_json(self, key: str) -> Any:
        """Read a JSON document."""
        return json.loads(self.get_bytes(key))

    def materialize(self, prefix: str, keys: list[str] | None = None) -> Path:
        """A local folder holding the objects under ``prefix`` (no copy for the folder backend)."""
        local = self.local_path(prefix)
        if local is not None:
            return local
        target = Path(tempfile.mkdtemp(prefix="hf-fetch-"))
        for key in keys if keys is not None else self.list(prefix):
            rel = key[len(prefix) :].lstrip("/")
            self.get_file(key, target / rel)
        return target


def _clean_key(key: str) -> str:
    key = key.strip("/")
    if not key or any(part in ("", ".", "..") for part in key.split("/")):
        raise StoreError(f"invalid store key: {key!r}")
    return key


class LocalFolderStore(ObjectStore):
    """The embedded default: objects are files under a root folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / _clean_key(key)

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def put_bytes(self, key: str, data: bytes) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put_bytes_if(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = target.with_name(f".{target.name}.lock")
        fd = _acquire_lock_file(lock)
        try:
            if if_none_match and target.exists():
                raise PreconditionFailed(f"{key} exists already")
            if if_match is not None:
                current = sha256_bytes(target.read_bytes()) if target.exists() else None
                if current != if_match:
                    raise PreconditionFailed(f"{key} changed since it was read")
            self.put_bytes(key, data)
            return sha256_bytes(data)
        finally:
            os.close(fd)
            lock.unlink(missing_ok=True)

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"{self.key_uri(key)} not found")
        return path.read_bytes()

    def get_with_token(self, key: str) -> tuple[bytes, str]:
        data = self.get_bytes(key)
        return data, sha256_bytes(data)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix.strip("/") if prefix.strip("/") else self.root
        if base.is_file():
            return [prefix.strip("/")]
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)

    def get_file(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._path(key), path)

    def staging_dir(self) -> Path:
        staging = self.root / STAGING / uuid.uuid4().hex
        staging.mkdir(parents=True)
        return staging

    def publish_dir(self, local_dir: Path, prefix: str) -> list[str]:
        target = self._path(prefix)
        if target.exists():
            raise StoreError(f"refusing to overwrite published folder {self.key_uri(prefix)}")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(local_dir, target)
        except OSError:
            shutil.copytree(local_dir, target)
            shutil.rmtree(local_dir, ignore_errors=True)
        return self.list(prefix)


def _acquire_lock_file(lock: Path, timeout_s: float = 30.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if time.monotonic() > deadline:
                raise StoreError(f"timed out waiting for lock {lock}") from None
            time.sleep(0.01)


class S3Store(ObjectStore):
    """Objects in ``s3://bucket/prefix`` through boto3 (``AWS_ENDPOINT_URL`` and the normal
    credential chain are honoured; nothing here ever logs credentials)."""

    def __init__(self, uri: str, *, retries: int = 5, backoff_s: float = 0.2) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        rest = uri[len("s3://") :]
        self.bucket, _, prefix = rest.partition("/")
        if len(self.bucket) < 3:
            raise StoreError(f"invalid S3 URI {uri!r}: bucket name must have 3+ characters")
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.retries = retries
        self.backoff_s = backoff_s
        self.client = boto3.client(
            "s3",
            config=Config(
                retries={"max_attempts": 2, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
            ),
        )
        self.transfer = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20)

    def _key(self, key: str) -> str:
        key = _clean_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` with exponential backoff on transient failures (5xx, throttling,
        connection errors); client errors fail at once; exhausted retries raise StoreError."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(self.retries + 1):
            try:
                return fn()
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if code in ("NoSuchKey", "404", "NotFound"):
                    raise FileNotFoundError(f"{what}: not found") from None
                if code in ("PreconditionFailed", "412") or status == 412:
                    raise PreconditionFailed(f"{what}: precondition failed") from None
                if status and status < 500 and code not in ("SlowDown", "RequestTimeout"):
                    raise StoreError(f"{what}: {code or status}") from exc
                err: Exception = exc
            except (BotoCoreError, S3UploadFailedError) as exc:
                err = exc
            if attempt == self.retries:
                raise StoreError(
                    f"{what} failed after {self.retries + 1} attempts: {type(err).__name__}: {err}"
                ) from err
            delay = self.backoff_s * (2**attempt) * (1.0 + 0.25 * random.random())
            log.warning("store: %s failed (%s); retry %d in %.2fs", what, err, attempt + 1, delay)
            time.sleep(delay)
        raise AssertionError("unreachable")

    def local_path(self, key: str) -> Path | None:
        return None

    def put_bytes(self, key: str, data: bytes) -> None:
        if len(data) >= self.transfer.multipart_threshold:
            self._retry(
                f"multipart put {self.key_uri(key)}",
                lambda: self.client.upload_fileobj(
                    io.BytesIO(data), self.bucket, self._key(key), Config=self.transfer
                ),
            )
            return
        self._retry(
            f"put {self.key_uri(key)}",
            lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data),
        )

    def put_bytes_if(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        extra: dict[str, str] = {}
        if if_none_match:
            extra["IfNoneMatch"] = "*"
        if if_match is not None:
            extra["IfMatch"] = if_match
        resp = self._retry(
            f"conditional put {self.key_uri(key)}",
            lambda: self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, **extra
            ),
        )
        return str(resp["ETag"])

    def get_bytes(self, key: str) -> bytes:
        return self.get_with_token(key)[0]

    def get_with_token(self, key: str) -> tuple[bytes, str]:
        resp = self._retry(
            f"get {self.key_uri(key)}",
            lambda: self.client.get_object(Bucket=self.bucket, Key=self._key(key)),
        )
        return resp["Body"].read(), str(resp["ETag"])

    def exists(self, key: str) -> bool:
        try:
            self._retry(
                f"head {self.key_uri(key)}",
                lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key)),
            )
            return True
        except FileNotFoundError:
            return False

    def _iter_keys(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix) if prefix.strip("/") else self.prefix
        full = full + "/" if full else ""
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            for obj in page.get("Contents", []):
                yield obj["Key"][strip:]

    def list(self, prefix: str) -> list[str]:
        return self._retry(f"list {self.key_uri(prefix)}", lambda: sorted(self._iter_keys(prefix)))

    def delete(self, key: str) -> None:
        self._retry(
            f"delete {self.key_uri(key)}",
            lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key)),
        )

    def put_file(self, key: str, path: Path) -> None:
        self._retry(
            f"upload {self.key_uri(key)}",
            lambda: self.client.upload_file(
                str(path), self.bucket, self._key(key), Config=self.transfer
            ),
        )

    def get_file(self, key: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        self._retry(
            f"download {self.key_uri(key)}",
            lambda: self.client.download_file(
                self.bucket, self._key(key), str(tmp), Config=self.transfer
            ),
        )
        os.replace(tmp, path)

    def staging_dir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="hf-stage-"))

    def publish_dir(self, local_dir: Path, prefix: str) -> list[str]:
        keys = []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            if path.name.startswith((".", "_")):
                continue  # Spark's _SUCCESS and .crc files
            key = f"{prefix.strip('/')}/{path.relative_to(local_dir).as_posix()}"
            self.put_file(key, path)
            keys.append(key)
        shutil.rmtree(local_dir, ignore_errors=True)
        return keys


def open_store(uri: str) -> ObjectStore:
    """The store for ``uri``: ``s3://bucket/prefix`` or a folder path."""
    if uri.startswith("s3://"):
        from infra.settings import get_settings

        settings = get_settings()
        return S3Store(uri, retries=settings.store_retries, backoff_s=settings.store_backoff_s)
    if "://" in uri and not uri.startswith("file://"):
        raise StoreError(f"unsupported store URI {uri!r}: use a folder path or s3://bucket/prefix")
    return LocalFolderStore(uri.removeprefix("file://"))
