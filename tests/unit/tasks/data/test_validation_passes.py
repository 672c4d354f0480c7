"""Validation in passes over shares of the customers (what bounds the de-duplication's memory at
30M rows): the same good events, quarantine and figures as one pass, for every kind of input
column the in-process rules take."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.data.demo_events import DemoDataParams, generate_demo_events
from tasks.data.validation_duckdb import InProcessValidation, validation_passes
from tests.unit.tasks.data.test_validation_duckdb import _variants


def _rows(folder) -> list[tuple]:
    table = pq.read_table(folder)
    return sorted((tuple(map(repr, r.values())) for r in table.to_pylist()), key=repr)


def _validated(path, tmp_path, name: str, passes: int):
    schema = pq.read_schema(path)
    checked = InProcessValidation.of_parquet(
        [path], schema, {c: c for c in schema.names}, passes=passes
    )
    good, bad = tmp_path / f"{name}-{passes}-good", tmp_path / f"{name}-{passes}-bad"
    good.mkdir()
    bad.mkdir()
    try:
        figures = checked.write_outputs(good, bad)
    finally:
        checked.close()
    return figures, good, bad


def _inputs(tmp_path) -> dict[str, pa.Table]:
    demo = tmp_path / "demo"
    generate_demo_events(DemoDataParams(customers=300, days=120, seed=4), demo)
    events = pq.read_table(demo)
    # every row twice more in part: exact duplicates across the whole input
    doubled = pa.concat_tables([events, events.slice(0, events.num_rows // 3)])
    return {**_variants(), "demo_with_duplicates": doubled}


@pytest.mark.parametrize("passes", [3, 7])
def test_passes_over_shares_of_customers_validate_like_one_pass(tmp_path, passes):
    for name, table in _inputs(tmp_path).items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path)
        one, one_good, one_bad = _validated(path, tmp_path, name, 1)
        many, many_good, many_bad = _validated(path, tmp_path, name, passes)
        assert many == one, name
        assert sorted(p.name for p in many_good.iterdir()) == [
            f"part-{i:05d}.parquet" for i in range(passes)
        ]
        assert _rows(many_good) == _rows(one_good), name
        assert _rows(many_bad) == _rows(one_bad), name
        assert pq.read_table(many_good).num_rows == one.rows_valid
        # each file is every good event of its customers (the features stage's passes)
        seen: dict[str, str] = {}
        for part in many_good.iterdir():
            for customer in set(pq.read_table(part, columns=["customer_id"])[0].to_pylist()):
                assert seen.setdefault(customer, part.name) == part.name, (name, customer)
        if name == "demo_with_duplicates":
            assert one.quarantined.get("duplicate_event", 0) >= table.num_rows // 5


def test_the_number_of_passes_follows_the_input_rows():
    assert validation_passes(4_300_000) == 1
    assert validation_passes(30_000_000) == 5
    assert validation_passes(10, rows_per_pass=3) == 4
