"""Who makes room for a new connection: idle ones first, then the slowest header sender; a
client's own connections before anyone else's; a refusal only when all are busy."""

from __future__ import annotations

import asyncio
import logging

from serving.admission import ConnectionTable
from serving.refusals import RefusalLog


def test_idle_connections_are_closed_first_then_the_longest_waiting():
    table = ConnectionTable(max_open=3, max_per_client=10)
    for key, t in (("a", 0.0), ("b", 1.0), ("c", 2.0)):
        assert table.admit(key, "10.0.0.1", t).admitted
    table.set_phase("a", "active", 3.0)
    table.set_phase("c", "idle", 4.0)
    first = table.admit("d", "10.0.0.2", 5.0)
    assert first.admitted and first.evicted == [("c", "idle")]
    second = table.admit("e", "10.0.0.3", 6.0)  # no idle left: the oldest waiting goes
    assert second.evicted == [("b", "waiting")]
    table.set_phase("d", "active", 7.0)
    table.set_phase("e", "active", 7.0)
    refused = table.admit("f", "10.0.0.4", 8.0)
    assert refused.refused == "connection_limit" and not refused.evicted
    assert len(table) == 3 and table.phases() == {"waiting": 0, "active": 3, "idle": 0}


def test_a_connection_idle_for_a_moment_goes_after_the_waiting_ones():
    table = ConnectionTable(max_open=2, max_per_client=10)
    table.admit("busy", "10.0.0.1", 0.0)
    table.admit("slow", "10.0.0.2", 1.0)
    table.set_phase("busy", "idle", 10.0)  # between two requests: its next may be on its way
    assert table.admit("new", "10.0.0.3", 10.5).evicted == [("slow", "waiting")]
    table.set_phase("new", "active", 10.6)
    assert table.admit("later", "10.0.0.4", 10.7).evicted == [("busy", "idle")]


def test_a_client_over_its_share_makes_room_among_its_own_connections():
    table = ConnectionTable(max_open=100, max_per_client=2)
    table.admit("other", "10.0.0.9", 0.0)
    table.set_phase("other", "idle", 0.5)  # older and idle, but another client's
    table.admit("x1", "10.0.0.1", 1.0)
    table.admit("x2", "10.0.0.1", 2.0)
    third = table.admit("x3", "10.0.0.1", 3.0)
    assert third.evicted == [("x1", "waiting")]
    table.set_phase("x2", "active", 4.0)
    table.set_phase("x3", "active", 4.0)
    assert table.admit("x4", "10.0.0.1", 5.0).refused == "client_limit"
    assert table.of_client("10.0.0.1") == 2 and table.phase("other") == "idle"
    table.remove("x2")
    assert table.admit("x5", "10.0.0.1", 6.0).admitted


def test_refusals_are_one_line_per_interval_with_counts(caplog):
    logger = logging.getLogger("test.refusals")

    async def burst() -> None:
        loop = asyncio.get_running_loop()
        refusals = RefusalLog(0.2, logger)
        for i in range(500):
            refusals.note("client_limit" if i % 5 else "header_timeout", "127.0.0.2", loop)
        refusals.note("header_too_large", "127.0.0.3", loop)
        await asyncio.sleep(0.5)  # the interval's line is written by its timer

    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        asyncio.run(burst())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("refused 1 connection or request: 1 header_timeout")
    assert "refused 500 connections or requests in the last" in lines[1]
    assert "400 client_limit, 99 header_timeout, 1 header_too_large" in lines[1]
    assert "busiest clients: 127.0.0.2 (499), 127.0.0.3 (1)" in lines[1]
