"""One artifact store addressed by URI: a local folder or ``s3://bucket/prefix`` (boto3).

Every write is atomic: a reader sees the previous complete object or the new complete one.
Folder backend (:class:`LocalFolderStore`): a temporary file beside the target, fsync, rename,
fsync of the folder (:mod:`infra.storage.fs`); files follow the umask; conditional writes hold an
``flock`` that dies with its holder. S3 backend (:mod:`infra.storage.store_s3`): a PUT is atomic per
object; directories are published as data objects first and a small manifest written last
(see :mod:`infra.storage.datasets`).
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from infra.errors import StoreError
from infra.layout import STAGING
from infra.storage import fs


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
        """All keys under ``prefix`` (recursive), sorted; StoreError for a prefix that would
        leave the store (``..``)."""

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


def clean_key(key: str) -> str:
    """``key`` without surrounding slashes; StoreError for keys that would leave the store."""
    key = key.strip("/")
    if not key or any(part in ("", ".", "..") for part in key.split("/")):
        raise StoreError(f"invalid store key: {key!r}")
    return key


def clean_prefix(prefix: str) -> str:
    """Like :func:`clean_key`, but the empty prefix (the whole store) is allowed."""
    return clean_key(prefix) if prefix.strip("/") else ""


class LocalFolderStore(ObjectStore):
    """The embedded default: objects are files under a root folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / clean_key(key)

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def put_bytes(self, key: str, data: bytes) -> None:
        fs.write_bytes_durably(self._path(key), data, self.key_uri(key))

    def put_bytes_if(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        target = self._path(key)
        lock = target.with_name(f".{target.name}.lock")
        with fs.held_lock(lock, f"conditional write of {self.key_uri(key)}"):
            if if_none_match and target.exists():
                raise PreconditionFailed(f"{key} exists already")
            if if_match is not None:
                current = sha256_bytes(target.read_bytes()) if target.exists() else None
                if current != if_match:
                    raise PreconditionFailed(f"{key} changed since it was read")
            self.put_bytes(key, data)
            return sha256_bytes(data)

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
        clean = clean_prefix(prefix)
        base = self.root / clean if clean else self.root
        if base.is_file():
            return [clean]
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
        fs.copy_file_durably(path, self._path(key), self.key_uri(key))

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
            fs.fsync_tree(local_dir)
            try:
                os.replace(local_dir, target)
            except OSError:  # another filesystem: copy, then make the copy durable
                shutil.copytree(local_dir, target)
                fs.fsync_tree(target)
                shutil.rmtree(local_dir, ignore_errors=True)
            fs.fsync_dir(target.parent)
        except OSError as exc:
            shutil.rmtree(target, ignore_errors=True)
            raise StoreError(
                f"could not publish {self.key_uri(prefix)}: {fs.describe_os_error(exc)}"
            ) from exc
        return self.list(prefix)


def open_store(uri: str) -> ObjectStore:
    """The store for ``uri``: ``s3://bucket/prefix`` or a folder path."""
    if uri.startswith("s3://"):
        from infra.settings import get_settings
        from infra.storage.store_s3 import S3Store

        settings = get_settings()
        return S3Store(uri, retries=settings.store_retries, backoff_s=settings.store_backoff_s)
    if "://" in uri and not uri.startswith("file://"):
        raise StoreError(f"unsupported store URI {uri!r}: use a folder path or s3://bucket/prefix")
    return LocalFolderStore(uri.removeprefix("file://"))


def __getattr__(name: str) -> Any:
    """``from infra.storage.store import S3Store`` keeps working; boto3 loads only when it is used."""
    if name == "S3Store":
        from infra.storage.store_s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
