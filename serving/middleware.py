"""Pure-ASGI middleware: request-body limits and request metrics for every route.

The body is read here, up to the size limit (413), whether or not a Content-Length was sent
(chunked uploads are counted as they arrive), within a deadline (408), and replayed to the app;
nothing over the limit is buffered. A ``Content-Encoding: gzip`` or ``deflate`` body is
decompressed here, the same limit applied to the decompressed bytes (413 as soon as they pass
it), so the app sees plain bodies only. A client that goes away mid-body is recorded as 499
("client closed request") and the app never sees a half body.

A path's trailing slashes are dropped first (``POST /predict/`` is ``POST /predict``, with its
limit, token check and metrics label): a redirect would be an empty 307 to clients that do not
follow redirects (httpx by default, curl without ``-L``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from serving.bodies import BodyProblem, content_codings, decode_body
from serving.metrics import ServingMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


Guard = Callable[[str], BodyProblem | None]
"""A route's check of a request's ``Authorization`` header before its body is read: the
refusal, or None to read it."""
CLIENT_GONE = 499  # nginx's "client closed request": no response could be sent
INLINE_DECODE_BYTES = 64 * 1024  # larger compressed bodies are decompressed in a thread


class BodyTooLarge(Exception):
    """The body (declared or received) exceeds the limit."""


class ClientGone(Exception):
    """The client disconnected before its body was complete."""


class LimitsAndMetrics:
    """Refuse bodies over ``max_body_bytes`` (413) or slower than ``body_timeout_s`` (408);
    count and time every HTTP request."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: ServingMetrics,
        max_body_bytes: int,
        body_timeout_s: float,
        route_body_bytes: dict[str, int] | None = None,
        route_guards: dict[tuple[str, str], Guard] | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.route_body_bytes = route_body_bytes or {}  # a route's own limit (POST /events)
        self.route_guards = route_guards or {}  # (method, path): checked before the body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = unslashed(scope)
        started = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        limit = self.route_body_bytes.get(scope["path"], self.max_body_bytes)
        try:
            try:
                guard = self.route_guards.get((scope["method"], scope["path"]))
                if guard is not None and (refusal := guard(_header(scope, b"authorization"))):
                    raise refusal
                codings = content_codings(_header(scope, b"content-encoding"))
                async with asyncio.timeout(self.body_timeout_s):
                    body = await self._read_body(scope, receive, limit)
                if codings:
                    body = await _decoded(body, codings, limit)
                    scope = _plain_scope(scope, len(body))
            except BodyProblem as exc:
                await _send_problem(send_and_note, exc.status, exc.message, exc.field, exc.headers)
                return
            except BodyTooLarge:
                await _send_problem(send_and_note, 413, f"larger than {limit} bytes")
                return
            except TimeoutError:
                self.metrics.dropped.labels("body_timeout").inc()
                message = f"not received within {self.body_timeout_s:g}s"
                await _send_problem(send_and_note, 408, message)
                return
            except ClientGone:
                self.metrics.dropped.labels("client_gone").inc()
                status = CLIENT_GONE
                return
            await self.app(scope, _replay(body, receive), send_and_note)
        finally:
            self.metrics.observe(scope["path"], status, time.perf_counter() - started)

    async def _read_body(self, scope: Scope, receive: Receive, limit: int) -> bytes:
        """The whole body; BodyTooLarge over ``limit`` (declared or actual), ClientGone when
        the client disconnects before its end."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    if int(value) > limit:
                        raise BodyTooLarge
                except ValueError:
                    raise BodyTooLarge from None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def unslashed(scope: Scope) -> Scope:
    """The scope with its path's trailing slashes dropped (``/predict/`` -> ``/predict``;
    ``/`` stays)."""
    path = scope["path"]
    if len(path) < 2 or not path.endswith("/"):
        return scope
    bare = path.rstrip("/") or "/"
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        raw_bare = raw.rstrip(b"/") or b"/"
        return {**scope, "path": bare, "raw_path": raw_bare}
    return {**scope, "path": bare}


def _header(scope: Scope, name: bytes) -> str:
    """A request header's values joined by commas ('' when absent)."""
    values = [v.decode("latin-1") for n, v in scope.get("headers", ()) if n == name]
    return ", ".join(values)


async def _decoded(body: bytes, codings: list[str], limit: int) -> bytes:
    """The body decompressed (zlib lets the event loop run while a large one inflates)."""
    if len(body) <= INLINE_DECODE_BYTES:
        return decode_body(body, codings, limit)
    return await asyncio.to_thread(decode_body, body, codings, limit)


def _plain_scope(scope: Scope, size: int) -> Scope:
    """The scope as if the decoded body had been sent: no Content-Encoding, its length."""
    drop = (b"content-encoding", b"content-length", b"transfer-encoding")
    headers = [(n, v) for n, v in scope.get("headers", ()) if n not in drop]
    return {**scope, "headers": [*headers, (b"content-length", str(size).encode())]}


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_problem(
    send: Send,
    status: int,
    message: str,
    field: str = "body",
    headers: dict[str, str] | None = None,
) -> None:
    """An error answer about the body that closes the connection (the rest of the body, if
    any, is not read: a client that sent ``Expect: 100-continue`` never sends it)."""
    await _send_json(
        send,
        status,
        {"detail": f"{field}: {message}", "errors": [{"field": field, "message": message}]},
        headers,
    )


async def _send_json(
    send: Send, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    body = json.dumps(payload).encode()
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
