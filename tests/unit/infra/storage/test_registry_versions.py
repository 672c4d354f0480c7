import pytest

from infra.errors import ChecksumMismatchError, HybridflowInputError, StoreError
from infra.storage.registry import ModelRegistry, PromotionConflict


def test_versions_are_immutable_and_verified(local_store):
    reg = ModelRegistry(local_store)
    m = reg.register({"model.pt": b"weights", "model.json": b"{}"}, metrics={"test_auc": 0.8})
    assert reg.get(m.version).metrics == {"test_auc": 0.8}
    with pytest.raises(StoreError, match="immutable"):
        reg.register({"model.pt": b"other"}, version=m.version)
    local_store.put_bytes(f"models/versions/{m.version}/model.pt", b"tampered")
    with pytest.raises(ChecksumMismatchError):
        reg.read_files(m.version)
    with pytest.raises(HybridflowInputError, match="not found"):
        reg.get("m-nope")


def test_alias_moves_by_compare_and_swap_and_rolls_back(local_store):
    reg = ModelRegistry(local_store)
    v1 = reg.register({"f": b"1"}).version
    v2 = reg.register({"f": b"2"}).version
    reg.set_alias(v1, "first", expected_version=None)
    with pytest.raises(PromotionConflict):
        reg.set_alias(v2, "decided against nothing", expected_version=None)
    reg.set_alias(v2, "better", expected_version=v1)
    assert reg.alias().version == v2
    assert reg.rollback().version == v1
    assert [c.reason for c in reg.alias().history][-1] == f"rollback from {v2}"


def test_incomplete_versions_are_not_listed(local_store):
    reg = ModelRegistry(local_store)
    done = reg.register({"f": b"1"}).version
    local_store.put_bytes("models/versions/m-crashed/f", b"no manifest")
    assert [m.version for m in reg.list_versions()] == [done]
