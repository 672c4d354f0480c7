"""The folder store's durability: file modes follow the umask, renames are fsynced with their
folder, prefixes cannot leave the store, and a full disk gives errors naming what was written
with nothing left behind (a real full filesystem: a small tmpfs in a mount namespace)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from infra.errors import StoreError
from infra.layout import alias_key, dataset_manifest_key, version_file_key
from infra.storage.datasets import publish_dataset
from infra.storage.registry import ModelRegistry
from infra.storage.store import LocalFolderStore

REPO = Path(__file__).resolve().parents[4]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_every_file_the_store_writes_follows_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        store = LocalFolderStore(tmp_path / "store")
        registry = ModelRegistry(store)
        version = registry.register({"model.pt": b"w", "model.json": b"{}"}).version
        registry.set_alias(version, "mode test")
        upload = tmp_path / "state.pt"
        upload.write_bytes(b"state")
        os.chmod(upload, 0o600)  # the source's mode must not leak into the store
        store.put_file("checkpoints/t/step-1/state.pt", upload)
        staging = store.staging_dir()
        (staging / "part-0.parquet").write_bytes(b"p")
        publish_dataset(store, staging, "features/as_of=2026-01-01", rows=1)
    finally:
        os.umask(old)
    written = [
        alias_key("production"),
        version_file_key(version, "model.pt"),
        version_file_key(version, "manifest.json"),
        "checkpoints/t/step-1/state.pt",
        dataset_manifest_key("features/as_of=2026-01-01"),
    ]
    expected = 0o666 & ~umask
    assert {k: oct(_mode(store.local_path(k))) for k in written} == {
        k: oct(expected) for k in written
    }
    lock = store.local_path(alias_key("production")).with_name(".production.json.lock")
    assert _mode(lock) == expected


def test_renames_are_made_durable_with_their_folder(tmp_path, monkeypatch):
    store = LocalFolderStore(tmp_path / "store")
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store.put_bytes("a/b.json", b"{}")
    assert synced[-1] == str(store.root / "a"), "the folder was not fsynced after the rename"
    source = tmp_path / "src.bin"
    source.write_bytes(b"data")
    synced.clear()
    store.put_file("c/d.bin", source)
    assert any(p.startswith(str(store.root / "c" / ".d.bin.")) for p in synced), synced
    assert synced[-1] == str(store.root / "c")
    staging = store.staging_dir()
    (staging / "sub").mkdir()
    (staging / "sub" / "part-0.parquet").write_bytes(b"p")
    synced.clear()
    store.publish_dir(staging, "ds/data-1")
    assert str(staging / "sub" / "part-0.parquet") in synced, "published files were not fsynced"
    assert synced[-1] == str(store.root / "ds")


@pytest.mark.parametrize("prefix", ["../../etc", "a/../../b", "./x", "a//b"])
def test_list_refuses_prefixes_outside_the_store(tmp_path, prefix):
    outside = tmp_path / "secret.txt"
    outside.write_text("not the store's")
    store = LocalFolderStore(tmp_path / "deep" / "store")
    with pytest.raises(StoreError, match="invalid store key"):
        store.list(prefix)
    with pytest.raises(StoreError, match="invalid store key"):
        store.delete_prefix(prefix)
    store.put_bytes("k", b"v")
    assert store.list("") == ["k"] and store.list("/") == ["k"]


def _can_mount_tmpfs(probe_dir: Path) -> bool:
    if not shutil.which("unshare"):
        return False
    probe_dir.mkdir()
    cmd = f"mount -t tmpfs -o size=64k tmpfs {probe_dir}"
    args = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", cmd]
    return subprocess.run(args, capture_output=True, timeout=30).returncode == 0


def test_a_full_disk_names_what_failed_and_leaves_nothing_behind(tmp_path):
    if not _can_mount_tmpfs(tmp_path / "probe"):
        pytest.skip("unshare/mount of a tmpfs is not permitted here: no full disk to test on")
    mount = tmp_path / "small-disk"
    mount.mkdir()
    script = (
        'mount -t tmpfs -o size=1m tmpfs "$1" && exec "$2" -m tests.fixtures.full_disk_probe "$1"'
    )
    args = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh"]
    proc = subprocess.run(
        [*args, str(mount), sys.executable], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    full = "No space left on device (ENOSPC)"
    assert "model version m-" in seen["register"] and full in seen["register"], seen
    assert "nothing of it was kept" in seen["register"]
    assert "checkpoint of training train-full-disk at step 1" in seen["checkpoint"], seen
    assert full in seen["checkpoint"]
    assert "uploads/blob.bin" in seen["put_file"] and full in seen["put_file"], seen
    assert "models/aliases/production.json" in seen["alias"] and full in seen["alias"], seen
    assert seen["left_behind"] == [], "temporary files or empty folders stayed behind"
    assert seen["versions"] == [seen["first"]] and seen["production"] == seen["first"]
    assert seen["checkpoints"] == 0
    assert seen["register_after_freeing"] == "ok"
