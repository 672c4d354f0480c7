"""How request bodies are labelled and compressed by real clients: Content-Types read as JSON
or Arrow, and gzip/deflate bodies decompressed with the size limit on the decompressed bytes."""

from __future__ import annotations

import gzip
import zlib

import pytest

from serving.bodies import BodyProblem, body_format, content_codings, decode_body

BODY = b'[{"customer_id": "c1", "event_time": "2025-07-01T10:00:00Z", "amount": 1.5}]' * 50


@pytest.mark.parametrize(
    ("content_type", "form"),
    [
        ("application/json", "json"),
        ("application/json; charset=utf-8", "json"),
        ("APPLICATION/JSON", "json"),
        ("application/x-www-form-urlencoded", "json"),
        ("text/plain;charset=UTF-8", "json"),
        ("application/problem+json", "json"),
        ("", "json"),
        ("application/vnd.apache.arrow.stream", "arrow"),
        ("application/vnd.apache.arrow.file", "arrow"),
        ("multipart/form-data; boundary=x", None),
        ("application/xml", None),
        ("text/csv", None),
    ],
)
def test_content_types_clients_send(content_type, form):
    assert body_format(content_type) == form


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-15)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("GZIP", gzip.compress),
        ("gzip", lambda b: gzip.compress(b[:100]) + gzip.compress(b[100:]) + b"\0" * 8),
        ("deflate", zlib.compress),
        ("deflate", _raw_deflate),
        ("identity", lambda b: b),
        ("identity, gzip", gzip.compress),
        ("gzip, gzip", lambda b: gzip.compress(gzip.compress(b))),
    ],
)
def test_compressed_bodies_decode_to_what_was_sent(encoding, encode):
    assert decode_body(encode(BODY), content_codings(encoding), len(BODY)) == BODY


def test_the_limit_holds_for_the_decompressed_bytes():
    bomb = gzip.compress(b"\0" * 50_000_000, compresslevel=9)
    assert len(bomb) < 100_000
    with pytest.raises(BodyProblem) as caught:
        decode_body(bomb, ["gzip"], 1_000_000)
    assert caught.value.status == 413
    assert caught.value.message == "larger than 1000000 bytes once decompressed"
    with pytest.raises(BodyProblem, match="once decompressed"):
        decode_body(gzip.compress(BODY), ["gzip"], len(BODY) - 1)
    # a multi-member body counts every member
    with pytest.raises(BodyProblem, match="once decompressed"):
        decode_body(gzip.compress(BODY) * 2, ["gzip"], len(BODY) + 1)


@pytest.mark.parametrize(
    ("body", "encoding", "status", "text"),
    [
        (BODY, "gzip", 400, "not valid gzip data"),
        (gzip.compress(BODY, mtime=0)[:-30], "gzip", 400, "not valid gzip data (truncated)"),
        (b"\x78\x9c garbage", "deflate", 400, "not valid deflate data"),
    ],
    # named, not by their bytes: every xdist worker must collect the same ids
    ids=["not-gzip", "truncated-gzip", "broken-deflate"],
)
def test_broken_compressed_bodies_are_named(body, encoding, status, text):
    with pytest.raises(BodyProblem) as caught:
        decode_body(body, content_codings(encoding), 10**6)
    assert caught.value.status == status and text in caught.value.message


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, br"])
def test_codings_not_decoded_are_415_naming_them(encoding):
    with pytest.raises(BodyProblem) as caught:
        content_codings(encoding)
    assert caught.value.status == 415 and caught.value.field == "content-encoding"
    assert "gzip, deflate or identity" in caught.value.message
