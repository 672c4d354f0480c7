"""Per-customer online state: fixed-size aggregates of a customer's events from which every
aggregate of :data:`tasks.definitions.feature_formulas.AGGREGATES` is read at any cutoff day on or
after the newest event.

Per customer (:func:`bytes_per_customer` says how much; the lifetime values and the slots of
days are one record, :mod:`serving.online.record`, the mix counts a row of a matrix per column):

- lifetime: first and last event time, last purchase time, events, purchases, events of each
  type in the mix, purchase amount, quantity sum and maximum, and the gaps between consecutive
  purchases as a running count/mean/sum of squared deviations (Chan's parallel update) and
  maximum;
- events, purchases and purchase amount per UTC day over the last :data:`RING_DAYS` days (the
  longest window), in a few slots of days per customer and a ring of every day for the busiest
  (:mod:`serving.online.days`);
- per mix column, the events of each value (uint32, one column per value seen).

Windows are whole UTC days: at the cutoff the end of day ``D`` (the batch stage's cutoffs are
ends of days), the ``w``-day window is days ``D - w + 1 .. D`` and equals the SQL's
``_t > cutoff - w days``. Gaps need a customer's purchases in time order: :meth:`purchase_order_breaks`
finds purchases before the customer's last one (the ingest refuses them); the rest is order-free.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from serving.online.blocks import BlockGone, Blocks, LocalBlocks
from serving.online.days import RING_BYTES, RING_DAYS, SLOTS, DayBuckets
from serving.online.delta import Delta, MixCells, delta_of
from serving.online.events import (
    DAY_US,
    NO_TIME,
    Coded,
    EventArrays,
    day_of,
    end_of_day_micros,
)
from serving.online.header import GENERATION, HEADER_BYTES, NEWEST, RING_DAY, VERSION, Header
from serving.online.one_row import row_aggregates
from serving.online.record import INITIAL, LIFETIME, POSITION, RECORD, RECORD_BYTES, Counts, Record
from tasks.definitions.feature_specs import DAY_MICROS, EVENT_TYPE_MIX, MIX_COLUMNS, WINDOWS_DAYS

__all__ = [
    "DAY_US",
    "NO_TIME",
    "RING_DAYS",
    "OnlineState",
    "Reading",
    "day_of",
    "end_of_day_micros",
]

OPTIMISTIC_READS = 3  # tries before a read waits for the lock (or, reading another
# process's changes, yields to it between tries)
READ_PATIENCE_S = 10.0  # a reader of another process's state gives up after this long
READ_BACKOFF_S = 0.0001  # ... and sleeps this long between later tries, so that the writer,
# which may run only on time nobody else wants (the worker under SCHED_IDLE), gets a core
APPLY_GROUPS = 4_096  # customers changed under one hold of the lock
_SLOTS_AT = tuple(POSITION[f] for f in ("slot_day", "slot_n", "slot_n_p", "slot_amount"))
_RING_AT = POSITION["ring"]


def bytes_per_customer(mix_values: int = 0, every_day: bool = False) -> int:
    """Bytes of state per customer: the arrays, plus 4 per value seen in the mix columns;
    ``every_day``: a customer with events on more than :data:`serving.online.days.SLOTS` days
    of the ring, who has a ring of every day besides (the id index, a Python dict, comes on
    top: about 100-150 bytes for a short id)."""
    return RECORD_BYTES + (RING_BYTES if every_day else 0) + 4 * mix_values


class OnlineState:
    """The state of every customer seen, seeded with the events at or before ``seed_cutoff``
    (microseconds: the snapshot's cutoff) and updated with later ones.

    Its arrays are in ``blocks`` (:mod:`serving.online.blocks`; this process's arrays by
    default). Reads are optimistic (:mod:`serving.online.header`'s seqlock): they do not wait
    for a change unless it changes what they read. In one process one lock is held around every
    change, and a read that finds its rows changing waits for it. A state in shared blocks can
    change hands (:meth:`handover`, :meth:`adopt`): from then on this object only reads, its
    customers told by :meth:`take` what the writer (another process, the ingest worker)
    applied."""

    def __init__(
        self, seed_cutoff: int, capacity: int = 1024, blocks: Blocks | None = None
    ) -> None:
        self.seed_cutoff = seed_cutoff
        self._blocks: Blocks = blocks if blocks is not None else LocalBlocks()
        self._names: dict[str, str] = {}  # which block holds which array (the layout)
        self._shapes: dict[str, list[int]] = {}
        header_name, header = self._blocks.allocate((HEADER_BYTES,), np.uint8)
        self._header_name = header_name
        self._header = Header(header)
        self._words = self._header.words
        self._days = DayBuckets(day_of(seed_cutoff), self._block)
        self._newest = seed_cutoff  # the newest event time applied, at least the seed's cutoff
        self.lock = threading.RLock()
        self._reader = False  # True once handed over: another object changes the state
        self._generation = 0  # the layout this object's arrays are of
        self._reported: Applied | None = None  # (a reader) what the writer said last
        self.row_of: dict[str, int] = {}  # customers whose events are applied
        self.ids: list[str] = []
        # customers given a row whose first events are not applied yet (not in row_of, so no
        # read finds them before they have events)
        self._pending: dict[str, int] = {}
        self._capacity = 0
        # each customer's lifetime values and day slots in a row of one array
        # (serving.online.record); _life: views of its lifetime fields
        self._records = np.zeros(0, dtype=RECORD)
        self._record = Record(self._records)
        self._life: dict[str, np.ndarray] = {}
        self._vocab: dict[str, dict[str, int]] = {c: {} for c in MIX_COLUMNS}
        self._mix: dict[str, np.ndarray] = {
            c: np.zeros((0, 0), dtype=np.uint32) for c in MIX_COLUMNS
        }
        self._counts: dict[str, Counts] = {c: Counts(m) for c, m in self._mix.items()}
        self._grow(capacity)
        self._header.changed(self._days.ring_day, self._newest)

    @property
    def newest(self) -> int:
        """The newest event time applied (microseconds), at least the seed's cutoff."""
        return self._words[NEWEST]

    @property
    def ring_day(self) -> int:
        """The newest day of the daily buckets (the newest event's, or the seed's)."""
        return self._words[RING_DAY]

    @property
    def every_day_customers(self) -> int:
        """Customers with events on more than :data:`serving.online.days.SLOTS` days of the
        ring (each holds a ring of every day)."""
        return self._reported.every_day if self._reported else self._days.rings

    @property
    def customers(self) -> int:
        return len(self.ids)

    @property
    def mix_values(self) -> int:
        """Distinct values seen in the mix columns (each costs 4 bytes per customer)."""
        return sum(m.shape[1] for m in self._mix.values())

    def nbytes(self) -> int:
        """Bytes held by the arrays (allocated capacity included; the id index not)."""
        if self._reported is not None:
            return self._reported.nbytes
        arrays = [self._records, *self._mix.values()]
        return int(sum(a.nbytes for a in arrays)) + self._days.nbytes()

    def cutoff_day(self) -> int:
        """The earliest day the features can be read at: the newest event's (or the seed's)."""
        return max(self.ring_day, day_of(self.seed_cutoff))

    # changes

    def seed(self, events: EventArrays) -> int:
        """Apply the snapshot's events (those at or before the seed cutoff); how many."""
        return self._apply_where(events, events.t <= self.seed_cutoff, None)

    def apply(self, events: EventArrays, rows: np.ndarray | None = None) -> int:
        """Apply events after the seed cutoff (earlier ones are the snapshot's and are skipped);
        how many were applied. ``rows``: the events' customer rows, when known already."""
        return self._apply_where(events, events.t > self.seed_cutoff, rows)

    def code_rows(self, customer: Coded) -> np.ndarray:
        """Each customer code's row, -1 for a customer the state has not seen."""
        with self.lock:
            return self._code_rows(customer)

    def known_rows(self, customer: Coded) -> np.ndarray:
        """Each event's customer row, -1 for a customer the state has not seen."""
        return self.code_rows(customer)[customer.codes]

    def group_rows(self, delta: Delta, code_rows: np.ndarray | None = None) -> np.ndarray:
        """The row of each of ``delta``'s customers, new customers given new rows;
        ``code_rows``: what :meth:`code_rows` gave a moment ago (only its -1s are looked up
        again)."""
        with self.lock:
            if code_rows is None:
                by_code = self._code_rows(Coded(delta.group_code, delta.customers))
            else:
                by_code = code_rows
            rows = by_code[delta.group_code]
            new = rows < 0
            if new.any() and code_rows is not None:  # added by another apply since then
                again = self._code_rows(Coded(delta.group_code[new], delta.customers))
                rows[new] = again[delta.group_code[new]]
                new = rows < 0
            if new.any():
                first = len(self.ids)
                added = np.arange(first, first + int(new.sum()))
                self._changing_rows(None)  # longer arrays
                try:
                    self._grow(first + added.size)
                finally:
                    self._changed()
                for code, row in zip(delta.group_code[new].tolist(), added.tolist(), strict=True):
                    customer_id = delta.customers[code]
                    self._pending[customer_id] = row
                    self.ids.append(customer_id)
                rows[new] = added
            return rows

    def purchase_order_breaks(
        self, events: EventArrays, rows: np.ndarray | None = None
    ) -> np.ndarray:
        """True for each purchase before its customer's last purchase in the state (applying it
        would put the gaps between purchases out of order); ``rows``: the events'
        :meth:`known_rows`, when known already."""
        rows = self.known_rows(events.customer) if rows is None else rows
        breaks = np.zeros(events.size, dtype=bool)
        bought = events.purchase & (rows >= 0)
        with self.lock:
            last = self._life["last_p_t"][rows[bought]]
        breaks[bought] = events.t[bought] < last
        return breaks

    def purchases_before_last(self, delta: Delta, rows: np.ndarray) -> np.ndarray:
        """For each customer of ``delta`` (``rows``: their rows, -1 for one the state has not
        seen): True when its first purchase in the batch is before its last purchase in the
        state (:meth:`purchase_order_breaks` of the batch's events, per customer)."""
        bought = (delta.n_p > 0) & (rows >= 0)
        breaks = np.zeros(delta.groups, dtype=bool)
        with self.lock:
            last = self._life["last_p_t"][rows[bought]]
        breaks[bought] = delta.first_p_t[bought] < last
        return breaks

    def last_purchases(self, customers: list[str], rows: np.ndarray) -> dict[str, int]:
        """The last purchase time in the state of each of ``customers`` that has one
        (``rows``: theirs, -1 for one the state has not seen)."""
        known = np.flatnonzero(rows >= 0)
        with self.lock:
            last = self._life["last_p_t"][rows[known]]
        return {
            customers[i]: t
            for i, t in zip(known.tolist(), last.tolist(), strict=True)
            if t != NO_TIME
        }

    def _apply_where(self, events: EventArrays, mask: np.ndarray, rows: np.ndarray | None) -> int:
        if not mask.all():
            events = events.take(mask)
            rows = None if rows is None else rows[mask]
        if events.size == 0:
            return 0
        delta = delta_of(events)
        self.apply_delta(delta, self.group_rows(delta) if rows is None else rows[delta.first_event])
        return events.size

    def apply_delta(self, delta: Delta, rows: np.ndarray, customers: int = APPLY_GROUPS) -> None:
        """Add a batch's per-customer sums (``rows``: each customer's row, :meth:`group_rows`)
        into the state, ``customers`` at a time under one hold of the lock (:meth:`apply_parts`
        all at once)."""
        for _ in self.apply_parts(delta, rows, customers):
            pass

    def apply_parts(
        self, delta: Delta, rows: np.ndarray, customers: int = APPLY_GROUPS
    ) -> Iterator[int]:
        """:meth:`apply_delta` a part at a time: adds the sums of ``customers`` customers under
        one hold of the lock, then yields how many customers are in (the caller may serve reads
        before it asks for the next part; the whole delta is in when the iterator ends). A
        customer's sums go in at once (a read sees all of the batch's events of a customer or
        none); ``newest`` moves with each part (the newest event applied so far)."""
        if delta.groups == 0:
            return
        bounds = [*range(0, delta.groups, customers), delta.groups]
        cells = np.searchsorted(delta.cell_group, bounds)
        mix_cells = {col: np.searchsorted(m.group, bounds) for col, m in delta.mix.items()}
        with self.lock:
            self._changing_rows(None)  # the ring moves on, the mix columns widen
            try:
                self._days.advance(day_of(delta.newest))
                value_ids = {col: self._value_ids(col, m) for col, m in delta.mix.items()}
            finally:
                self._changed()
        for i in range(len(bounds) - 1):
            part = slice(bounds[i], bounds[i + 1])
            part_rows = rows[part]
            with self.lock:
                self._changing_rows(np.sort(part_rows))
                try:
                    self._add_gaps(delta, part, part_rows)
                    self._add_lifetime(delta, part, part_rows)
                    part_cells = slice(cells[i], cells[i + 1])
                    self._days.add(
                        rows[delta.cell_group[part_cells]],
                        delta.cell_day[part_cells],
                        delta.cell_n[part_cells],
                        delta.cell_n_p[part_cells],
                        delta.cell_amount[part_cells],
                    )
                    for col, m in delta.mix.items():
                        part_cells = slice(mix_cells[col][i], mix_cells[col][i + 1])
                        self._add_mix(col, m, part_cells, rows, value_ids[col])
                    self._newest = max(self._newest, int(delta.last_t[part].max()))
                    if self._pending:
                        self._publish(part_rows)
                finally:
                    self._changed()
            yield bounds[i + 1]

    def _publish(self, rows: np.ndarray) -> None:
        """Make the new customers among ``rows`` (their events just applied) readable."""
        first_new = min(self._pending.values())
        for row in rows[rows >= first_new].tolist():
            customer_id = self.ids[row]
            if self._pending.pop(customer_id, None) is not None:
                self.row_of[customer_id] = row

    def _changing_rows(self, rows: np.ndarray | None) -> None:
        """Rows ``rows`` (sorted; None: every row) are about to change (the lock is held)."""
        if self._reader:
            raise RuntimeError("this online state was handed over: another object changes it")
        self._header.changing(rows)

    def _changed(self) -> None:
        self._header.changed(self._days.ring_day, self._newest)

    def _code_rows(self, customer: Coded) -> np.ndarray:
        """Each customer code's row, -1 for a customer the state has not seen."""
        present = customer.used()
        values = customer.values
        if not customer.every_value_used:
            values = [values[c] for c in present.tolist()]
        rows = np.fromiter(
            map(self.row_of.get, values, itertools.repeat(-1)), np.int64, len(values)
        )
        if self._pending:  # given rows by a batch not applied yet
            for i in np.flatnonzero(rows < 0).tolist():
                rows[i] = self._pending.get(values[i], -1)
        by_code = np.full(len(customer.values), -1, dtype=np.int64)
        by_code[present] = rows
        return by_code

    def _add_gaps(self, delta: Delta, part: slice, rows: np.ndarray) -> None:
        """Merge each customer's gaps between purchases: the state's (count = purchases - 1),
        the one from the state's last purchase to the batch's first, the batch's own (Chan's
        parallel update of count/mean/M2, and the maximum). Before the purchases are counted."""
        bought = np.flatnonzero(delta.n_p[part] > 0)
        if bought.size == 0:
            return
        life = self._life
        g = bought + part.start
        r = rows[bought]
        previous = life["last_p_t"][r]
        had = previous != NO_TIME
        k_a = np.maximum(life["n_p"][r].astype(np.float64) - 1, 0.0)
        state = (
            k_a,
            np.where(k_a > 0, life["gap_mean"][r], 0.0),
            np.where(k_a > 0, life["gap_m2"][r], 0.0),
            np.where(k_a > 0, life["gap_max"][r], -np.inf),
        )
        first = delta.first_p_t[g]
        edge_gap = (first - np.where(had, previous, first)) / DAY_MICROS
        edge = (
            had.astype(np.float64),
            edge_gap,
            np.zeros(g.size),
            np.where(had, edge_gap, -np.inf),
        )
        own = (
            delta.gap_k[g].astype(np.float64),
            delta.gap_mean[g],
            delta.gap_m2[g],
            delta.gap_max[g],
        )
        k, mean, m2, longest = _merged(_merged(state, edge), own)
        some = k > 0
        life["gap_mean"][r] = np.where(some, mean, 0.0)
        life["gap_m2"][r] = np.where(some, m2, 0.0)
        life["gap_max"][r] = np.where(some, longest, 0.0)
        life["last_p_t"][r] = np.maximum(previous, delta.last_p_t[g])

    def _add_lifetime(self, delta: Delta, part: slice, rows: np.ndarray) -> None:
        life = self._life
        life["first_t"][rows] = np.minimum(life["first_t"][rows], delta.first_t[part])
        life["last_t"][rows] = np.maximum(life["last_t"][rows], delta.last_t[part])
        life["n"][rows] += delta.n[part].astype(np.int32)
        life["n_p"][rows] += delta.n_p[part].astype(np.int32)
        life["amount"][rows] += delta.amount[part]
        life["q_sum"][rows] += delta.q_sum[part]
        life["q_max"][rows] = np.maximum(life["q_max"][rows], delta.q_max[part])
        for i, name in enumerate(EVENT_TYPE_MIX):
            life[f"n_{name}"][rows] += delta.n_kind[part, i].astype(np.int32)

    def _value_ids(self, col: str, cells: MixCells) -> np.ndarray:
        """Each of the column's values' id in the state (-1 for a value without an event)."""
        ids = np.full(len(cells.values), -1, dtype=np.int64)
        if cells.count.size == 0:
            return ids
        used = np.unique(cells.value)
        vocab = self._vocab[col]
        ids[used] = [vocab.setdefault(cells.values[v], len(vocab)) for v in used.tolist()]
        if len(vocab) > self._mix[col].shape[1]:
            self._widen_mix(col, len(vocab))
        return ids

    def _add_mix(
        self, col: str, cells: MixCells, part: slice, rows: np.ndarray, ids: np.ndarray
    ) -> None:
        if part.stop <= part.start:
            return
        counts = self._mix[col]
        flat = rows[cells.group[part]] * counts.shape[1] + ids[cells.value[part]]
        counts.reshape(-1)[flat] += cells.count[part].astype(np.uint32)  # cells are unique

    # growth

    def _block(self, key: str, shape: tuple[int, ...], dtype: np.dtype | str) -> np.ndarray:
        """A new zeroed array for ``key`` in a block of its own, named in the header's layout;
        the block that held ``key`` before is unlinked (a reader's mapping of it stays valid
        until it opens the new one). Every row is changing (the lock is held)."""
        name, array = self._blocks.allocate(shape, dtype)
        old = self._names.get(key)
        self._names[key] = name
        self._shapes[key] = list(shape)
        self._header.publish_layout(self._layout())
        self._generation = self._words[GENERATION]
        if old is not None:
            self._blocks.unlink(old)
        return array

    def _layout(self) -> dict:
        return {key: [name, self._shapes[key]] for key, name in self._names.items()}

    def _grow(self, needed: int) -> None:
        if needed <= self._capacity:
            return
        capacity = max(needed, self._capacity + self._capacity // 2, 1024)
        old_capacity, self._capacity = self._capacity, capacity
        grown_records = self._block("records", (capacity,), RECORD)
        for name, value in INITIAL.items():
            grown_records[name][old_capacity:] = value
        grown_records[:old_capacity] = self._records
        self._bind_records(grown_records)
        for col, counts in self._mix.items():
            grown = self._block(f"mix:{col}", (capacity, counts.shape[1]), np.uint32)
            grown[: counts.shape[0]] = counts
            self._mix[col] = grown
            self._counts[col] = Counts(grown)
        self._header.publish_layout(self._layout())
        self._generation = self._words[GENERATION]

    def _bind_records(self, array: np.ndarray) -> None:
        self._records = array
        self._record = Record(array)
        self._life = {name: array[name] for name in LIFETIME}
        self._days.bind(array)

    def _widen_mix(self, col: str, values: int) -> None:
        counts = self._mix[col]
        width = max(values, counts.shape[1] * 2, 4)
        grown = self._block(f"mix:{col}", (counts.shape[0], width), np.uint32)
        grown[:, : counts.shape[1]] = counts
        self._mix[col] = grown
        self._counts[col] = Counts(grown)

    # changing hands

    def handover(self) -> Handover:
        """What another object (:meth:`adopt`, in the ingest worker) needs to change this
        state from now on; this object only reads it from then on (:meth:`take`)."""
        with self.lock:
            if self._pending:
                raise RuntimeError("an online state is handed over between applies only")
            self._reader = True
            days = self._days
            return Handover(
                blocks=self._blocks,
                header=self._header_name,
                seed_cutoff=self.seed_cutoff,
                capacity=self._capacity,
                ids=list(self.ids),
                vocab={col: dict(v) for col, v in self._vocab.items()},
                newest=self._newest,
                ring_day=days.ring_day,
                rings=days.rings_handed_out,
                free=list(days.free_rings),
                overflow=days.overflow_copy(),
            )

    @classmethod
    def adopt(cls, handover: Handover) -> OnlineState:
        """The state :meth:`handover` gave, as an object that changes it (its arrays the same
        blocks)."""
        state = cls.__new__(cls)
        state.seed_cutoff = handover.seed_cutoff
        state._blocks = handover.blocks
        state._header_name = handover.header
        state._header = Header(handover.blocks.attach(handover.header, (HEADER_BYTES,), np.uint8))
        state._words = state._header.words
        state._days = DayBuckets(day_of(handover.seed_cutoff), state._block)
        state._newest = handover.newest
        state.lock = threading.RLock()
        state._reader = False
        state._reported = None
        state.ids = list(handover.ids)
        state.row_of = {c: i for i, c in enumerate(state.ids)}
        state._pending = {}
        state._capacity = handover.capacity
        state._vocab = handover.vocab
        state._names, state._shapes = {}, {}
        state._attach()
        state._days.restore(
            handover.ring_day, handover.rings, handover.free, dict(handover.overflow)
        )
        return state

    def _attach(self) -> None:
        """Map the arrays the header's layout names (a reader: after the writer moved one)."""
        while True:
            version = self._words[VERSION]
            generation = self._words[GENERATION]
            try:
                layout = self._header.layout()
                arrays = {
                    key: self._blocks.attach(name, tuple(shape), _dtype_of(key))
                    for key, (name, shape) in layout.items()
                }
            except (BlockGone, ValueError):  # moved again meanwhile (or torn): read it again
                if not self._reader:
                    raise
                time.sleep(READ_BACKOFF_S)
                continue
            if self._words[VERSION] == version and self._words[GENERATION] == generation:
                break
        self._names = {key: name for key, (name, _) in layout.items()}
        self._shapes = {key: list(shape) for key, (_, shape) in layout.items()}
        self._capacity = len(arrays["records"])
        self._bind_records(arrays["records"])
        self._mix = {col: arrays[f"mix:{col}"] for col in MIX_COLUMNS}
        self._counts = {col: Counts(m) for col, m in self._mix.items()}
        self._days.attach_pool({k: v for k, v in arrays.items() if k.startswith("pool:")})
        self._generation = generation

    def applied(self, customers_before: int) -> Applied:
        """What a reader of this state (:meth:`take`) needs after an apply: the customers
        added since it had ``customers_before``, and the figures it reports."""
        return Applied(
            new_ids=self.ids[customers_before:],
            customers=len(self.ids),
            every_day=self._days.rings,
            nbytes=self.nbytes(),
            overflow=self._days.overflow_copy(),
        )

    def take(self, applied: Applied) -> None:
        """(A reader) the writer's word after an apply: its new customers become readable."""
        first = len(self.ids)
        for row, customer_id in enumerate(applied.new_ids, start=first):
            self.ids.append(customer_id)
            self.row_of[customer_id] = row
        self._days.set_overflow(applied.overflow)
        self._reported = applied

    def release(self) -> None:
        """Unlink this state's blocks (its header and every array it names); the arrays stay
        readable while they are referenced. Safe to repeat, from either side."""
        with self.lock:
            names = dict(self._names)
            try:
                names |= {key: name for key, (name, _) in self._header.layout().items()}
            except ValueError:
                pass
            for name in names.values():
                self._blocks.unlink(name)
            self._blocks.unlink(self._header_name)

    # reads

    def read(self, rows: np.ndarray, at_least_day: int) -> Reading:
        """The aggregates of the customers at ``rows`` at the end of ``at_least_day`` or of
        :meth:`cutoff_day`, whichever is later, read at one moment (events applied meanwhile
        wait)."""
        for tries in itertools.count():
            version = self._words[VERSION]
            if version % 2 == 0 or not self._reader and tries >= OPTIMISTIC_READS:
                if self._words[GENERATION] != self._generation:
                    self._attach()
                if version % 2 == 0:
                    copied = self._read(rows, at_least_day)
                    if self._words[VERSION] == version:
                        return copied
                else:
                    with self.lock:
                        return self._read(rows, at_least_day)
            self._wait(tries)
        raise AssertionError("unreachable")

    def _read(self, rows: np.ndarray, at_least_day: int) -> Reading:
        ring_day = self._words[RING_DAY]
        day = max(at_least_day, ring_day, day_of(self.seed_cutoff))
        life = {name: array[rows] for name, array in self._life.items()}
        sums = self._days.sums(rows, day, ring_day)
        mix = {col: counts[rows] for col, counts in self._mix.items()}
        return Reading(_aggregates(life, sums, mix), day, self._words[NEWEST])

    def _wait(self, tries: int) -> None:
        """Between tries of a read that found its rows changing: a reader of another
        process's changes gives it the processor, after the first few tries by sleeping
        (:data:`READ_BACKOFF_S`: a writer under ``SCHED_IDLE`` gets no core while this one
        spins), and gives up after :data:`READ_PATIENCE_S`; in one process the tries go on at
        once."""
        if not self._reader:
            return
        if tries == 0:
            self._waiting_since = time.monotonic()
        elif time.monotonic() - self._waiting_since > READ_PATIENCE_S:
            raise TimeoutError(f"the online state changed for {READ_PATIENCE_S}s")
        time.sleep(0 if tries < OPTIMISTIC_READS else READ_BACKOFF_S)

    def read_row(self, row: int, at_least_day: int) -> RowRead:
        """What a single request reads of the customer at ``row`` (:mod:`serving.online.one_row`
        turns it into features) at the end of ``at_least_day`` or of :meth:`cutoff_day`,
        whichever is later: its record's fields in one call, its window sums, its mix counts.
        Read without waiting for the chunk being applied unless it changes this customer: the
        copy counts when the version did not move while it was taken."""
        words = self._words
        for tries in itertools.count():
            version = words[VERSION]
            if self._header.may_read(version, row):
                if words[GENERATION] != self._generation:
                    self._attach()
                copied = self._row_read(row, at_least_day)
                if words[VERSION] == version:
                    return copied
            if not self._reader and tries >= OPTIMISTIC_READS:
                with self.lock:
                    return self._row_read(row, at_least_day)
            self._wait(tries)
        raise AssertionError("unreachable")

    def _row_read(self, row: int, at_least_day: int) -> RowRead:
        words = self._words
        ring_day = words[RING_DAY]
        day = max(at_least_day, ring_day, day_of(self.seed_cutoff))
        v = self._record.unpack(row)
        d, n, p, amount = _SLOTS_AT
        slots = zip(
            v[d : d + SLOTS],
            v[n : n + SLOTS],
            v[p : p + SLOTS],
            v[amount : amount + SLOTS],
            strict=True,
        )
        sums = self._days.row_sums(row, day, slots, v[_RING_AT], ring_day)
        mix = [counts.unpack(row) for counts in self._counts.values()]
        return RowRead(v, sums, mix, day, words[NEWEST])

    def read_one(self, row: int, at_least_day: int) -> Reading:
        """:meth:`read` for one customer, its aggregates as Python floats (the same values
        as :meth:`read`'s, from :meth:`read_row` by :func:`serving.online.one_row.row_aggregates`)."""
        one = self.read_row(row, at_least_day)
        return Reading(row_aggregates()(one.record, one.sums, one.mix), one.day, one.newest)

    def aggregates(self, rows: np.ndarray, cutoff_day: int) -> dict[str, np.ndarray]:
        """Every aggregate of :data:`tasks.definitions.feature_formulas.AGGREGATES` for the
        customers at ``rows`` at the end of ``cutoff_day`` (no earlier than
        :meth:`cutoff_day`); doubles, NaN for SQL's null."""
        reading = self.read(rows, cutoff_day)
        if reading.day != cutoff_day:
            raise ValueError(f"cutoff day {cutoff_day} is before the newest event's {reading.day}")
        return reading.aggregates


def _dtype_of(key: str) -> np.dtype:
    """The type of the array a layout names ``key``."""
    if key == "records":
        return RECORD
    if key.startswith("mix:"):
        return np.dtype(np.uint32)
    return DayBuckets.pool_dtype(key)


def _merged(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Two runs of gaps (count, mean, M2, max) as one (Chan et al.'s parallel update)."""
    k_a, mean_a, m2_a, max_a = a
    k_b, mean_b, m2_b, max_b = b
    k = k_a + k_b
    share = k_b / np.where(k > 0, k, 1.0)
    delta = mean_b - mean_a
    mean = np.where(k_a > 0, mean_a + delta * share, mean_b)
    m2 = m2_a + m2_b + np.where((k_a > 0) & (k_b > 0), delta * delta * k_a * share, 0.0)
    return k, np.where(k_b > 0, mean, mean_a), m2, np.maximum(max_a, max_b)


@dataclass(frozen=True)
class Handover:
    """A state in blocks, as :meth:`OnlineState.handover` gives it to the object that changes
    it from then on (pickled to the ingest worker: the arrays travel as their blocks' names in
    the header)."""

    blocks: Blocks
    header: str
    seed_cutoff: int
    capacity: int
    ids: list[str]
    vocab: dict[str, dict[str, int]]
    newest: int
    ring_day: int
    rings: int
    free: list[int]
    overflow: dict[int, dict[int, list[int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Applied:
    """What the writer of a state tells its readers after an apply (:meth:`OnlineState.take`):
    the customers it added (their rows follow the reader's last), how many there are, those
    with a ring of every day, the state's bytes, the day counts past 65,535."""

    new_ids: list[str]
    customers: int
    every_day: int
    nbytes: int
    overflow: dict[int, dict[int, list[int]]]


@dataclass(frozen=True)
class Reading:
    """Customers' aggregates (:meth:`OnlineState.read`): at the end of ``day``, with the
    newest event applied then (microseconds)."""

    aggregates: dict[str, np.ndarray]
    day: int
    newest: int


class RowRead(NamedTuple):
    """One customer's read (:meth:`OnlineState.read_row`) at the end of ``day``, with the
    newest event applied then: ``record`` its record's fields
    (:meth:`serving.online.record.Record.unpack`), ``sums`` its window sums
    (:meth:`serving.online.days.DayBuckets.row_sums`), ``mix`` each mix column's counts per
    value (:data:`tasks.definitions.feature_specs.MIX_COLUMNS`' order)."""

    record: tuple
    sums: list[list[float]]
    mix: list[tuple[int, ...]]
    day: int
    newest: int


def _aggregates(
    life: dict[str, np.ndarray], sums: np.ndarray, mix: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The aggregates of customers from their lifetime values, window sums
    (:meth:`serving.online.days.DayBuckets.sums`) and mix counts."""

    def times(values: np.ndarray) -> np.ndarray:
        out = values.astype(np.float64)
        out[values == NO_TIME] = np.nan
        return out

    n_p = life["n_p"].astype(np.float64)
    bought = n_p > 0
    gaps = n_p - 1
    has_gap = gaps > 0
    a: dict[str, np.ndarray] = {
        "_last_t": times(life["last_t"]),
        "_first_t": life["first_t"].astype(np.float64),
        "_n": life["n"].astype(np.float64),
        "_n_p": n_p,
        "_last_p_t": times(life["last_p_t"]),
        "_amount": np.where(bought, life["amount"], np.nan),
        "_basket_mean": np.where(bought, life["q_sum"] / np.where(bought, n_p, 1.0), np.nan),
        "_basket_max": np.where(bought, life["q_max"], np.nan),
        "_gap_mean": np.where(has_gap, life["gap_mean"], np.nan),
        "_gap_std": np.where(
            has_gap, np.sqrt(np.maximum(life["gap_m2"], 0.0) / np.where(has_gap, gaps, 1.0)), np.nan
        ),
        "_gap_max": np.where(has_gap, life["gap_max"], np.nan),
    }
    for kind in EVENT_TYPE_MIX:
        a[f"_n_{kind}"] = life[f"n_{kind}"].astype(np.float64)
    for j, w in enumerate(WINDOWS_DAYS):
        a[f"_n_{w}"] = sums[0, j]
        a[f"_n_p_{w}"] = sums[1, j]
        a[f"_amount_{w}"] = np.where(sums[1, j] > 0, sums[2, j], np.nan)
    for col, counts in mix.items():
        c = counts.astype(np.float64)
        present = c > 0
        any_value = present.any(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            clogc = np.where(present, c * np.log(np.where(present, c, 1.0)), 0.0).sum(axis=1)
        a[f"_{col}_values"] = present.sum(axis=1).astype(np.float64)
        a[f"_{col}_top"] = c.max(axis=1, initial=0.0)
        a[f"_{col}_total"] = c.sum(axis=1)
        a[f"_{col}_clogc"] = np.where(any_value, clogc, np.nan)
    return a
