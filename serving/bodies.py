"""What a request body is, as HTTP clients label it: the media type (JSON or Arrow IPC) from
``Content-Type`` and the compression from ``Content-Encoding``, decompressed within the size
limit.

Clients label JSON in many ways: ``curl -d`` sends ``application/x-www-form-urlencoded``,
``fetch()`` with a string body ``text/plain;charset=UTF-8``, some ``application/json;
charset=utf-8`` or a ``+json`` type, some nothing at all. The body is what it is: those are read
as JSON (a real form body then fails as invalid JSON, naming the position). A type that cannot
be JSON (``multipart/form-data``, XML, CSV) is 415 naming the types taken.
"""

from __future__ import annotations

import zlib
from typing import Literal

JSON_MEDIA_TYPE = "application/json"
IPC_STREAM_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
IPC_FILE_MEDIA_TYPE = "application/vnd.apache.arrow.file"
JSON_LABELS = frozenset(
    {
        "",  # no Content-Type
        JSON_MEDIA_TYPE,
        "text/json",
        "text/plain",  # fetch() / XMLHttpRequest with a string body
        "application/x-www-form-urlencoded",  # curl -d, wget --post-data
    }
)
ARROW_LABELS = frozenset({IPC_STREAM_MEDIA_TYPE, IPC_FILE_MEDIA_TYPE, "application/x-apache-arrow"})
ENCODINGS = ("gzip", "deflate", "identity")

BodyFormat = Literal["json", "arrow"]


class BodyProblem(Exception):
    """A body that cannot be read as sent (or must not be read: no token), with its HTTP status,
    the header or part to blame and the answer's own headers."""

    def __init__(
        self, status: int, field: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{field}: {message}")
        self.status, self.field, self.message = status, field, message
        self.headers = headers or {}


def media_type(content_type: str) -> str:
    """``'Application/JSON; charset=UTF-8'`` -> ``'application/json'``."""
    return content_type.split(";", 1)[0].strip().lower()


def body_format(content_type: str) -> BodyFormat | None:
    """``json`` or ``arrow`` for a Content-Type, None for one that is neither."""
    media = media_type(content_type)
    if media in JSON_LABELS or media.endswith("+json"):
        return "json"
    if media in ARROW_LABELS:
        return "arrow"
    return None


def unsupported_media(content_type: str, formats: tuple[BodyFormat, ...]) -> BodyProblem:
    """415 naming the Content-Type sent and the ones to send instead."""
    wanted = {"json": JSON_MEDIA_TYPE, "arrow": f"{IPC_STREAM_MEDIA_TYPE} (or .file)"}
    send = " or ".join(wanted[f] for f in formats)
    return BodyProblem(415, "content-type", f"{media_type(content_type)!r}: send {send}")


def content_codings(content_encoding: str) -> list[str]:
    """The codings of a Content-Encoding header in the order they were applied (``identity``
    dropped); 415 naming one this endpoint does not decode."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    codings = ["gzip" if c == "x-gzip" else c for c in codings]
    for coding in codings:
        if coding not in ENCODINGS:
            raise BodyProblem(
                415,
                "content-encoding",
                f"{coding!r}: send a body that is gzip, deflate or identity (not compressed)",
            )
    return [c for c in codings if c != "identity"]


def decode_body(body: bytes, codings: list[str], limit: int) -> bytes:
    """``body`` with its codings undone (last applied first); 413 as soon as the decoded bytes
    pass ``limit`` (a gzip bomb costs ``limit`` bytes, never more), 400 for data that is not
    what the coding says."""
    for coding in reversed(codings):
        body = _inflate(body, coding, limit)
    return body


def _inflate(data: bytes, coding: str, limit: int) -> bytes:
    """One coding undone: gzip (every member of a multi-member file) or deflate (zlib-wrapped
    as RFC 9110 says, or raw as some clients send it)."""
    wbits = 31 if coding == "gzip" else 15
    if coding == "deflate" and not _zlib_header(data):
        wbits = -15  # raw deflate, as some clients send it
    out: list[bytes] = []
    size = 0
    while data:
        inflater = zlib.decompressobj(wbits)
        try:
            chunk = inflater.decompress(data, limit + 1 - size)
        except zlib.error as exc:
            raise BodyProblem(400, "body", f"not valid {coding} data ({exc})") from None
        size += len(chunk)
        if size > limit or inflater.unconsumed_tail:
            raise BodyProblem(413, "body", f"larger than {limit} bytes once decompressed")
        if not inflater.eof:
            raise BodyProblem(400, "body", f"not valid {coding} data (truncated)")
        out.append(chunk)
        # the next gzip member, if any (zero padding after the last is ignored, as gzip does)
        data = inflater.unused_data.lstrip(b"\x00") if coding == "gzip" else b""
    return b"".join(out)


def _zlib_header(data: bytes) -> bool:
    """Whether ``data`` starts with a zlib header (deflate, its check bits right)."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
