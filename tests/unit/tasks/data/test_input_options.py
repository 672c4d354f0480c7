"""Pure parts of reading a user's events: delimiter detection, option merging, CLI arg types,
the engine-free inspection of the files."""

from __future__ import annotations

import argparse
import datetime as dt

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from cli.args import column_mapping, delimiter, one_character
from infra.errors import HybridflowInputError
from infra.routing.planner import count_event_rows
from tasks.data.input_formats import (
    CSV_SUFFIXES,
    InputOptions,
    amounts_use_decimal_comma,
    check_required_columns,
    choose_timestamp_format,
    comma_grouped_sql,
    detect_delimiter,
    detect_format,
    inspect_events,
)
from tasks.definitions.contract import (
    EVENT_TYPE_SYNONYMS,
    column_map_hints,
    customer_id_text,
    event_type_name,
    event_type_sql,
)
from tasks.definitions.feature_specs import EVENT_TYPE_MIX


def test_delimiter_is_the_one_that_splits_the_header_most():
    assert detect_delimiter("customer_id;event_time;amount") == ";"
    assert detect_delimiter("a\tb\tc") == "\t"
    assert detect_delimiter("a|b|c,d") == "|"
    assert detect_delimiter("single") == ","


def test_flags_win_over_settings_and_maps_merge():
    flags = InputOptions(column_map={"amount": "Total"}, timestamp_format="d/M/yyyy")
    settings = InputOptions(
        column_map={"amount": "Price", "customer_id": "Client"}, csv_delimiter=";"
    )
    merged = flags.merged_with(settings)
    assert merged.column_map == {"amount": "Total", "customer_id": "Client"}
    assert merged.csv_delimiter == ";" and merged.timestamp_format == "d/M/yyyy"


def test_cli_argument_types():
    assert column_mapping("Customer_ID=Client ID") == ("customer_id", "Client ID")
    assert delimiter("tab") == "\t" and delimiter(";") == ";"
    for bad in ("amount", "=x", "amount="):
        with pytest.raises(argparse.ArgumentTypeError):
            column_mapping(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        delimiter(";;")


def test_format_comes_from_the_file_names(tmp_path):
    assert detect_format([tmp_path / "a.csv.gz", tmp_path / "b.CSV"], tmp_path) == "csv"
    assert detect_format([tmp_path / "x=1" / "part.parquet"], tmp_path) == "parquet"


def _error(path, options=None) -> str:
    with pytest.raises(HybridflowInputError) as caught:
        inspect_events(path, options or InputOptions())
    return str(caught.value)


def test_inspection_names_the_contract_columns_from_headers_and_footers(tmp_path):
    csv = tmp_path / "shop.csv"
    csv.write_text('Client;"When; local";Total;Extra\nc1;2025-01-01;1.5;x\n')
    found = inspect_events(
        csv,
        InputOptions(
            column_map={"customer_id": "client", "event_time": "when; local", "amount": "TOTAL"}
        ),
    )
    assert found.format == "csv" and found.csv_delimiter == ";" and found.files == [csv]
    assert found.columns == ["customer_id", "event_time", "amount", "extra"]
    assert found.rows_estimate >= 1

    folder = tmp_path / "events"
    for day, columns in (("2025-01-01", ["customer_id", "amount"]), ("2025-01-02", ["EVENT_TIME"])):
        part = folder / f"day={day}"
        part.mkdir(parents=True)
        pq.write_table(pa.table({c: ["1", "2"] for c in columns}), part / "part-0.parquet")
    found = inspect_events(folder, InputOptions())
    assert found.format == "parquet" and found.rows_estimate == 4
    assert found.columns == ["customer_id", "amount", "event_time", "day"]


def test_inspection_refuses_what_the_engine_would_refuse_later(tmp_path):
    csv = tmp_path / "events.csv"
    csv.write_text("Client,When,Qty\nc1,2025-01-01,1\n")
    message = _error(csv, InputOptions(column_map={"customer_id": "client"}))
    assert message.startswith("events are missing required column(s) event_time, amount;")
    assert "found: customer_id, when, qty" in message
    assert "no column 'price'" in _error(csv, InputOptions(column_map={"amount": "price"}))
    assert "is not an events column" in _error(csv, InputOptions(column_map={"total": "qty"}))
    dupes = tmp_path / "dupes.csv"
    dupes.write_text("customer_id,Amount,amount,event_time\n")
    assert "'amount' appears more than once" in _error(dupes)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert _error(empty).startswith("events input is empty")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    assert _error(broken).startswith(f"cannot read Parquet file {broken}")


def test_csv_headers_are_read_as_rfc_4180_like_every_engine_reads_them(tmp_path):
    quoted = tmp_path / "quoted.csv"
    quoted.write_text('\ufeff"cust""id","when, local",amount,"note\nEUR"\nc1,2025-01-01,1,x\n')
    found = inspect_events(
        quoted,
        InputOptions(column_map={"customer_id": 'cust"id', "event_time": "when, local"}),
    )
    assert found.columns == ["customer_id", "event_time", "amount", "note\neur"]
    assert found.csv_dialect is not None and found.csv_dialect.escape == '"'


def test_a_csv_header_with_an_unclosed_quote_is_refused_before_any_engine(tmp_path):
    unclosed = tmp_path / "unclosed.csv"
    unclosed.write_text('"customer_id,event_time,amount\nc1,2025-01-01,1\n')
    message = _error(unclosed)
    assert message.startswith(f"cannot read the header of CSV file {unclosed}")
    assert "--csv-escape" in message


def test_a_backslash_escape_is_an_option_and_changes_how_the_header_reads(tmp_path):
    escaped = tmp_path / "escaped.csv"
    escaped.write_text('"cust\\"id",event_time,amount\nc1,2025-01-01,1\n')
    options = InputOptions(column_map={"customer_id": 'cust"id'}, csv_escape="\\")
    found = inspect_events(escaped, options)
    assert found.columns == ["customer_id", "event_time", "amount"]
    assert found.csv_dialect is not None and found.csv_dialect.spark_options() == {
        "sep": ",",
        "quote": '"',
        "escape": "\\",
        "multiLine": "true",
    }
    with pytest.raises(argparse.ArgumentTypeError):
        one_character("\\\\")


def test_parquet_files_that_disagree_on_a_column_type_are_refused_naming_both(tmp_path):
    folder = tmp_path / "events"
    folder.mkdir()
    base = {"customer_id": ["c1"], "event_time": ["2025-01-01"]}
    pq.write_table(pa.table(base | {"amount": [1.5], "note": [1]}), folder / "a.parquet")
    pq.write_table(pa.table(base | {"amount": ["2"], "note": ["x"]}), folder / "b.parquet")
    message = _error(folder)
    assert message == (
        f"column 'amount' is double in {folder / 'a.parquet'} but string in "
        f"{folder / 'b.parquet'}: all Parquet files of one input need the same type for each "
        "column"
    )
    # a column validation does not read may differ; text encodings and time units may too
    pq.write_table(
        pa.table(
            {
                "customer_id": pa.array(["c2"]).dictionary_encode(),
                "event_time": pa.array([dt.datetime(2025, 1, 1)], pa.timestamp("ms")),
                "amount": [2.5],
                "note": ["x"],
            }
        ),
        folder / "b.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "customer_id": pa.array(["c1"], pa.large_string()),
                "event_time": pa.array([dt.datetime(2025, 1, 1)], pa.timestamp("us", tz="UTC")),
                "amount": [1.5],
                "note": [1],
            }
        ),
        folder / "a.parquet",
    )
    assert inspect_events(folder, InputOptions()).rows_estimate == 2


def test_an_events_path_in_a_symbolic_link_loop_is_an_input_error(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    message = _error(loop)
    assert message.startswith(f"cannot resolve events path {loop}: ")
    assert "\n" not in message


def test_a_retail_export_missing_contract_names_is_told_the_map_that_reads_it(tmp_path):
    csv = tmp_path / "retail.csv"
    csv.write_text(
        '"Customer ID","InvoiceDate","Quantity","Price"\n"C1","01/01/2024 09:00",1,2.5\n'
    )
    message = _error(csv, InputOptions())
    assert message.endswith(
        "if these are yours: --map customer_id='customer id' --map event_time=invoicedate "
        "--map amount=price (amount is the event's total value: a unit price undercounts "
        "multi-item rows)"
    )
    assert column_map_hints(["amount"], ["qty", "Total", "Price"]) == {"amount": "Total"}
    assert column_map_hints(["customer_id"], ["when", "what"]) == {}
    # one input column never answers two missing ones
    assert column_map_hints(["event_time", "amount"], ["date"]) == {"event_time": "date"}


def test_a_tied_sample_is_decided_by_the_whole_column(tmp_path):
    samples = ["12/1/2010 8:26", "12/2/2010 9:01"]  # d/M and M/d alike
    asked: list[list] = []

    def counts(formats):
        asked.append(list(formats))
        return {f: (500 if f == "M/d/yyyy H:mm" else 300) for f in formats}

    assert choose_timestamp_format(samples, tmp_path, counts) == "M/d/yyyy H:mm"
    assert asked == [["d/M/yyyy H:mm", "M/d/yyyy H:mm"]]
    # a column that never tells them apart keeps the first candidate, as without a counter
    assert choose_timestamp_format(samples, tmp_path, lambda fs: dict.fromkeys(fs, 9)) == (
        "d/M/yyyy H:mm"
    )
    assert choose_timestamp_format(samples, tmp_path) == "d/M/yyyy H:mm"
    # no tie: the whole column is not read
    assert choose_timestamp_format(["13/1/2010 8:26"], tmp_path, counts) == "d/M/yyyy H:mm"
    assert len(asked) == 1


def test_integer_dates_are_yyyymmdd_never_epoch_seconds(tmp_path):
    # CDNOW writes dates as 19970101: epoch seconds would read 1970-08-19
    cdnow = ["19970101", "19970612", "19980630"]
    assert choose_timestamp_format(cdnow, tmp_path) == "yyyyMMdd"
    assert choose_timestamp_format(["20250102103005"], tmp_path) == "yyyyMMddHHmmss"
    # 12 digits: yyyyMMddHHmm when every value is a valid minute (epoch milliseconds of
    # 1973-2001 would read 202501021030 as 1976-06-02); epoch millis when one is not
    assert choose_timestamp_format(["202501021030", "202512312359"], tmp_path) == "yyyyMMddHHmm"
    assert choose_timestamp_format(["202501021030", "987654321098"], tmp_path) == "epoch_millis"
    assert choose_timestamp_format(["202501021030", "1735812000000"], tmp_path) == "epoch_millis"
    assert choose_timestamp_format(["1735725600", "1735812000"], tmp_path) == "epoch_seconds"
    assert choose_timestamp_format(["1430578965994"], tmp_path) == "epoch_millis"
    with pytest.raises(HybridflowInputError, match="1997011"):  # 7 digits: neither
        choose_timestamp_format(["1997011"], tmp_path)


def test_a_header_aligned_with_spaces_is_refused_with_how_to_convert_it(tmp_path):
    path = tmp_path / "CDNOW_master.txt"
    path.write_text("customer_id date quantity amount\n    1 19970101   1    11.77\n")
    message = _error(path)
    assert "looks separated by spaces" in message and "awk" in message
    assert "--csv-delimiter ' '" in message
    # told the delimiter, the file is read as the user says (single spaces)
    path.write_text("customer_id event_time amount\n1 19970101 11.77\n")
    found = inspect_events(path, InputOptions(csv_delimiter=" "))
    assert found.columns == ["customer_id", "event_time", "amount"]


def test_decimal_comma_amounts_are_detected_only_where_they_cannot_be_misread():
    assert amounts_use_decimal_comma(["12,50", "7", "1.234,5", "abc", None, " 3,25 "], ";")
    assert amounts_use_decimal_comma(["1.234", "12,5"], "\t")  # 1.234 groups thousands
    assert not amounts_use_decimal_comma(["12,50", "12.50"], ";")  # a decimal point too
    assert not amounts_use_decimal_comma(["12,50"], ",")  # "12,50" quoted in a , file
    assert not amounts_use_decimal_comma(["7", "8.5"], ";")


def test_inspection_detects_a_decimal_comma_from_the_first_rows(tmp_path):
    options = InputOptions(column_map={"customer_id": "Kunde", "event_time": "Datum"})
    euro = tmp_path / "euro.csv"
    euro.write_text("Kunde;Datum;Betrag\nK1;31.12.2025 14:30;12,50\nK2;01.12.2025 09:00;7\n")
    assert inspect_events(euro, options.model_copy(update={"column_map": {
        **options.column_map, "amount": "Betrag"}})).csv_dialect.decimal_comma  # fmt: skip
    euro.write_text("Kunde;Datum;amount\nK1;31.12.2025 14:30;12.50\nK2;01.12.2025;7,5\n")
    assert not inspect_events(euro, options).csv_dialect.decimal_comma


def test_a_customer_id_with_a_zero_fraction_is_its_integer():
    assert customer_id_text(" 13085.0 ") == "13085"
    assert customer_id_text("13085.00") == "13085"
    assert customer_id_text("007.0") == "007"
    for kept in ("13085.5", "1.3085E4", "a.0", "13085.", "c1", "13085.0\n"):
        assert customer_id_text(kept) == kept.strip(" ")


def test_a_log_without_amounts_is_told_how_to_run():
    # RetailRocket's events.csv: views, carts and transactions, no value
    with pytest.raises(HybridflowInputError) as caught:
        check_required_columns(["timestamp", "customer_id", "event", "itemid", "transactionid"])
    message = str(caught.value)
    assert "amount" in message and "RetailRocket" in message and "one value on every row" in message


def test_public_event_types_get_the_contract_s_names():
    assert [event_type_name(t) for t in ("Transaction", "cart", "addtocart", "PageView")] == [
        "purchase", "add_to_cart", "add_to_cart", "view",
    ]  # fmt: skip
    assert event_type_name("remove_from_cart") == "remove_from_cart"
    assert set(EVENT_TYPE_SYNONYMS.values()) == {"purchase", *EVENT_TYPE_MIX}


def test_the_logs_own_purchase_event_is_a_purchase_in_python_and_sql():
    """``--purchase-event checkout``: ``Checkout`` is a purchase, the synonyms still are; the
    user's word wins over a synonym's meaning; DuckDB runs the same SQL text Spark does."""
    texts = ["Checkout", " checkout ", "transaction", "view", "cart", "purchase_complete"]
    for word, expected in (
        (" CheckOut ", ["purchase", "purchase", "purchase", "view", "add_to_cart"]),
        ("cart", ["Checkout", "checkout", "purchase", "view", "purchase"]),
    ):
        assert [event_type_name(t.strip(), word) for t in texts[:5]] == expected
        sql = event_type_sql("trim(x)", word)
        got = duckdb.sql(f"SELECT {sql} FROM unnest($texts) AS t(x)", params={"texts": texts[:5]})
        assert [r[0] for r in got.fetchall()] == expected
    assert event_type_name("purchase_complete") == "purchase_complete"
    assert InputOptions(purchase_event="purchase_complete").purchase_event == "purchase_complete"
    for bad in ("it's", "a\\b", "", "  "):
        with pytest.raises(ValidationError, match="purchase_event"):
            InputOptions(purchase_event=bad)
    given = InputOptions(purchase_event="checkout")
    assert given.merged_with(InputOptions(purchase_event="x")).purchase_event == "checkout"
    assert InputOptions().merged_with(given).purchase_event == "checkout"


def test_excel_and_spreadsheet_exports_are_read_or_refused_with_the_conversion(tmp_path):
    """A ``.tsv`` file is delimited text like ``.csv`` (before: 'cannot tell the format');
    UTF-16 (Excel's 'Unicode Text') and Windows-1252 files are refused naming the encoding and
    the iconv line (before: 'binary data, not CSV text', 'not UTF-8 text')."""
    text = "customer_id\tevent_time\tamount\nc1\t2025-01-01\t1.5\n"
    tsv = tmp_path / "export.tsv"
    tsv.write_text(text)
    found = inspect_events(tsv, InputOptions())
    assert found.format == "csv" and found.csv_dialect.delimiter == "\t"
    assert found.columns == ["customer_id", "event_time", "amount"]
    assert count_event_rows([tsv], CSV_SUFFIXES) == 1
    for encoding in ("utf-16", "utf-16-le"):  # with and without a byte-order mark
        path = tmp_path / f"{encoding}.txt"
        path.write_bytes(text.encode(encoding))
        message = _error(path)
        assert "it is UTF-16 text" in message and "iconv -f UTF-16 -t UTF-8" in message
    latin = tmp_path / "latin.csv"
    latin.write_bytes(
        "customer_id,event_time,amount,country\nc1,2025-01-01,1,Côte\n".encode("cp1252")
    )
    message = _error(latin)
    assert "not UTF-8 text (byte 0xf4 on line 2" in message
    assert f"iconv -f CP1252 -t UTF-8 {latin} > events.csv" in message


def test_thousands_commas_are_dropped_from_amounts_in_sql():
    """``"1,234.50"`` (a spreadsheet's number format, quoted in a CSV) is 1234.5 (before: an
    invalid_amount row: large purchases quarantined); commas that group no thousands stay."""
    texts = ["1,234.50", " 12,345 ", "-1,000.5", "1,23", "1,2345", "12,5", "1234.5", "a,bcd"]
    sql = comma_grouped_sql("x", "regexp_matches")
    got = duckdb.sql(f"SELECT {sql} FROM unnest($t) AS t(x)", params={"t": texts}).fetchall()
    assert [r[0] for r in got] == [
        "1234.50", "12345", "-1000.5", "1,23", "1,2345", "12,5", "1234.5", "a,bcd",
    ]  # fmt: skip
