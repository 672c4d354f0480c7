"""Model registry in the store: immutable versions and aliases moved by compare-and-swap.

Layout under the store root::

    models/versions/<version>/<file>          weights, config (written first)
    models/versions/<version>/manifest.json   metrics, lineage, sha256 of every file (last)
    models/aliases/<alias>.json               {"version": ..., "history": [...]}

A version exists once its manifest exists; the manifest is created with a create-only write, so a
version can never be overwritten. Files are read back only after their sha256 matches.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from typing import Any

from pydantic import BaseModel, Field

from infra.errors import ChecksumMismatchError, HybridflowInputError, StoreError
from infra.layout import (
    VERSIONS,
    alias_key,
    is_version_manifest_key,
    version_file_key,
    version_manifest_key,
)
from infra.store import ObjectStore, PreconditionFailed, sha256_bytes

PRODUCTION = "production"


class ModelManifest(BaseModel):
    """What a model version is, where it came from and how to verify it."""

    version: str
    created_at: dt.datetime
    files: dict[str, str] = Field(description="file name -> sha256")
    metrics: dict[str, float] = Field(default_factory=dict)
    features: list[str] = Field(default_factory=list)
    data_fingerprint: str = ""
    parent_version: str | None = None
    warm_start: bool = False
    training_id: str = ""
    code_version: str = ""
    as_of: dt.date | None = None
    horizon_days: int | None = None
    training: dict[str, Any] = Field(default_factory=dict)
    evaluation: dict[str, Any] = Field(
        default_factory=dict, description="calibration, test and backtest figures vs the baseline"
    )


class AliasChange(BaseModel):
    """One move of an alias."""

    version: str
    at: dt.datetime
    reason: str


class AliasRecord(BaseModel):
    """An alias and its history (newest last)."""

    alias: str
    version: str
    history: list[AliasChange] = Field(default_factory=list)


class PromotionConflict(StoreError):
    """Another promotion moved the alias first; this one lost and changed nothing."""


def new_version_id(now: dt.datetime | None = None) -> str:
    """A sortable, unique version id such as ``m-20251231-120000-a1b2c3``."""
    now = now or dt.datetime.now(dt.UTC)
    return f"m-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


class ModelRegistry:
    """Versions and aliases in an :class:`~infra.store.ObjectStore`."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def register(self, files: dict[str, bytes], **fields: Any) -> ModelManifest:
        """Write ``files`` and then the manifest (create-only) as a new immutable version."""
        version = fields.pop("version", None) or new_version_id()
        manifest = ModelManifest(
            version=version,
            created_at=dt.datetime.now(dt.UTC),
            files={name: sha256_bytes(data) for name, data in files.items()},
            **fields,
        )
        try:
            for name, data in files.items():
                self.store.put_bytes(version_file_key(version, name), data)
        except StoreError as exc:
            raise StoreError(
                f"model version {version} could not be registered (no manifest written, so it "
                f"is not visible): {exc}"
            ) from exc
        try:
            self.store.put_bytes_if(
                version_manifest_key(version),
                manifest.model_dump_json(indent=2).encode(),
                if_none_match=True,
            )
        except PreconditionFailed:
            raise StoreError(
                f"model version {version} exists already; versions are immutable"
            ) from None
        return manifest

    def get(self, version: str) -> ModelManifest:
        """The manifest of ``version``; a clear error when it does not exist."""
        try:
            data = self.store.get_bytes(version_manifest_key(version))
        except FileNotFoundError:
            raise HybridflowInputError(f"model version not found: {version}") from None
        return ModelManifest.model_validate_json(data)

    def list_versions(self) -> list[ModelManifest]:
        """All complete versions, oldest first (incomplete ones have no manifest and are skipped)."""
        keys = [k for k in self.store.list(VERSIONS) if is_version_manifest_key(k)]
        manifests = [ModelManifest.model_validate_json(self.store.get_bytes(k)) for k in keys]
        return sorted(manifests, key=lambda m: (m.created_at, m.version))

    def find_training(self, training_id: str) -> ModelManifest | None:
        """The version a training run (by its stable id) registered, if it finished before."""
        for manifest in reversed(self.list_versions()):
            if manifest.training_id == training_id:
                return manifest
        return None

    def read_files(self, version: str) -> tuple[ModelManifest, dict[str, bytes]]:
        """The manifest and every file of ``version``, each verified against its sha256."""
        manifest = self.get(version)
        files = {}
        for name, expected in manifest.files.items():
            data = self.store.get_bytes(version_file_key(version, name))
            if sha256_bytes(data) != expected:
                raise ChecksumMismatchError(
                    f"model {version}: {name} does not match its sha256 in the manifest"
                )
            files[name] = data
        return manifest, files

    def alias(self, name: str = PRODUCTION) -> AliasRecord | None:
        """The alias record, or None when the alias was never set."""
        return self._alias_with_token(name)[0]

    def _alias_with_token(self, name: str) -> tuple[AliasRecord | None, str | None]:
        try:
            data, token = self.store.get_with_token(alias_key(name))
        except FileNotFoundError:
            return None, None
        return AliasRecord.model_validate_json(data), token

    def set_alias(
        self,
        version: str,
        reason: str,
        *,
        name: str = PRODUCTION,
        expected_version: str | None | bool = False,
    ) -> AliasRecord:
        """Point alias ``name`` at ``version`` with a compare-and-swap write.

        ``expected_version``: the version the caller decided against (None = "no alias yet");
        False skips that check. If another writer moved the alias in between, raises
        :class:`PromotionConflict` and nothing changes.
        """
        self.get(version)  # must exist
        current, token = self._alias_with_token(name)
        current_version = current.version if current else None
        if expected_version is not False and expected_version != current_version:
            raise PromotionConflict(
                f"alias {name} moved to {current_version} while deciding against "
                f"{expected_version}; promotion of {version} abandoned"
            )
        history = (current.history if current else []) + [
            AliasChange(version=version, at=dt.datetime.now(dt.UTC), reason=reason)
        ]
        record = AliasRecord(alias=name, version=version, history=history[-100:])
        body = record.model_dump_json(indent=2).encode()
        try:
            if token is None:
                self.store.put_bytes_if(alias_key(name), body, if_none_match=True)
            else:
                self.store.put_bytes_if(alias_key(name), body, if_match=token)
        except PreconditionFailed:
            raise PromotionConflict(
                f"alias {name} was moved by a concurrent promotion; {version} was not promoted"
            ) from None
        return record

    def rollback(self, name: str = PRODUCTION) -> AliasRecord:
        """Move the alias back to the version it pointed at before its latest move."""
        current = self.alias(name)
        if current is None or len(current.history) < 2:
            raise HybridflowInputError(f"alias {name} has no earlier version to roll back to")
        previous = current.history[-2].version
        return self.set_alias(
            previous,
            f"rollback from {current.version}",
            name=name,
            expected_version=current.version,
        )


def manifest_summary(manifest: ModelManifest) -> str:
    """One JSON line about a version (for CLI listings)."""
    return json.dumps(
        {
            "version": manifest.version,
            "created_at": manifest.created_at.isoformat(),
            **manifest.metrics,
        }
    )
