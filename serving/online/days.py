"""Events, purchases and purchase amount per customer and UTC day over the last
:data:`RING_DAYS` days (the longest feature window), from which each window's sums are read at
any cutoff day on or after the newest day.

Most customers are active on few days in a year, so each customer has :data:`SLOTS` slots of
(day, events, purchases, amount) in place of a ring of every day: a day takes a free slot (one
never used, or one whose day has left the longest window), and nothing needs clearing when the
days move on. A customer with events on more than :data:`SLOTS` days of the ring gets a ring of
every day from a pool (its slots are moved into it): at most :data:`RING_BYTES` more, until
the days leaving the window leave it with events on :data:`SLOTS` days or fewer; then its days
move back into its slots and the ring goes back to the pool for the next busy customer.
Counts are uint16; a day's count past 65,535 keeps the rest in a side table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from tasks.definitions.feature_specs import WINDOWS_DAYS

RING_DAYS = max(WINDOWS_DAYS)
SLOTS = 32
EMPTY = 0  # the day of a slot never used (days are kept as days after the first ring's oldest)
COUNT_MAX = int(np.iinfo(np.uint16).max)
RING_BYTES = RING_DAYS * (2 + 2 + 8)  # a pool ring
_WINDOWS = np.asarray(WINDOWS_DAYS, dtype=np.int64)
# by a day's age (days before the cutoff day, RING_DAYS for older): the shortest window that
# holds it (len(WINDOWS_DAYS): none)
_SHORTEST = np.searchsorted(_WINDOWS, np.arange(RING_DAYS + 1), side="right").astype(np.int32)
_SHORTEST_OF_AGE: list[int] = _SHORTEST[:RING_DAYS].tolist()  # for a day in the ring
# the pool's arrays: attribute -> (the key naming its block, its type)
_POOL = {
    "_ring_n": ("pool:n", np.uint16),
    "_ring_n_p": ("pool:n_p", np.uint16),
    "_ring_amount": ("pool:amount", np.float64),
}
Allocate = Callable[[str, tuple[int, ...], "np.dtype | str | type"], np.ndarray]


def _zeros(key: str, shape: tuple[int, ...], dtype: np.dtype | str | type) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


class DayBuckets:
    """The daily buckets of every customer row (not thread-safe: the online state's lock)."""

    def __init__(self, ring_day: int, allocate: Allocate = _zeros) -> None:
        self._allocate = allocate  # a new zeroed array for the pool (key, shape, dtype)
        self.ring_day = ring_day  # the newest day: the ring holds days ring_day - RING_DAYS + 1 on
        self._base = ring_day - RING_DAYS  # a slot's day is kept as day - _base (uint16)
        # each row's slots and pool ring (-1 for none): views of the customers' records
        # (serving.online.record), set by bind
        self._day = np.zeros((0, SLOTS), dtype=np.uint16)
        self._n = np.zeros((0, SLOTS), dtype=np.uint16)
        self._n_p = np.zeros((0, SLOTS), dtype=np.uint16)
        self._amount = np.zeros((0, SLOTS), dtype=np.float64)
        self._ring_of = np.zeros(0, dtype=np.int32)
        self._rings = 0  # rings of the pool ever handed out
        self._free: list[int] = []  # rings handed back (all zero), taken before new ones
        self._ring_n = np.zeros((0, RING_DAYS), dtype=np.uint16)
        self._ring_n_p = np.zeros((0, RING_DAYS), dtype=np.uint16)
        self._ring_amount = np.zeros((0, RING_DAYS), dtype=np.float64)
        self._overflow: dict[int, dict[int, list[int]]] = {}  # row -> day -> [n, n_p] > 65,535

    @property
    def rings(self) -> int:
        """Customers with a ring of every day (events on more than :data:`SLOTS` days)."""
        return self._rings - len(self._free)

    @property
    def rings_handed_out(self) -> int:
        return self._rings

    @property
    def free_rings(self) -> list[int]:
        return list(self._free)

    def overflow_copy(self) -> dict[int, dict[int, list[int]]]:
        """The day counts past 65,535 (row -> day -> [events, purchases] beyond)."""
        return {row: {d: list(v) for d, v in days.items()} for row, days in self._overflow.items()}

    def set_overflow(self, overflow: dict[int, dict[int, list[int]]]) -> None:
        self._overflow = overflow

    def restore(
        self, ring_day: int, rings: int, free: list[int], overflow: dict[int, dict[int, list[int]]]
    ) -> None:
        """Take on the pool's bookkeeping of the buckets of another object (the arrays are
        bound: :meth:`bind`, :meth:`attach_pool`)."""
        self.ring_day, self._rings, self._free, self._overflow = ring_day, rings, free, overflow

    @staticmethod
    def pool_dtype(key: str) -> np.dtype:
        for pool_key, dtype in _POOL.values():
            if pool_key == key:
                return np.dtype(dtype)
        raise ValueError(f"no array of the day buckets is named {key!r}")

    def attach_pool(self, arrays: dict[str, np.ndarray]) -> None:
        """Read the pool's rings from ``arrays`` (by key; the empty pool for a key not there)."""
        for attribute, (key, dtype) in _POOL.items():
            array = arrays.get(key)
            setattr(self, attribute, np.zeros((0, RING_DAYS), dtype) if array is None else array)

    def nbytes(self) -> int:
        """Bytes of the pool's rings (the slots are in the customers' records)."""
        rings = (self._ring_n, self._ring_n_p, self._ring_amount)
        return int(sum(a.nbytes for a in rings))

    def bind(self, records: np.ndarray) -> None:
        """Keep the slots in ``records`` (:func:`serving.online.record.records`: every row's,
        this one's rows copied in already)."""
        self._day = records["slot_day"]
        self._n, self._n_p = records["slot_n"], records["slot_n_p"]
        self._amount = records["slot_amount"]
        self._ring_of = records["ring"]

    # changes

    def advance(self, day: int) -> None:
        """Move the newest day on to ``day``: the days that leave the rings are cleared (slots
        of days that left are free without clearing)."""
        if day <= self.ring_day:
            return
        leaving = range(self.ring_day + 1, min(day, self.ring_day + RING_DAYS) + 1)
        slots = np.asarray([d % RING_DAYS for d in leaving], dtype=np.intp)
        for ring in (self._ring_n, self._ring_n_p, self._ring_amount):
            ring[: self._rings, slots] = 0
        self.ring_day = day
        self._hand_back_quiet_rings()
        oldest = day - RING_DAYS
        for row in list(self._overflow):
            kept = {d: v for d, v in self._overflow[row].items() if d > oldest}
            if kept:
                self._overflow[row] = kept
            else:
                del self._overflow[row]

    def _hand_back_quiet_rings(self) -> None:
        """Move the days of rings with events on :data:`SLOTS` days or fewer back into their
        customers' slots, and hand those rings back to the pool."""
        if self.rings == 0:
            return
        rows = np.flatnonzero(self._ring_of >= 0)
        ring = self._ring_of[rows]
        active = self._ring_n[ring] > 0
        quiet = active.sum(axis=1) <= SLOTS
        if not quiet.any():
            return
        rows, ring, active = rows[quiet], ring[quiet], active[quiet]
        which, cell = np.nonzero(active)
        oldest = self.ring_day - RING_DAYS + 1
        day = oldest + (cell - oldest) % RING_DAYS
        # the k-th active day of a ring goes to slot k (every slot of a ringed row is EMPTY)
        runs = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
        slot = np.arange(which.size) - np.repeat(runs, np.diff(np.r_[runs, which.size]))
        at = (rows[which], slot)
        self._day[at] = day - self._base
        self._n[at] = self._ring_n[ring[which], cell]
        self._n_p[at] = self._ring_n_p[ring[which], cell]
        self._amount[at] = self._ring_amount[ring[which], cell]
        for pool in (self._ring_n, self._ring_n_p, self._ring_amount):
            pool[ring] = 0
        self._ring_of[rows] = -1
        self._free += ring.tolist()

    def add(
        self,
        rows: np.ndarray,
        day: np.ndarray,
        n: np.ndarray,
        n_p: np.ndarray,
        amount: np.ndarray,
    ) -> None:
        """Add cells of (row, day): unique pairs, the cells of a row consecutive. Days that
        have left the ring (older than :attr:`ring_day` - RING_DAYS + 1) are dropped."""
        keep = day > self.ring_day - RING_DAYS
        if not keep.all():
            rows, day, n, n_p, amount = rows[keep], day[keep], n[keep], n_p[keep], amount[keep]
        if rows.size == 0:
            return
        if int(day.max()) - self._base > np.iinfo(np.uint16).max:
            raise ValueError(f"day {int(day.max())}: more than 179 years after the snapshot")
        in_slots = self._ring_of[rows] < 0
        slot, new = self._slots(rows[in_slots], day[in_slots] - self._base)
        if (slot < 0).any():  # no room: those customers' days move to a ring of every day
            self._to_ring(np.unique(rows[in_slots][slot < 0]))
            still = self._ring_of[rows[in_slots]] < 0
            slot, new = slot[still], new[still]
            in_slots[np.flatnonzero(in_slots)[~still]] = False
        self._add_to_slots(rows[in_slots], day[in_slots], slot, new, n, n_p, amount, in_slots)
        in_ring = ~in_slots
        if in_ring.any():
            cell = self._ring_of[rows[in_ring]].astype(np.int64) * RING_DAYS
            cell += day[in_ring] % RING_DAYS
            self._ring_amount.reshape(-1)[cell] += amount[in_ring]
            parts = ((self._ring_n, n[in_ring]), (self._ring_n_p, n_p[in_ring]))
            for index, (ring, added) in enumerate(parts):
                flat = ring.reshape(-1)
                total = flat[cell].astype(np.int64) + added
                flat[cell] = self._capped(total, rows[in_ring], day[in_ring], index)

    def _slots(self, rows: np.ndarray, day: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each cell's slot (-1: its customer has no free one left) and whether it is new
        (``day``: as kept, days after ``_base``)."""
        taken = self._day[rows]
        match = taken == day[:, None]
        found = match.any(axis=1)
        slot = np.where(found, match.argmax(axis=1), -1)
        need = np.flatnonzero(~found)
        if need.size:
            needy = rows[need]
            free = taken[need] <= self.ring_day - RING_DAYS - self._base  # EMPTY, or left
            runs = np.flatnonzero(np.r_[True, needy[1:] != needy[:-1]])
            rank = np.arange(needy.size) - np.repeat(runs, np.diff(np.r_[runs, needy.size]))
            nth = free & (np.cumsum(free, axis=1) == rank[:, None] + 1)
            slot[need] = np.where(nth.any(axis=1), nth.argmax(axis=1), -1)
        return slot, ~found

    def _add_to_slots(
        self,
        rows: np.ndarray,
        day: np.ndarray,
        slot: np.ndarray,
        new: np.ndarray,
        n: np.ndarray,
        n_p: np.ndarray,
        amount: np.ndarray,
        chosen: np.ndarray,
    ) -> None:
        if rows.size == 0:
            return
        cell = (rows, slot)
        self._day[cell] = day - self._base
        self._amount[cell] = np.where(new, 0.0, self._amount[cell]) + amount[chosen]
        for index, (counts, added) in enumerate(((self._n, n), (self._n_p, n_p))):
            total = np.where(new, 0, counts[cell].astype(np.int64)) + added[chosen]
            counts[cell] = self._capped(total, rows, day, index)

    def _capped(self, total: np.ndarray, rows: np.ndarray, day: np.ndarray, index: int):
        """``total`` as uint16, what is past 65,535 kept in the side table."""
        over = total > COUNT_MAX
        if over.any():
            for row, d, extra in zip(
                rows[over].tolist(),
                day[over].tolist(),
                (total[over] - COUNT_MAX).tolist(),
                strict=True,
            ):
                self._overflow.setdefault(row, {}).setdefault(d, [0, 0])[index] += extra
        return np.minimum(total, COUNT_MAX).astype(np.uint16)

    def _to_ring(self, rows: np.ndarray) -> None:
        """Give ``rows`` rings of every day from the pool, their slots' days moved in."""
        reused = [self._free.pop() for _ in range(min(len(self._free), rows.size))]
        first = self._rings
        self._rings += rows.size - len(reused)
        if self._rings > len(self._ring_n):
            capacity = max(self._rings, 2 * len(self._ring_n), 64)
            for name, (key, dtype) in _POOL.items():
                old = getattr(self, name)
                out = self._allocate(key, (capacity, RING_DAYS), dtype)
                out[: len(old)] = old
                setattr(self, name, out)
        ring = np.asarray([*reused, *range(first, self._rings)], dtype=np.int32)
        self._ring_of[rows] = ring
        taken = self._day[rows].astype(np.int64) + self._base
        which, slot = np.nonzero(taken > self.ring_day - RING_DAYS)
        cell = ring[which].astype(np.int64) * RING_DAYS + taken[which, slot] % RING_DAYS
        self._ring_n.reshape(-1)[cell] = self._n[rows][which, slot]
        self._ring_n_p.reshape(-1)[cell] = self._n_p[rows][which, slot]
        self._ring_amount.reshape(-1)[cell] = self._amount[rows][which, slot]
        self._day[rows] = EMPTY
        self._n[rows] = self._n_p[rows] = 0
        self._amount[rows] = 0.0

    # reads

    def sums(self, rows: np.ndarray, cutoff_day: int, ring_day: int | None = None) -> np.ndarray:
        """Events, purchases and amount (the first axis) of each window (:data:`WINDOWS_DAYS`,
        the middle axis) ending at the end of ``cutoff_day`` (no earlier than
        ``ring_day``, by default :attr:`ring_day`), per row of ``rows`` (the last axis), as
        doubles."""
        ring_day = self.ring_day if ring_day is None else ring_day
        m = len(rows)
        # the windows nest: a slot's day is in every window from the shortest that holds it
        # (none for EMPTY or a day that left), so sum per (shortest window, row), then add up
        age = (cutoff_day - self._base) - self._day[rows].astype(np.int32)
        shortest = np.take(_SHORTEST, age, mode="clip")  # an age past RING_DAYS: none
        bins = (shortest * np.int32(m) + np.arange(m, dtype=np.int32)[:, None]).ravel()
        sums = np.empty((3, _WINDOWS.size, m))
        for i, values in enumerate((self._n[rows], self._n_p[rows], self._amount[rows])):
            per = np.bincount(bins, values.ravel(), (_WINDOWS.size + 1) * m)
            np.cumsum(per.reshape(-1, m)[: _WINDOWS.size], axis=0, out=sums[i])
        ring_of = self._ring_of[rows]
        ringed = np.flatnonzero(ring_of >= 0)
        if ringed.size:
            ring = ring_of[ringed]
            every_day = np.stack(
                [self._ring_n[ring], self._ring_n_p[ring], self._ring_amount[ring]]
            )
            sums[..., ringed] += _ring_sums(every_day, ring_day, cutoff_day).transpose(0, 2, 1)
        if self._overflow:
            for i in np.flatnonzero(np.isin(rows, list(self._overflow))).tolist():
                for d, (more_n, more_p) in self._overflow[int(rows[i])].items():
                    late = d > cutoff_day - _WINDOWS
                    sums[0, late, i] += more_n
                    sums[1, late, i] += more_p
        return sums

    def row_sums(
        self,
        row: int,
        cutoff_day: int,
        slots: Iterable[tuple[int, int, int, float]],
        ring: int,
        ring_day: int | None = None,
    ) -> list[list[float]]:
        """:meth:`sums` of one row in plain Python (a request's read: no array operation per
        window), from its record's ``slots`` (day as kept, events, purchases, amount: the
        row's values of the record's slot fields, slot by slot) and ``ring`` (its pool ring,
        -1 for none): ``[events, purchases, amount]``, each a list over :data:`WINDOWS_DAYS`."""
        windows = len(WINDOWS_DAYS)
        per = [[0.0] * windows for _ in range(3)]
        n_per, p_per, amount_per = per
        top = cutoff_day - self._base  # a slot's age is top - its kept day
        shortest = _SHORTEST_OF_AGE
        for kept, n, n_p, amount in slots:
            age = top - kept
            if age < RING_DAYS:  # EMPTY, or a day that left the longest window: older
                k = shortest[age]
                n_per[k] += n
                p_per[k] += n_p
                amount_per[k] += amount
        for values in per:  # the windows nest: each holds the shorter ones' days
            for k in range(1, windows):
                values[k] += values[k - 1]
        if ring >= 0:
            every_day = np.stack(
                [self._ring_n[ring], self._ring_n_p[ring], self._ring_amount[ring]]
            )
            for values, more in zip(
                per,
                _ring_sums(
                    every_day, self.ring_day if ring_day is None else ring_day, cutoff_day
                ).tolist(),
                strict=True,
            ):
                for k in range(windows):
                    values[k] += more[k]
        if self._overflow and row in self._overflow:
            for d, (more_n, more_p) in list(self._overflow[row].items()):
                for k, w in enumerate(WINDOWS_DAYS):
                    if d > cutoff_day - w:
                        n_per[k] += more_n
                        p_per[k] += more_p
        return per


def _ring_sums(ring: np.ndarray, ring_day: int, cutoff_day: int) -> np.ndarray:
    """:meth:`DayBuckets.sums` of rings of every day (the last axis: day % RING_DAYS). A window
    ending on or after the ring's newest day is a suffix of the ring's days in order."""
    oldest = ring_day - RING_DAYS + 1
    shift = oldest % RING_DAYS
    days = ring.astype(np.float64)
    in_order = np.concatenate([days[..., shift:], days[..., :shift]], axis=-1)
    suffix = np.zeros(in_order.shape[:-1] + (RING_DAYS + 1,))
    suffix[..., :RING_DAYS] = np.cumsum(in_order[..., ::-1], axis=-1)[..., ::-1]
    starts = [min(max(cutoff_day - w + 1 - oldest, 0), RING_DAYS) for w in WINDOWS_DAYS]
    return suffix[..., starts]
