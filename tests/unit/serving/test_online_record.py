"""One customer's record (:mod:`serving.online.record`): read in one call as what numpy holds,
every field aligned, the size the memory figures say."""

from __future__ import annotations

import numpy as np

from serving.online.days import SLOTS
from serving.online.events import NO_TIME
from serving.online.record import (
    FIRST_NONE,
    LIFETIME,
    LIFETIME_BYTES,
    POSITION,
    RECORD,
    RECORD_BYTES,
    Counts,
    Record,
    records,
)


def test_every_field_is_aligned_and_the_record_is_the_documented_544_bytes():
    for name, (dtype, offset) in RECORD.fields.items():
        assert offset % dtype.base.itemsize == 0, name
    assert RECORD_BYTES == 544 and RECORD_BYTES % 8 == 0  # docs/serving.md's memory table
    assert LIFETIME_BYTES == 92


def test_a_row_unpacks_to_the_values_numpy_holds_in_it():
    rng = np.random.default_rng(3)
    array = records(5)
    for name in RECORD.names:
        field = array[name]
        if field.dtype.kind == "f":
            field[...] = rng.normal(size=field.shape) * 1e6
        else:
            info = np.iinfo(field.dtype)
            field[...] = rng.integers(info.min, info.max, size=field.shape, endpoint=True)
    reader = Record(array)
    for row in range(5):
        values = reader.unpack(row)
        assert len(values) == len(LIFETIME) + 4 * SLOTS + 1
        for name in RECORD.names:
            at = POSITION[name]
            expected = array[name][row]
            if expected.ndim:
                assert list(values[at : at + SLOTS]) == expected.tolist(), name
            else:
                assert values[at] == expected.item(), name
                assert type(values[at]) is type(expected.item()), name


def test_new_records_start_as_customers_without_events_and_keep_the_old_ones():
    old = records(2)
    old["n"][1] = 7
    old["slot_day"][1, 3] = 11
    grown = records(4, old)
    reader = Record(grown)
    assert reader.unpack(1)[POSITION["n"]] == 7
    assert reader.unpack(1)[POSITION["slot_day"] + 3] == 11
    fresh = reader.unpack(3)
    assert fresh[POSITION["first_t"]] == FIRST_NONE
    assert fresh[POSITION["last_t"]] == fresh[POSITION["last_p_t"]] == NO_TIME
    assert fresh[POSITION["q_max"]] == -np.inf
    assert fresh[POSITION["ring"]] == -1
    assert fresh[POSITION["n"]] == 0


def test_a_mix_columns_row_unpacks_to_its_counts():
    counts = np.arange(12, dtype=np.uint32).reshape(3, 4)
    assert Counts(counts).unpack(2) == (8, 9, 10, 11)
    assert Counts(np.zeros((3, 0), dtype=np.uint32)).unpack(1) == ()
