"""Datasets in the store: immutable data folders published behind a small manifest.

A dataset at ``prefix`` is ``prefix/_manifest.json`` naming one ``prefix/data-<id>/`` folder.
Writers publish the data folder first and the manifest last, so readers see the previous
complete dataset or the new complete one, never a mix; a crash before the manifest leaves only
an unreferenced folder that the next publish sweeps away.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra.errors import StoreError
from infra.layout import (
    STAGING,
    dataset_data_prefix,
    dataset_generation_folder,
    dataset_manifest_key,
)
from infra.store import ObjectStore

STALE_STAGING_S = 6 * 3600  # a staging folder this old belongs to a run that died


class DatasetManifest(BaseModel):
    """What a published dataset holds and where its files are."""

    prefix: str
    data_prefix: str
    files: list[str]
    rows: int
    created_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    metadata: dict[str, Any] = Field(default_factory=dict)


def publish_dataset(
    store: ObjectStore,
    local_dir: Path,
    prefix: str,
    *,
    rows: int,
    metadata: dict[str, Any] | None = None,
) -> DatasetManifest:
    """Publish the Parquet files in ``local_dir`` as the dataset at ``prefix`` (replacing it)."""
    for junk in list(local_dir.rglob("*")):
        if junk.is_file() and junk.name.startswith((".", "_")):
            junk.unlink()  # Spark's _SUCCESS and .crc files are not data
    data_prefix = new_data_prefix(prefix)
    keys = store.publish_dir(local_dir, data_prefix)
    return publish_written(store, prefix, data_prefix, keys, rows=rows, metadata=metadata)


def new_data_prefix(prefix: str) -> str:
    """A fresh data folder for the dataset at ``prefix``, for writers that put the files there
    themselves (e.g. one per Spark task) before :func:`publish_written`."""
    return dataset_data_prefix(prefix.strip("/"), uuid.uuid4().hex[:12])


def publish_written(
    store: ObjectStore,
    prefix: str,
    data_prefix: str,
    keys: list[str],
    *,
    rows: int,
    metadata: dict[str, Any] | None = None,
) -> DatasetManifest:
    """Publish the files already written at ``keys`` under ``data_prefix`` as the dataset at
    ``prefix`` (the manifest last), replacing the previous generation."""
    prefix = prefix.strip("/")
    previous = find_dataset(store, prefix)
    manifest = DatasetManifest(
        prefix=prefix,
        data_prefix=data_prefix,
        files=sorted(k for k in keys if k.endswith(".parquet")),
        rows=rows,
        metadata=metadata or {},
    )
    store.put_json(dataset_manifest_key(prefix), manifest.model_dump(mode="json"))
    _sweep_unreferenced(store, prefix, keep={data_prefix, previous.data_prefix if previous else ""})
    sweep_stale_staging(store)
    return manifest


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


def _sweep_unreferenced(store: ObjectStore, prefix: str, keep: set[str]) -> None:
    """Remove data folders of older generations; the one before the current stays for readers
    that resolved the previous manifest a moment ago."""
    seen = {
        folder for key in store.list(prefix) if (folder := dataset_generation_folder(prefix, key))
    }
    for data_prefix in seen - keep:
        store.delete_prefix(data_prefix)


def find_dataset(store: ObjectStore, prefix: str) -> DatasetManifest | None:
    """The dataset's manifest, or None when nothing was published at ``prefix``."""
    try:
        return DatasetManifest.model_validate(store.get_json(dataset_manifest_key(prefix)))
    except FileNotFoundError:
        return None


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
