"""Valid events as the online state reads them: numpy arrays, text columns as codes into their
distinct values, times in microseconds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.definitions.feature_specs import DAY_MICROS, EVENT_TYPE_MIX, MIX_COLUMNS

DAY_US = int(DAY_MICROS)
NO_TIME = np.iinfo(np.int64).min


def day_of(micros: int) -> int:
    """The UTC day (days since the epoch) of a time in microseconds."""
    return micros // DAY_US


def end_of_day_micros(day: int) -> int:
    """The cutoff of day ``day``: its last microsecond (as :func:`tasks.data.cutoffs.end_of_day`)."""
    return (day + 1) * DAY_US - 1


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

    def take(self, index: np.ndarray | slice, permutation: bool = False) -> Coded:
        """The codes at ``index``; ``permutation``: every position once (each value stays used)."""
        return Coded(self.codes[index], self.values, permutation and self.every_value_used)

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

    def take(self, index: np.ndarray | slice, permutation: bool = False) -> EventArrays:
        """The events at ``index`` (positions, a mask or a slice); ``permutation``: every
        event once, reordered."""
        return EventArrays(
            customer=self.customer.take(index, permutation),
            t=self.t[index],
            purchase=self.purchase[index],
            amount=self.amount[index],
            quantity=self.quantity[index],
            kind=self.kind[index],
            mix={c: v.take(index, permutation) for c, v in self.mix.items()},
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
