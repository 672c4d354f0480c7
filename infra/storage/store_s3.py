"""The S3 backend of the store: ``s3://bucket/prefix`` through boto3.

Transient failures (5xx, throttling, connection errors) are retried with backoff. A conditional
write is the one request whose retry can be told apart from a lost race: when a PUT landed but
its answer was lost, its retry finds the precondition failed by the PUT's own bytes, so a 412 is
checked against what the object now holds before it is reported as a conflict.
"""

from __future__ import annotations

import io
import logging
import os
import random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from infra.errors import StoreError
from infra.storage.store import ObjectStore, PreconditionFailed, clean_key, clean_prefix

log = logging.getLogger(__name__)
T = TypeVar("T")


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
        key = clean_key(key)
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
        what = f"conditional put {self.key_uri(key)}"
        try:
            resp = self._retry(
                what,
                lambda: self.client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, **extra
                ),
            )
        except PreconditionFailed:
            landed = self._landed_token(key, data)
            if landed is None:
                raise
            log.info("%s: an earlier attempt had landed (its answer was lost)", what)
            return landed
        return str(resp["ETag"])

    def _landed_token(self, key: str, data: bytes) -> str | None:
        """The object's token when it holds exactly ``data`` (our own write), else None."""
        try:
            current, token = self.get_with_token(key)
        except FileNotFoundError:
            return None
        return token if current == data else None

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
        full = self._key(prefix) if clean_prefix(prefix) else self.prefix
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
