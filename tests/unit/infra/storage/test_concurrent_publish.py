"""Two writers publishing the same dataset at once, under every interleaving hypothesis finds:
after each single store operation, the manifest readers see names files that exist (and so does
the generation before it); at the end only those two generations are left."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.layout import dataset_generation_folder
from infra.storage.datasets import (
    DatasetManifest,
    find_dataset,
    publish_dataset,
    sweep_abandoned_generations,
)
from infra.storage.store import LocalFolderStore, ObjectStore

PREFIX = "features/as_of=2026-01-31"
WRITERS = ("A", "B")


class Turnstile:
    """Lets one writer thread at a time perform its next store operation, in an order the test
    chooses."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.waiting: set[str] = set()
        self.done: set[str] = set()
        self.granted: str | None = None

    def wait_turn(self) -> None:
        me = threading.current_thread().name
        with self.cond:
            self.waiting.add(me)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.granted == me, timeout=60)
            assert self.granted == me, f"{me} was never let through"
            self.granted = None
            self.waiting.discard(me)
            self.cond.notify_all()

    def finish(self, name: str) -> None:
        with self.cond:
            self.done.add(name)
            self.cond.notify_all()

    def step(self, name: str) -> bool:
        """Let ``name`` run one store operation (up to its next one or its end); False when it
        has finished."""
        with self.cond:
            ready = lambda: name in self.waiting or name in self.done  # noqa: E731
            assert self.cond.wait_for(ready, timeout=60), f"{name} is stuck"
            if name in self.done:
                return False
            self.granted = name
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: self.granted is None, timeout=60)
            assert self.cond.wait_for(ready, timeout=60), f"{name} is stuck"
            return True


class SteppedStore(ObjectStore):
    """A real folder store whose every operation waits for its turn."""

    def __init__(self, inner: LocalFolderStore, turnstile: Turnstile) -> None:
        self.inner, self.turnstile, self.uri = inner, turnstile, inner.uri

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.turnstile.wait_turn()
        return getattr(self.inner, name)(*args, **kwargs)

    def put_bytes(self, key, data):
        return self._call("put_bytes", key, data)

    def put_bytes_if(self, key, data, *, if_none_match=False, if_match=None):
        return self._call("put_bytes_if", key, data, if_none_match=if_none_match, if_match=if_match)

    def get_bytes(self, key):
        return self._call("get_bytes", key)

    def get_with_token(self, key):
        return self._call("get_with_token", key)

    def exists(self, key):
        return self._call("exists", key)

    def list(self, prefix):
        return self._call("list", prefix)

    def delete(self, key):
        return self._call("delete", key)

    def delete_prefix(self, prefix):
        return self._call("delete_prefix", prefix)

    def put_file(self, key, path):
        return self._call("put_file", key, path)

    def get_file(self, key, path):
        return self._call("get_file", key, path)

    def staging_dir(self):
        return self.inner.staging_dir()

    def publish_dir(self, local_dir, prefix):
        return self._call("publish_dir", local_dir, prefix)

    def local_path(self, key):
        return self.inner.local_path(key)


def _staged(store: LocalFolderStore, content: str) -> Path:
    folder = store.staging_dir()
    (folder / "part-00000.parquet").write_text(content)
    (folder / "_SUCCESS").write_text("")
    return folder


def _generations(store: LocalFolderStore) -> set[str]:
    return {g for k in store.list(PREFIX) if (g := dataset_generation_folder(PREFIX, k))}


def _readers_are_safe(store: LocalFolderStore) -> None:
    """What a reader can resolve right now exists: the manifest's files and the generation
    before it (a reader that resolved the previous manifest a moment ago is reading that)."""
    manifest = find_dataset(store, PREFIX)
    if manifest is None:
        return
    missing = [f for f in manifest.files if not store.exists(f)]
    assert not missing, f"the manifest names deleted files: {missing}"
    if manifest.previous_data_prefix:
        assert store.list(manifest.previous_data_prefix), "the generation before was deleted"


def _run_writers(store: LocalFolderStore, schedule: list[int]) -> dict[str, DatasetManifest]:
    turnstile = Turnstile()
    stepped = SteppedStore(store, turnstile)
    results: dict[str, DatasetManifest] = {}
    errors: list[BaseException] = []

    def writer(name: str, local: Path) -> Callable[[], None]:
        def run() -> None:
            try:
                results[name] = publish_dataset(stepped, local, PREFIX, rows=1)
            except BaseException as exc:  # re-raised in the test thread
                errors.append(exc)
            finally:
                turnstile.finish(name)

        return run

    threads = [
        threading.Thread(target=writer(n, _staged(store, n)), name=n, daemon=True) for n in WRITERS
    ]
    for t in threads:
        t.start()
    for pick in schedule:
        name = WRITERS[pick]
        if not turnstile.step(name):
            turnstile.step(WRITERS[1 - pick])
        _readers_are_safe(store)
    while any(turnstile.step(n) for n in WRITERS):
        _readers_are_safe(store)
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    existing=st.integers(min_value=0, max_value=2),
    schedule=st.lists(st.integers(min_value=0, max_value=1), max_size=40),
)
def test_two_writers_of_one_dataset_never_leave_a_manifest_naming_deleted_files(
    tmp_path_factory, existing, schedule
):
    store = LocalFolderStore(tmp_path_factory.mktemp("store"))
    for i in range(existing):
        publish_dataset(store, _staged(store, f"old {i}"), PREFIX, rows=1)
    results = _run_writers(store, schedule)
    final = find_dataset(store, PREFIX)
    ours = {m.data_prefix for m in results.values()}
    assert final.data_prefix in ours and final.previous_data_prefix in ours, "a write was lost"
    assert _generations(store) == {final.data_prefix, final.previous_data_prefix}


def test_a_generation_nobody_published_is_swept_only_once_it_is_stale(tmp_path):
    store = LocalFolderStore(tmp_path / "store")
    publish_dataset(store, _staged(store, "v1"), PREFIX, rows=1)
    t0 = dt.datetime(2026, 1, 31, 12, 0, tzinfo=dt.UTC)
    # a writer that died after uploading its data folder, before its manifest
    orphan = store.publish_dir(_staged(store, "orphan"), f"{PREFIX}/data-20260131T120000Z-dead")
    legacy = store.publish_dir(_staged(store, "legacy"), f"{PREFIX}/data-0123456789ab")
    assert sweep_abandoned_generations(store, PREFIX, now=t0 + dt.timedelta(hours=1)) == [
        f"{PREFIX}/data-0123456789ab"  # an earlier release's id (no time): swept when unnamed
    ]
    assert store.exists(orphan[0]) and not store.exists(legacy[0])
    swept = sweep_abandoned_generations(store, PREFIX, now=t0 + dt.timedelta(hours=7))
    assert swept == [f"{PREFIX}/data-20260131T120000Z-dead"]
    assert len(_generations(store)) == 1, "the published generation must stay"
