"""Connection-level guards uvicorn does not have: a deadline and a size cap for a request's
headers, caps on open connections (per client and in all) that close idle and slow connections
before refusing a new one, and refusals logged once per interval.

- Headers: every request gets ``header_timeout_s`` from its first byte (or from the connection's
  opening) to its last header line, else 408 and the connection is closed (a slowloris client
  holds a connection for that long at most); headers over ``max_header_bytes`` (request line
  included) get 431 as soon as that many bytes arrived, so a header flood costs at most the cap
  plus one socket read.
- Open connections: :class:`serving.admission.ConnectionTable` decides; a new connection over a
  cap first closes the longest-idle kept-alive connection under that cap, then the slowest header
  sender (408); only when all are busy with requests is it answered 503 and closed. Idle and
  half-sent connections therefore never cost a legitimate request its answer.
- Refusals (408, 431, 503, 400) are counted in ``/metrics`` and logged by
  :class:`serving.refusals.RefusalLog`, one line per interval.

Refused connections are closed gracefully: the answer is written, the sending side shut, and what
the client still sends is read and dropped for up to ``LINGER_S`` before the socket closes, so
the client reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.admission import ConnectionTable, Phase
from serving.metrics import ServingMetrics
from serving.refusals import RefusalLog

LINGER_S = 2.0
INVALID_REQUEST = "Invalid HTTP request received."


def _answer(status: str, text: str) -> bytes:
    body = text.encode() + b"\r\n"
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


REQUEST_TIMEOUT = _answer("408 Request Timeout", "request headers too slow")
HEADERS_TOO_LARGE = _answer("431 Request Header Fields Too Large", "request headers too large")
SERVICE_UNAVAILABLE = _answer("503 Service Unavailable", "too many connections")


class DropInvalidRequestLines(logging.Filter):
    """uvicorn logs a WARNING for every malformed request; the guarded protocol counts those
    in the refusal log instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != INVALID_REQUEST


def guarded_protocol(
    metrics: ServingMetrics,
    header_timeout_s: float,
    *,
    max_header_bytes: int,
    max_connections: int,
    max_connections_per_client: int,
    refusals: RefusalLog,
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the guards above, counting what it drops."""
    table = ConnectionTable(max_connections, max_connections_per_client)

    def publish() -> None:
        for phase, n in table.phases().items():
            metrics.open_connections.labels(phase).set(n)

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _header_deadline: asyncio.TimerHandle | None = None
        _header_bytes = 0
        _reading_headers = True
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._peer = self.client[0] if self.client else "unknown"
            admission = table.admit(self, self._peer, self.loop.time())
            for victim, phase in admission.evicted:
                victim._make_room(phase)  # type: ignore[attr-defined]
            if not admission.admitted:
                reason = admission.refused or "connection_limit"
                self._refuse(reason, SERVICE_UNAVAILABLE)
                return
            self._arm_header_deadline()
            publish()

        def connection_lost(self, exc: Exception | None) -> None:
            table.remove(self)
            publish()
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # lingering: read and dropped
            counted = self._reading_headers or table.phase(self) == "idle"
            if counted:
                self._header_bytes += len(data)
            super().data_received(data)
            if self._reading_headers and self._header_bytes > max_header_bytes:
                self._refuse("header_too_large", HEADERS_TOO_LARGE)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._reading_headers = True
            if table.phase(self) == "idle":
                table.set_phase(self, "waiting", self.loop.time())
                publish()
            self._arm_header_deadline()  # the next request on a kept-alive connection

        def on_headers_complete(self) -> None:
            if self._refused:
                return  # the rest of a chunk that arrived with refused headers
            self._disarm_header_deadline()
            self._reading_headers = False
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > max_header_bytes:
                self._refuse("header_too_large", HEADERS_TOO_LARGE)
                return
            self._header_bytes = 0
            table.set_phase(self, "active", self.loop.time())
            publish()
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._refused:
                super().on_message_complete()

        def on_response_complete(self) -> None:
            queued = bool(self.pipeline)
            super().on_response_complete()
            if self.transport.is_closing() or queued:
                return
            phase: Phase = "waiting" if self._reading_headers else "idle"
            table.set_phase(self, phase, self.loop.time())
            publish()

        def send_400_response(self, msg: str) -> None:
            self._note("bad_request")
            super().send_400_response(msg)

        def _make_room(self, phase: Phase) -> None:
            """Closed to let a new connection in: an idle one quietly, a slow one with 408."""
            if self.transport.is_closing():
                return
            if phase == "idle":
                metrics.idle_closed.inc()
                self._disarm_header_deadline()
                self.transport.close()
            else:
                self._refuse("slow_headers", REQUEST_TIMEOUT)

        def _refuse(self, reason: str, answer: bytes) -> None:
            """Answer, stop taking requests, and close after the lingering period."""
            if self._refused:
                return
            self._refused = True
            table.remove(self)
            publish()
            self._disarm_header_deadline()
            self._unset_keepalive_if_required()
            self._note(reason)
            if self.transport.is_closing():
                return
            self.transport.write(answer)
            if self.transport.can_write_eof():
                self.transport.write_eof()
                self.loop.call_later(LINGER_S, self.transport.close)
            else:
                self.transport.close()

        def _note(self, reason: str) -> None:
            metrics.dropped.labels(reason).inc()
            refusals.note(reason, getattr(self, "_peer", "unknown"), self.loop)

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is None and not self._refused:
                self._header_deadline = self.loop.call_later(
                    header_timeout_s, self._headers_too_slow
                )

        def _disarm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if not self.transport.is_closing():
                self._refuse("header_timeout", REQUEST_TIMEOUT)

    return GuardedHttpToolsProtocol
