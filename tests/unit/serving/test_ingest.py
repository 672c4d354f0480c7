"""Events sent to ``POST /events`` are checked by the validate stage's rules: for every column
type the in-process validation takes, the rows the endpoint accepts are the validate stage's good
events and it refuses as many rows for each quarantine reason; malformed bodies, unknown and
missing columns and wrong types are request errors naming the field."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest

from infra.storage.events_log import SEGMENT_SCHEMA
from serving.online.ingest import (
    IPC_MEDIA_TYPE,
    IngestError,
    check_contract,
    parse_events,
)
from tasks.data.validation_duckdb import GOOD_EVENTS_SCHEMA, InProcessValidation
from tasks.definitions.contract import event_type_name
from tests.unit.tasks.data.test_validation_duckdb import _variants


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _rows(table: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def test_the_segments_schema_is_the_validated_events():
    assert SEGMENT_SCHEMA == GOOD_EVENTS_SCHEMA


@pytest.mark.parametrize("variant", list(_variants()))
def test_the_contract_accepts_and_refuses_what_validate_does(variant):
    table = _variants()[variant]
    checked = check_contract(parse_events(ipc(table), IPC_MEDIA_TYPE))
    validation = InProcessValidation.of_table(table)
    try:
        good, figures = validation.good(), validation.figures()
    finally:
        validation.close()
    accepted = checked.events.filter(pa.array(checked.valid()))
    assert _rows(accepted) == _rows(good)
    assert checked.counts() == figures.quarantined
    problem = checked.problem()
    assert problem is not None and problem.status == 422
    assert problem.extra["refused"] == figures.quarantined
    assert "nothing was applied" in problem.problems[0]["message"]


def test_a_clean_batch_has_no_problem_and_gets_the_defaults():
    body = json.dumps(
        [
            {"customer_id": 17, "event_time": "2025-07-01T10:00:00+02:00", "amount": 3},
            {"customer_id": " c2 ", "event_time": "2025-07-01", "amount": 0.5, "quantity": 2.0},
            {"customer_id": "13085.0", "event_time": "2025-07-01", "amount": 1},  # pandas' id
        ]
    ).encode()
    checked = check_contract(parse_events(body, "application/json; charset=utf-8"))
    assert checked.problem() is None
    rows = checked.events.to_pylist()[:2]
    assert [r["customer_id"] for r in checked.events.to_pylist()] == ["17", "c2", "13085"]
    assert rows[0]["event_time"] == dt.datetime(2025, 7, 1, 8, tzinfo=dt.UTC)
    assert rows[1]["event_time"] == dt.datetime(2025, 7, 1, tzinfo=dt.UTC)
    assert [r["event_type"] for r in rows] == ["purchase", "purchase"]
    assert [r["quantity"] for r in rows] == [1, 2]
    assert checked.events.schema == SEGMENT_SCHEMA


EVENT = {"customer_id": "c1", "event_time": "2025-07-01T10:00:00Z", "amount": 1.0}


@pytest.mark.parametrize(
    ("body", "content_type", "status", "text"),
    [
        (b"[{not json", "application/json", 422, "body: body is not valid JSON"),
        (b"", "application/json", 422, "body: body is not valid JSON"),
        (b'{"events": []}', "application/json", 422, "body: a JSON array of event objects"),
        (b"[]", "application/json", 422, "body: no events"),
        (b"[1]", "application/json", 422, "[0]: an event object"),
        (
            json.dumps([EVENT, {**EVENT, "colour": "red"}]).encode(),
            "application/json",
            422,
            "[1].colour: unknown column",
        ),
        (
            json.dumps([{**EVENT, "amount": "1"}]).encode(),
            None,
            422,
            "[0].amount: must be a number",
        ),
        (
            json.dumps([{**EVENT, "amount": True}]).encode(),
            None,
            422,
            "[0].amount: must be a number",
        ),
        (
            json.dumps([{**EVENT, "customer_id": 1.5}]).encode(),
            None,
            422,
            "[0].customer_id: must be a string or an integer",
        ),
        (
            json.dumps([{**EVENT, "event_time": 1751364000.5}]).encode(),
            None,
            422,
            "[0].event_time: must be an ISO-8601 string, or whole epoch seconds (9-10 digits) "
            "or milliseconds (12-13 digits)",
        ),
        (
            json.dumps([EVENT, {**EVENT, "event_time": 17513640000}]).encode(),
            None,
            422,
            "[1].event_time: must be an ISO-8601 string, or whole epoch",
        ),
        (
            json.dumps([EVENT, {**EVENT, "event_time": -1751364000}]).encode(),
            None,
            422,
            "[1].event_time: must be an ISO-8601 string, or whole epoch",
        ),
        (
            b'[{"customer_id": "c1", "event_time": "2025-07-01", "amount": 1},'
            b' {"customer_id": "c1", "event_time": "2025-07-01", "amount": NaN}]',
            None,
            422,
            "[1].amount: NaN is not a number JSON allows (send null for no value)",
        ),
        (
            b'[{"customer_id": "c1", "event_time": "2025-07-01", "amount": 1, "quantity": '
            b"-Infinity}]",
            None,
            422,
            "[0].quantity: -Infinity is not a number JSON allows",
        ),
        (
            json.dumps([{"customer_id": "c1", "event_time": "2025-07-01"}]).encode(),
            None,
            422,
            "amount: required column(s) amount missing",
        ),
        (b"[" * 100_000 + b"]" * 100_000, None, 422, "body: body is not valid JSON (arrays or"),
        (json.dumps([EVENT]).encode(), "text/csv", 415, "content-type: 'text/csv'"),
        (json.dumps([EVENT]).encode(), "multipart/form-data; boundary=x", 415, "'multipart"),
        (b"\x00\x01not arrow", IPC_MEDIA_TYPE, 422, "body: body is not an Arrow IPC stream"),
    ],
)
def test_malformed_bodies_are_request_errors_naming_the_field(body, content_type, status, text):
    with pytest.raises(IngestError) as caught:
        parse_events(body, content_type or "application/json")
    assert caught.value.status == status
    assert text in str(caught.value)


def _ipc_table(**columns: pa.Array) -> bytes:
    base = {
        "customer_id": pa.array(["c1"]),
        "event_time": pa.array([dt.datetime(2025, 7, 1)], pa.timestamp("us")),
        "amount": pa.array([1.0]),
    }
    return ipc(pa.table(base | columns))


@pytest.mark.parametrize(
    ("columns", "text"),
    [
        ({"colour": pa.array(["red"])}, "colour: unknown column"),
        ({"amount": pa.array(["1.0"])}, "amount: type string is not one the contract reads"),
        (
            {"event_time": pa.array([1], pa.time32("s"))},
            "event_time: type time32[s]: send timestamps (naive = UTC), dates, or ISO-8601",
        ),
        ({"customer_id": pa.array([1.5])}, "customer_id: float ids must be whole numbers, not 1.5"),
    ],
)
def test_arrow_columns_of_the_wrong_type_are_named(columns, text):
    with pytest.raises(IngestError) as caught:
        parse_events(_ipc_table(**columns), IPC_MEDIA_TYPE)
    assert caught.value.status == 422 and text in str(caught.value)


def test_missing_arrow_columns_are_named():
    table = pa.table({"customer_id": ["c1"], "amount": [1.0]})
    with pytest.raises(IngestError, match="event_time: required column"):
        parse_events(ipc(table), IPC_MEDIA_TYPE)


def test_a_bad_row_names_its_row_reason_and_value():
    rows = [EVENT, {**EVENT, "amount": -2.5}, {**EVENT, "event_time": "yesterday"}, EVENT]
    infinite = b'{"customer_id": "c9", "event_time": "2025-07-01", "amount": 1e999}'
    body = json.dumps(rows).encode()[:-1] + b", " + infinite + b"]"
    checked = check_contract(parse_events(body, "application/json"))
    assert [checked.reason(i) for i in range(checked.rows)] == [
        None,
        "invalid_amount",
        "invalid_event_time",
        "duplicate_event",
        "invalid_amount",  # 1e999 reads as infinity
    ]
    problem = checked.problem()
    fields = [p["field"] for p in problem.problems]
    assert fields == ["body", "[1].amount", "[2].event_time", "[3]", "[4].amount"]
    assert "4 of 5 events refused" in problem.problems[0]["message"]
    assert problem.problems[1]["message"] == "invalid_amount (-2.5)"


def test_only_the_first_rows_are_listed_but_all_are_counted():
    body = json.dumps([{**EVENT, "amount": -float(i + 1)} for i in range(100)]).encode()
    problem = check_contract(parse_events(body, "application/json")).problem()
    assert problem.extra["refused"] == {"invalid_amount": 100}
    assert len(problem.problems) == 1 + 20
    assert np.all([p["message"].startswith("invalid_amount") for p in problem.problems[1:]])


@pytest.mark.parametrize("seed", range(6))
def test_extra_copies_are_the_rows_repeating_an_earlier_valid_row_exactly(seed):
    """Many ties in time (a live stream's microseconds), rows equal but for one column, nulls,
    an invalid row among copies, times out of order: the refused copies are exactly the valid
    rows equal in every column (nulls equal) to an earlier valid row."""
    rng = np.random.default_rng(seed)
    n = 400
    base = dt.datetime(2025, 7, 1, tzinfo=dt.UTC)
    t = rng.integers(0, 40, n)
    if seed % 2:
        t = np.sort(t)
    rows = [
        {
            "customer_id": f"c{rng.integers(3)}",
            "event_time": (base + dt.timedelta(microseconds=int(t[i]))).isoformat(),
            "amount": [0.0, -0.0, 1.5, -1.0][rng.integers(4)],
            "event_type": ["purchase", "view", None][rng.integers(3)],
            "quantity": [1, 2, None][rng.integers(3)],
            "category": ["a", None, ""][rng.integers(3)],
            "channel": ["web", None][rng.integers(2)],
        }
        for i in range(n)
    ]
    checked = check_contract(parse_events(json.dumps(rows).encode(), "application/json"))
    events = checked.events.to_pylist()
    seen, expected = set(), []
    for i, row in enumerate(events):
        if checked.reason(i) not in (None, "duplicate_event"):
            continue  # refused for another reason: not a row copies repeat
        key = tuple(row.values())
        expected.append(key in seen)
        seen.add(key)
    got = [
        checked.reason(i) == "duplicate_event"
        for i in range(n)
        if checked.reason(i) in (None, "duplicate_event")
    ]
    assert got == expected
    assert 0 < sum(expected) < len(expected)


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "Application/JSON; charset=UTF-8",
        "application/x-www-form-urlencoded",  # curl -d
        "text/plain;charset=UTF-8",  # fetch() with a string body
        "application/vnd.api+json",
        "",
    ],
)
def test_json_is_read_under_the_labels_clients_give_it(content_type):
    events = parse_events(json.dumps([EVENT]).encode(), content_type)
    assert events.column("customer_id").to_pylist() == ["c1"]


def test_a_utf8_byte_order_mark_is_skipped():
    body = b"\xef\xbb\xbf" + json.dumps([EVENT]).encode()
    assert parse_events(body, "application/json").column("customer_id").to_pylist() == ["c1"]


def test_epoch_numbers_are_the_times_validate_reads_from_epoch_texts():
    """pandas' ``to_json(orient="records")`` writes epoch milliseconds; the validate stage reads
    9-10 digit texts as seconds and 12-13 digit texts as milliseconds."""
    iso = "2025-07-01T10:00:00.250Z"
    at = dt.datetime(2025, 7, 1, 10, 0, 0, 250_000, tzinfo=dt.UTC)
    seconds = int(at.replace(microsecond=0).timestamp())
    rows = [
        {**EVENT, "event_time": iso},
        {**EVENT, "event_time": seconds * 1000 + 250, "amount": 2.0},
        {**EVENT, "event_time": seconds, "amount": 3.0},
    ]
    events = check_contract(parse_events(json.dumps(rows).encode(), "application/json")).events
    assert events.column("event_time").to_pylist() == [at, at, at.replace(microsecond=0)]


def test_epoch_texts_are_read_by_the_same_digit_rule_as_epoch_numbers():
    """JSON strings of epoch digits (what a client that quotes every value sends) and Arrow
    text columns are read as the numbers are: 9-10 digits seconds, 12-13 milliseconds (before:
    ``invalid_event_time``); other digit counts stay invalid, ISO texts read as before."""
    at = dt.datetime(2025, 7, 1, 10, 0, 0, 250_000, tzinfo=dt.UTC)
    seconds = int(at.replace(microsecond=0).timestamp())
    times = [f"{seconds * 1000 + 250}", f" {seconds} ", "2025-07-01T10:00:00.250Z", "17513640001"]
    rows = [{**EVENT, "event_time": t, "amount": float(i + 1)} for i, t in enumerate(times)]
    checked = check_contract(parse_events(json.dumps(rows).encode(), "application/json"))
    assert [checked.reason(i) for i in range(checked.rows)] == [
        None,
        None,
        None,
        "invalid_event_time",
    ]
    assert checked.events.column("event_time").to_pylist()[:3] == [
        at,
        at.replace(microsecond=0),
        at,
    ]
    table = pa.table({"customer_id": ["c1", "c1"], "event_time": times[:2], "amount": [1.0, 2.0]})
    events = check_contract(parse_events(ipc(table), IPC_MEDIA_TYPE)).events
    assert events.column("event_time").to_pylist() == [at, at.replace(microsecond=0)]


def _ipc_file(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_the_arrow_file_format_and_pandas_types_read_as_the_stream_does():
    """An IPC file (``ARROW1``) under either Arrow media type; nanosecond times (what
    ``pa.Table.from_pandas`` gives) floored to the microsecond, as Spark reads them; large
    strings, dictionaries and zoned times as their values."""
    at = dt.datetime(2025, 7, 1, 10, 0, 0, 123_456, tzinfo=dt.UTC)
    nanos = int(at.timestamp()) * 10**9 + 123_456_789
    pandas_like = pa.table(
        {
            "customer_id": pa.array(["c1", "c2"], pa.large_string()),
            "event_time": pa.array([nanos, nanos], pa.timestamp("ns", tz="Europe/Paris")),
            "amount": [1.0, 2.0],
            "event_type": pa.array(["view", "purchase"]).dictionary_encode(),
        }
    )
    expected = check_contract(parse_events(ipc(pandas_like), IPC_MEDIA_TYPE)).events
    assert expected.column("event_time").to_pylist() == [at, at]
    for media in (IPC_MEDIA_TYPE, "application/vnd.apache.arrow.file"):
        as_file = check_contract(parse_events(_ipc_file(pandas_like), media)).events
        assert as_file.equals(expected)
    naive = pandas_like.set_column(1, "event_time", pa.array([nanos, nanos], pa.timestamp("ns")))
    as_naive = check_contract(parse_events(ipc(naive), IPC_MEDIA_TYPE)).events
    assert as_naive.column("event_time").to_pylist() == [at, at]


def test_a_broken_arrow_file_is_named_as_a_file():
    body = _ipc_file(pa.table({"customer_id": ["c1"]}))[:-20]
    with pytest.raises(IngestError, match="body: body is not an Arrow IPC file"):
        parse_events(body, IPC_MEDIA_TYPE)


def test_float_ids_in_arrow_read_as_validation_reads_them():
    """pandas gives an integer id column with a gap float64: whole numbers are their integer
    text, NaN a missing id (quarantined as validation quarantines it); a fraction is refused."""
    ids = pa.array([13085.0, float("nan"), -7.0])
    table = pa.table(
        {
            "customer_id": ids,
            "event_time": pa.array([dt.datetime(2025, 7, 1)] * 3, pa.timestamp("us")),
            "amount": [1.0, 2.0, 3.0],
        }
    )
    checked = check_contract(parse_events(ipc(table), IPC_MEDIA_TYPE))
    assert checked.events.column("customer_id").to_pylist() == ["13085", None, "-7"]
    assert [checked.reason(row) for row in range(3)] == [None, "missing_customer_id", None]
    fraction = table.set_column(0, "customer_id", pa.array([1.0, 2.5, 3.0]))
    with pytest.raises(IngestError, match="customer_id: float ids must be whole numbers, not 2.5"):
        parse_events(ipc(fraction), IPC_MEDIA_TYPE)


def test_the_logs_own_purchase_event_is_read_as_the_validate_stage_reads_it():
    """``HYBRIDFLOW_PURCHASE_EVENT=checkout``: ``POST /events`` names ``Checkout`` purchase, as
    ``hybridflow run --purchase-event checkout`` did for the batch (before: kept as
    ``Checkout``, so the online state counted no purchase)."""
    types = ["Checkout", " checkout ", "transaction", "view", "cart", "purchase_complete"]
    rows = [{**EVENT, "event_type": t, "amount": float(i + 1)} for i, t in enumerate(types)]
    body = json.dumps(rows).encode()
    for word in (None, "CHECKOUT", "cart"):
        got = check_contract(parse_events(body, "application/json"), word).events
        expected = [event_type_name(t.strip(), word) for t in types]
        assert got.column("event_type").to_pylist() == expected, word
    assert expected[:5] == ["Checkout", "checkout", "purchase", "view", "purchase"]
