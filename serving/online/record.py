"""One customer's online state in one record: the lifetime values and the day slots
(:mod:`serving.online.days`) side by side in a row of one array, so a request reads a customer
with one call (:meth:`Record.unpack`: every field of the row as a tuple of Python numbers) and
touches a few adjacent cache lines instead of one per array.

Fields of 8 bytes come first, then 4, then 2, so every field is aligned in the packed record
(:data:`RECORD_BYTES` is a multiple of 8); the state and the day buckets change the records
through numpy views of the fields (:func:`records`), a request reads them through
:class:`Record`.
"""

from __future__ import annotations

import struct

import numpy as np

from serving.online.days import SLOTS
from serving.online.events import NO_TIME
from tasks.definitions.feature_specs import EVENT_TYPE_MIX

FIRST_NONE = np.iinfo(np.int64).max
# the lifetime values of a customer (serving.online.state says what each is)
LIFETIME: dict[str, str] = {
    "first_t": "<i8",
    "last_t": "<i8",
    "last_p_t": "<i8",
    "amount": "<f8",
    "q_sum": "<f8",
    "q_max": "<f8",
    "gap_mean": "<f8",
    "gap_m2": "<f8",
    "gap_max": "<f8",
    "n": "<i4",
    "n_p": "<i4",
    **{f"n_{kind}": "<i4" for kind in EVENT_TYPE_MIX},
}
# a customer's slots of days (serving.online.days: the day as kept, events, purchases, amount)
# and its pool ring (-1 for none)
SLOT_FIELDS: dict[str, str] = {
    "slot_amount": "<f8",
    "ring": "<i4",
    "slot_day": "<u2",
    "slot_n": "<u2",
    "slot_n_p": "<u2",
}
_SHAPES = {"ring": ()}
INITIAL: dict[str, float | int] = {
    "first_t": FIRST_NONE,
    "last_t": NO_TIME,
    "last_p_t": NO_TIME,
    "q_max": -np.inf,
    "ring": -1,
}
_FIELDS = [(name, kind, ()) for name, kind in LIFETIME.items()] + [
    (name, kind, _SHAPES.get(name, (SLOTS,))) for name, kind in SLOT_FIELDS.items()
]
_ORDER = sorted(_FIELDS, key=lambda f: -np.dtype(f[1]).itemsize)  # 8, then 4, then 2 bytes
RECORD = np.dtype([(name, kind, shape) for name, kind, shape in _ORDER])
RECORD_BYTES = RECORD.itemsize
LIFETIME_BYTES = sum(np.dtype(kind).itemsize for kind in LIFETIME.values())


def _positions() -> dict[str, int]:
    at, out = 0, {}
    for name, _, shape in _ORDER:
        out[name] = at
        at += int(np.prod(shape, dtype=np.int64))
    return out


POSITION: dict[str, int] = _positions()
"""Where each field starts in :meth:`Record.unpack`'s tuple (a slot field: its SLOTS values
from there, slot 0 first)."""
_STRUCT_CODE = {"<i8": "q", "<f8": "d", "<i4": "i", "<u2": "H"}  # struct's standard sizes
_FORMAT = "<" + "".join(
    f"{int(np.prod(shape, dtype=np.int64))}{_STRUCT_CODE[kind]}" for _, kind, shape in _ORDER
)


def records(capacity: int, old: np.ndarray | None = None) -> np.ndarray:
    """Records for ``capacity`` customers, the fields at their initial values, ``old``'s
    records copied in first."""
    out = np.zeros(capacity, dtype=RECORD)
    for name, value in INITIAL.items():
        out[name] = value
    if old is not None:
        out[: len(old)] = old
    return out


class Record:
    """Reads one customer's record from an array of :func:`records` as a tuple of Python
    numbers (the fields in :data:`RECORD`'s order, each slot field's values in a run:
    :data:`POSITION`)."""

    __slots__ = ("_memory", "_unpack")

    def __init__(self, array: np.ndarray) -> None:
        if array.dtype != RECORD or not array.flags.c_contiguous:
            raise ValueError("not a contiguous array of online records")
        self._memory = memoryview(array.view(np.uint8))
        self._unpack = struct.Struct(_FORMAT).unpack_from

    def unpack(self, row: int) -> tuple:
        """Every field of ``row`` in one call."""
        return self._unpack(self._memory, row * RECORD_BYTES)


class Counts:
    """Reads one row of a uint32 matrix (a mix column's counts per value) as a tuple of ints."""

    __slots__ = ("_memory", "_unpack", "_width")

    def __init__(self, array: np.ndarray) -> None:
        if array.dtype != np.uint32 or array.ndim != 2 or not array.flags.c_contiguous:
            raise ValueError("not a contiguous uint32 matrix")
        self._width = array.shape[1] * 4
        self._memory = memoryview(array.reshape(-1).view(np.uint8))
        self._unpack = struct.Struct(f"<{array.shape[1]}I").unpack_from

    def unpack(self, row: int) -> tuple[int, ...]:
        return self._unpack(self._memory, row * self._width)
