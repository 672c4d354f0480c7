"""``hybridflow serve`` against hostile and broken HTTP clients, over raw sockets on loopback:
headers that never finish, bodies that never finish, clients that vanish mid-body, more
connections than the limit, all busy — each is cut off with an answer that says why (or counted as the
client's doing), and valid requests keep getting 200 meanwhile."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from serving_process import metric_value, running_server, wait_for

from infra.storage.store import LocalFolderStore
from tests.fixtures.serving_sample import (
    publish_sample_snapshot,
    register_sample_model,
    sample_feature_table,
)

pytestmark = pytest.mark.e2e
DEADLINE_S = 3.0  # header and body deadline of the guarded server
DROPPED = "hybridflow_serving_dropped_requests_total"
REQUESTS = "hybridflow_serving_requests_total"


def _start(tmp_path_factory, name: str, env: dict[str, str]):
    root = tmp_path_factory.mktemp(name)
    store = LocalFolderStore(root / "store")
    table = sample_feature_table(200, seed=3)
    publish_sample_snapshot(store, table, dt.date(2025, 12, 31))
    register_sample_model(store, table, seed=1)
    return running_server(root / "store", root / "work", env)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory) -> Iterator[str]:
    env = {
        "HYBRIDFLOW_SERVE__HEADER_TIMEOUT_S": str(DEADLINE_S),
        "HYBRIDFLOW_SERVE__BODY_TIMEOUT_S": str(DEADLINE_S),
        "HYBRIDFLOW_SERVE__MAX_CONNECTIONS": "500",
    }
    with _start(tmp_path_factory, "guarded", env) as server:
        wait_for(lambda: httpx.get(f"{server.url}/ready").status_code == 200, 60, "/ready")
        yield server.url


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> Iterator[str]:
    env = {
        "HYBRIDFLOW_SERVE__HEADER_TIMEOUT_S": "300",
        "HYBRIDFLOW_SERVE__BODY_TIMEOUT_S": "300",
        "HYBRIDFLOW_SERVE__MAX_CONNECTIONS": "20",
    }
    with _start(tmp_path_factory, "limited", env) as server:
        wait_for(lambda: httpx.get(f"{server.url}/ready").status_code == 200, 60, "/ready")
        yield server.url


def _metric(url: str, name: str, **labels: str) -> float:
    return metric_value(httpx.get(f"{url}/metrics").text, name, **labels)


@contextlib.contextmanager
def _raw(url: str, sent: bytes = b"") -> Iterator[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    try:
        if sent:
            sock.sendall(sent)
        yield sock
    finally:
        sock.close()


def _answer_then_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _valid_request_works(url: str) -> None:
    answer = httpx.post(f"{url}/predict", json={"customer_id": "c000001"}, timeout=30)
    assert answer.status_code == 200, answer.text


def _partial_body_request(declared: int = 400) -> bytes:
    return (
        b"POST /predict HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(declared).encode() + b'\r\n\r\n{"customer_id": "c0'
    )


def test_headers_that_never_finish_get_408_and_the_connection_is_closed(guarded):
    before = _metric(guarded, DROPPED, reason="header_timeout")
    with _raw(guarded, b"POST /predict HTTP/1.1\r\nHost: test\r\nX-Slow: 1") as slow:
        with _raw(guarded) as silent:  # connects and never sends a byte
            _valid_request_works(guarded)
            assert _answer_then_close(slow).startswith(b"HTTP/1.1 408 ")
            assert _answer_then_close(silent).startswith(b"HTTP/1.1 408 ")
    assert _metric(guarded, DROPPED, reason="header_timeout") == before + 2


def test_fifty_clients_holding_half_a_body_are_cut_off(guarded):
    before = _metric(guarded, DROPPED, reason="body_timeout")
    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(_raw(guarded, _partial_body_request())) for _ in range(50)]
        _valid_request_works(guarded)
        answers = [_answer_then_close(c) for c in clients]
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[0][:200]
    detail = json.loads(answers[0].split(b"\r\n\r\n", 1)[1])["detail"]
    assert detail == f"body: not received within {DEADLINE_S:g}s"
    assert _metric(guarded, DROPPED, reason="body_timeout") == before + 50
    _valid_request_works(guarded)


def test_a_client_that_vanishes_mid_body_is_not_a_bad_request(guarded):
    bad_before = _metric(guarded, REQUESTS, route="/predict", status="422")
    gone_before = _metric(guarded, DROPPED, reason="client_gone")
    with _raw(guarded, _partial_body_request()):
        pass  # closed with 380 bytes of body still owed
    wait_for(
        lambda: _metric(guarded, DROPPED, reason="client_gone") == gone_before + 1,
        30,
        "the vanished client to be counted",
    )
    assert _metric(guarded, REQUESTS, route="/predict", status="499") >= 1
    assert _metric(guarded, REQUESTS, route="/predict", status="422") == bad_before


def test_a_slow_but_steady_body_within_the_deadline_is_served(guarded):
    body = b'{"customer_id": "c000002"}'
    head = b"POST /predict HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
    head += b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
    with _raw(guarded, head + b"\r\n\r\n" + body[:10]) as sock:
        sock.sendall(body[10:])
        answer = _answer_then_close(sock)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]


def test_connections_over_the_limit_get_503_when_all_are_busy_and_the_limit_frees_up(limited):
    before = _metric(limited, DROPPED, reason="connection_limit")
    busy = "hybridflow_serving_open_connections"
    with contextlib.ExitStack() as stack:
        for _ in range(20):  # busy: their bodies never end (body deadline 300 s)
            stack.enter_context(_raw(limited, _partial_body_request()))

        def full() -> bool:  # /metrics itself needs a connection: a 503 there says it too
            answer = httpx.get(f"{limited}/metrics", timeout=30)
            return (
                answer.status_code == 503 or metric_value(answer.text, busy, phase="active") >= 20
            )

        wait_for(full, 60, "every connection to be busy with a request")
        refused = httpx.post(f"{limited}/predict", json={"customer_id": "c000001"}, timeout=30)
        assert refused.status_code == 503 and refused.text.strip() == "too many connections"
    assert _metric(limited, DROPPED, reason="connection_limit") >= before + 1
    wait_for(
        lambda: httpx.get(f"{limited}/health", timeout=30).status_code == 200,
        60,
        "the limit to free up once the clients are gone",
    )
    _valid_request_works(limited)
