"""Pure parts of reading a user's events: delimiter detection, option merging, CLI arg types."""

from __future__ import annotations

import argparse

import pytest

from cli.args import column_mapping, delimiter
from tasks.data.input_formats import InputOptions, detect_delimiter, detect_format


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
