"""A checkpoint that reached the store counts as saved even when pruning older ones fails."""

from __future__ import annotations

import logging

import pytest
import torch

from infra.errors import StoreError
from infra.storage.store import LocalFolderStore
from tasks.ml.checkpoints import CheckpointStore


class _ListFailsStore(LocalFolderStore):
    """A folder store whose listings fail once ``broken`` is set (writes still work)."""

    broken = False

    def list(self, prefix: str = "") -> list[str]:
        if self.broken:
            raise StoreError(f"list {prefix} failed after 4 attempts: connection refused")
        return super().list(prefix)


def test_prune_failure_after_a_saved_checkpoint_is_a_warning(tmp_path, caplog):
    store = _ListFailsStore(tmp_path / "store")
    checkpoints = CheckpointStore(store, "t-prune", keep=1)
    checkpoints.save({"w": torch.zeros(2)}, step=1, epoch=1, batch=0, samples_seen=0)
    store.broken = True
    with caplog.at_level(logging.WARNING, logger="tasks.ml.checkpoints"):
        saved = checkpoints.save({"w": torch.ones(2)}, step=2, epoch=1, batch=0, samples_seen=0)
    assert saved.step == 2
    assert "checkpoint step 2 saved, pruning older ones failed" in caplog.text
    store.broken = False
    assert [m.step for m in checkpoints.manifests()] == [2, 1]  # pruned by the next save
    checkpoints.save({"w": torch.ones(2)}, step=3, epoch=1, batch=0, samples_seen=0)
    assert [m.step for m in checkpoints.manifests()] == [3]


def test_a_failed_upload_still_raises_naming_the_checkpoint(tmp_path):
    store = LocalFolderStore(tmp_path / "store")
    checkpoints = CheckpointStore(store, "t-upload")
    (tmp_path / "store" / "checkpoints").write_text("a file where a folder must be")
    with pytest.raises(StoreError, match="step 1 could not be saved"):
        checkpoints.save({"w": torch.zeros(2)}, step=1, epoch=1, batch=0, samples_seen=0)
