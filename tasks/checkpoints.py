"""Training checkpoints in the store: atomic, verified, newest-valid-first.

Layout per training run (``training_id``)::

    checkpoints/<training_id>/step-<step>/state.pt        torch.save of plain tensors/types
    checkpoints/<training_id>/manifest-<step>.json        written last: names the file + sha256

A checkpoint exists once its manifest exists, so a crash or a store failure mid-save leaves
nothing that a reader would pick up. Reading verifies the sha256 before
``torch.load(weights_only=True)``; a corrupt or truncated newest checkpoint is skipped with a
warning in favour of the one before. Only the newest ``keep`` checkpoints are kept.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from infra.errors import ChecksumMismatchError, StoreError
from infra.store import ObjectStore, sha256_bytes, sha256_file

log = logging.getLogger(__name__)
ROOT = "checkpoints"
STATE_FILE = "state.pt"


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


class CheckpointPolicy:
    """When to checkpoint: every ``every_steps`` optimiser steps and/or ``every_seconds``."""

    def __init__(self, every_steps: int, every_seconds: float) -> None:
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.last_time = time.monotonic()
        self.last_step_saved = -1

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
        self.prefix = f"{ROOT}/{training_id}"

    def uri(self) -> str:
        """Where this run's checkpoints live."""
        return self.store.key_uri(self.prefix)

    def save(self, state: dict[str, Any], **fields: Any) -> CheckpointManifest:
        """Write ``state`` then its manifest; prune older checkpoints. StoreError on failure
        (after the store's retries), with no manifest written for this step."""
        step = int(fields["step"])
        with tempfile.TemporaryDirectory(prefix="hf-ckpt-") as tmp:
            path = Path(tmp) / STATE_FILE
            torch.save(state, path)
            digest, size = sha256_file(path), path.stat().st_size
            manifest = CheckpointManifest(
                training_id=self.training_id,
                files={STATE_FILE: digest},
                size_bytes=size,
                **fields,
            )
            try:
                self.store.put_file(f"{self.prefix}/step-{step:010d}/{STATE_FILE}", path)
                self.store.put_bytes(
                    f"{self.prefix}/manifest-{step:010d}.json",
                    manifest.model_dump_json(indent=2).encode(),
                )
            except StoreError as exc:
                raise StoreError(
                    f"checkpoint of training {self.training_id} at step {step} could not be "
                    f"saved to {self.uri()}: {exc}"
                ) from exc
        self._prune()
        return manifest

    def manifests(self) -> list[CheckpointManifest]:
        """Readable checkpoint manifests, newest step first."""
        out = []
        for key in self.store.list(self.prefix):
            name = key.rsplit("/", 1)[-1]
            if name.startswith("manifest-") and name.endswith(".json"):
                try:
                    out.append(CheckpointManifest.model_validate_json(self.store.get_bytes(key)))
                except (ValueError, FileNotFoundError) as exc:
                    log.warning("checkpoint manifest %s is unreadable, skipped: %s", key, exc)
        return sorted(out, key=lambda m: m.step, reverse=True)

    def load(self, manifest: CheckpointManifest) -> LoadedCheckpoint:
        """Fetch and verify one checkpoint; ChecksumMismatchError when its bytes are corrupt."""
        key = f"{self.prefix}/step-{manifest.step:010d}/{STATE_FILE}"
        data = self.store.get_bytes(key)
        actual = sha256_bytes(data)
        if actual != manifest.files[STATE_FILE]:
            raise ChecksumMismatchError(
                f"{self.store.key_uri(key)}: sha256 {actual[:12]}... does not match its "
                f"manifest ({manifest.files[STATE_FILE][:12]}...)"
            )
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        return LoadedCheckpoint(manifest=manifest, state=state, uri=self.store.key_uri(key))

    def latest_valid(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies; corrupt or missing ones are skipped with a warning."""
        for manifest in self.manifests():
            try:
                return self.load(manifest)
            except (ChecksumMismatchError, FileNotFoundError) as exc:
                log.warning(
                    "checkpoint step %d of training %s skipped: %s",
                    manifest.step,
                    self.training_id,
                    exc,
                )
        return None

    def clear(self) -> int:
        """Remove every checkpoint of this run (``--fresh``); returns how many there were."""
        n = len(self.manifests())
        for key in self.store.list(self.prefix):
            if key.rsplit("/", 1)[-1].startswith("manifest-"):
                self.store.delete(key)  # manifests first: nothing half-deleted stays visible
        self.store.delete_prefix(self.prefix)
        return n

    def _prune(self) -> None:
        """Keep the newest ``keep`` checkpoints; drop older ones and orphaned state objects
        (manifests first, so nothing visible ever points at a deleted object)."""
        keys = self.store.list(self.prefix)
        steps = sorted(
            {int(k.rsplit("-", 1)[-1][:-5]) for k in keys if "/manifest-" in k}, reverse=True
        )
        if not steps:
            return
        for step in steps[self.keep :]:
            self.store.delete(f"{self.prefix}/manifest-{step:010d}.json")
        kept = set(steps[: self.keep])
        state_steps = {
            int(part[5:])
            for part in (k[len(self.prefix) + 1 :].split("/", 1)[0] for k in keys)
            if part.startswith("step-")
        }
        for step in sorted(state_steps):
            if step not in kept and step < steps[0]:
                self.store.delete_prefix(f"{self.prefix}/step-{step:010d}")
