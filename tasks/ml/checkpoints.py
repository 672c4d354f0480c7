"""Training checkpoints in the store: atomic, verified, newest-valid-first.

Layout per training run (``training_id``)::

    checkpoints/<training_id>/step-<step>/state.pt        torch.save of plain tensors/types
    checkpoints/<training_id>/manifest-<step>.json        written last: names the file + sha256

A checkpoint exists once its manifest exists, so a crash or a store failure mid-save leaves
nothing that a reader would pick up. Reading verifies the sha256 before
``torch.load(weights_only=True)``; a newest checkpoint that is corrupt, truncated, missing or not a
weights-only torch file (a pickle with a blocked global) is skipped with a warning naming it, in
favour of the one before (:meth:`CheckpointStore.candidates`). Only the newest ``keep``
checkpoints are kept.
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra.errors import ChecksumMismatchError, StoreError
from infra.layout import (
    CHECKPOINT_STATE,
    checkpoint_key_step,
    checkpoint_manifest_key,
    checkpoint_state_key,
    checkpoint_step_prefix,
    checkpoints_prefix,
)
from infra.settings import CheckpointSettings
from infra.storage.store import ObjectStore, sha256_bytes, sha256_file
from tasks.ml.weights import WeightsUnreadableError, load_weights

log = logging.getLogger(__name__)


class CheckpointManifest(BaseModel):
    """What a checkpoint holds and how to verify it."""

    training_id: str
    step: int
    epoch: int = Field(description="epoch the data position refers to (1-based)")
    batch: int = Field(description="next global mini-batch index within that epoch")
    samples_seen: int
    best_metric: float | None = None
    finished: bool = False
    world_size: int = 1
    files: dict[str, str] = Field(description="file name -> sha256")
    size_bytes: int
    created_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))


class LoadedCheckpoint(BaseModel):
    """A verified checkpoint: its manifest and the loaded state dict."""

    model_config = {"arbitrary_types_allowed": True}

    manifest: CheckpointManifest
    state: dict[str, Any]
    uri: str


class CheckpointUnusableError(ValueError):
    """A checkpoint whose bytes verify but whose state cannot be used (unreadable, not a dict)."""


class CheckpointPolicy:
    """When to checkpoint: every ``every_steps`` optimiser steps and/or ``every_seconds``."""

    def __init__(self, every_steps: int, every_seconds: float) -> None:
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.last_time = time.monotonic()
        self.last_step_saved = -1

    @classmethod
    def of(cls, settings: CheckpointSettings) -> CheckpointPolicy:
        """The policy of ``HYBRIDFLOW_CHECKPOINT__*`` (by default: every 120 s of training)."""
        return cls(settings.every_steps, settings.every_seconds)

    def due(self, step: int) -> bool:
        """True when a checkpoint should be written after ``step``."""
        if self.every_steps and step % self.every_steps == 0:
            return True
        return bool(self.every_seconds) and time.monotonic() - self.last_time >= self.every_seconds

    def mark(self, step: int) -> None:
        """A checkpoint was just written at ``step``."""
        self.last_time = time.monotonic()
        self.last_step_saved = step


class CheckpointStore:
    """Save, list, verify and prune the checkpoints of one training run."""

    def __init__(self, store: ObjectStore, training_id: str, keep: int = 3) -> None:
        self.store = store
        self.training_id = training_id
        self.keep = keep
        self.prefix = checkpoints_prefix(training_id)
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[CheckpointManifest] | None = None
        self.skipped: list[int] = []  # steps :meth:`candidates` passed over, newest first

    def uri(self) -> str:
        """Where this run's checkpoints live."""
        return self.store.key_uri(self.prefix)

    def save(self, state: dict[str, Any], **fields: Any) -> CheckpointManifest:
        """Write ``state`` then its manifest; prune older checkpoints. StoreError on failure
        (after the store's retries), with no manifest written for this step."""
        self.wait()
        return self._upload(*self._serialize(state, fields))

    def save_async(
        self,
        state: dict[str, Any],
        on_saved: Callable[[CheckpointManifest], None] | None = None,
        **fields: Any,
    ) -> None:
        """Serialise ``state`` now (a consistent snapshot) and upload it in a background thread
        while training goes on. The previous upload is finished first and its failure, if any,
        is raised here; :meth:`wait` raises the last one's."""
        self.wait()
        path, manifest = self._serialize(state, fields)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-ckpt")

        def upload() -> CheckpointManifest:
            saved = self._upload(path, manifest)
            if on_saved is not None:
                on_saved(saved)
            return saved

        self._pending = self._executor.submit(upload)

    def wait(self) -> CheckpointManifest | None:
        """Block until the background upload (if any) is done; raises its StoreError."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> None:
        """Let an upload in flight finish (its outcome is not raised) and stop the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor, self._pending = None, None

    def _serialize(
        self, state: dict[str, Any], fields: dict[str, Any]
    ) -> tuple[Path, CheckpointManifest]:
        import torch

        path = Path(tempfile.mkdtemp(prefix="hf-ckpt-")) / CHECKPOINT_STATE
        torch.save(state, path)
        manifest = CheckpointManifest(
            training_id=self.training_id,
            files={CHECKPOINT_STATE: sha256_file(path)},
            size_bytes=path.stat().st_size,
            **fields,
        )
        return path, manifest

    def _upload(self, path: Path, manifest: CheckpointManifest) -> CheckpointManifest:
        step = manifest.step
        try:
            self.store.put_file(checkpoint_state_key(self.training_id, step), path)
            self.store.put_bytes(
                checkpoint_manifest_key(self.training_id, step),
                manifest.model_dump_json(indent=2).encode(),
            )
        except StoreError as exc:
            raise StoreError(
                f"checkpoint of training {self.training_id} at step {step} could not be "
                f"saved to {self.uri()}: {exc}"
            ) from exc
        finally:
            shutil.rmtree(path.parent, ignore_errors=True)
        try:
            self._prune()
        except StoreError as exc:  # the checkpoint is saved; older ones go with the next save
            log.warning("checkpoint step %d saved, pruning older ones failed: %s", step, exc)
        return manifest

    def manifests(self) -> list[CheckpointManifest]:
        """Readable checkpoint manifests, newest step first."""
        out = []
        for key in self.store.list(self.prefix):
            if (checkpoint_key_step(self.training_id, key) or ("",))[0] == "manifest":
                try:
                    out.append(CheckpointManifest.model_validate_json(self.store.get_bytes(key)))
                except (ValueError, FileNotFoundError) as exc:
                    log.warning("checkpoint manifest %s is unreadable, skipped: %s", key, exc)
        return sorted(out, key=lambda m: m.step, reverse=True)

    def load(self, manifest: CheckpointManifest) -> LoadedCheckpoint:
        """Fetch and verify one checkpoint; ChecksumMismatchError when its bytes are corrupt,
        CheckpointUnusableError when they are not a weights-only torch file of a state dict."""
        key = checkpoint_state_key(self.training_id, manifest.step)
        uri = self.store.key_uri(key)
        data = self.store.get_bytes(key)
        actual = sha256_bytes(data)
        if actual != manifest.files.get(CHECKPOINT_STATE):
            raise ChecksumMismatchError(
                f"{uri}: sha256 {actual[:12]}... does not match its manifest "
                f"({(manifest.files.get(CHECKPOINT_STATE) or 'none')[:12]}...)"
            )
        try:
            state = load_weights(data)
        except WeightsUnreadableError as exc:
            raise CheckpointUnusableError(f"{uri}: {exc}") from None
        if not isinstance(state, dict):
            raise CheckpointUnusableError(
                f"{uri}: it holds a {type(state).__name__}, not a training state"
            )
        return LoadedCheckpoint(manifest=manifest, state=state, uri=uri)

    def candidates(self) -> Iterator[LoadedCheckpoint]:
        """The checkpoints that verify and load, newest first; the others are skipped with a
        warning naming them (and their steps recorded in :attr:`skipped`). A caller that cannot
        use one either (another network, a state that does not restore) calls :meth:`skip` and
        takes the next."""
        self.skipped = []
        for manifest in self.manifests():
            try:
                loaded = self.load(manifest)
            except (ChecksumMismatchError, CheckpointUnusableError, FileNotFoundError) as exc:
                self.skip(manifest.step, str(exc))
                continue
            yield loaded

    def skip(self, step: int, reason: str) -> None:
        """Warn that checkpoint ``step`` is passed over, and why."""
        self.skipped.append(step)
        log.warning(
            "checkpoint step %d of training %s skipped (the one before is tried next): %s",
            step,
            self.training_id,
            reason,
        )

    def latest_valid(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies and loads; the others are skipped with a warning."""
        return next(self.candidates(), None)

    def clear(self) -> int:
        """Remove every checkpoint of this run (``--fresh``); returns how many there were."""
        n = len(self.manifests())
        for key in self.store.list(self.prefix):
            if (checkpoint_key_step(self.training_id, key) or ("",))[0] == "manifest":
                self.store.delete(key)  # manifests first: nothing half-deleted stays visible
        self.store.delete_prefix(self.prefix)
        return n

    def _prune(self) -> None:
        """Keep the newest ``keep`` checkpoints; drop older ones and orphaned state objects
        (manifests first, so nothing visible ever points at a deleted object)."""
        parsed = [checkpoint_key_step(self.training_id, k) for k in self.store.list(self.prefix)]
        steps = sorted({s for kind, s in filter(None, parsed) if kind == "manifest"}, reverse=True)
        if not steps:
            return
        for step in steps[self.keep :]:
            self.store.delete(checkpoint_manifest_key(self.training_id, step))
        kept = set(steps[: self.keep])
        state_steps = {s for kind, s in filter(None, parsed) if kind == "step"}
        for step in sorted(state_steps):
            if step not in kept and step < steps[0]:
                self.store.delete_prefix(checkpoint_step_prefix(self.training_id, step))
