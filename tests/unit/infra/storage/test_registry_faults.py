"""The registry under faults: a killed lock holder, corrupt versions, repeated rollbacks, a damaged
alias file, bad version names — through the library and through ``hybridflow models``."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time

import pytest

from infra.errors import HybridflowInputError, StoreError
from infra.layout import alias_key, version_file_key
from infra.storage.fs import held_lock
from infra.storage.registry import (
    AliasChange,
    AliasDamaged,
    ModelRegistry,
    UnusableVersion,
    rollback_stack,
)


@pytest.fixture
def registry(local_store):
    return ModelRegistry(local_store)


def _versions(registry: ModelRegistry, n: int) -> list[str]:
    return [registry.register({"model.pt": f"weights {i}".encode()}).version for i in range(n)]


def _flip_a_byte(store, version: str, name: str = "model.pt") -> None:
    path = store.local_path(version_file_key(version, name))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def models_cli(local_store, monkeypatch, capsys):
    """``hybridflow models ...`` in this process against ``local_store``: (exit code, out, err)."""
    from cli.main import main
    from infra.settings import get_settings

    monkeypatch.setenv("HYBRIDFLOW_STORE", str(local_store.root))
    get_settings.cache_clear()

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["models", *args])
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    get_settings.cache_clear()


# 1. a lock left by a killed process


def test_a_sigkilled_lock_holder_does_not_block_promotion(registry, local_store):
    v1, v2 = _versions(registry, 2)
    registry.set_alias(v1, "first")
    lock = local_store.local_path(alias_key("production")).with_name(".production.json.lock")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from infra.storage.fs import held_lock\n"
            "with held_lock(Path(sys.argv[1]), 'test holder'):\n"
            "    print('held', flush=True); time.sleep(600)",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreError, match=f"held by pid {holder.pid}"):
            with held_lock(lock, "a second writer", timeout_s=0.2):
                pass  # a live holder keeps the lock, and the error names it
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
    assert lock.exists(), "the killed holder left its lock file behind"
    registry.set_alias(v2, "after the holder died")
    assert registry.alias().version == v2


def test_a_stale_lock_file_from_an_older_release_is_ignored(registry, local_store, models_cli):
    (v1,) = _versions(registry, 1)
    lock = local_store.local_path(alias_key("production")).with_name(".production.json.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()  # the reproduction: `touch <store>/models/aliases/.production.json.lock`
    started = time.monotonic()
    code, out, _ = models_cli("promote", v1)
    assert code == 0 and f"production -> {v1}" in out
    assert time.monotonic() - started < 20, "promotion waited for a lock nobody holds"


# 2. a corrupt version is never promoted, and `models show` says what is wrong


def test_a_corrupt_version_is_refused_by_promote_and_reported_by_show(
    registry, local_store, models_cli
):
    v1, v2 = _versions(registry, 2)
    registry.set_alias(v1, "first")
    _flip_a_byte(local_store, v2)
    assert registry.verify(v2) == ["model.pt does not match its sha256 in the manifest"]
    with pytest.raises(UnusableVersion, match=f"{v2} cannot be served"):
        registry.set_alias(v2, "corrupt", expected_version=v1)
    assert registry.alias().version == v1

    code, _, err = models_cli("promote", v2)
    assert code == 2 and "model.pt does not match its sha256" in err
    code, out, err = models_cli("show", v2)
    assert code == 1 and f'"version": "{v2}"' in out
    assert f"model version {v2} is damaged: model.pt does not match" in err
    local_store.delete(version_file_key(v1, "model.pt"))
    assert registry.verify(v1) == ["model.pt is missing"]
    code, _, err = models_cli("show")
    assert code == 1 and "model.pt is missing" in err


def test_rollback_to_a_version_that_no_longer_verifies_is_refused(registry, local_store):
    v1, v2 = _versions(registry, 2)
    registry.set_alias(v1, "first")
    registry.set_alias(v2, "second")
    _flip_a_byte(local_store, v1)
    with pytest.raises(UnusableVersion, match=v1):
        registry.rollback()
    assert registry.alias().version == v2


# 3. rollback walks the promotion history


def test_rollback_twice_walks_back_instead_of_toggling(registry, models_cli):
    v1, v2, v3 = _versions(registry, 3)
    for v in (v1, v2, v3):
        registry.set_alias(v, "promote")
    assert registry.rollback().version == v2
    assert registry.rollback().version == v1
    with pytest.raises(HybridflowInputError, match="no earlier version"):
        registry.rollback()
    assert registry.alias().version == v1
    code, _, err = models_cli("rollback")
    assert code == 2 and "no earlier version" in err


def test_the_issues_reproduction_promote_rollback_rollback(registry, models_cli):
    v1, v2 = _versions(registry, 2)
    registry.set_alias(v1, "first")
    assert models_cli("promote", v2)[0] == 0
    assert models_cli("rollback")[0] == 0
    code, _, _ = models_cli("rollback")
    assert code == 2 and registry.alias().version == v1, "a second rollback toggled back to v2"


def test_promoting_the_same_version_twice_still_rolls_back(registry):
    v1, v2 = _versions(registry, 2)
    for v in (v1, v2, v2):
        registry.set_alias(v, "promote")
    assert registry.rollback().version == v1


def test_a_promotion_after_a_rollback_is_undone_first(registry):
    v1, v2, v3, v4 = _versions(registry, 4)
    for v in (v1, v2, v3):
        registry.set_alias(v, "promote")
    registry.rollback()  # -> v2
    registry.set_alias(v4, "promote")
    assert [registry.rollback().version, registry.rollback().version] == [v2, v1]


def _change(version: str, reason: str, action=None) -> AliasChange:
    return AliasChange(version=version, at=dt.datetime(2026, 1, 1), reason=reason, action=action)


def test_rollback_stack_reads_records_written_before_actions_were_recorded():
    old_toggle = [
        _change("a", "promote"),
        _change("b", "promote"),
        _change("a", "rollback from b"),
    ]
    assert rollback_stack(old_toggle) == ["a"]
    assert rollback_stack([*old_toggle, _change("c", "gate")]) == ["a", "c"]
    repaired = [_change("a", "x"), _change("b", "y", "repair"), _change("c", "z")]
    assert rollback_stack(repaired) == ["b", "c"]


# 6. a damaged alias file


def test_a_truncated_alias_is_reported_and_a_promotion_repairs_it(
    registry, local_store, models_cli
):
    v1, v2 = _versions(registry, 2)
    registry.set_alias(v1, "first")
    registry.set_alias(v2, "second")
    path = local_store.local_path(alias_key("production"))
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(AliasDamaged, match="models/aliases/production.json is damaged"):
        registry.alias()
    with pytest.raises(AliasDamaged):  # a gate that decided against a version does not repair
        registry.set_alias(v1, "gate", expected_version=v2)

    code, out, err = models_cli("list")
    assert code == 0 and v1 in out and v2 in out and "is damaged" in err
    code, _, err = models_cli("rollback")
    assert code == 2 and "cannot roll back" in err and "models promote" in err
    code, out, _ = models_cli("promote", v1)
    assert code == 0 and "was a damaged alias file" in out
    record = registry.alias()
    assert record.version == v1 and [c.action for c in record.history] == ["repair"]
    with pytest.raises(HybridflowInputError, match="no earlier version"):
        registry.rollback()


# 13. version names


@pytest.mark.parametrize("bad", ["../../etc", "a/b", ".hidden", "two words", ""])
def test_invalid_version_names_are_bad_input(registry, models_cli, bad):
    with pytest.raises(HybridflowInputError, match="invalid model version name"):
        registry.get(bad)
    code, _, err = models_cli("promote", bad)
    assert code == 2 and "invalid model version name" in err
    code, _, err = models_cli("show", bad)
    assert code == 2 and "invalid model version name" in err


def test_a_version_name_that_does_not_exist_is_bad_input(models_cli):
    code, _, err = models_cli("promote", "m-20260101-000000-abcdef")
    assert code == 2 and "model version not found" in err
