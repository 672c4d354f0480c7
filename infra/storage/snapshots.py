"""The runs' feature datasets in the store: each run's scoring features and training snapshots
(keyed by run, so no run replaces another's), which of them production serves, retiring the
ones nothing needs, and repairing a damaged manifest (``hybridflow snapshots``).

A scoring-feature dataset is served with the model versions that record it
(:attr:`infra.storage.registry.ModelManifest.scoring_features`); a training snapshot is what a version
was fitted on (``snapshot``) and what its drift reference is built from. Retiring either is
refused while production, or a version production can roll back to, records it.
"""

from __future__ import annotations

import datetime as dt
import io
from dataclasses import dataclass

import pyarrow.parquet as pq

from infra.errors import HybridflowInputError
from infra.layout import (
    FEATURES,
    SNAPSHOTS,
    dataset_generation_folder,
    dataset_manifest_key,
    run_dataset_of,
    scoring_features_date,
    scoring_features_prefix,
)
from infra.storage.datasets import (
    DatasetManifest,
    DatasetManifestDamaged,
    find_dataset,
    generation_time,
)
from infra.storage.registry import AliasDamaged, ModelRegistry, rollback_stack
from infra.storage.store import ObjectStore


@dataclass(frozen=True)
class RunDataset:
    """A feature dataset of the store: where, of which date (horizon) and run, its manifest
    (None when damaged: ``damage`` says how) and the versions that record it."""

    prefix: str
    kind: str  # "features" | "snapshot" | "backtest"
    as_of: dt.date
    horizon_days: int | None
    run_id: str | None
    manifest: DatasetManifest | None
    damage: str | None
    used_by: tuple[str, ...]


def _kind(prefix: str) -> str:
    if prefix.startswith(f"{FEATURES}/"):
        return "features"
    return "backtest" if prefix.startswith(f"{SNAPSHOTS}/backtest/") else "snapshot"


def protected_versions(registry: ModelRegistry) -> list[str]:
    """Production and the versions it can roll back to (their datasets must stay)."""
    try:
        record = registry.alias()
    except AliasDamaged:
        return []
    return rollback_stack(record.history) if record else []


def list_datasets(store: ObjectStore) -> list[RunDataset]:
    """Every scoring-feature dataset and training snapshot, oldest date first, each with the
    protected versions (:func:`protected_versions`) that record it."""
    registry = ModelRegistry(store)
    uses: dict[str, list[str]] = {}
    for version in protected_versions(registry):
        try:
            manifest = registry.get(version)
        except Exception:  # a damaged version: `models show` names the damage
            continue
        for prefix in (manifest.scoring_features, manifest.snapshot):
            if prefix:
                uses.setdefault(prefix, []).append(version)
    found = []
    for key in [*store.list(FEATURES), *store.list(SNAPSHOTS)]:
        run = run_dataset_of(key)
        if run is not None:
            prefix, as_of, horizon, run_id = run
        elif (day := scoring_features_date(key)) is not None:
            prefix, as_of, horizon, run_id = scoring_features_prefix(day), day, None, None
        else:
            continue
        try:
            manifest, damage = find_dataset(store, prefix), None
        except DatasetManifestDamaged as exc:
            manifest, damage = None, str(exc)
        found.append(
            RunDataset(
                prefix,
                _kind(prefix),
                as_of,
                horizon,
                run_id,
                manifest,
                damage,
                tuple(uses.get(prefix, [])),
            )
        )
    return sorted(found, key=lambda d: (d.as_of, d.kind, d.prefix))


def _known(store: ObjectStore, prefix: str) -> RunDataset:
    prefix = prefix.strip("/")
    for dataset in list_datasets(store):
        if dataset.prefix == prefix:
            return dataset
    raise HybridflowInputError(
        f"no feature dataset at {prefix!r}: `hybridflow snapshots list` lists them"
    )


def retire(store: ObjectStore, prefix: str) -> RunDataset:
    """Delete the dataset at ``prefix`` (manifest first, then its files); refused (input error)
    while production or a version it can roll back to records it."""
    dataset = _known(store, prefix)
    if dataset.used_by:
        raise HybridflowInputError(
            f"{dataset.prefix} is recorded by model version(s) {', '.join(dataset.used_by)} "
            "(production or a rollback target): promote another version first"
        )
    store.delete(dataset_manifest_key(dataset.prefix))  # unpublished first: readers see none
    # its generations only: a run-less date's folder also holds the runs' datasets of that date
    folders = {
        folder
        for key in store.list(dataset.prefix)
        if (folder := dataset_generation_folder(dataset.prefix, key)) is not None
    }
    for folder in sorted(folders):
        store.delete_prefix(folder)
    return dataset


def repair(store: ObjectStore, prefix: str) -> DatasetManifest:
    """Rewrite a damaged manifest to name the newest generation under ``prefix`` whose Parquet
    files all read (rows counted from their footers); metadata the old manifest held (schema,
    source events) is not recovered. An intact manifest is left as it is."""
    prefix = prefix.strip("/")
    key = dataset_manifest_key(prefix)
    try:
        _, token = store.get_with_token(key)
    except FileNotFoundError:
        raise HybridflowInputError(f"no dataset manifest at {store.key_uri(key)}") from None
    try:
        current = find_dataset(store, prefix)
    except DatasetManifestDamaged:
        current = None
    if current is not None:
        return current
    generations: dict[str, list[str]] = {}
    for k in store.list(prefix):
        folder = dataset_generation_folder(prefix, k)
        if folder is not None and k.endswith(".parquet"):
            generations.setdefault(folder, []).append(k)
    for folder in sorted(generations, key=_newest_first):
        files = sorted(generations[folder])
        try:
            rows = sum(
                pq.ParquetFile(io.BytesIO(store.get_bytes(f))).metadata.num_rows for f in files
            )
        except Exception:  # an unreadable file: an older generation may still be whole
            continue
        manifest = DatasetManifest(
            prefix=prefix,
            data_prefix=folder,
            files=files,
            rows=rows,
            metadata={"repaired_at": dt.datetime.now(dt.UTC).isoformat()},
        )
        store.put_bytes_if(key, manifest.model_dump_json(indent=2).encode(), if_match=token)
        return manifest
    raise HybridflowInputError(
        f"dataset {store.key_uri(prefix)} has no whole generation to name: retire it with "
        f"`hybridflow snapshots retire {prefix}` (if no version records it) and re-run"
    )


def _newest_first(folder: str) -> tuple[float, str]:
    created = generation_time(folder)
    return (-(created.timestamp() if created else 0.0), folder)


def scoring_features_for(
    store: ObjectStore, as_of: dt.date, features_prefix: str | None = None
) -> DatasetManifest | None:
    """The scoring features to score for ``as_of``: those at ``features_prefix`` (a run's) when
    given, else the most recently published of that date (any run's, or run-less)."""
    if features_prefix is not None:
        return find_dataset(store, features_prefix)
    candidates = [
        d.manifest
        for d in list_datasets(store)
        if d.kind == "features" and d.as_of == as_of and d.manifest is not None
    ]
    return max(candidates, key=lambda m: m.created_at, default=None)
