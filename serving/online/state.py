"""Per-customer online state: fixed-size aggregates of a customer's events from which every
aggregate of :data:`tasks.definitions.feature_formulas.AGGREGATES` is read at any cutoff day on or
after the newest event.

Per customer (one row of each array; :func:`bytes_per_customer` says how much):

- lifetime: first and last event time, last purchase time, events, purchases, events of each
  type in the mix, purchase amount, quantity sum and maximum, and the gaps between consecutive
  purchases as a running count/mean/sum of squared deviations (Chan's parallel update) and
  maximum;
- a ring of the last :data:`RING_DAYS` days (the longest window): events, purchases (uint16,
  counts past 65,535 in one day kept in a side table) and purchase amount per UTC day. One ring
  day for every customer: when it moves on, the days that leave are cleared for all;
- per mix column, the events of each value (uint32, one column per value seen).

Windows are whole UTC days: at the cutoff the end of day ``D`` (the batch stage's cutoffs are
ends of days), the ``w``-day window is days ``D - w + 1 .. D`` and equals the SQL's
``_t > cutoff - w days``. Gaps need a customer's purchases in time order: :meth:`purchase_order_breaks`
finds purchases before the customer's last one (the ingest refuses them); the rest is order-free.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.definitions.feature_specs import DAY_MICROS, EVENT_TYPE_MIX, MIX_COLUMNS, WINDOWS_DAYS

RING_DAYS = max(WINDOWS_DAYS)
DAY_US = int(DAY_MICROS)
NO_TIME = np.iinfo(np.int64).min
FIRST_NONE = np.iinfo(np.int64).max
COUNT_MAX = int(np.iinfo(np.uint16).max)
OPTIMISTIC_READS = 3  # tries before a read waits for the lock
_LIFETIME: dict[str, np.dtype] = {
    "first_t": np.dtype(np.int64),
    "last_t": np.dtype(np.int64),
    "last_p_t": np.dtype(np.int64),
    "n": np.dtype(np.int32),
    "n_p": np.dtype(np.int32),
    **{f"n_{kind}": np.dtype(np.int32) for kind in EVENT_TYPE_MIX},
    "amount": np.dtype(np.float64),
    "q_sum": np.dtype(np.float64),
    "q_max": np.dtype(np.float64),
    "gap_mean": np.dtype(np.float64),
    "gap_m2": np.dtype(np.float64),
    "gap_max": np.dtype(np.float64),
}
_INITIAL = {"first_t": FIRST_NONE, "last_t": NO_TIME, "last_p_t": NO_TIME, "q_max": -np.inf}
_RING: dict[str, np.dtype] = {
    "day_n": np.dtype(np.uint16),
    "day_n_p": np.dtype(np.uint16),
    "day_amount": np.dtype(np.float64),
}


def day_of(micros: int) -> int:
    """The UTC day (days since the epoch) of a time in microseconds."""
    return micros // DAY_US


def end_of_day_micros(day: int) -> int:
    """The cutoff of day ``day``: its last microsecond (as :func:`tasks.data.cutoffs.end_of_day`)."""
    return (day + 1) * DAY_US - 1


def bytes_per_customer(mix_values: int = 0) -> int:
    """Bytes of state per customer: the arrays, plus 4 per value seen in the mix columns (the
    id index, a Python dict, comes on top: about 100-150 bytes for a short id)."""
    lifetime = sum(t.itemsize for t in _LIFETIME.values())
    ring = RING_DAYS * sum(t.itemsize for t in _RING.values())
    return lifetime + ring + 4 * mix_values


@dataclass(frozen=True)
class Coded:
    """A text column as codes into its distinct values (-1 for null)."""

    codes: np.ndarray  # int32 per event
    values: list[str]
    every_value_used: bool = False  # each value has an event (no need to find which)

    @classmethod
    def of(cls, column: pa.Array) -> Coded:
        encoded = pc.dictionary_encode(column)
        codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
        return cls(codes.astype(np.int32, copy=False), encoded.dictionary.to_pylist(), True)

    def take(self, index: np.ndarray | slice) -> Coded:
        return Coded(self.codes[index], self.values)

    def used(self) -> np.ndarray:
        """The codes with at least one event."""
        if self.every_value_used:
            return np.arange(len(self.values))
        return np.unique(self.codes[self.codes >= 0])


@dataclass(frozen=True)
class EventArrays:
    """Valid events as the state applies them: customer ids and mix values as codes, times in
    microseconds, a purchase flag, the quantity as a double, the event type's index in the mix
    (-1 for other types)."""

    customer: Coded
    t: np.ndarray
    purchase: np.ndarray
    amount: np.ndarray
    quantity: np.ndarray
    kind: np.ndarray
    mix: dict[str, Coded]

    @property
    def size(self) -> int:
        return len(self.t)

    def take(self, index: np.ndarray | slice) -> EventArrays:
        """The events at ``index`` (positions, a mask or a slice)."""
        return EventArrays(
            customer=self.customer.take(index),
            t=self.t[index],
            purchase=self.purchase[index],
            amount=self.amount[index],
            quantity=self.quantity[index],
            kind=self.kind[index],
            mix={c: v.take(index) for c, v in self.mix.items()},
        )


def event_arrays(events: pa.Table) -> EventArrays:
    """Valid events with the contract's columns (``event_time`` a timestamp, ``event_type`` and
    ``quantity`` filled in), as :class:`EventArrays`; a missing mix column is all null."""
    n = events.num_rows

    def column(name: str) -> pa.Array:
        return events.column(name).combine_chunks()

    t = pc.cast(column("event_time"), pa.timestamp("us", tz="UTC")).cast(pa.int64())
    event_type = column("event_type")
    kind = pc.fill_null(pc.index_in(event_type, value_set=pa.array(EVENT_TYPE_MIX)), -1)
    return EventArrays(
        customer=Coded.of(pc.cast(column("customer_id"), pa.string())),
        t=t.to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
        purchase=pc.equal(event_type, "purchase").to_numpy(zero_copy_only=False),
        amount=pc.cast(column("amount"), pa.float64()).to_numpy(zero_copy_only=False),
        quantity=pc.cast(column("quantity"), pa.float64()).to_numpy(zero_copy_only=False),
        kind=kind.to_numpy(zero_copy_only=False).astype(np.int8),
        mix={
            c: Coded.of(
                pc.cast(column(c), pa.string())
                if c in events.column_names
                else pa.nulls(n, pa.string())
            )
            for c in MIX_COLUMNS
        },
    )


class OnlineState:
    """The state of every customer seen, seeded with the events at or before ``seed_cutoff``
    (microseconds: the snapshot's cutoff) and updated with later ones. Thread-safe: one lock
    around every change and every read."""

    def __init__(self, seed_cutoff: int, capacity: int = 1024) -> None:
        self.seed_cutoff = seed_cutoff
        self.ring_day = day_of(seed_cutoff)
        self.newest = seed_cutoff  # the newest event time applied, at least the seed's cutoff
        self.lock = threading.RLock()
        # optimistic reads of one customer (:meth:`read_one`) while a chunk is applied: the
        # version is odd during a change and moves whenever the rows being changed do
        # (``_changing``: sorted rows, or None for every row)
        self._version = 0
        self._changing: np.ndarray | None = None
        self.row_of: dict[str, int] = {}
        self.ids: list[str] = []
        self._capacity = 0
        self._life: dict[str, np.ndarray] = {}
        self._ring: dict[str, np.ndarray] = {}
        self._vocab: dict[str, dict[str, int]] = {c: {} for c in MIX_COLUMNS}
        self._mix: dict[str, np.ndarray] = {
            c: np.zeros((0, 0), dtype=np.uint32) for c in MIX_COLUMNS
        }
        self._overflow: dict[int, dict[int, list[int]]] = {}  # row -> day -> [n, n_p] > 65,535
        self._grow(capacity)

    @property
    def customers(self) -> int:
        return len(self.ids)

    @property
    def mix_values(self) -> int:
        """Distinct values seen in the mix columns (each costs 4 bytes per customer)."""
        return sum(m.shape[1] for m in self._mix.values())

    def nbytes(self) -> int:
        """Bytes held by the arrays (allocated capacity included; the id index not)."""
        arrays = [*self._life.values(), *self._ring.values(), *self._mix.values()]
        return int(sum(a.nbytes for a in arrays))

    def cutoff_day(self) -> int:
        """The earliest day the features can be read at: the newest event's (or the seed's)."""
        return max(self.ring_day, day_of(self.seed_cutoff))

    # changes

    def seed(self, events: EventArrays) -> int:
        """Apply the snapshot's events (those at or before the seed cutoff); how many."""
        return self._apply_where(events, events.t <= self.seed_cutoff, None)

    def apply(self, events: EventArrays, rows: np.ndarray | None = None) -> int:
        """Apply events after the seed cutoff (earlier ones are the snapshot's and are skipped);
        how many were applied. ``rows``: the events' customer rows (:meth:`rows_for`), when
        known already."""
        return self._apply_where(events, events.t > self.seed_cutoff, rows)

    def known_rows(self, customer: Coded) -> np.ndarray:
        """Each event's customer row, -1 for a customer the state has not seen."""
        with self.lock:
            return self._known_rows(customer)

    def rows_for(self, customer: Coded, known: np.ndarray | None = None) -> np.ndarray:
        """Each event's customer row, new customers given new rows; ``known``: the rows
        :meth:`known_rows` gave a moment ago (only its -1s are looked up again)."""
        with self.lock:
            return self._rows(customer, known)

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

    def _apply_where(self, events: EventArrays, mask: np.ndarray, rows: np.ndarray | None) -> int:
        if not mask.all():
            events = events.take(mask)
            rows = None if rows is None else rows[mask]
        if events.size == 0:
            return 0
        with self.lock:
            self._changing_rows(None)  # new rows, maybe longer arrays
            rows = self._rows(events.customer) if rows is None else rows
            order = np.lexsort((events.t, rows))
            rows, t = rows[order], events.t[order]
            purchase = events.purchase[order]
            starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
            group_rows = rows[starts]
            self._changing_rows(group_rows)
            try:
                self._apply_lifetime(rows, t, purchase, events, order, starts, group_rows)
                self._apply_gaps(rows, t, purchase)
                self._apply_ring(rows, t, purchase, events.amount[order])
                for col, values in events.mix.items():
                    self._apply_mix(col, rows, values.take(order))
                self.newest = max(self.newest, int(t.max()))
            finally:
                self._changed()
        return events.size

    def _changing_rows(self, rows: np.ndarray | None) -> None:
        """Rows ``rows`` (sorted; None: every row) are about to change (the lock is held)."""
        self._changing = rows
        self._version += 1 if self._version % 2 == 0 else 2

    def _changed(self) -> None:
        self._changing = None
        self._version += 1

    def _known_rows(self, customer: Coded) -> np.ndarray:
        """Each event's customer row, -1 for a customer the state has not seen."""
        present = customer.used()
        values = customer.values
        row_of = self.row_of
        rows = np.asarray([row_of.get(values[c], -1) for c in present.tolist()], dtype=np.int64)
        by_code = np.full(len(values), -1, dtype=np.int64)
        by_code[present] = rows
        return by_code[customer.codes]

    def _rows(self, customer: Coded, known: np.ndarray | None = None) -> np.ndarray:
        """Each event's customer row; new customers get new rows."""
        rows = self._known_rows(customer) if known is None else known.copy()
        new = rows < 0
        if new.any() and known is not None:  # added by another apply since ``known``
            rows[new] = self._known_rows(customer.take(new))
            new = rows < 0
        if new.any():
            codes = np.unique(customer.codes[new])
            first = len(self.ids)
            self._grow(first + codes.size)
            assigned = np.full(len(customer.values), -1, dtype=np.int64)
            for code, row in zip(codes.tolist(), range(first, first + codes.size), strict=True):
                customer_id = customer.values[code]
                self.row_of[customer_id] = row
                self.ids.append(customer_id)
                assigned[code] = row
            rows[new] = assigned[customer.codes[new]]
        return rows

    def _apply_lifetime(
        self,
        rows: np.ndarray,
        t: np.ndarray,
        purchase: np.ndarray,
        events: EventArrays,
        order: np.ndarray,
        starts: np.ndarray,
        group_rows: np.ndarray,
    ) -> None:
        life = self._life
        ends = np.r_[starts[1:], rows.size] - 1
        life["first_t"][group_rows] = np.minimum(life["first_t"][group_rows], t[starts])
        life["last_t"][group_rows] = np.maximum(life["last_t"][group_rows], t[ends])
        life["n"][group_rows] += np.diff(np.r_[starts, rows.size]).astype(np.int32)
        life["n_p"][group_rows] += np.add.reduceat(purchase.astype(np.int32), starts)
        amount = np.where(purchase, events.amount[order], 0.0)
        quantity = events.quantity[order]
        life["amount"][group_rows] += np.add.reduceat(amount, starts)
        life["q_sum"][group_rows] += np.add.reduceat(np.where(purchase, quantity, 0.0), starts)
        q_max = np.maximum.reduceat(np.where(purchase, quantity, -np.inf), starts)
        life["q_max"][group_rows] = np.maximum(life["q_max"][group_rows], q_max)
        kind = events.kind[order]
        for i, name in enumerate(EVENT_TYPE_MIX):
            life[f"n_{name}"][group_rows] += np.add.reduceat((kind == i).astype(np.int32), starts)

    def _apply_gaps(self, rows: np.ndarray, t: np.ndarray, purchase: np.ndarray) -> None:
        """Each purchase's gap to the customer's previous one (in this batch, else the state's
        last purchase), merged into the running count/mean/M2/max."""
        life = self._life
        p_rows, p_t = rows[purchase], t[purchase]
        if p_rows.size == 0:
            return
        first = np.r_[True, p_rows[1:] != p_rows[:-1]]
        previous = np.r_[NO_TIME, p_t[:-1]]
        previous[first] = life["last_p_t"][p_rows[first]]
        has_gap = previous != NO_TIME
        gap_rows = p_rows[has_gap]
        gaps = (p_t[has_gap] - previous[has_gap]) / DAY_MICROS
        group_starts = np.flatnonzero(first)
        group_rows = p_rows[group_starts]
        added = np.diff(np.r_[group_starts, p_rows.size])  # purchases of each group's customer
        last = p_t[np.r_[group_starts[1:], p_t.size] - 1]
        life["last_p_t"][group_rows] = np.maximum(life["last_p_t"][group_rows], last)
        if gaps.size == 0:
            return
        starts = np.flatnonzero(np.r_[True, gap_rows[1:] != gap_rows[:-1]])
        g_rows = gap_rows[starts]
        k_b = np.diff(np.r_[starts, gaps.size]).astype(np.float64)
        mean_b = np.add.reduceat(gaps, starts) / k_b
        m2_b = np.add.reduceat((gaps - np.repeat(mean_b, k_b.astype(np.int64))) ** 2, starts)
        max_b = np.maximum.reduceat(gaps, starts)
        before = life["n_p"][g_rows] - added[np.searchsorted(group_rows, g_rows)]
        k_a = np.maximum(before - 1, 0).astype(np.float64)
        mean_a = np.where(k_a > 0, life["gap_mean"][g_rows], 0.0)
        m2_a = np.where(k_a > 0, life["gap_m2"][g_rows], 0.0)
        k = k_a + k_b
        delta = mean_b - mean_a
        life["gap_mean"][g_rows] = np.where(k_a > 0, mean_a + delta * k_b / k, mean_b)
        life["gap_m2"][g_rows] = m2_a + m2_b + np.where(k_a > 0, delta**2 * k_a * k_b / k, 0.0)
        life["gap_max"][g_rows] = np.where(
            k_a > 0, np.maximum(life["gap_max"][g_rows], max_b), max_b
        )

    def _apply_ring(
        self, rows: np.ndarray, t: np.ndarray, purchase: np.ndarray, amount: np.ndarray
    ) -> None:
        day = t // DAY_US
        self._advance(int(day.max()))
        keep = day > self.ring_day - RING_DAYS
        if not keep.any():
            return
        rows, day, purchase, amount = rows[keep], day[keep], purchase[keep], amount[keep]
        cell, first, inverse = np.unique(
            rows * RING_DAYS + day % RING_DAYS, return_index=True, return_inverse=True
        )
        cell_day = day[first]
        ring = self._ring
        spent = np.bincount(inverse, weights=np.where(purchase, amount, 0.0))
        ring["day_amount"].reshape(-1)[cell] += spent  # cells are unique
        for name, counted in (("day_n", None), ("day_n_p", purchase)):
            added = np.bincount(inverse, weights=counted).astype(np.int64)
            flat = ring[name].reshape(-1)
            total = flat[cell].astype(np.int64) + added
            over = total > COUNT_MAX
            flat[cell] = np.minimum(total, COUNT_MAX).astype(np.uint16)
            if over.any():
                index = 0 if name == "day_n" else 1
                for c, d, extra in zip(
                    cell[over].tolist(),
                    cell_day[over].tolist(),
                    (total[over] - COUNT_MAX).tolist(),
                    strict=True,
                ):
                    days = self._overflow.setdefault(c // RING_DAYS, {})
                    days.setdefault(d, [0, 0])[index] += extra

    def _advance(self, day: int) -> None:
        """Move the ring day on to ``day``, clearing the days that leave it for every customer."""
        if day <= self.ring_day:
            return
        self._changing_rows(None)
        leaving = range(self.ring_day + 1, min(day, self.ring_day + RING_DAYS) + 1)
        slots = np.asarray([d % RING_DAYS for d in leaving], dtype=np.intp)
        for array in self._ring.values():
            array[:, slots] = 0
        self.ring_day = day
        oldest = day - RING_DAYS
        for row in list(self._overflow):
            kept = {d: v for d, v in self._overflow[row].items() if d > oldest}
            if kept:
                self._overflow[row] = kept
            else:
                del self._overflow[row]

    def _apply_mix(self, col: str, rows: np.ndarray, values: Coded) -> None:
        valid = values.codes >= 0
        if not valid.any():
            return
        present = values.used()
        vocab = self._vocab[col]
        ids = np.full(len(values.values), -1, dtype=np.int64)
        ids[present] = [vocab.setdefault(values.values[c], len(vocab)) for c in present.tolist()]
        if len(vocab) > self._mix[col].shape[1]:
            self._widen_mix(col, len(vocab))
        counts = self._mix[col]
        cells, added = np.unique(
            rows[valid] * counts.shape[1] + ids[values.codes[valid]], return_counts=True
        )
        counts.reshape(-1)[cells] += added.astype(np.uint32)  # cells are unique

    # growth

    def _grow(self, needed: int) -> None:
        if needed <= self._capacity:
            return
        capacity = max(needed, self._capacity + self._capacity // 2, 1024)
        for name, dtype in _LIFETIME.items():
            grown = np.full(capacity, _INITIAL.get(name, 0), dtype=dtype)
            if name in self._life:
                grown[: self._capacity] = self._life[name]
            self._life[name] = grown
        for name, dtype in _RING.items():
            grown = np.zeros((capacity, RING_DAYS), dtype=dtype)
            if name in self._ring:
                grown[: self._capacity] = self._ring[name]
            self._ring[name] = grown
        for col, counts in self._mix.items():
            grown = np.zeros((capacity, counts.shape[1]), dtype=np.uint32)
            grown[: counts.shape[0]] = counts
            self._mix[col] = grown
        self._capacity = capacity

    def _widen_mix(self, col: str, values: int) -> None:
        self._changing_rows(None)
        counts = self._mix[col]
        width = max(values, counts.shape[1] * 2, 4)
        grown = np.zeros((counts.shape[0], width), dtype=np.uint32)
        grown[:, : counts.shape[1]] = counts
        self._mix[col] = grown

    # reads

    def read(self, rows: np.ndarray, at_least_day: int) -> Reading:
        """The aggregates of the customers at ``rows`` at the end of ``at_least_day`` or of
        :meth:`cutoff_day`, whichever is later, read at one moment (events applied meanwhile
        wait)."""
        with self.lock:
            day = max(at_least_day, self.cutoff_day())
            life = {name: array[rows] for name, array in self._life.items()}
            ring = {name: array[rows] for name, array in self._ring.items()}
            mix = {col: counts[rows] for col, counts in self._mix.items()}
            overflow = [self._overflow.get(int(r)) for r in rows] if self._overflow else None
            ring_day, newest = self.ring_day, self.newest
        return Reading(_aggregates(life, ring, mix, overflow, ring_day, day), day, newest)

    def read_one(self, row: int, at_least_day: int) -> Reading:
        """:meth:`read` for one customer, its aggregates as scalars (what a single request
        needs: a few microseconds instead of a hundred array operations). Read without waiting
        for the chunk being applied unless it changes this customer: the copy counts when the
        version did not move while it was taken."""
        for _ in range(OPTIMISTIC_READS):
            version, changing = self._version, self._changing
            if version % 2 and (changing is None or _has(changing, row)):
                break
            copied = self._row_copy(row, at_least_day)
            if self._version == version:
                return copied
        with self.lock:
            return self._row_copy(row, at_least_day)

    def _row_copy(self, row: int, at_least_day: int) -> Reading:
        day = max(at_least_day, self.cutoff_day())
        life = {name: array[row] for name, array in self._life.items()}
        ring = np.stack([array[row] for array in self._ring.values()])
        mix = {col: counts[row].copy() for col, counts in self._mix.items()}
        overflow = self._overflow.get(row)
        ring_day, newest = self.ring_day, self.newest
        return Reading(_aggregates_of_one(life, ring, mix, overflow, ring_day, day), day, newest)

    def aggregates(self, rows: np.ndarray, cutoff_day: int) -> dict[str, np.ndarray]:
        """Every aggregate of :data:`tasks.definitions.feature_formulas.AGGREGATES` for the
        customers at ``rows`` at the end of ``cutoff_day`` (no earlier than
        :meth:`cutoff_day`); doubles, NaN for SQL's null."""
        reading = self.read(rows, cutoff_day)
        if reading.day != cutoff_day:
            raise ValueError(f"cutoff day {cutoff_day} is before the newest event's {reading.day}")
        return reading.aggregates


def _has(sorted_rows: np.ndarray, row: int) -> bool:
    i = int(np.searchsorted(sorted_rows, row))
    return i < len(sorted_rows) and int(sorted_rows[i]) == row


@dataclass(frozen=True)
class Reading:
    """Customers' aggregates (:meth:`OnlineState.read`): at the end of ``day``, with the
    newest event applied then (microseconds)."""

    aggregates: dict[str, np.ndarray]
    day: int
    newest: int


def _aggregates(
    life: dict[str, np.ndarray],
    ring: dict[str, np.ndarray],
    mix: dict[str, np.ndarray],
    overflow: list[dict[int, list[int]] | None] | None,
    ring_day: int,
    cutoff_day: int,
) -> dict[str, np.ndarray]:
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
    ring_stack = np.stack([ring["day_n"], ring["day_n_p"], ring["day_amount"]])
    sums = _window_sums(ring_stack, overflow, ring_day, cutoff_day)
    for j, w in enumerate(WINDOWS_DAYS):
        a[f"_n_{w}"] = sums[0, :, j]
        a[f"_n_p_{w}"] = sums[1, :, j]
        a[f"_amount_{w}"] = np.where(sums[1, :, j] > 0, sums[2, :, j], np.nan)
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


def _window_sums(
    ring: np.ndarray,
    overflow: list[dict[int, list[int]] | None] | None,
    ring_day: int,
    cutoff_day: int,
) -> np.ndarray:
    """Events, purchases and amount (``ring``'s first axis) of each window
    (:data:`WINDOWS_DAYS`, the last axis) ending at the end of ``cutoff_day``, per customer
    (the middle axis). A window ending on or after the ring's newest day
    is a suffix of the ring's days in order, summed newest first (amounts are non-negative: no
    sum loses precision to cancellation)."""
    oldest = ring_day - RING_DAYS + 1
    shift = oldest % RING_DAYS
    days = ring.astype(np.float64)
    in_order = np.concatenate([days[..., shift:], days[..., :shift]], axis=-1)
    suffix = np.zeros(in_order.shape[:-1] + (RING_DAYS + 1,))
    suffix[..., :RING_DAYS] = np.cumsum(in_order[..., ::-1], axis=-1)[..., ::-1]
    starts = [min(max(cutoff_day - w + 1 - oldest, 0), RING_DAYS) for w in WINDOWS_DAYS]
    sums = suffix[..., starts]
    for i, extra in enumerate(overflow or []):
        for d, (more_n, more_p) in (extra or {}).items():
            late = [j for j, start in enumerate(starts) if d >= oldest + start]
            sums[0, i, late] += more_n
            sums[1, i, late] += more_p
    return sums


def _aggregates_of_one(
    life: dict[str, np.generic],
    ring: np.ndarray,
    mix: dict[str, np.ndarray],
    overflow: dict[int, list[int]] | None,
    ring_day: int,
    cutoff_day: int,
) -> dict[str, np.float64]:
    """:func:`_aggregates` of one customer, as float64 scalars (NaN for SQL's null)."""
    f, nan = np.float64, np.float64(np.nan)
    n_p = f(life["n_p"])
    bought, gaps = n_p > 0, n_p - 1
    a = {
        "_last_t": nan if life["last_t"] == NO_TIME else f(life["last_t"]),
        "_first_t": f(life["first_t"]),
        "_n": f(life["n"]),
        "_n_p": n_p,
        "_last_p_t": nan if life["last_p_t"] == NO_TIME else f(life["last_p_t"]),
        "_amount": f(life["amount"]) if bought else nan,
        "_basket_mean": f(life["q_sum"]) / n_p if bought else nan,
        "_basket_max": f(life["q_max"]) if bought else nan,
        "_gap_mean": f(life["gap_mean"]) if gaps > 0 else nan,
        "_gap_std": np.sqrt(max(f(life["gap_m2"]), f(0.0)) / gaps) if gaps > 0 else nan,
        "_gap_max": f(life["gap_max"]) if gaps > 0 else nan,
    }
    for kind in EVENT_TYPE_MIX:
        a[f"_n_{kind}"] = f(life[f"n_{kind}"])
    one = ring[:, None, :]
    sums = _window_sums(one, None if overflow is None else [overflow], ring_day, cutoff_day)[:, 0]
    for j, w in enumerate(WINDOWS_DAYS):
        n_w, n_p_w, amount_w = sums[0, j], sums[1, j], sums[2, j]
        a[f"_n_{w}"], a[f"_n_p_{w}"] = n_w, n_p_w
        a[f"_amount_{w}"] = amount_w if n_p_w > 0 else nan
    for col, counts in mix.items():
        c = counts[counts > 0].astype(np.float64)
        a[f"_{col}_values"] = f(c.size)
        a[f"_{col}_top"] = c.max() if c.size else f(0.0)
        a[f"_{col}_total"] = c.sum() if c.size else f(0.0)
        a[f"_{col}_clogc"] = (c * np.log(c)).sum() if c.size else nan
    return a
