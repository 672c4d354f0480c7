"""Datasets in the store: immutable data folders published behind a small manifest.

A dataset at ``prefix`` is ``prefix/_manifest.json`` naming one ``prefix/data-<generation>/``
folder and the generation it replaced. Writers publish the data folder first and then move the
manifest with a compare-and-swap, so readers see the previous complete dataset or the new
complete one, never a mix, and two writers of the same dataset line up one after the other
(the last one wins) instead of overwriting each other's manifest.

Deleting is safe for concurrent writers because a generation is deleted only by the writer that
pushed it out of the two newest (the current one and the one before it stay for readers that
resolved the manifest a moment ago): a generation still being written by another writer is in no
manifest yet and is never touched. Generations a crashed writer never published are swept once
they are older than ``STALE_STAGING_S`` (their id starts with their UTC creation time; ids
without a time were written by an earlier release and are swept when no manifest names them).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.errors import StoreError
from infra.layout import (
    STAGING,
    dataset_data_prefix,
    dataset_generation_folder,
    dataset_manifest_key,
)
from infra.storage.store import ObjectStore, PreconditionFailed

log = logging.getLogger(__name__)
STALE_STAGING_S = 6 * 3600  # a staging folder or unpublished generation this old was abandoned
MANIFEST_SWAP_ATTEMPTS = 50
_GENERATION_TIME = re.compile(r"/data-(\d{8}T\d{6}Z)-[0-9a-f]+$")


class DatasetManifest(BaseModel):
    """What a published dataset holds and where its files are."""

    prefix: str
    data_prefix: str
    files: list[str]
    rows: int
    created_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    metadata: dict[str, Any] = Field(default_factory=dict)
    previous_data_prefix: str | None = Field(
        default=None, description="the generation this one replaced (kept for its readers)"
    )


class DatasetManifestDamaged(StoreError):
    """A dataset's manifest is not a readable manifest (truncated, edited by hand); the message
    names its key and the command that repairs it."""

    def __init__(self, store: ObjectStore, prefix: str, problem: str) -> None:
        self.prefix = prefix.strip("/")
        self.key = dataset_manifest_key(prefix)
        super().__init__(
            f"dataset manifest {store.key_uri(self.key)} is damaged ({problem}): repair it with "
            f"`hybridflow snapshots repair {self.prefix}`"
        )


def parse_manifest(store: ObjectStore, prefix: str, data: bytes) -> DatasetManifest:
    """The manifest in ``data`` (read from ``prefix``); DatasetManifestDamaged when it is not one."""
    try:
        return DatasetManifest.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"msg": "unreadable"}
        where = ".".join(str(p) for p in first.get("loc", ()))
        problem = f"{where}: {first['msg']}" if where else str(first["msg"])
        raise DatasetManifestDamaged(store, prefix, problem) from None


SOURCE_EVENTS_KEY = "source_events"
CUSTOMER_FILES_KEY = "customer_files"
"""A dataset's metadata entry, true when each of its files holds every row of the customers
(``customer_id``) it has rows of: the good events validated in process, a share of the
customers per file. A reader that takes a share of the customers at a time can take such files
as they are instead of sharing the rows out again (:mod:`tasks.data.features_duckdb`)."""


def customer_files(manifest: DatasetManifest) -> bool:
    """Whether ``manifest``'s files are each the whole of their customers' rows
    (:data:`CUSTOMER_FILES_KEY`); a dataset of one file always is."""
    return len(manifest.files) <= 1 or manifest.metadata.get(CUSTOMER_FILES_KEY) is True


class SourceEvents(BaseModel):
    """What a scoring-feature dataset was computed from, recorded in its manifest's metadata:
    the validated events generation and the cutoff (microseconds since the epoch). The endpoint
    seeds its online state from these events (:mod:`serving.online`)."""

    model_config = ConfigDict(frozen=True)

    events_prefix: str
    events_data_prefix: str
    cutoff_micros: int

    def to_metadata(self) -> dict[str, Any]:
        return {SOURCE_EVENTS_KEY: self.model_dump()}

    @classmethod
    def of(cls, manifest: DatasetManifest) -> SourceEvents | None:
        """The source recorded in ``manifest``, None for a dataset without one."""
        entry = manifest.metadata.get(SOURCE_EVENTS_KEY)
        return cls.model_validate(entry) if entry is not None else None


def new_generation(now: dt.datetime | None = None) -> str:
    """A unique generation id that starts with its UTC creation time."""
    now = now or dt.datetime.now(dt.UTC)
    return f"{now.astimezone(dt.UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(6)}"


def generation_time(data_prefix: str) -> dt.datetime | None:
    """When a generation was created (None for ids written before they carried a time)."""
    match = _GENERATION_TIME.search(data_prefix)
    if match is None:
        return None
    return dt.datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)


def publish_dataset(
    store: ObjectStore,
    local_dir: Path,
    prefix: str,
    *,
    rows: int,
    metadata: dict[str, Any] | None = None,
    now: dt.datetime | None = None,
) -> DatasetManifest:
    """Publish the Parquet files in ``local_dir`` as the dataset at ``prefix`` (replacing it)."""
    for junk in list(local_dir.rglob("*")):
        if junk.is_file() and junk.name.startswith((".", "_")):
            junk.unlink()  # Spark's _SUCCESS and .crc files are not data
    data_prefix = new_data_prefix(prefix, now)
    keys = store.publish_dir(local_dir, data_prefix)
    return publish_written_dataset(
        store, prefix, data_prefix, keys, rows=rows, metadata=metadata, now=now
    )


def new_data_prefix(prefix: str, now: dt.datetime | None = None) -> str:
    """The folder of a new generation of the dataset at ``prefix`` (its id carries the time)."""
    return dataset_data_prefix(prefix.strip("/"), new_generation(now))


def publish_written_dataset(
    store: ObjectStore,
    prefix: str,
    data_prefix: str,
    keys: list[str],
    *,
    rows: int,
    metadata: dict[str, Any] | None = None,
    now: dt.datetime | None = None,
) -> DatasetManifest:
    """Publish files already in the store under ``data_prefix`` (uploaded, or written there by
    Spark's executors): the manifest moves to the Parquet ``keys``, then old generations go."""
    prefix = prefix.strip("/")
    files = sorted(k for k in keys if k.endswith(".parquet"))
    manifest, replaced = _swap_manifest(store, prefix, data_prefix, files, rows, metadata or {})
    if replaced is not None and replaced.previous_data_prefix not in (None, data_prefix):
        store.delete_prefix(replaced.previous_data_prefix)  # now two generations back
    sweep_abandoned_generations(store, prefix, now)
    sweep_stale_staging(store)
    return manifest


def _swap_manifest(
    store: ObjectStore,
    prefix: str,
    data_prefix: str,
    files: list[str],
    rows: int,
    metadata: dict[str, Any],
) -> tuple[DatasetManifest, DatasetManifest | None]:
    """Point the manifest at ``data_prefix`` by compare-and-swap, re-reading after a lost race.
    Returns the new manifest and the one it replaced."""
    key = dataset_manifest_key(prefix)
    for _ in range(MANIFEST_SWAP_ATTEMPTS):
        current, token = _manifest_with_token(store, prefix)
        manifest = DatasetManifest(
            prefix=prefix,
            data_prefix=data_prefix,
            files=files,
            rows=rows,
            metadata=metadata,
            previous_data_prefix=current.data_prefix if current else None,
        )
        body = manifest.model_dump_json(indent=2).encode()
        try:
            if token is None:
                store.put_bytes_if(key, body, if_none_match=True)
            else:
                store.put_bytes_if(key, body, if_match=token)
        except PreconditionFailed:
            continue  # another writer published in between: line up behind it
        return manifest, current
    raise StoreError(
        f"dataset {store.key_uri(prefix)}: the manifest kept changing under "
        f"{MANIFEST_SWAP_ATTEMPTS} attempts to publish {data_prefix}"
    )


def _manifest_with_token(
    store: ObjectStore, prefix: str
) -> tuple[DatasetManifest | None, str | None]:
    try:
        data, token = store.get_with_token(dataset_manifest_key(prefix))
    except FileNotFoundError:
        return None, None
    return parse_manifest(store, prefix, data), token


def sweep_abandoned_generations(
    store: ObjectStore, prefix: str, now: dt.datetime | None = None
) -> list[str]:
    """Remove generations no manifest names that are older than ``STALE_STAGING_S`` (their
    writer died before publishing); younger ones may still be on their way. Returns them."""
    current = find_dataset(store, prefix)
    keep = {current.data_prefix, current.previous_data_prefix} if current else set()
    cutoff = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(seconds=STALE_STAGING_S)
    seen = {
        folder for key in store.list(prefix) if (folder := dataset_generation_folder(prefix, key))
    }
    removed = []
    for data_prefix in sorted(seen - keep):
        created = generation_time(data_prefix)  # None: written by a release before this one
        if created is None or created < cutoff:
            store.delete_prefix(data_prefix)
            removed.append(data_prefix)
    return removed


def sweep_stale_staging(store: ObjectStore, max_age_s: float = STALE_STAGING_S) -> list[Path]:
    """Remove a folder store's staging folders older than ``max_age_s`` (left by killed runs;
    never read, as nothing was published from them). Returns what was removed."""
    staging = store.local_path(STAGING)
    if staging is None or not staging.is_dir():
        return []
    cutoff = time.time() - max_age_s
    removed = []
    for folder in staging.iterdir():
        try:
            if folder.is_dir() and folder.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        except FileNotFoundError:
            continue  # another process swept it
    return removed


def find_dataset(store: ObjectStore, prefix: str) -> DatasetManifest | None:
    """The dataset's manifest, or None when nothing was published at ``prefix``;
    DatasetManifestDamaged naming its key when it is unreadable."""
    try:
        data = store.get_bytes(dataset_manifest_key(prefix))
    except FileNotFoundError:
        return None
    return parse_manifest(store, prefix, data)


def read_dataset_manifest(store: ObjectStore, prefix: str) -> DatasetManifest:
    """The dataset's manifest; StoreError naming the URI when it was never published."""
    manifest = find_dataset(store, prefix)
    if manifest is None:
        raise StoreError(f"no dataset published at {store.key_uri(prefix)}")
    return manifest


def local_dataset_dir(store: ObjectStore, manifest: DatasetManifest) -> Path:
    """A local folder with the dataset's files (the store's own folder for a local store)."""
    return store.materialize(manifest.data_prefix, manifest.files)


def release_local_dir(store: ObjectStore, path: Path) -> None:
    """Drop a temporary copy made by :func:`local_dataset_dir` (never the store's own folder)."""
    if store.local_path("x") is None:
        shutil.rmtree(path, ignore_errors=True)
