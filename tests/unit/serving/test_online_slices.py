"""The log applied in slices with the event loop serving between them, and ingestion's work in a
worker process: a segment applied in parts gives the state it gives applied whole, a read
between parts sees each customer's events of the segment all or none, requests run between
the slices, segments are applied once each and in order while ingestion and tailing run at
once, and a replica whose worker is a process converges with the endpoint that wrote the log
(a killed worker is started again; one whose endpoint dies goes with it)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from infra.settings import IngestSettings
from infra.storage.events_log import EventsLog
from infra.storage.store import LocalFolderStore
from serving.metrics import ServingMetrics
from serving.online import applier
from serving.online.delta import delta_of
from serving.online.events import event_arrays
from serving.online.ingest import IngestError
from serving.online.prepare import PreparedBatch, Refusal, decode_segment, prepare_batch
from serving.online.service import OnlineFeatures
from serving.online.state import OnlineState, end_of_day_micros
from serving.online.worker import ProcessWorker, WorkerGone
from serving.snapshot import load_snapshot, newest_snapshot_manifest
from tests.fixtures.online_events import BASE, BASE_DAY, events_table, random_stream
from tests.fixtures.online_store import online_sample_store
from tests.unit.serving.test_online_service import NOW, body, event, features

CUTOFF = end_of_day_micros(BASE_DAY)


@pytest.fixture
def store(tmp_path):
    store = LocalFolderStore(tmp_path / "store")
    online_sample_store(store, events_table(random_stream(3, 30, 900, 500, False)), BASE)
    return store


def later_events(seed: int, customers: int, events: int) -> list[dict]:
    """Valid events of the 5 days after the cutoff, in time order (each customer's purchases
    too): a random stream moved on by 6 days."""
    rows = random_stream(seed, customers, events, 5, False)
    later = [r | {"event_time": r["event_time"] + dt.timedelta(days=6)} for r in rows]
    return sorted(later, key=lambda r: r["event_time"])


def seeded() -> OnlineState:
    state = OnlineState(CUTOFF)
    state.seed(event_arrays(events_table(random_stream(1, 40, 600, 300, False))))
    return state


def all_aggregates(state: OnlineState) -> dict[str, np.ndarray]:
    rows = np.asarray([state.row_of[c] for c in sorted(state.row_of)])
    return state.aggregates(rows, state.cutoff_day())


def test_a_segment_applied_in_parts_gives_the_state_it_gives_applied_whole():
    delta = delta_of(event_arrays(events_table(later_events(5, 60, 400))))
    whole, parted = seeded(), seeded()
    whole.apply_delta(delta, whole.group_rows(delta))
    parts = list(parted.apply_parts(delta, parted.group_rows(delta), customers=7))
    assert len(parts) == -(-delta.groups // 7) and parts[-1] == delta.groups
    assert sorted(whole.row_of) == sorted(parted.row_of)
    expected, got = all_aggregates(whole), all_aggregates(parted)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_a_read_between_parts_sees_each_customers_events_of_the_segment_all_or_none():
    rows = later_events(6, 50, 300)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["customer_id"]] = counts.get(r["customer_id"], 0) + 1
    state = seeded()
    before = {c: state.read_one(state.row_of[c], 0).aggregates["_n"] for c in state.row_of}
    delta = delta_of(event_arrays(events_table(rows)))
    seen_between = 0
    for _ in state.apply_parts(delta, state.group_rows(delta), customers=4):
        for customer, row in list(state.row_of.items()):
            n = state.read_one(row, 0).aggregates["_n"]
            old = before.get(customer, 0.0)
            assert n in (old, old + counts.get(customer, 0)), customer
            seen_between += n == old + counts.get(customer, 0) and customer in counts
    assert seen_between > 0
    for customer, n in counts.items():
        assert (
            state.read_one(state.row_of[customer], 0).aggregates["_n"]
            == before.get(customer, 0.0) + n
        )


def replica(store, **kwargs) -> OnlineFeatures:
    online = OnlineFeatures(store, IngestSettings(), ServingMetrics(), clock=lambda: NOW, **kwargs)
    return online


def snapshot_of(store):
    return load_snapshot(store, newest_snapshot_manifest(store))


def test_requests_are_answered_while_the_worker_applies_a_segment(store, monkeypatch):
    monkeypatch.setattr(applier, "PART_CUSTOMERS", 3)
    answered = threading.Event()
    parts: list[int] = []
    apply_parts = OnlineState.apply_parts

    def noted(self, *args, **kwargs):
        for done in apply_parts(self, *args, **kwargs):
            parts.append(done)
            if len(parts) == 1:  # the segment is half applied until a request is answered
                assert answered.wait(60), "no request was answered while a segment was applied"
            yield done

    batch = body(*(event(f"c{i}", 2, 9) for i in range(20)))

    async def scenario() -> tuple[np.ndarray, np.ndarray]:
        online = replica(store)  # a worker in a thread: the event loop is this test's
        try:
            await online.follow(snapshot_of(store))
            monkeypatch.setattr(OnlineState, "apply_parts", noted)  # (the seed's are not noted)
            ingesting = asyncio.create_task(online.ingest(batch, "application/json", None))
            while not parts:  # the worker has applied the first part, and waits
                await asyncio.sleep(0.001)
            during = features(online, ["c0", "c1", "c19"])  # a request's read, answered
            answered.set()
            assert (await ingesting)["accepted"] == 20
            return during, features(online, ["c0", "c1", "c19"])
        finally:
            await online.close()

    during, after = asyncio.run(scenario())
    assert parts == [3, 6, 9, 12, 15, 18, 20]  # 20 customers, 3 at a time
    # read between parts: the first part's customers with the segment's events, the rest without
    assert (during == after).all(axis=1).tolist() == [True, True, False]


def test_ingestion_and_tailing_at_once_apply_every_segment_once_and_in_order(store):
    writer, follower = replica(store), replica(store)
    applied: list[int] = []
    original = OnlineFeatures._applied_segment

    def noted(self, follower_, info, events):
        if self is follower:
            applied.append(info.seq)
        original(self, follower_, info, events)

    async def scenario() -> None:
        await writer.follow(snapshot_of(store))
        await follower.follow(snapshot_of(store))

        async def send() -> None:
            for i in range(8):
                rows = [event(f"x{i}", 1 + i, h, event_type="view") for h in range(3)]
                await writer.ingest(body(*rows), "application/json", None)
                await follower.ingest(body(event(f"y{i}", 1 + i, 5)), "application/json", None)

        async def tail() -> None:
            for _ in range(40):
                await follower.follow(snapshot_of(store))
                await asyncio.sleep(0)

        await asyncio.gather(send(), tail(), tail())
        await follower.follow(snapshot_of(store))
        await writer.follow(snapshot_of(store))

    OnlineFeatures._applied_segment = noted  # type: ignore[method-assign]
    try:
        asyncio.run(scenario())
    finally:
        OnlineFeatures._applied_segment = original  # type: ignore[method-assign]
    head = EventsLog(store).head()
    assert head == 16 and applied == list(range(1, 17))
    assert writer.follower.seq == follower.follower.seq == head
    ids = sorted(writer.follower.state.row_of)
    assert ids == sorted(follower.follower.state.row_of)
    np.testing.assert_array_equal(features(writer, ids), features(follower, ids))


def test_a_replica_with_a_worker_process_converges_with_the_endpoint(store):
    async def scenario() -> tuple[list[str], np.ndarray, np.ndarray, set[int | None]]:
        a_worker, b_worker = ProcessWorker(), ProcessWorker()
        a = replica(store, worker=a_worker)
        b = replica(store, worker=b_worker)
        try:
            await a.follow(snapshot_of(store))
            await b.follow(snapshot_of(store))
            for i in range(5):
                rows = [event(f"c{(i * 7 + k) % 31}", 2 + i, k) for k in range(6)]
                answer = await a.ingest(body(*rows), "application/json", f"batch-{i}")
                assert answer["segment"] == i + 1 and not answer["duplicate"]
            with pytest.raises(IngestError) as reused:  # the key of another batch
                await a.ingest(body(event("c1", 2, 0)), "application/json", "batch-0")
            assert reused.value.status == 409
            with pytest.raises(IngestError) as bad:  # a bad row, named by the worker
                await a.ingest(body(event("c1", 9, 1, amount=-1.0)), "application/json", None)
            assert bad.value.status == 422 and "[0].amount: invalid_amount" in str(bad.value)
            await b.follow(snapshot_of(store))
            assert a.follower.seq == b.follower.seq == 5
            ids = sorted(a.follower.state.row_of)
            assert ids == sorted(b.follower.state.row_of)
            pids = {a_worker.pid, b_worker.pid}
            return ids, features(a, ids), features(b, ids), pids
        finally:
            await a.close()
            await b.close()

    ids, on_a, on_b, pids = asyncio.run(scenario())
    assert None not in pids and os.getpid() not in pids and len(pids) == 2
    np.testing.assert_array_equal(on_a, on_b)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # the server runs on uvloop
def test_a_killed_worker_is_started_again_and_the_call_tried_once_more(loop):
    batch = body(event("c1", 2, 9), event("c2", 3, 1))

    async def scenario() -> tuple[int | None, int | None, object]:
        worker = ProcessWorker()
        try:
            await worker.start()
            first = worker.pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            prepared = await worker.call(prepare_batch, batch, "application/json", None)
            return first, worker.pid, prepared
        finally:
            await worker.close()

    run = asyncio.run if loop == "asyncio" else pytest.importorskip("uvloop").run
    first, second, prepared = run(scenario())
    assert second is not None and second != first
    assert isinstance(prepared, PreparedBatch) and prepared.delta.events == 2


def test_the_workers_answers_are_the_functions_own_and_its_errors_are_raised_here():
    async def scenario() -> None:
        worker = ProcessWorker()
        try:
            refusal = await worker.call(prepare_batch, b"[{]", "application/json", None)
            assert isinstance(refusal, Refusal) and refusal.status == 422
            assert "not valid JSON" in str(refusal.error())
            with pytest.raises(Exception, match="Parquet|parquet|magic"):
                await worker.call(decode_segment, 1, b"not parquet", "segment 1", 0)
            prepared = await worker.call(
                prepare_batch, body(event("c1", 2, 9)), "application/json", "key-1"
            )
            assert prepared.segment_id == "key-1"
            with pytest.raises(ValueError, match="not a call"):
                await worker.call(print, "x")
        finally:
            await worker.close()

    asyncio.run(scenario())


def test_the_worker_ends_with_its_endpoint():
    code = (
        "import asyncio, os\n"
        "from serving.online.worker import ProcessWorker\n"
        "async def main():\n"
        "    w = ProcessWorker()\n"
        "    await w.start()\n"
        "    print(w.pid, flush=True)\n"
        "    os.kill(os.getpid(), 9)\n"
        "asyncio.run(main())\n"
    )
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    pid = int(json.loads(out.stdout.strip().splitlines()[-1]))
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"worker {pid} outlived its endpoint"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_gone_for_good_is_an_error_not_a_hang(monkeypatch):
    async def scenario() -> None:
        worker = ProcessWorker()

        async def never(proc, request):
            raise WorkerGone("gone")

        monkeypatch.setattr(worker, "_exchange", never)
        try:
            with pytest.raises(WorkerGone, match="died twice"):
                await worker.call(prepare_batch, b"[]", "application/json", None)
        finally:
            await worker.close()

    asyncio.run(scenario())


def test_the_purchase_order_check_per_customer_is_the_per_event_check():
    state = seeded()
    # the 5 days after the cutoff, then a batch that reaches back into them: some purchases
    # come before their customer's last one
    state.apply(event_arrays(events_table(later_events(8, 40, 300))))
    rows = random_stream(9, 45, 300, 4, False)
    late = [r | {"event_time": r["event_time"] + dt.timedelta(days=8)} for r in rows]
    events = event_arrays(events_table(late))
    per_event = state.purchase_order_breaks(events)
    delta = delta_of(events)
    code_rows = state.code_rows(events.customer)
    per_customer = state.purchases_before_last(delta, code_rows[delta.group_code])
    expected = np.zeros(delta.groups, dtype=bool)
    group_of_code = {int(c): g for g, c in enumerate(delta.group_code.tolist())}
    for code in np.unique(events.customer.codes[per_event]).tolist():
        expected[group_of_code[code]] = True
    assert 0 < expected.sum() < delta.groups
    np.testing.assert_array_equal(per_customer, expected)
    last = state.last_purchases(delta.customers, code_rows)
    for customer, t in last.items():
        assert t == state.read_one(state.row_of[customer], 0).aggregates["_last_p_t"]


def test_an_answer_crosses_through_a_mapped_file_or_inline_and_leaves_nothing_behind(tmp_path):
    from serving.online.worker import opened, sealed

    big = {"a": np.arange(100_000, dtype=np.int64), "ids": ["x", "y"]}
    envelope = sealed(big, tmp_path)
    assert len(envelope) < 10_000  # the arrays are in the file, not in the pipe
    assert len(list(tmp_path.iterdir())) == 1
    back = opened(envelope)
    assert list(tmp_path.iterdir()) == []  # removed once mapped
    np.testing.assert_array_equal(back["a"], big["a"])
    back["a"][0] = -1  # writable, and the sender's copy is not
    assert back["ids"] == ["x", "y"] and big["a"][0] == 0
    small = opened(sealed({"a": np.arange(10)}, tmp_path))
    small["a"][0] = 5
    assert list(tmp_path.iterdir()) == [] and small["a"].tolist()[:2] == [5, 1]
    inline = opened(sealed(big, None))  # no folder in memory: through the pipe
    np.testing.assert_array_equal(inline["a"], big["a"])


def test_answer_files_of_workers_that_are_gone_are_removed(tmp_path):
    from serving.online.worker import remove_orphans, sealed

    mine = sealed({"a": np.arange(100_000)}, tmp_path)  # this process's: alive, kept
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (tmp_path / f"hybridflow-ingest-{gone}-abc").write_bytes(b"x")
    remove_orphans(tmp_path)
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(f"hybridflow-ingest-{os.getpid()}-")
    assert mine


def test_the_worker_runs_at_the_niceness_it_is_given():
    async def scenario() -> int:
        worker = ProcessWorker(nice=5)
        try:
            await worker.call(prepare_batch, b"[]", "application/json", None)  # it has started
            assert worker.pid is not None
            with open(f"/proc/{worker.pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[16])
        finally:
            await worker.close()

    assert asyncio.run(scenario()) == os.nice(0) + 5


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux's SCHED_IDLE")
def test_the_worker_runs_under_sched_idle_when_asked():
    async def policies(worker: ProcessWorker) -> set[int]:
        """The scheduling policies of the worker's threads (those its imports started too)."""
        try:
            await worker.call(prepare_batch, b"[]", "application/json", None)  # it has started
            assert worker.pid is not None
            threads = os.listdir(f"/proc/{worker.pid}/task")
            return {os.sched_getscheduler(int(t)) for t in threads}
        finally:
            await worker.close()

    assert asyncio.run(policies(ProcessWorker(nice=5, idle=True))) == {os.SCHED_IDLE}
    assert asyncio.run(policies(ProcessWorker(nice=5))) == {os.SCHED_OTHER}
