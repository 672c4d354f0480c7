"""``hybridflow serve`` against a header flood, idle kept-alive connections, slowloris clients
and a client that hogs connections, over raw sockets from several loopback addresses (127.0.0.x:
one address per attacker, 127.0.0.1 for the legitimate client): every legitimate request is
answered 200, the endpoint's memory stays flat, refusals are logged once per interval, and the
API map (/docs, /redoc, /openapi.json) is not served unless a setting asks for it."""

from __future__ import annotations

import contextlib
import datetime as dt
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serving_process import ServerProcess, metric_value, running_server, wait_for

from infra.storage.store import LocalFolderStore
from tests.fixtures.serving_sample import (
    publish_sample_snapshot,
    register_sample_model,
    sample_feature_table,
)

pytestmark = pytest.mark.e2e
DROPPED = "hybridflow_serving_dropped_requests_total"
IDLE_CLOSED = "hybridflow_serving_idle_connections_closed_total"
MAX_CONNECTIONS = 40
PER_CLIENT = 10
MAX_HEADER_BYTES = 16_384


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("hostile")
    store = LocalFolderStore(root / "store")
    table = sample_feature_table(200, seed=3)
    publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
    register_sample_model(store, table, seed=1)
    env = {
        # nothing is closed by a timer during a test: only the caps can make room
        "HYBRIDFLOW_SERVE__HEADER_TIMEOUT_S": "600",
        "HYBRIDFLOW_SERVE__BODY_TIMEOUT_S": "600",
        "HYBRIDFLOW_SERVE__KEEP_ALIVE_S": "600",
        "HYBRIDFLOW_SERVE__MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "HYBRIDFLOW_SERVE__MAX_CONNECTIONS_PER_CLIENT": str(PER_CLIENT),
        "HYBRIDFLOW_SERVE__MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
        "HYBRIDFLOW_SERVE__REFUSAL_LOG_INTERVAL_S": "3600",
    }
    with running_server(root / "store", root / "work", env) as proc:
        wait_for(lambda: httpx.get(f"{proc.url}/ready").status_code == 200, 60, "/ready")
        yield proc


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


@contextlib.contextmanager
def _sockets(url: str, source: str, n: int, sent: bytes = b"") -> Iterator[list[socket.socket]]:
    """``n`` connections from ``source`` (a 127.0.0.x address), each having sent ``sent``."""
    opened: list[socket.socket] = []
    try:
        for _ in range(n):
            sock = socket.create_connection(_address(url), timeout=60, source_address=(source, 0))
            opened.append(sock)
            if sent:
                sock.sendall(sent)
        yield opened
    finally:
        for sock in opened:
            sock.close()


def _answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes (or resets) the connection."""
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def _kept_alive(url: str, source: str, n: int) -> contextlib.AbstractContextManager:
    """``n`` connections from ``source`` that each got one answer and now sit idle."""
    request = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"

    @contextlib.contextmanager
    def opened():
        with _sockets(url, source, n, request) as socks:
            for sock in socks:
                head = sock.recv(65536)
                assert head.startswith(b"HTTP/1.1 200 "), head[:200]
            yield socks

    return opened()


def _metric(url: str, name: str, **labels: str) -> float:
    return metric_value(httpx.get(f"{url}/metrics", timeout=30).text, name, **labels)


def _legitimate_requests_all_succeed(url: str, n: int = 20) -> None:
    """``n`` requests from 127.0.0.1, each on a new connection: every one answered 200."""
    codes = []
    for _ in range(n):
        with httpx.Client(timeout=30) as client:
            codes.append(client.post(f"{url}/predict", json={"customer_id": "c000001"}).status_code)
    assert codes == [200] * n


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_headers_over_the_cap_get_431_and_cost_no_memory(server):
    url = server.url
    before = _metric(url, DROPPED, reason="header_too_large")
    big = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Flood: " + b"a" * (64 * 1024) + b"\r\n\r\n"
    with _sockets(url, "127.0.0.2", 1, big) as (sock,):
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:300]
    many = b"GET /health HTTP/1.1\r\nHost: t\r\n" + b"X-Many: 0123456789\r\n" * 2000 + b"\r\n"
    with _sockets(url, "127.0.0.2", 1, many) as (sock,):
        assert _answer(sock).startswith(b"HTTP/1.1 431 ")
    fits = {"X-Cookie": "c" * (MAX_HEADER_BYTES // 2)}
    answer = httpx.get(f"{url}/health", headers=fits, timeout=30)
    assert answer.status_code == 200

    rss_before = _rss_kib(server.process.pid)
    flood = 32 * 1024 * 1024
    results: list[bytes] = []

    def flood_one(source: str) -> None:
        with _sockets(url, source, 1) as (sock,):
            head = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Flood: "
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(head + b"a" * flood)
            results.append(_answer(sock))

    threads = [threading.Thread(target=flood_one, args=(f"127.0.0.{3 + i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    grown_mib = (_rss_kib(server.process.pid) - rss_before) / 1024
    assert all(r.startswith(b"HTTP/1.1 431 ") or r == b"" for r in results), results
    assert any(r.startswith(b"HTTP/1.1 431 ") for r in results)
    assert grown_mib < 16, f"eight 32 MiB header floods grew the endpoint by {grown_mib:.0f} MiB"
    assert _metric(url, DROPPED, reason="header_too_large") >= before + 2 + 1
    _legitimate_requests_all_succeed(url, 5)


def test_idle_kept_alive_connections_do_not_cost_a_request_its_answer(server):
    url = server.url
    before = _metric(url, IDLE_CLOSED)
    with contextlib.ExitStack() as stack:  # 60 idle connections, more than the cap of 40
        for i in range(6):
            stack.enter_context(_kept_alive(url, f"127.0.1.{i + 1}", PER_CLIENT))
        _legitimate_requests_all_succeed(url)
    assert _metric(url, IDLE_CLOSED) >= before + 20


def test_slowloris_clients_are_closed_before_a_legitimate_request_waits(server):
    url = server.url
    before = _metric(url, DROPPED, reason="slow_headers")
    partial = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: "
    with contextlib.ExitStack() as stack:  # 60 half-sent headers (header deadline 600 s)
        slow = [
            stack.enter_context(_sockets(url, f"127.0.2.{i + 1}", PER_CLIENT, partial))
            for i in range(6)
        ]
        _legitimate_requests_all_succeed(url)
        evicted = [s for group in slow for s in group if _closed(s)]
        assert evicted, "no slow sender was closed to make room"
        for sock in evicted:
            assert _answer(sock).startswith(b"HTTP/1.1 408 ")
    assert _metric(url, DROPPED, reason="slow_headers") >= before + 20


def _closed(sock: socket.socket) -> bool:
    """Whether the server has answered and shut its side (without blocking)."""
    sock.setblocking(False)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)


def test_one_client_cannot_take_more_than_its_share_of_connections(server):
    url = server.url
    before = _metric(url, DROPPED, reason="client_limit")
    half_body = (
        b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b'Content-Length: 400\r\n\r\n{"customer_id": "c0'
    )
    active = "hybridflow_serving_open_connections"
    busy_before = _metric(url, active, phase="active")
    with _sockets(url, "127.0.3.1", PER_CLIENT, half_body):  # busy: their bodies never end
        wait_for(
            lambda: _metric(url, active, phase="active") >= busy_before + PER_CLIENT,
            60,
            "the hog's connections to be busy with their requests",
        )
        with _sockets(url, "127.0.3.1", 1) as (extra,):
            answer = _answer(extra)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:300]
        _legitimate_requests_all_succeed(url, 5)
    assert _metric(url, DROPPED, reason="client_limit") >= before + 1


def test_refusals_are_logged_once_per_interval_not_once_each(server):
    url = server.url
    partial = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: "
    with contextlib.ExitStack() as stack:
        for i in range(10):
            stack.enter_context(_sockets(url, f"127.0.4.{i + 1}", PER_CLIENT, partial))
        _legitimate_requests_all_succeed(url, 2)
    log = server.log()
    refused = [line for line in log.splitlines() if "refused " in line]
    assert 1 <= len(refused) <= 2, refused  # interval 3600 s: the first at once, then none
    assert "Exceeded concurrency limit" not in log and "Invalid HTTP request" not in log


def test_the_api_map_is_not_served(server):
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        assert httpx.get(f"{server.url}{path}", timeout=30).status_code == 404, path
