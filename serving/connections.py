"""Connection-level guards uvicorn does not have: a deadline for a request's headers.

uvicorn closes idle kept-alive connections, but a client that opens a connection and sends its
headers a byte at a time (or never finishes them) holds the connection for as long as it likes.
The protocol below gives every request ``header_timeout_s`` from its first byte (or from the
connection's opening) to its last header line; past that it answers 408 and closes. Connections
refused by uvicorn's connection limit (``limit_concurrency``, answered 503) are counted too.
The body's deadline is the middleware's (:mod:`serving.middleware`), as the app reads it.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.metrics import ServingMetrics

REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 26\r\nconnection: close\r\n\r\nrequest headers too slow\r\n"
)


def guarded_protocol(metrics: ServingMetrics, header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header deadline, counting what it drops."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_header_deadline()  # the next request on a kept-alive connection

        def on_headers_complete(self) -> None:
            self._disarm_header_deadline()
            limit = self.limit_concurrency
            if limit is not None and max(len(self.connections), len(self.tasks)) >= limit:
                metrics.dropped.labels("connection_limit").inc()  # uvicorn answers 503
            super().on_headers_complete()

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is None:
                self._header_deadline = self.loop.call_later(
                    header_timeout_s, self._headers_too_slow
                )

        def _disarm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if self.transport.is_closing():
                return
            metrics.dropped.labels("header_timeout").inc()
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()

    return GuardedHttpToolsProtocol
