"""The features' SQL text, which Spark and DuckDB both run: plain names only, no decimal
literals (Spark would compute in DECIMAL where DuckDB uses doubles), every join hinted."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from tasks.data.cutoffs import Cutoff, Origins, pipeline_cutoffs
from tasks.data.feature_sql import cutoff_sql, examples_sql, identifier, wide_sql
from tasks.definitions.feature_formulas import AGGREGATES
from tasks.definitions.feature_specs import MIX_COLUMNS

ALL = {"event_type", "quantity", *MIX_COLUMNS}
RUN = pipeline_cutoffs(dt.date(2025, 6, 30), 90, Origins(count=3, stride_days=30))
CUTOFFS = RUN.distinct()


@pytest.mark.parametrize("name", ["customer_id", "train__n_p_7", "_t"])
def test_plain_names_pass(name):
    assert identifier(name) == name


@pytest.mark.parametrize("name", ["", "a b", 'x"; DROP TABLE t; --', "1st", "naïve", "a-b"])
def test_other_names_are_refused(name):
    with pytest.raises(ValueError, match="not a plain SQL name"):
        identifier(name)


def test_cutoffs_need_distinct_names():
    at = dt.datetime(2025, 1, 1)
    with pytest.raises(ValueError, match="distinct names"):
        wide_sql("events", [Cutoff("a", at), Cutoff("a", at)], [])
    with pytest.raises(ValueError, match="distinct names"):
        wide_sql("events", [], [])


@pytest.mark.parametrize("mixes", [list(MIX_COLUMNS), []])
def test_every_branch_is_joined_with_a_hash_join_hint(mixes):
    sql = wide_sql("events", CUTOFFS, mixes)
    branches = ["gaps"] + [f"mix_{i}" for i in range(len(mixes))]
    assert f"/*+ SHUFFLE_HASH({', '.join(branches)}) */" in sql
    assert sql.count("LEFT JOIN") == len(branches)
    for col in MIX_COLUMNS:
        assert (f"WHERE {col} IS NOT NULL" in sql) == (col in mixes)


def test_no_decimal_literals():
    texts = [wide_sql("events", CUTOFFS, list(MIX_COLUMNS))]
    texts += [cutoff_sql("wide", c, ALL) for c in CUTOFFS]
    texts += [examples_sql("wide", RUN.train, ALL), examples_sql("wide", RUN.backtest, ALL)]
    for text in texts:
        bare = re.findall(r"(?<![\w.])\d+\.\d*(?:[eE][-+]?\d+)?(?!\d|::DOUBLE)", text)
        assert not bare, bare


def test_examples_are_one_select_per_origin_with_its_date():
    sql = examples_sql("wide", RUN.train, ALL)
    assert sql.count("UNION ALL") == len(RUN.train) - 1 == 2
    for cutoff, day in zip(RUN.train, ["2025-04-01", "2025-03-02", "2025-01-31"], strict=True):
        assert f"DATE '{day}' AS origin" in sql and f"{cutoff.name}___last_t IS NOT NULL" in sql
    with pytest.raises(ValueError, match="labelled cutoffs"):
        examples_sql("wide", [RUN.score], ALL)


def test_the_sql_computes_every_declared_aggregate_and_no_other():
    cutoff = RUN.score  # the unlabelled scoring cutoff
    sql = wide_sql("events", [cutoff], list(MIX_COLUMNS))
    computed = set(re.findall(rf"AS {cutoff.name}__(_\w+)", sql))
    assert computed == set(AGGREGATES)
