import pytest

from infra.errors import StoreError
from infra.storage.datasets import find_dataset, publish_dataset, read_dataset_manifest
from infra.storage.store import LocalFolderStore, PreconditionFailed, open_store, sha256_bytes


def test_put_get_list_delete(tmp_path):
    store = LocalFolderStore(tmp_path)
    store.put_bytes("a/b/c.bin", b"hello")
    store.put_json("a/x.json", {"k": 1})
    assert store.get_bytes("a/b/c.bin") == b"hello"
    assert store.get_json("a/x.json") == {"k": 1}
    assert store.list("a") == ["a/b/c.bin", "a/x.json"]
    store.delete("a/b/c.bin")
    assert not store.exists("a/b/c.bin")
    with pytest.raises(FileNotFoundError):
        store.get_bytes("a/b/c.bin")


def test_writes_leave_no_temporary_files(tmp_path):
    store = LocalFolderStore(tmp_path)
    for i in range(5):
        store.put_bytes("k", str(i).encode())
    assert [p.name for p in tmp_path.iterdir()] == ["k"]


@pytest.mark.parametrize("key", ["", "../escape", "a/../../b", "a//b"])
def test_rejects_keys_outside_the_root(tmp_path, key):
    with pytest.raises(StoreError):
        LocalFolderStore(tmp_path).put_bytes(key, b"x")


def test_conditional_writes(tmp_path):
    store = LocalFolderStore(tmp_path)
    token = store.put_bytes_if("alias", b"v1", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put_bytes_if("alias", b"v2", if_none_match=True)
    store.put_bytes_if("alias", b"v2", if_match=token)
    with pytest.raises(PreconditionFailed):
        store.put_bytes_if("alias", b"v3", if_match=token)  # stale token
    assert store.get_with_token("alias") == (b"v2", sha256_bytes(b"v2"))


def test_open_store_by_uri(tmp_path):
    assert isinstance(open_store(str(tmp_path)), LocalFolderStore)
    with pytest.raises(StoreError, match="unsupported"):
        open_store("gs://bucket/x")


def test_dataset_publish_replaces_atomically_and_sweeps_old_generations(tmp_path):
    store = LocalFolderStore(tmp_path / "store")
    prefixes = []
    for gen in range(3):
        local = store.staging_dir()
        (local / "part-0.parquet").write_bytes(f"gen{gen}".encode())
        (local / "_SUCCESS").write_bytes(b"")
        m = publish_dataset(store, local, "ds/x", rows=gen)
        prefixes.append(m.data_prefix)
        assert read_dataset_manifest(store, "ds/x").data_prefix == m.data_prefix
        assert m.files == [f"{m.data_prefix}/part-0.parquet"]
    data_dirs = {k.split("/")[2] for k in store.list("ds/x") if "/data-" in k}
    # the current and the previous generation stay; older ones are swept
    assert data_dirs == {prefixes[2].split("/")[-1], prefixes[1].split("/")[-1]}


def test_unpublished_data_is_invisible(tmp_path):
    store = LocalFolderStore(tmp_path)
    store.put_bytes("ds/y/data-abc/part-0.parquet", b"half-written")  # crash before manifest
    assert find_dataset(store, "ds/y") is None
    with pytest.raises(StoreError, match="no dataset"):
        read_dataset_manifest(store, "ds/y")
