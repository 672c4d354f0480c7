"""What the endpoint serves, and how it is replaced while requests keep flowing.

:class:`ModelHolder` keeps one immutable :class:`ServingState` (model + feature snapshot).
A reload builds a complete new state off to the side — download, sha256 check,
``torch.load(weights_only=True)``, warm-up batch — and then swaps it in with a single reference
assignment. A request reads the reference once and finishes on the state it read, so requests in
flight never see a half-loaded model. A version that fails any check is refused: the old state
keeps serving, and the refusal is logged and counted in ``/metrics`` once per alias state
(a damaged alias file included), and shown by ``/ready`` until the store is consistent again
(a fixed alias, a rollback to the served version, a newer snapshot).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, Field

from infra.errors import ChecksumMismatchError, HybridflowInputError
from infra.layout import alias_key
from infra.storage.datasets import DatasetManifest, DatasetManifestDamaged, find_dataset
from infra.storage.registry import PRODUCTION, AliasDamaged, ModelRegistry, parse_alias
from infra.storage.store import ObjectStore
from serving.metrics import ServingMetrics
from serving.scorer import Scorer, canonical_scorer, fast_scorer
from serving.snapshot import FeatureSnapshot, load_snapshot, newest_snapshot_manifest
from tasks.ml.models import FittedModel, load_model, predict_proba

log = logging.getLogger(__name__)
WARMUP_ROWS = 256
STILL_REFUSED = "still refused"  # a check skipped because it was refused in this same state
ONCE = ("manifest_damaged", "snapshot_missing")  # refusals re-found every poll: logged once


class ReloadRefused(Exception):
    """A new model or snapshot failed a check; ``reason`` is a short metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ServedModel:
    """A verified, warmed-up model version."""

    version: str
    model: FittedModel
    score: Scorer  # features (rows x features, model order) -> probabilities
    features: tuple[str, ...]
    position: dict[str, int]
    loaded_at: float
    snapshot_prefix: str | None = None  # its run's scoring features (None: a version before)


@dataclass(frozen=True)
class ServingState:
    """Everything one request needs; replaced whole, never changed in place."""

    model: ServedModel | None = None
    snapshot: FeatureSnapshot | None = None
    snapshot_columns: np.ndarray | None = None  # the model's features' columns in the snapshot


class ReloadReport(BaseModel):
    """What one check of the alias and the snapshots did."""

    model_version: str | None
    features_as_of: dt.date | None
    changed: list[str] = Field(default_factory=list)
    refused: list[str] = Field(default_factory=list)


class ModelHolder:
    """Holds the served state and reloads it from the store (thread-safe; one reload at a time)."""

    def __init__(self, store: ObjectStore, metrics: ServingMetrics, alias: str = PRODUCTION):
        self.store = store
        self.registry = ModelRegistry(store)
        self.metrics = metrics
        self.alias = alias
        self.state = ServingState()
        self._errors: dict[str, str] = {}  # kind -> why its newest version was refused
        self._lock = threading.Lock()
        self._alias_token: str | None = None
        self._refused: set[tuple[str, str | None]] = set()  # (alias token, snapshot data prefix)
        self._refused_snapshots: set[str] = set()

    @property
    def last_error(self) -> str | None:
        """Why what the store holds now is not being served (None when it is)."""
        return "; ".join(self._errors.values()) or None

    def refresh(self, force: bool = False) -> ReloadReport:
        """Check the newest snapshot and the alias; swap in whatever changed and verifies.

        Without ``force``, an unchanged alias (same ETag/content token) costs one small read and a
        version refused once is not retried until the alias or the snapshot moves.
        """
        with self._lock:
            report = ReloadReport(model_version=None, features_as_of=None)
            for kind, step in (
                ("snapshot", self._refresh_snapshot),
                ("model", self._refresh_model),
            ):
                try:
                    change = step(force)
                except ReloadRefused as exc:
                    self._refuse(kind, exc.reason, str(exc), report)
                except Exception as exc:  # store down, unreadable object: keep serving
                    self._refuse(kind, "error", f"{type(exc).__name__}: {exc}", report)
                else:
                    if change == STILL_REFUSED:
                        continue
                    self._errors.pop(kind, None)  # the store and what is served agree again
                    if change:
                        report.changed.append(change)
            state = self.state
            report.model_version = state.model.version if state.model else None
            report.features_as_of = state.snapshot.as_of if state.snapshot else None
            return report

    def _refuse(self, kind: str, reason: str, message: str, report: ReloadReport) -> None:
        error = f"{kind} refused ({reason}): {message}"
        if reason in ONCE and self._errors.get(kind) == error:
            return  # refused once, logged once: shown by /ready until it is repaired
        self.metrics.reload_failures.labels(kind, reason).inc()
        current = self.state.model.version if self.state.model else "nothing"
        self._errors[kind] = error
        log.error("%s; still serving %s", self._errors[kind], current)
        report.refused.append(self._errors[kind])

    def _wanted_snapshot(self, model: ServedModel | None) -> DatasetManifest | None:
        """The snapshot to serve with ``model``: the scoring features of the run that trained
        it, never another run's; for a version that records none (or no model yet) the newest
        run-less date (stores of earlier releases, the serving sample)."""
        if model is not None and model.snapshot_prefix is not None:
            manifest = _dataset(self.store, model.snapshot_prefix)
            if manifest is None:
                raise ReloadRefused(
                    "snapshot_missing",
                    f"model {model.version}: its feature snapshot {model.snapshot_prefix} is not "
                    "published (retired?)",
                )
            return manifest
        try:
            return newest_snapshot_manifest(self.store)
        except DatasetManifestDamaged as exc:
            raise ReloadRefused("manifest_damaged", str(exc)) from None

    def _refresh_snapshot(self, force: bool) -> str | None:
        manifest = self._wanted_snapshot(self.state.model)
        current = self.state.snapshot
        if manifest is None or (current and current.data_prefix == manifest.data_prefix):
            return None
        if manifest.data_prefix in self._refused_snapshots and not force:
            return STILL_REFUSED
        try:
            snapshot = load_snapshot(self.store, manifest)
            if snapshot.rows == 0:
                raise ReloadRefused("empty", f"feature snapshot {manifest.prefix} has no rows")
            columns = None
            if self.state.model is not None:
                columns = _columns_for(snapshot, self.state.model.features, manifest.prefix)
        except Exception:
            self._refused_snapshots.add(manifest.data_prefix)
            raise
        self.state = dataclasses.replace(self.state, snapshot=snapshot, snapshot_columns=columns)
        self._refused_snapshots.clear()
        self.metrics.serving_snapshot(snapshot.as_of.isoformat(), snapshot.rows)
        log.info("feature snapshot as_of %s loaded: %d customers", snapshot.as_of, snapshot.rows)
        return f"features as_of {snapshot.as_of} ({snapshot.rows} customers)"

    def _refresh_model(self, force: bool) -> str | None:
        try:
            data, token = self.store.get_with_token(alias_key(self.alias))
        except FileNotFoundError:
            if self.state.model is None:
                log.warning("no %s model yet: /ready answers 503 until one is promoted", self.alias)
            return None
        if token == self._alias_token and not force:
            return None
        snapshot = self.state.snapshot
        attempt = (token, snapshot.data_prefix if snapshot else None)
        if attempt in self._refused and not force:
            return STILL_REFUSED
        current = self.state.model
        try:
            version = _alias_version(data, self.alias)
            if current is not None and current.version == version:
                self._alias_token = token
                return None
            served, columns, snapshot = self._load(version, snapshot)
        except Exception:
            self._refused.add(attempt)
            raise
        if snapshot is not None and snapshot is not self.state.snapshot:
            self.metrics.serving_snapshot(snapshot.as_of.isoformat(), snapshot.rows)
            log.info(
                "feature snapshot as_of %s loaded: %d customers", snapshot.as_of, snapshot.rows
            )
        self.state = dataclasses.replace(
            self.state, model=served, snapshot=snapshot, snapshot_columns=columns
        )
        self._alias_token = token
        self._refused.clear()  # alias tokens never come back: the old ones are dead weight
        self.metrics.reloads.inc()
        self.metrics.serving_model(served.version, served.loaded_at)
        was = current.version if current else "nothing"
        log.info("now serving model %s (was %s)", served.version, was)
        return f"model {was} -> {served.version}"

    def _load(
        self, version: str, snapshot: FeatureSnapshot | None
    ) -> tuple[ServedModel, np.ndarray | None, FeatureSnapshot | None]:
        """Download, verify, load and warm up ``version`` with its run's feature snapshot (kept
        when it is ``snapshot`` already, else loaded); ReloadRefused on any failed check."""
        try:
            manifest, files = self.registry.read_files(version)
            model = load_model(files, manifest.files)
        except ChecksumMismatchError as exc:
            raise ReloadRefused("checksum", f"model {version}: {exc}") from exc
        except (HybridflowInputError, FileNotFoundError) as exc:
            raise ReloadRefused("missing", f"model {version}: {exc}") from exc
        except Exception as exc:
            raise ReloadRefused(
                "load_error", f"model {version}: {type(exc).__name__}: {exc}"
            ) from exc
        features = tuple(model.features)
        if manifest.scoring_features is not None:
            snapshot = self._snapshot_of(version, manifest.scoring_features, snapshot)
        columns = _columns_for(snapshot, features, version) if snapshot else None
        batch = warmup_batch(features, snapshot, columns)
        try:
            scores = predict_proba(model, batch)
            for row in batch[:3]:
                predict_proba(model, row[None, :])
        except Exception as exc:
            raise ReloadRefused("warmup_error", f"model {version}: warm-up failed: {exc}") from exc
        bad = int((~np.isfinite(scores) | (scores < 0) | (scores > 1)).sum())
        if bad:
            raise ReloadRefused(
                "warmup_nan",
                f"model {version} gave {bad} non-finite or out-of-range score(s) "
                f"on a warm-up batch of {len(batch)} rows",
            )
        served = ServedModel(
            version=version,
            model=model,
            score=_checked_fast_scorer(model, batch, scores, version),
            features=features,
            position={f: i for i, f in enumerate(features)},
            loaded_at=time.time(),
            snapshot_prefix=manifest.scoring_features,
        )
        return served, columns, snapshot

    def _snapshot_of(
        self, version: str, prefix: str, current: FeatureSnapshot | None
    ) -> FeatureSnapshot:
        """The snapshot at ``prefix`` (``current`` when it is that one already)."""
        published = _dataset(self.store, prefix)
        if published is None:
            raise ReloadRefused(
                "snapshot_missing",
                f"model {version}: its feature snapshot {prefix} is not published (retired?)",
            )
        if current is not None and current.data_prefix == published.data_prefix:
            return current
        snapshot = load_snapshot(self.store, published)
        if snapshot.rows == 0:
            raise ReloadRefused("empty", f"feature snapshot {published.prefix} has no rows")
        return snapshot


def _dataset(store: ObjectStore, prefix: str) -> DatasetManifest | None:
    """The dataset's manifest; ReloadRefused("manifest_damaged") naming its key when damaged."""
    try:
        return find_dataset(store, prefix)
    except DatasetManifestDamaged as exc:
        raise ReloadRefused("manifest_damaged", str(exc)) from None


def _alias_version(data: bytes, alias: str) -> str:
    """The version an alias file names; ReloadRefused("alias_damaged") when it is unreadable."""
    try:
        return parse_alias(data, alias).version
    except AliasDamaged as exc:
        raise ReloadRefused("alias_damaged", str(exc)) from None


def _checked_fast_scorer(
    model: FittedModel, batch: np.ndarray, expected: np.ndarray, version: str
) -> Scorer:
    """The fast path when it reproduces ``predict_proba`` on the warm-up batch, else canonical."""
    fast = fast_scorer(model)
    if fast is not None:
        got = np.concatenate([fast(batch), fast(batch[:1])])
        want = np.concatenate([expected, expected[:1]])
        if np.allclose(got, want, rtol=0, atol=1e-6):
            return fast
        log.warning("model %s: fast scoring path differs from predict_proba; not used", version)
    return canonical_scorer(model)


def _columns_for(snapshot: FeatureSnapshot, features: tuple[str, ...], what: str) -> np.ndarray:
    try:
        return snapshot.column_indices(features)
    except KeyError as exc:
        raise ReloadRefused(
            "features_missing",
            f"{what}: feature snapshot as_of {snapshot.as_of} lacks feature(s) {exc.args[0]}",
        ) from None


def warmup_batch(
    features: tuple[str, ...], snapshot: FeatureSnapshot | None, columns: np.ndarray | None
) -> np.ndarray:
    """Real rows from the snapshot when there is one (plus an all-zero row), else synthetic."""
    zeros = np.zeros((1, len(features)), dtype=np.float32)
    if snapshot is not None and columns is not None and snapshot.rows:
        rows = snapshot.values[: WARMUP_ROWS - 1][:, columns]
        return np.vstack([rows, zeros])
    rng = np.random.default_rng(0)
    synthetic = rng.exponential(10.0, size=(WARMUP_ROWS - 1, len(features))).astype(np.float32)
    return np.vstack([synthetic, zeros])
