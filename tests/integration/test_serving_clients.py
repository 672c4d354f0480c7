"""``hybridflow serve`` as a real process, driven by clients nobody here wrote, sending what they
really send: curl (``-d`` labels JSON as a form, ``Expect: 100-continue`` on large bodies,
``--data-binary @file``), gzip bodies (a gzip bomb is a 413, not an OOM), HTTP/1.0 and
pipelined requests on a raw socket, pandas (``to_json``'s epoch milliseconds,
``date_format="iso"``, ``pa.Table.from_pandas``' nanoseconds), the Arrow IPC file format and
``json.dumps``' NaN. Each is accepted with the JSON path's meaning or refused with a 4xx in the
one error shape, naming the problem.

One server for the module, over a folder store with a run's events, its snapshot and a model
(the online state on).
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import shutil
import socket
import subprocess

import httpx
import pandas as pd
import pyarrow as pa
import pytest
import requests
from serving_process import running_server, wait_for

from infra.storage.store import LocalFolderStore
from tests.fixtures.online_events import BASE, events_table, random_stream
from tests.fixtures.online_store import online_sample_store

pytestmark = pytest.mark.e2e

TOKEN = "clients-token-41c2"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BODY = 65_536  # /predict's limit
MAX_EVENTS_BODY = 1_048_576  # /events' limit
DAY = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # after the snapshot, before the server's clock
ARROW_STREAM = "application/vnd.apache.arrow.stream"
ERROR_KEYS = {"detail", "errors"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("clients")
    store = LocalFolderStore(root / "store")
    online_sample_store(store, events_table(random_stream(21, 120, 2500, 500, False)), BASE)
    env = {
        "HYBRIDFLOW_SERVE__INGEST__TOKEN": TOKEN,
        "HYBRIDFLOW_SERVE__MAX_BODY_BYTES": str(MAX_BODY),
        "HYBRIDFLOW_SERVE__INGEST__MAX_BODY_BYTES": str(MAX_EVENTS_BODY),
        "HYBRIDFLOW_SERVE__API_DOCS": "true",
    }
    with running_server(root / "store", root / "work", env) as process:
        with httpx.Client(base_url=process.url, timeout=30) as client:
            wait_for(
                lambda: client.get("/ready").json().get("online", {}).get("status") == "on",
                60,
                "the online state",
            )
        yield process


def _events(customer: str, n: int = 3, minute: int = 0) -> list[dict]:
    """``n`` purchases of ``customer`` a minute apart on DAY, as JSON objects."""
    at = [DAY + dt.timedelta(minutes=minute + i) for i in range(n)]
    return [
        {"customer_id": customer, "event_time": t.isoformat(), "amount": 10.0 + i}
        for i, t in enumerate(at)
    ]


def _score(url: str, customer: str) -> dict:
    r = requests.post(f"{url}/predict", json={"customer_id": customer}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _error(r: requests.Response | httpx.Response, status: int, text: str) -> dict:
    """The answer is ``status`` in the endpoint's error shape, its detail holding ``text``."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) >= ERROR_KEYS and body["errors"], body
    assert all(set(e) == {"field", "message"} for e in body["errors"]), body
    assert text in body["detail"], body["detail"]
    return body


def _curl(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    cmd = ["curl", "-sS", "-v", "--max-time", "60", "-w", "\n%{http_code}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=True)


def _curl_answer(done: subprocess.CompletedProcess) -> tuple[int, dict]:
    body, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(body)


def test_curl_d_as_the_docs_show_it(server, tmp_path):
    """``curl -d`` labels its body ``application/x-www-form-urlencoded``: read as the JSON it
    is (before: /events answered 415 to the docs' own example)."""
    events = tmp_path / "events.json"
    events.write_text(json.dumps(_events("curl-d")))
    status, answer = _curl_answer(
        _curl(f"{server.url}/events", "-H", f"Authorization: Bearer {TOKEN}", "-d", f"@{events}")
    )
    assert status == 200 and answer["accepted"] == 3, answer
    status, answer = _curl_answer(_curl(f"{server.url}/predict", "-d", '{"customer_id": "curl-d"}'))
    assert status == 200 and answer["customer_id"] == "curl-d" and 0 <= answer["score"] <= 1


def test_curl_expect_100_continue_and_an_arrow_file(server, tmp_path):
    """curl sends ``Expect: 100-continue`` before a large body and waits up to a second for
    the go-ahead: the endpoint answers ``100 Continue`` at once. An Arrow IPC stream from
    ``--data-binary @file``, and an over-limit body refused before it is sent."""
    rows = _events("curl-arrow", 2_000)
    table = pa.Table.from_pylist(
        [{**r, "event_time": dt.datetime.fromisoformat(r["event_time"])} for r in rows]
    )
    path = tmp_path / "events.arrows"
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table)
    assert path.stat().st_size > 1024
    done = _curl(
        f"{server.url}/events",
        "-H",
        f"Authorization: Bearer {TOKEN}",
        "-H",
        f"Content-Type: {ARROW_STREAM}",
        "-H",
        "Expect: 100-continue",
        "--data-binary",
        f"@{path}",
    )
    assert "HTTP/1.1 100 Continue" in done.stderr, done.stderr
    status, answer = _curl_answer(done)
    assert status == 200 and answer["accepted"] == 2_000, answer
    big = tmp_path / "big.json"
    big.write_text(json.dumps(_events("curl-big", 20_000)))
    assert big.stat().st_size > MAX_EVENTS_BODY
    done = _curl(
        f"{server.url}/events",
        "-H",
        f"Authorization: Bearer {TOKEN}",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        f"@{big}",
    )
    status, answer = _curl_answer(done)
    assert status == 413 and "larger than 1048576 bytes" in answer["detail"], answer
    assert "HTTP/1.1 100 Continue" not in done.stderr  # refused before the body was sent


def test_a_client_without_the_token_is_refused_before_its_body(server, tmp_path):
    """The ingest token is checked before the body is read: curl's ``Expect: 100-continue``
    gets the 401/403 instead of the go-ahead, and never uploads the body (before: the whole
    body was read, up to 32 MiB a connection for anyone, then refused)."""
    path = tmp_path / "events.json"
    path.write_text(json.dumps(_events("no-token", 5_000)))
    for auth, status, text in (
        ([], 401, "authorization: bearer token required"),
        (["-H", "Authorization: Bearer wrong"], 403, "authorization: wrong token"),
    ):
        done = _curl(
            f"{server.url}/events",
            *auth,
            "-H",
            "Content-Type: application/json",
            "-H",
            "Expect: 100-continue",
            "--data-binary",
            f"@{path}",
        )
        got, answer = _curl_answer(done)
        assert got == status and text in answer["detail"], answer
        assert "HTTP/1.1 100 Continue" not in done.stderr, done.stderr
    done = _curl(
        f"{server.url}/events", "-H", "Content-Type: application/json", "--data-binary", f"@{path}"
    )
    assert "www-authenticate: Bearer" in done.stderr.lower().replace("bearer", "Bearer")
    r = requests.get(f"{server.url}/events", timeout=30)  # the method first: 405, not 401
    _error(r, 405, "GET is not allowed on /events: send POST")


def test_gzip_bodies_are_read_and_a_gzip_bomb_is_413(server):
    plain = _events("gzip-plain")
    packed = [{**e, "customer_id": "gzip-packed"} for e in plain]
    headers = AUTH | {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    assert requests.post(f"{server.url}/events", json=plain, headers=AUTH, timeout=30).ok
    r = requests.post(
        f"{server.url}/events",
        data=gzip.compress(json.dumps(packed).encode()),
        headers=headers,
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["accepted"] == 3, r.text
    assert _score(server.url, "gzip-packed")["score"] == _score(server.url, "gzip-plain")["score"]
    body = gzip.compress(b'{"customer_id": "gzip-plain"}')
    r = requests.post(f"{server.url}/predict", data=body, headers=headers, timeout=30)
    assert r.status_code == 200 and r.json()["customer_id"] == "gzip-plain"
    bomb = gzip.compress(b" " * 200_000_000, compresslevel=9)  # 200 MB in about 200 kB
    assert len(bomb) < MAX_EVENTS_BODY
    r = requests.post(f"{server.url}/events", data=bomb, headers=headers, timeout=60)
    _error(r, 413, "body: larger than 1048576 bytes once decompressed")
    r = requests.post(
        f"{server.url}/predict", data=body, timeout=30, headers={"Content-Encoding": "br"}
    )
    _error(r, 415, "content-encoding: 'br'")
    assert requests.get(f"{server.url}/health", timeout=30).ok


def test_http_1_0_and_pipelined_requests_on_one_socket(server):
    port = int(server.url.rsplit(":", 1)[1])
    body = b'{"customer_id": "c1"}'
    predict = (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    last = b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    answers = _exchange(port, predict * 3 + last)
    assert answers.count(b"HTTP/1.1 200 OK") == 3 and answers.count(b"404 Not Found") == 1
    assert answers.index(b"404 Not Found") > answers.rindex(b"200 OK")  # in order
    old = b"POST /predict HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    answer = _exchange(port, old)  # the server closes after the answer: HTTP/1.0's default
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"}")
    assert b'"customer_id":"c1"' in answer


def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_pandas_frames_as_pandas_sends_them(server):
    """``to_json(orient="records")`` writes epoch milliseconds, ``date_format="iso"``
    ``...T00:00:00.000Z``, ``pa.Table.from_pandas`` nanosecond timestamps, ``pyarrow.feather``
    / ``new_file`` the IPC file format: each the same events as ISO JSON."""
    frame = pd.DataFrame(_events("pd-json"))
    frame["event_time"] = pd.to_datetime(frame["event_time"])
    sent = {
        "pd-json": (json.dumps(_events("pd-json")), "application/json"),
        "pd-ms": (frame.assign(customer_id="pd-ms").to_json(orient="records"), "application/json"),
        "pd-iso": (
            frame.assign(customer_id="pd-iso").to_json(orient="records", date_format="iso"),
            "application/json",
        ),
        "pd-arrow": (
            _ipc(pa.Table.from_pandas(frame.assign(customer_id="pd-arrow")), False),
            ARROW_STREAM,
        ),
        "pd-file": (
            _ipc(pa.Table.from_pandas(frame.assign(customer_id="pd-file")), True),
            "application/vnd.apache.arrow.file",
        ),
    }
    assert '"event_time":1767571200000' in sent["pd-ms"][0]
    assert '"event_time":"2026-01-05T00:00:00.000Z"' in sent["pd-iso"][0]
    for customer, (body, media) in sent.items():
        r = requests.post(
            f"{server.url}/events", data=body, timeout=30, headers=AUTH | {"Content-Type": media}
        )
        assert r.status_code == 200 and r.json()["accepted"] == 3, (customer, r.text)
    answers = {c: _score(server.url, c) for c in sent}
    assert len({a["score"] for a in answers.values()}) == 1, answers


def _ipc(table: pa.Table, file_format: bool) -> bytes:
    sink = io.BytesIO()
    opener = pa.ipc.new_file if file_format else pa.ipc.new_stream
    with opener(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def test_bodies_the_endpoint_cannot_read_are_named(server):
    """``json.dumps`` writes NaN (not JSON): the row and field are named; a form, XML or an
    epoch in seconds with a fraction: what to send instead."""
    events = _events("bad")
    nan = json.dumps([events[0], {**events[1], "amount": float("nan")}])
    r = requests.post(f"{server.url}/events", data=nan, headers=AUTH, timeout=30)
    _error(r, 422, "[1].amount: NaN is not a number JSON allows")
    r = requests.post(
        f"{server.url}/events", files={"f": ("e.json", b"[]")}, headers=AUTH, timeout=30
    )
    _error(r, 415, "'multipart/form-data': send application/json or " + ARROW_STREAM)
    r = requests.post(
        f"{server.url}/predict",
        data="<c/>",
        timeout=30,
        headers={"Content-Type": "application/xml"},
    )
    _error(r, 415, "content-type: 'application/xml': send application/json")
    fraction = [{**events[0], "event_time": 1767571200.5}]
    r = requests.post(f"{server.url}/events", json=fraction, headers=AUTH, timeout=30)
    _error(r, 422, "[0].event_time: must be an ISO-8601 string, or whole epoch seconds")
    nan = json.dumps({"features": {"recency_days": float("inf")}})
    r = requests.post(f"{server.url}/predict", data=nan, timeout=30)
    _error(r, 422, "features.recency_days: must be a finite number")


def test_windows_byte_order_marks_and_deep_nesting(server):
    """Notepad and PowerShell 5 write UTF-8 files with a byte-order mark: both endpoints skip it
    (before: /predict answered 'not valid JSON'); arrays nested 10,000 deep are a 422 (before:
    /events answered 500, a RecursionError)."""
    bom = b"\xef\xbb\xbf"
    r = requests.post(f"{server.url}/predict", data=bom + b'{"customer_id": "c1"}', timeout=30)
    assert r.status_code == 200 and r.json()["customer_id"] == "c1", r.text
    body = bom + json.dumps(_events("bom")).encode()
    r = requests.post(f"{server.url}/events", data=body, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["accepted"] == 3, r.text
    deep = b"[" * 10_000 + b"]" * 10_000
    r = requests.post(f"{server.url}/events", data=deep, headers=AUTH, timeout=30)
    _error(r, 422, "body: body is not valid JSON (arrays or objects nested too deep)")
    r = requests.post(f"{server.url}/predict", data=deep, timeout=30)
    _error(r, 422, "body: body is not valid JSON (recursion limit exceeded")


def test_every_refusal_has_the_one_error_shape(server):
    """404 names the routes, 405 the method to use (with ``Allow``), 401 asks for a bearer
    token (``WWW-Authenticate``); ``HEAD`` works on the probes; ``/openapi.json`` has the
    bodies."""
    with requests.Session() as session:  # one kept-alive connection for all of them
        r = session.get(f"{server.url}/nope", timeout=30)
        _error(r, 404, "no route /nope (routes: GET /health, GET /ready, GET /metrics, POST")
        r = session.get(f"{server.url}/predict", timeout=30)
        body = _error(r, 405, "GET is not allowed on /predict: send POST")
        assert r.headers["allow"] == "POST" and body["errors"][0]["field"] == "method"
        r = session.post(f"{server.url}/events", json=_events("x"), timeout=30)
        _error(r, 401, "bearer token required")
        assert r.headers["www-authenticate"] == "Bearer"
        r = session.post(f"{server.url}/predict", json={"customer_id": "nobody"}, timeout=30)
        _error(r, 404, "unknown customer 'nobody'")
        r = session.post(f"{server.url}/predict", data=b"x" * (MAX_BODY + 1), timeout=30)
        _error(r, 413, f"larger than {MAX_BODY} bytes")
        assert session.head(f"{server.url}/health", timeout=30).status_code == 200
        assert session.head(f"{server.url}/ready", timeout=30).status_code == 200
        paths = session.get(f"{server.url}/openapi.json", timeout=30).json()["paths"]
        assert {"/predict", "/events"} <= set(paths)
        body = paths["/events"]["post"]["requestBody"]["content"]
        assert {"application/json", ARROW_STREAM} <= set(body)


def test_a_trailing_slash_names_the_same_route(server):
    """``POST /predict/`` and ``/events/`` are answered as their routes by clients that follow
    no redirects (httpx, curl without ``-L``) and those that do (requests): before, an empty
    307 to the unslashed path."""
    status, answer = _curl_answer(_curl(f"{server.url}/predict/", "-d", '{"customer_id": "c1"}'))
    assert status == 200 and answer["customer_id"] == "c1", answer
    r = httpx.post(f"{server.url}/events/", json=_events("slash"), headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["accepted"] == 3, r.text
    r = requests.post(f"{server.url}/predict/", json={"customer_id": "slash"}, timeout=30)
    assert r.status_code == 200 and not r.history and r.json()["customer_id"] == "slash", r.text
    _error(httpx.post(f"{server.url}/events/", json=[], timeout=30), 401, "bearer token required")
    assert httpx.get(f"{server.url}/health/", timeout=30).json() == {"status": "ok"}
