"""The events input contract, called directly with a real Spark session and folder store:
every input error names its file/column/value, every quarantine reason keeps the original
values while good rows flow through, formats are detected, and unchanged inputs are cached."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.compute.spark_io import read_dataset
from infra.errors import HybridflowInputError
from tasks.data.input_formats import InputOptions
from tasks.stages.validate import validate_stage

pytestmark = pytest.mark.integration

GOOD_CSV = """customer_id,event_time,amount,quantity
c1,2025-01-01 10:00:00,10.0,1
c1,2025-01-05 10:00:00,20.0,2
c2,2025-01-02 09:30:00,5.5,1
c3,2025-01-03 12:00:00,7.0,3
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _validate(
    spark,
    store,
    path,
    *,
    max_bad=1.0,
    options=None,
    use_cache=False,
    run_id="r1",
    in_process_rows=None,
):
    return validate_stage(
        spark,
        store,
        run_id,
        str(path),
        max_bad,
        options=options,
        use_cache=use_cache,
        in_process_rows=in_process_rows,
    )


def _rows(spark, store, prefix) -> list[dict]:
    df = read_dataset(spark, store, prefix)
    return sorted((r.asDict() for r in df.collect()), key=lambda r: str(sorted(r.items())))


def _error(spark, store, path, **kw) -> str:
    with pytest.raises(HybridflowInputError) as info:
        _validate(spark, store, path, **kw)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_input_errors_name_the_file_column_or_value(spark, local_store, tmp_path):
    missing = tmp_path / "nope.csv"
    assert str(missing) in _error(spark, local_store, missing)

    only_marker = tmp_path / "marker"
    _write(only_marker / "_SUCCESS", "")
    assert "holds no data files" in _error(spark, local_store, only_marker)

    header_only = _write(tmp_path / "header.csv", "customer_id,event_time,amount\n")
    assert "empty" in _error(spark, local_store, header_only)

    empty_pq = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"customer_id": pa.array([], pa.string())}), empty_pq)
    assert "empty" in _error(spark, local_store, empty_pq)

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    pq.write_table(
        pa.table({"customer_id": ["a"], "event_time": ["2025-01-01"], "amount": [1.0]}),
        corrupt / "good.parquet",
    )
    (corrupt / "bad.parquet").write_bytes(b"PAR1 this is not parquet at all")
    message = _error(spark, local_store, corrupt)
    assert "bad.parquet" in message and "cannot read Parquet file" in message

    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\x00\x01\x02garbage\n")
    assert "binary.csv" in _error(spark, local_store, binary)

    mixed = tmp_path / "mixed"
    _write(mixed / "a.csv", GOOD_CSV)
    _write(mixed / "b.json", "{}")
    assert "cannot tell the format" in _error(spark, local_store, mixed)

    no_amount = _write(tmp_path / "no_amount.csv", "customer_id,event_time\nc1,2025-01-01\n")
    message = _error(spark, local_store, no_amount)
    assert "missing required column(s) amount" in message and "--map" in message

    array_amount = tmp_path / "array_amount.parquet"
    pq.write_table(
        pa.table({"customer_id": ["a"], "event_time": ["2025-01-01"], "amount": [[1.0, 2.0]]}),
        array_amount,
    )
    message = _error(spark, local_store, array_amount)
    assert "'amount'" in message and "array<double>" in message and "cannot be cast" in message

    integer_dates = tmp_path / "integer_dates.parquet"  # CDNOW's dates as a database types them
    pq.write_table(
        pa.table({"customer_id": ["a"], "event_time": [19970101], "amount": [1.0]}), integer_dates
    )
    message = _error(spark, local_store, integer_dates)
    assert "'event_time'" in message and "bigint" in message and "19970101" in message

    headers = tmp_path / "headers"
    _write(headers / "a.csv", GOOD_CSV)
    _write(headers / "b.csv", "amount,customer_id,event_time\n1.0,c9,2025-01-01\n")
    message = _error(spark, local_store, headers)
    assert "b.csv" in message and "same columns in the same order" in message

    bad_times = _write(tmp_path / "times.csv", "customer_id,event_time,amount\nc1,yesterday,1\n")
    message = _error(spark, local_store, bad_times)
    assert "'yesterday'" in message and "--timestamp-format" in message

    good = _write(tmp_path / "good.csv", GOOD_CSV)
    message = _error(spark, local_store, good, options=InputOptions(column_map={"price": "x"}))
    assert "'price' is not an events column" in message
    message = _error(spark, local_store, good, options=InputOptions(column_map={"amount": "Total"}))
    assert "no column 'Total'" in message

    dupes = _write(
        tmp_path / "dupes.csv", "customer_id,Amount,event_time,AMOUNT\nc1,1,2025-01-01,2\n"
    )
    assert "'amount' appears more than once" in _error(spark, local_store, dupes)


BAD_ROWS_CSV = """customer_id,event_time,amount,quantity,channel
c1,2025-01-01 10:00:00,10.0,1,web
c1,2025-01-05 10:00:00,20.0,2,web
c2,2025-01-02 09:30:00,5.5,1,app
c3,2025-01-03 12:00:00,7.0,3,
c4,2025-01-04 12:00:00,1.0,1,web
c4,2025-01-04 12:00:00,1.0,1,web
c4,2025-01-04 12:00:00,1.0,1,web
,2025-01-04 12:00:00,1.0,1,web
   ,2025-01-04 12:00:00,1.0,1,web
c5,not a time,1.0,1,web
c5,2025-01-04 12:00:00,abc,1,web
c5,2025-01-04 12:00:00,NaN,1,web
c5,2025-01-04 12:00:00,Infinity,1,web
c5,2025-01-04 12:00:00,-3,1,web
c5,2025-01-04 12:00:00,,1,web
c5,2025-01-04 12:00:00,2.0,0,web
c5,2025-01-04 12:00:00,2.0,2.5,web
c5,2025-01-04 12:00:00,2.0,many,web
"""


def test_every_quarantine_reason_keeps_original_values_and_good_rows_flow(
    spark, local_store, tmp_path
):
    path = _write(tmp_path / "events.csv", BAD_ROWS_CSV)
    result = _validate(spark, local_store, path)
    assert result.rows_read == 18
    assert result.quarantine_reasons == {
        "duplicate_event": 2,
        "missing_customer_id": 2,
        "invalid_event_time": 1,
        "invalid_amount": 5,
        "invalid_quantity": 3,
    }
    assert result.rows_quarantined == 13 and result.rows_valid == 5
    assert result.available_columns == [
        "amount",
        "channel",
        "customer_id",
        "event_time",
        "quantity",
    ]

    quarantine = _rows(spark, local_store, result.quarantine_prefix)
    by_amount = {r["amount"]: r["reason"] for r in quarantine if r["customer_id"] == "c5"}
    assert by_amount["abc"] == by_amount["NaN"] == by_amount["Infinity"] == "invalid_amount"
    assert by_amount["-3"] == "invalid_amount"
    assert {r["quantity"] for r in quarantine if r["reason"] == "invalid_quantity"} == {
        "0",
        "2.5",
        "many",
    }
    assert [r["event_time"] for r in quarantine if r["reason"] == "invalid_event_time"] == [
        "not a time"
    ]
    assert set(quarantine[0]) == {
        "customer_id",
        "event_time",
        "amount",
        "quantity",
        "channel",
        "reason",
    }

    good = _rows(spark, local_store, result.events_prefix)
    assert sorted((r["customer_id"], r["amount"]) for r in good) == [
        ("c1", 10.0),
        ("c1", 20.0),
        ("c2", 5.5),
        ("c3", 7.0),
        ("c4", 1.0),
    ]
    assert {r["event_type"] for r in good} == {"purchase"}
    assert {r["channel"] for r in good if r["customer_id"] == "c3"} == {None}

    with pytest.raises(HybridflowInputError) as info:
        _validate(spark, local_store, path, max_bad=0.05, run_id="r2")
    assert "13 of 18 event rows" in str(info.value) and "--max-bad-fraction 5.0%" in str(info.value)
    assert "runs/r2/quarantine" in str(info.value)
    assert len(_rows(spark, local_store, "runs/r2/quarantine")) == 13


def test_csv_dialects_and_parquet_partitions_read_the_same_events(spark, local_store, tmp_path):
    semicolon = _write(
        tmp_path / "shop" / "part1.csv",
        "Client;Date;TOTAL;Qty\nc1;01/02/2025 10:00;10,5;1\nc1;13/02/2025 09:00;20;2\n"
        "c2;28/02/2025 23:59;5;1\n",
    )
    result = _validate(
        spark,
        local_store,
        semicolon.parent,
        options=InputOptions(
            column_map={"customer_id": "client", "event_time": "date", "amount": "total"}
        ),
    )
    # a ';' CSV whose amounts have no decimal point: "10,5" is read with a decimal comma
    assert result.quarantine_reasons == {}
    assert result.rows_valid == 3
    assert sorted(r["amount"] for r in _rows(spark, local_store, result.events_prefix)) == [
        5.0,
        10.5,
        20.0,
    ]
    assert result.first_event == dt.datetime(2025, 2, 1, 10, 0, tzinfo=dt.UTC)
    assert result.last_event == dt.datetime(2025, 2, 28, 23, 59, tzinfo=dt.UTC)

    epoch = _write(
        tmp_path / "epoch.tsv.csv",
        "CUSTOMER_ID\tEvent_Time\tAmount\n7\t1735725600\t3\n8\t1735812000\t4\n",
    )
    result = _validate(spark, local_store, epoch, run_id="r2")
    assert result.rows_valid == 2 and result.first_event == dt.datetime(
        2025, 1, 1, 10, tzinfo=dt.UTC
    )
    assert {r["customer_id"] for r in _rows(spark, local_store, result.events_prefix)} == {"7", "8"}

    iso = _write(tmp_path / "iso.csv", "customer_id,event_time,amount\nc1,2025-03-01T10:00:00Z,1\n")
    result = _validate(spark, local_store, iso, run_id="r3")
    assert result.first_event == dt.datetime(2025, 3, 1, 10, tzinfo=dt.UTC)

    hive = tmp_path / "hive"
    for day, ids in (("2025-01-01", [1, 2]), ("2025-01-02", [3])):
        part = hive / f"event_date={day}"
        part.mkdir(parents=True)
        pq.write_table(
            pa.table(
                {
                    "Customer_Id": pa.array(ids, pa.int64()),
                    "EVENT_TIME": pa.array(
                        [dt.datetime.fromisoformat(f"{day} 12:00:00")] * len(ids),
                        pa.timestamp("us"),
                    ),
                    "amount": pa.array([1.5] * len(ids)),
                }
            ),
            part / "part-0.parquet",
        )
    (hive / "_SUCCESS").write_text("")
    result = _validate(spark, local_store, hive, run_id="r4")
    assert result.rows_valid == 3
    assert result.available_columns == ["amount", "customer_id", "event_time"]
    assert {r["customer_id"] for r in _rows(spark, local_store, result.events_prefix)} == {
        "1",
        "2",
        "3",
    }


def test_unchanged_inputs_are_cached_and_changes_recompute(spark, local_store, tmp_path):
    path = _write(tmp_path / "events" / "a.csv", GOOD_CSV)
    first = _validate(spark, local_store, path.parent, use_cache=True, run_id="first")
    assert not first.report.cached

    second = _validate(spark, local_store, path.parent, use_cache=True, run_id="second")
    assert second.report.cached
    assert second.events_prefix == first.events_prefix == "runs/first/events"
    assert second.quarantine_uri == first.quarantine_uri

    forced = _validate(spark, local_store, path.parent, use_cache=False, run_id="forced")
    assert not forced.report.cached and forced.events_prefix == "runs/forced/events"

    other = _validate(
        spark,
        local_store,
        path.parent,
        use_cache=True,
        run_id="other-options",
        options=InputOptions(csv_delimiter=","),
    )
    assert not other.report.cached

    _write(path.parent / "b.csv", GOOD_CSV.replace("c1,", "c9,"))
    grown = _validate(spark, local_store, path.parent, use_cache=True, run_id="grown")
    assert not grown.report.cached and grown.rows_read == 8

    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    touched = _validate(spark, local_store, path.parent, use_cache=True, run_id="touched")
    assert not touched.report.cached


RFC_4180_CSV = (
    "\ufeff"
    '"customer_id","event_time","amount","category"\r\n'
    '"C00001921""q",2025-01-01 10:00:00,"1.5","a, b"\r\n'
    '"two\nlines",2025-01-02 10:00:00,2,"say ""hi"""\r\n'
    "plain,2025-01-03 10:00:00,3,\r\n"
)


def test_spark_reads_csv_quoting_as_rfc_4180(spark, local_store, tmp_path):
    path = _write(tmp_path / "quoted.csv", RFC_4180_CSV)
    result = _validate(spark, local_store, path, in_process_rows=0)
    assert result.report.spark_jobs
    assert result.rows_read == 3 and result.rows_valid == 3
    good = _rows(spark, local_store, result.events_prefix)
    assert sorted((r["customer_id"], r["amount"], r["category"]) for r in good) == [
        ('C00001921"q', 1.5, "a, b"),
        ("plain", 3.0, None),
        ("two\nlines", 2.0, 'say "hi"'),
    ]

    header = _write(tmp_path / "header.csv", '"cust""id",event_time,amount\nc1,2025-01-01,1\n')
    mapped = _validate(
        spark,
        local_store,
        header,
        options=InputOptions(column_map={"customer_id": 'cust"id'}),
        run_id="r2",
        in_process_rows=0,
    )
    assert mapped.rows_valid == 1

    backslash = _write(
        tmp_path / "backslash.csv", 'customer_id,event_time,amount\n"c\\"1",2025-01-01,1\n'
    )
    escaped = _validate(
        spark,
        local_store,
        backslash,
        options=InputOptions(csv_escape="\\"),
        run_id="r3",
        in_process_rows=0,
    )
    assert [r["customer_id"] for r in _rows(spark, local_store, escaped.events_prefix)] == ['c"1']


ODD_CSV = (
    "customer_id,event_time,amount,quantity,channel\n"
    "c1,2025-01-02T10:00:00+02:00, 1.5 ,1,web\n"
    "c1,2025-01-02 10:00:00.1234567,1e3,2.0,\n"
    'c2,2025-01-02T10:00:00Z,"1,5",1,""\n'
    "c2,2025-01-02 10:00:00 UTC,1d,1,app\n"
    "c3,2025,+.5e+2,3,app\n"
    "c3,10000-01-01 00:00:00,1,1,app\n"
    "c3,2025-02-30,1,1,app\n"
    "c4,2025-01-02 24:00:00,1,1,app\n"
    "c4,2025-01-03,1_000,1,app\n"
    "c4,2025-01-04,inf,1,app\n"
    "c5,2025-01-05\n"
    "c5,2025-01-06,2,1,app,extra\n"
    "c6,2025-01-07,3,9999999999,app\n"
    "c6,2025-01-08,3,-0,app\n"
)


def _engine_outputs(spark, store, path, run_id, in_process_rows, options=None):
    result = validate_stage(
        spark,
        store,
        run_id,
        str(path),
        1.0,
        options=options,
        use_cache=False,
        in_process_rows=in_process_rows,
    )
    good = _rows(spark, store, result.events_prefix)
    quarantine = _rows(spark, store, result.quarantine_prefix)
    return result, good, quarantine


@pytest.mark.parametrize(
    ("name", "text", "options"),
    [
        ("bad_rows", BAD_ROWS_CSV, None),
        ("rfc_4180", RFC_4180_CSV, None),
        ("odd_values", ODD_CSV, None),
        (
            "day_first_semicolons",
            "Client;Date;TOTAL;Qty\nc1;01/02/2025 10:00;10,5;1\nc1;13/02/2025 09:00;20;2\n"
            "c2;28/02/2025 23:59;5;1\nc3;31/02/2025 10:00;5;1\nc3;1/2/2025 9:5;5;1\n",
            InputOptions(
                column_map={"customer_id": "client", "event_time": "date", "amount": "total"}
            ),
        ),
        (
            "epoch_tabs",
            "CUSTOMER_ID\tEvent_Time\tAmount\n7\t1735725600\t3\n8\t1735812000.5\t4\n9\t-1\t1\n",
            None,
        ),
        (
            "given_pattern",
            "customer_id,event_time,amount\nc1,02.01.2025 10:00:00,1\nc2,2.1.2025 10:00:00,1\n",
            InputOptions(timestamp_format="dd.MM.yyyy HH:mm:ss"),
        ),
        (
            "cdnow_compact_dates_and_float_ids",  # yyyyMMdd; ids as pandas writes them
            "customer_id,date,quantity,amount\n00001,19970101,1,11.77\n13085.0,19970102,2,5\n"
            " 13085 ,19970102,2,5\n,19970103,1,1\n12346.0,19971301,1,1\n12346.00,1997011,1,1\n"
            "007.0,19980630,1,1\n1.5,19980630,1,1\n12346.0,19980630,1,1\n",
            InputOptions(column_map={"event_time": "date"}),
        ),
        (
            "compact_minutes",  # yyyyMMddHHmm (12 digits), detected, not epoch milliseconds
            "customer_id,event_time,amount\nc1,202501021030,1\nc1,202512312359,2\n"
            "c2,202502301000,1\nc2,202501021060,1\nc3,20250102103,1\nc3, 202501030000 ,1\n",
            None,
        ),
        (
            "thousands_commas",  # "1,234.50" as spreadsheets export it: 1234.5 on both engines
            'customer_id,event_time,amount\nc1,2025-01-01,"1,234.50"\nc1,2025-01-02," 12,345 "\n'
            'c2,2025-01-03,"-1,000.5"\nc2,2025-01-04,"1,23"\nc3,2025-01-05,"1,2345"\n'
            "c3,2025-01-06,999.5\n",
            None,
        ),
        (
            "own_purchase_event",  # --purchase-event checkout: any case, synonyms still read
            "customer_id,event_time,amount,event_type\nc1,2025-01-01,1,Checkout\n"
            "c1,2025-01-02,1, checkout \nc2,2025-01-03,1,transaction\nc2,2025-01-04,1,view\n"
            "c3,2025-01-05,1,purchase_complete\nc3,2025-01-06,1,\n",
            InputOptions(purchase_event="CHECKOUT"),
        ),
        (
            "decimal_comma",  # a European export: ; and 12,50 and 1.234,50
            "Kunde;Datum;Betrag\nK1;31.12.2025 14:30;12,50\nK1;01.12.2025 09:00;1.234,50\n"
            "K2;02.12.2025 10:00;7\nK2;03.12.2025 10:00;-1,5\nK3;04.12.2025 10:00;abc\n"
            "K3;05.12.2025 10:00; 3,25 \nK4;06.12.2025 10:00;1.234\n",
            InputOptions(
                column_map={"customer_id": "kunde", "event_time": "datum", "amount": "betrag"}
            ),
        ),
        (
            "backslash_escape",
            'customer_id,event_time,amount\n"c\\"1",2025-01-01,1\n"c,2",2025-01-01,2\n',
            InputOptions(csv_escape="\\"),
        ),
    ],
)
def test_duckdb_and_spark_read_and_validate_csv_alike(
    spark, local_store, tmp_path, name, text, options
):
    path = _write(tmp_path / f"{name}.csv", text)
    spark_result, spark_good, spark_quarantine = _engine_outputs(
        spark, local_store, path, f"{name}-spark", 0, options
    )
    result, good, quarantine = _engine_outputs(
        spark, local_store, path, f"{name}-duckdb", None, options
    )
    assert spark_result.report.spark_jobs and result.report.spark_jobs == 0
    assert good == spark_good
    assert quarantine == spark_quarantine
    assert result.quarantine_reasons == spark_result.quarantine_reasons
    assert (result.first_event, result.last_event) == (
        spark_result.first_event,
        spark_result.last_event,
    )
    assert result.available_columns == spark_result.available_columns


def test_public_log_shapes_are_read_as_their_values_mean_on_both_engines(
    spark, local_store, tmp_path
):
    # CDNOW's yyyyMMdd integers are dates (not epoch seconds of 1970), UCI's "13085.0" ids are
    # 13085, a European export's 1.234,50 is 1234.5: on both engines
    cdnow = _write(
        tmp_path / "cdnow.csv",
        "customer_id,date,quantity,amount\n00001,19970101,1,11.77\n13085.0,19980630,2,5\n",
    )
    euro = _write(tmp_path / "euro.csv", "Kunde;Datum;Betrag\nK1;31.12.2025 14:30;1.234,50\n")
    minutes = _write(tmp_path / "minutes.csv", "user,ts,amount\nu1,202501021030,1\n")
    grouped = _write(
        tmp_path / "grouped.csv", 'customer_id,event_time,amount\nc1,2025-01-02,"1,234.50"\n'
    )
    shop = _write(
        tmp_path / "shop.csv",
        "customer_id,event_time,amount,event_type\nc1,2025-01-02,1,Checkout\nc1,2025-01-03,1,view\n",
    )
    for engine, limit in (("spark", 0), ("duckdb", None)):
        result, good, _ = _engine_outputs(
            spark, local_store, minutes, f"minutes-{engine}", limit,
            InputOptions(column_map={"customer_id": "user", "event_time": "ts"}),
        )  # fmt: skip
        assert [r["event_time"] for r in good] == [dt.datetime(2025, 1, 2, 10, 30)], engine
        result, good, _ = _engine_outputs(
            spark, local_store, shop, f"shop-{engine}", limit,
            InputOptions(purchase_event="checkout"),
        )  # fmt: skip
        assert [r["event_type"] for r in good] == ["purchase", "view"], engine
        result, good, _ = _engine_outputs(spark, local_store, grouped, f"grouped-{engine}", limit)
        assert [r["amount"] for r in good] == [1234.5], engine
        result, good, _ = _engine_outputs(
            spark, local_store, cdnow, f"cdnow-{engine}", limit,
            InputOptions(column_map={"event_time": "date"}),
        )  # fmt: skip
        assert [(r["customer_id"], r["event_time"].date()) for r in good] == [
            ("00001", dt.date(1997, 1, 1)),
            ("13085", dt.date(1998, 6, 30)),
        ], engine
        result, good, _ = _engine_outputs(
            spark, local_store, euro, f"euro-{engine}", limit,
            InputOptions(column_map={"customer_id": "kunde", "event_time": "datum",
                                     "amount": "betrag"}),
        )  # fmt: skip
        assert [(r["amount"], r["event_time"]) for r in good] == [
            (1234.5, dt.datetime(2025, 12, 31, 14, 30))
        ], engine


def test_pandas_nanosecond_parquet_is_read_in_process_and_refused_by_name_for_spark(
    spark, local_store, tmp_path
):
    # pandas' df.to_parquet writes datetime64[ns]: Spark refuses the whole file
    path = tmp_path / "pandas.parquet"
    times = pa.array([dt.datetime(2025, 1, 1, 10), dt.datetime(2025, 1, 2)], pa.timestamp("ns"))
    pq.write_table(
        pa.table({"customer_id": ["a", "b"], "event_time": times, "amount": [1.0, 2.0]}), path
    )
    result, good, _ = _engine_outputs(spark, local_store, path, "nanos-duckdb", None)
    assert result.rows_valid == 2 and result.report.spark_jobs == 0
    assert good[0]["event_time"] == dt.datetime(2025, 1, 1, 10)
    message = _error(spark, local_store, path, in_process_rows=0)
    assert "'event_time'" in message and "nanosecond" in message
    assert "coerce_timestamps='us'" in message


def test_a_log_whose_first_rows_fit_day_and_month_first_is_read_as_the_whole_column_says(
    spark, local_store, tmp_path
):
    # an export sorted by time (the UCI Online Retail log): its first 200+ rows fall on days
    # 1-12 of a month and parse both ways; only later rows show the month comes first
    early = [f"c{i % 7},12/{1 + i % 12}/2010 8:{i % 60:02d},2.5" for i in range(240)]
    late = [f"c{i},12/{13 + i}/2010 9:00,1.0" for i in range(10)]
    path = _write(tmp_path / "sorted.csv", "\n".join(["customer,date,price", *early, *late]))
    options = InputOptions(
        column_map={"customer_id": "customer", "event_time": "date", "amount": "price"}
    )
    for engine, limit in (("spark", 0), ("duckdb", None)):
        result, good, _ = _engine_outputs(
            spark, local_store, path, f"sorted-{engine}", limit, options
        )
        assert result.quarantine_reasons == {}, engine
        assert result.rows_valid == 250, engine
        assert result.last_event.date() == dt.date(2010, 12, 22), engine


def test_rows_that_differ_only_outside_the_contract_are_two_events_on_both_engines(
    spark, local_store, tmp_path
):
    # invoice lines: two items at one price in one invoice are two purchases; a line sent
    # twice is a duplicate, also when its extra values are empty
    text = (
        "customer_id,event_time,amount,invoice,item\n"
        "c1,2025-01-01 10:00:00,2.5,536365,85123A\n"
        "c1,2025-01-01 10:00:00,2.5,536365,71053\n"
        "c1,2025-01-01 10:00:00,2.5,536365,85123A\n"
        "c2,2025-01-02 10:00:00,1.0,,\n"
        "c2,2025-01-02 10:00:00,1.0,,\n"
    )
    csv = _write(tmp_path / "lines.csv", text)
    parquet = tmp_path / "lines.parquet"
    lines = [row.split(",") for row in text.splitlines()[1:]]
    pq.write_table(
        pa.table(
            {
                "customer_id": [r[0] for r in lines],
                "event_time": [dt.datetime.fromisoformat(r[1]) for r in lines],
                "amount": [float(r[2]) for r in lines],
                "invoice": [int(r[3]) if r[3] else None for r in lines],
                "item": [r[4] or None for r in lines],
            }
        ),
        parquet,
    )
    for path in (csv, parquet):
        for engine, limit in (("spark", 0), ("duckdb", None)):
            result, good, quarantine = _engine_outputs(
                spark, local_store, path, f"lines-{path.suffix[1:]}-{engine}", limit
            )
            where = f"{path.name} on {engine}"
            assert result.rows_valid == 3, where
            assert result.quarantine_reasons == {"duplicate_event": 2}, where
            assert sorted(r["customer_id"] for r in good) == ["c1", "c1", "c2"], where
            assert len(quarantine) == 2, where
