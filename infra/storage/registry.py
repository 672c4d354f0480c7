"""Model registry in the store: immutable, verified versions and aliases moved by compare-and-swap.

Layout under the store root::

    models/versions/<version>/<file>          weights, config (written first)
    models/versions/<version>/manifest.json   metrics, lineage, sha256 of every file (last)
    models/aliases/<alias>.json               {"version": ..., "history": [...]}

A version exists once its manifest exists; the manifest is created with a create-only write, so a
version can never be overwritten, and a failed registration removes what it wrote. Files are read
back only after their sha256 matches, and an alias is moved only to a version whose files verify.
An alias's history is a log of promotions and rollbacks; a rollback undoes the latest promotion
not undone yet (``promote B; promote C; rollback; rollback`` is back at A). A damaged alias file
is reported as such, and a promotion repairs it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import secrets
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from infra.errors import ChecksumMismatchError, HybridflowInputError, StoreError
from infra.layout import (
    VERSIONS,
    alias_key,
    is_version_manifest_key,
    version_file_key,
    version_manifest_key,
    version_prefix,
)
from infra.storage.store import ObjectStore, PreconditionFailed, sha256_bytes

log = logging.getLogger(__name__)
PRODUCTION = "production"
HISTORY_KEPT = 100
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ModelManifest(BaseModel):
    """What a model version is, where it came from and how to verify it."""

    version: str
    created_at: dt.datetime
    kind: str = Field(
        default="mlp", description="the model family (versions from before families: mlp)"
    )
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
    scoring_features: str | None = Field(
        default=None,
        description="the prefix of the scoring features of the run that trained it: what the "
        "endpoint serves with it (None in versions from before: the newest run-less date)",
    )
    snapshot: str | None = Field(
        default=None, description="the prefix of the training snapshot it was fitted on"
    )
    training: dict[str, Any] = Field(default_factory=dict)
    evaluation: dict[str, Any] = Field(
        default_factory=dict, description="calibration, test and backtest figures vs the baseline"
    )
    leaderboard: list[dict[str, Any]] = Field(
        default_factory=list,
        description="every contender of the training run that registered it, best first",
    )


AliasAction = Literal["promote", "rollback", "repair"]


class AliasChange(BaseModel):
    """One move of an alias."""

    version: str
    at: dt.datetime
    reason: str
    action: AliasAction | None = Field(
        default=None, description="None in records written before actions were recorded"
    )

    def kind(self) -> AliasAction:
        """What this move was (older records: a rollback said so in its reason)."""
        if self.action is not None:
            return self.action
        return "rollback" if self.reason.startswith("rollback from ") else "promote"


class AliasRecord(BaseModel):
    """An alias and its history (newest last)."""

    alias: str
    version: str
    history: list[AliasChange] = Field(default_factory=list)


class PromotionConflict(StoreError):
    """Another promotion moved the alias first; this one lost and changed nothing."""


class AliasDamaged(StoreError):
    """The alias file is not a readable alias record (truncated, edited by hand)."""


class UnusableVersion(HybridflowInputError):
    """A version that cannot be promoted: its files are missing or fail their sha256."""


def check_version_name(version: str) -> str:
    """``version`` when it is a valid version or alias name; HybridflowInputError otherwise."""
    if not _NAME.match(version):
        raise HybridflowInputError(
            f"invalid model version name {version!r}: letters, digits, '.', '_' and '-' only "
            "(at most 128, not starting with '.' or '-')"
        )
    return version


def new_version_id(now: dt.datetime | None = None) -> str:
    """A sortable, unique version id such as ``m-20251231-120000-a1b2c3``."""
    now = now or dt.datetime.now(dt.UTC)
    return f"m-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def rollback_stack(history: list[AliasChange]) -> list[str]:
    """The versions an alias can roll back through, oldest first; the last one is current.

    A promotion pushes its version (promoting the current version again changes nothing), a
    rollback pops the current one, a repair starts over (the history before it was lost)."""
    stack: list[str] = []
    for change in history:
        kind = change.kind()
        if kind == "rollback" and stack:
            stack.pop()
        elif kind == "repair":
            stack = []
        if not stack or stack[-1] != change.version:
            stack.append(change.version)
    return stack


def parse_alias(data: bytes, name: str) -> AliasRecord:
    """The alias record in ``data``; AliasDamaged naming the key and the repair otherwise."""
    try:
        return AliasRecord.model_validate_json(data)
    except ValidationError as exc:
        problem = exc.errors()[0].get("msg", "invalid") if exc.errors() else str(exc)
        raise AliasDamaged(
            f"alias {alias_key(name)} is damaged ({len(data)} bytes, {problem}): repair it with "
            "`hybridflow models promote VERSION`"
        ) from None


class ModelRegistry:
    """Versions and aliases in an :class:`~infra.storage.store.ObjectStore`."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def register(self, files: dict[str, bytes], **fields: Any) -> ModelManifest:
        """Write ``files`` and then the manifest (create-only) as a new immutable version; on a
        failure nothing of the version is left behind."""
        version = check_version_name(fields.pop("version", None) or new_version_id())
        manifest = ModelManifest(
            version=version,
            created_at=dt.datetime.now(dt.UTC),
            files={name: sha256_bytes(data) for name, data in files.items()},
            **fields,
        )
        body = manifest.model_dump_json(indent=2).encode()
        try:
            if self.store.exists(version_manifest_key(version)):
                raise PreconditionFailed(version_manifest_key(version))
            for name, data in files.items():
                self.store.put_bytes(version_file_key(version, name), data)
            self.store.put_bytes_if(version_manifest_key(version), body, if_none_match=True)
        except PreconditionFailed:
            raise StoreError(
                f"model version {version} exists already; versions are immutable"
            ) from None
        except StoreError as exc:
            self._remove_partial(version)
            raise StoreError(
                f"model version {version} could not be registered in {self.store.uri} "
                f"(nothing of it was kept): {exc}"
            ) from exc
        return manifest

    def _remove_partial(self, version: str) -> None:
        try:
            self.store.delete_prefix(version_prefix(version))
        except (StoreError, OSError) as exc:  # the store is failing: say what is left
            log.warning("model version %s: partial files left behind: %s", version, exc)

    def get(self, version: str) -> ModelManifest:
        """The manifest of ``version``; a clear error when it does not exist or is damaged."""
        key = version_manifest_key(check_version_name(version))
        try:
            data = self.store.get_bytes(key)
        except FileNotFoundError:
            raise HybridflowInputError(f"model version not found: {version}") from None
        try:
            return ModelManifest.model_validate_json(data)
        except ValidationError as exc:
            raise StoreError(f"model version {version}: {key} is damaged: {exc}") from None

    def list_versions(self) -> list[ModelManifest]:
        """All complete versions, oldest first (incomplete ones have no manifest and are
        skipped; a damaged manifest is skipped with a warning)."""
        manifests = []
        for key in (k for k in self.store.list(VERSIONS) if is_version_manifest_key(k)):
            try:
                manifests.append(ModelManifest.model_validate_json(self.store.get_bytes(key)))
            except (ValidationError, FileNotFoundError) as exc:
                log.warning("model manifest %s is unreadable, not listed: %s", key, exc)
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

    def verify(self, version: str) -> list[str]:
        """What is wrong with ``version``'s files (empty when every file verifies)."""
        manifest = self.get(version)
        problems = []
        for name, expected in manifest.files.items():
            try:
                data = self.store.get_bytes(version_file_key(version, name))
            except FileNotFoundError:
                problems.append(f"{name} is missing")
                continue
            if sha256_bytes(data) != expected:
                problems.append(f"{name} does not match its sha256 in the manifest")
        return problems

    def alias(self, name: str = PRODUCTION) -> AliasRecord | None:
        """The alias record, or None when the alias was never set; AliasDamaged when its file
        cannot be read as one."""
        data, _ = self._alias_bytes(name)
        return None if data is None else parse_alias(data, name)

    def _alias_bytes(self, name: str) -> tuple[bytes | None, str | None]:
        try:
            return self.store.get_with_token(alias_key(check_version_name(name)))
        except FileNotFoundError:
            return None, None

    def set_alias(
        self,
        version: str,
        reason: str,
        *,
        name: str = PRODUCTION,
        expected_version: str | None | bool = False,
        action: AliasAction = "promote",
    ) -> AliasRecord:
        """Point alias ``name`` at ``version`` (whose files must verify) with a compare-and-swap.

        ``expected_version``: the version the caller decided against (None = "no alias yet");
        False skips that check, and only then is a damaged alias file replaced (a repair). If
        another writer moved the alias in between, raises :class:`PromotionConflict` and
        nothing changes.
        """
        self._check_usable(version)
        data, token = self._alias_bytes(name)
        try:
            current = None if data is None else parse_alias(data, name)
        except AliasDamaged as damage:
            if expected_version is not False:
                raise
            log.warning("%s; replaced by %s", damage, version)
            current, action = None, "repair"
            reason = f"{reason} (repaired a damaged alias file)"
        current_version = current.version if current else None
        if expected_version is not False and expected_version != current_version:
            raise PromotionConflict(
                f"alias {name} moved to {current_version} while deciding against "
                f"{expected_version}; promotion of {version} abandoned"
            )
        change = AliasChange(
            version=version, at=dt.datetime.now(dt.UTC), reason=reason, action=action
        )
        history = (current.history if current else []) + [change]
        record = AliasRecord(alias=name, version=version, history=history[-HISTORY_KEPT:])
        self._swap_alias(name, record, token, version)
        return record

    def _check_usable(self, version: str) -> None:
        problems = self.verify(version)
        if problems:
            raise UnusableVersion(
                f"model version {version} cannot be served: {'; '.join(problems)}; "
                "the alias was not moved"
            )

    def _swap_alias(self, name: str, record: AliasRecord, token: str | None, version: str) -> None:
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

    def rollback(self, name: str = PRODUCTION) -> AliasRecord:
        """Undo the alias's latest promotion that was not undone yet (its files must verify)."""
        current = self.alias(name)
        stack = rollback_stack(current.history) if current else []
        if current is None or len(stack) < 2:
            raise HybridflowInputError(f"alias {name} has no earlier version to roll back to")
        target = stack[-2]
        return self.set_alias(
            target,
            f"rollback from {current.version}",
            name=name,
            expected_version=current.version,
            action="rollback",
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
