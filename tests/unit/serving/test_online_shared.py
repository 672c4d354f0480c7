"""An online state changed by one object (the ingest worker's) and read by another (the
endpoint's) through shared blocks: the header's seqlock, a handed-over state read while its
writer grows it (new customers, wider mix columns, rings of every day) equal to a state that
never changed hands, a reader waiting only for the rows being changed, and every block and
process released when the endpoint stops or loses its worker."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pytest

from infra.settings import IngestSettings
from infra.storage.store import LocalFolderStore
from serving.metrics import ServingMetrics
from serving.online import state as state_module
from serving.online.blocks import BLOCK_PREFIX, LocalBlocks, SharedBlocks, block_files
from serving.online.days import SLOTS
from serving.online.events import DAY_US, event_arrays
from serving.online.header import HEADER_BYTES, Header
from serving.online.ingest import IngestError
from serving.online.service import OnlineFeatures
from serving.online.state import OnlineState, end_of_day_micros
from serving.online.worker import ProcessWorker
from serving.snapshot import load_snapshot, newest_snapshot_manifest
from tasks.data.cutoffs import micros
from tests.fixtures.online_events import (
    BASE,
    BASE_DAY,
    event_micros,
    events_table,
    random_event,
    random_stream,
)
from tests.fixtures.online_store import online_sample_store
from tests.unit.serving.test_online_service import NOW, body, event, features

CUTOFF = end_of_day_micros(BASE_DAY - 40)


def test_the_header_tells_a_reader_which_rows_are_changing():
    header = Header(np.zeros(HEADER_BYTES, dtype=np.uint8))
    assert header.may_read(0, 7)
    header.changing(np.asarray([3, 7, 9]))
    version = header.words[0]
    assert version % 2 == 1
    assert header.may_read(version, 5) and not header.may_read(version, 7)
    header.changed(ring_day=20_000, newest=123)
    assert header.words[0] == version + 1 and header.words[1:3].tolist() == [20_000, 123]
    header.changing(None)  # every row
    assert not header.may_read(header.words[0], 5)
    header.changing(np.asarray([1]))  # a change within a change: the version stays odd
    assert header.words[0] % 2 == 1 and header.may_read(header.words[0], 5)
    generation = header.words[3]
    header.publish_layout({"records": ["hybridflow-state-1-a-0", [8]]})
    assert header.words[3] == generation + 1
    assert header.layout() == {"records": ["hybridflow-state-1-a-0", [8]]}
    with pytest.raises(ValueError, match="layout of"):
        header.publish_layout({"x": "y" * HEADER_BYTES})


def _later_rows() -> tuple[list[dict], list[dict]]:
    """Events before and after :data:`CUTOFF`: random ones, then new customers, new mix
    values and a customer active on more days than it has slots, after it."""
    rows = random_stream(11, 60, 1_500, 80, False)
    before = [r for r in rows if micros(r["event_time"]) <= CUTOFF]
    after = sorted((r for r in rows if micros(r["event_time"]) > CUTOFF), key=event_micros)
    rng = np.random.default_rng(2)
    extra = []
    for d in range(SLOTS + 6):  # a ring of every day, taken after the handover
        extra.append(random_event("busy", CUTOFF + d * DAY_US + 3_600_000_000, rng, True))
    for i in range(40):  # new customers (the records grow) and new mix values (columns widen)
        new = random_event(f"new{i}", CUTOFF + (i % 30) * DAY_US + 7_200_000_000, rng, False)
        extra.append(new | {"category": f"cat{i % 17}", "channel": f"ch{i % 9}"})
    return before, sorted(after + extra, key=event_micros)


def _aggregates(state: OnlineState, ids: list[str], day: int) -> dict[str, np.ndarray]:
    return state.aggregates(np.asarray([state.row_of[c] for c in ids]), day)


def test_a_handed_over_state_reads_what_its_writer_applies_as_a_state_in_one_hand(tmp_path):
    before, after = _later_rows()
    alone = OnlineState(CUTOFF)
    alone.seed(event_arrays(events_table(before)))
    reader = OnlineState(CUTOFF, capacity=8, blocks=SharedBlocks(tmp_path))
    reader.seed(event_arrays(events_table(before)))
    # as the endpoint hands it to its worker: pickled, the arrays by their blocks' names
    writer = OnlineState.adopt(pickle.loads(pickle.dumps(reader.handover())))
    with pytest.raises(RuntimeError, match="handed over"):
        reader.apply(event_arrays(events_table(after[:1])))
    generation = reader._generation
    for part in np.array_split(np.arange(len(after)), 7):
        chunk = event_arrays(events_table([after[i] for i in part]))
        alone.apply(chunk)
        customers = writer.customers
        writer.apply(chunk)
        reader.take(writer.applied(customers))
    assert writer.every_day_customers == 1 and reader.every_day_customers == 1
    assert reader.customers == alone.customers and reader.row_of == alone.row_of
    assert reader.newest == alone.newest and reader.ring_day == alone.ring_day
    ids = sorted(alone.row_of)
    day = alone.cutoff_day() + 3
    got, want = _aggregates(reader, ids, day), _aggregates(alone, ids, day)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    for customer in ("busy", "new3", ids[0]):
        assert reader.read_one(reader.row_of[customer], day) == alone.read_one(
            alone.row_of[customer], day
        )
    assert reader._generation > generation  # it opened the blocks the writer moved to
    assert reader.nbytes() == writer.nbytes()
    writer.release()
    assert list(tmp_path.iterdir()) == []
    reader.release()  # again, from the other side: nothing left to do


def test_a_reader_waits_only_for_the_rows_being_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(state_module, "READ_PATIENCE_S", 0.2)
    before, _ = _later_rows()
    reader = OnlineState(CUTOFF, blocks=SharedBlocks(tmp_path))
    reader.seed(event_arrays(events_table(before)))
    writer = OnlineState.adopt(reader.handover())
    busy, calm = reader.row_of["c1"], reader.row_of["c2"]
    day = reader.cutoff_day()
    want = reader.read_one(busy, day)
    writer._changing_rows(np.asarray([busy]))  # a part of a segment is being applied
    assert reader.read_one(calm, day).day == day  # another customer: read at once
    with pytest.raises(TimeoutError, match="changed for"):
        reader.read_one(busy, day)
    with pytest.raises(TimeoutError):  # a read of many customers waits for any change
        reader.read(np.asarray([calm]), day)
    writer._changed()
    assert reader.read_one(busy, day) == want
    writer.release()


def test_local_blocks_are_named_apart_and_gone_once_unlinked():
    a, b = LocalBlocks(), LocalBlocks()
    name_a, _ = a.allocate((4,), np.int64)
    name_b, _ = b.allocate((4,), np.int64)
    assert name_a != name_b and name_a.startswith(BLOCK_PREFIX)
    a.unlink(name_a)
    assert a.names == []


def _blocks_of(*pids: int | None) -> list[Path]:
    wanted = {str(p) for p in pids if p is not None}
    return [p for p in block_files() if p.name.removeprefix(BLOCK_PREFIX).split("-")[0] in wanted]


def test_a_worker_lost_is_a_state_seeded_again_and_stopping_leaves_no_block_or_process(
    tmp_path,
):
    store = LocalFolderStore(tmp_path / "store")
    online_sample_store(store, events_table(random_stream(3, 30, 900, 500, False)), BASE)
    snapshot = load_snapshot(store, newest_snapshot_manifest(store))

    def endpoint(worker) -> OnlineFeatures:
        return OnlineFeatures(store, IngestSettings(), ServingMetrics(), lambda: NOW, worker)

    async def scenario() -> tuple[list[int | None], np.ndarray, list[Path]]:
        worker = ProcessWorker()
        online = endpoint(worker)
        try:
            await online.follow(snapshot)
            await online.ingest(body(event("c1", 2, 9)), "application/json", "one")
            first = worker.pid
            in_use = _blocks_of(os.getpid(), first)
            os.kill(first, signal.SIGKILL)  # the worker, and the state it changed, are gone
            with pytest.raises(IngestError) as lost:
                await online.ingest(body(event("c2", 3, 9)), "application/json", "two")
            assert lost.value.status == 503 and online.follower is None
            assert "seeding it again" in online.status
            await online.follow(snapshot)  # the next poll: seeded again, the log caught up
            assert online.status == "on" and online.follower.seq == 1
            answer = await online.ingest(body(event("c2", 3, 9)), "application/json", "two")
            assert answer["segment"] == 2 and not answer["duplicate"]
            got = features(online, ["c1", "c2"])
            return [first, worker.pid], got, in_use
        finally:
            await online.close()

    pids, got, in_use = asyncio.run(scenario())
    assert in_use  # the state was in shared blocks while it was served
    assert not _blocks_of(os.getpid(), *pids)  # and none is left
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    alone = endpoint(None)  # a replica that never lost its state, its worker a thread
    asyncio.run(alone.follow(snapshot))
    try:
        np.testing.assert_array_equal(features(alone, ["c1", "c2"]), got)
    finally:
        asyncio.run(alone.close())


def test_a_folder_without_room_for_a_block_is_an_error_naming_it(tmp_path, monkeypatch):
    def full(fd: int, offset: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match="has no room for 800 bytes of online state"):
        SharedBlocks(tmp_path).allocate((100,), np.int64)
    assert list(tmp_path.iterdir()) == []


def test_an_apply_that_fails_part_way_drops_the_state_and_the_next_seed_has_the_segment(
    tmp_path, monkeypatch
):
    store = LocalFolderStore(tmp_path / "store")
    online_sample_store(store, events_table(random_stream(3, 30, 900, 500, False)), BASE)
    snapshot = load_snapshot(store, newest_snapshot_manifest(store))
    online = OnlineFeatures(store, IngestSettings(), ServingMetrics(), lambda: NOW)
    batch = body(*(event("c1", 2, h, category=f"new-{h}") for h in range(12)))  # columns widen
    allocate = LocalBlocks.allocate

    def no_room(self, shape, dtype):
        raise OSError(28, "no room for a block")

    async def scenario() -> np.ndarray:
        await online.follow(snapshot)
        monkeypatch.setattr(LocalBlocks, "allocate", no_room)
        with pytest.raises(IngestError) as failed:
            await online.ingest(batch, "application/json", "wide")
        assert failed.value.status == 503 and online.follower is None
        assert "an apply failed (" in online.status and "no room for a block" in online.status
        monkeypatch.setattr(LocalBlocks, "allocate", allocate)
        await online.follow(snapshot)  # seeded again: the segment written before is applied
        assert online.status == "on" and online.follower.seq == 1
        again = await online.ingest(batch, "application/json", "wide")
        assert again["duplicate"] and again["segment"] == 1
        return features(online, ["c1"])

    try:
        got = asyncio.run(scenario())
    finally:
        asyncio.run(online.close())
    alone = OnlineFeatures(store, IngestSettings(), ServingMetrics(), lambda: NOW)
    try:
        asyncio.run(alone.follow(snapshot))
        np.testing.assert_array_equal(features(alone, ["c1"]), got)
    finally:
        asyncio.run(alone.close())
