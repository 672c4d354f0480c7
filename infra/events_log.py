"""The events log in the store: accepted events as immutable, numbered segments.

Segment ``n`` is one Parquet file at :func:`infra.layout.events_log_segment_key` with the
validated events' columns (:data:`SEGMENT_SCHEMA`, what the validate stage publishes) and, in its
footer, a :class:`SegmentInfo` (number, segment id, content hash, rows, event time span). A
segment is written once, by a conditional create (``If-None-Match: *`` on S3, a lock and an
atomic rename in a folder), so two writers can never both take a number: the loser gets
:class:`infra.store.PreconditionFailed`, reads what the winner wrote and tries the next number.
Numbers are dense (a writer only writes ``n + 1`` after reading ``n``), so a reader follows the
log by reading ``n + 1`` until it is absent. The segments folder is a plain Parquet folder: a
batch run reads it like any events input.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel

from infra.errors import StoreError
from infra.layout import (
    EVENTS_LOG_SEGMENTS,
    events_log_reader_key,
    events_log_segment_key,
    events_log_segment_seq,
)
from infra.store import ObjectStore

SEGMENT_SCHEMA = pa.schema(
    [
        ("customer_id", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("amount", pa.float64()),
        ("event_type", pa.string()),
        ("quantity", pa.int32()),
        ("category", pa.string()),
        ("channel", pa.string()),
    ]
)
"""The validated events' columns and types (the validate stage's output; a test holds them
equal to ``tasks.data.validation_duckdb.GOOD_EVENTS_SCHEMA``)."""
INFO_KEY = b"hybridflow.segment"


class SegmentInfo(BaseModel):
    """What a segment holds: its number (its key's), the id that makes re-sends idempotent, the
    sha256 of the request that carried it, its rows and the span of its event times
    (microseconds)."""

    seq: int = 0
    segment_id: str
    content_sha256: str
    rows: int
    first_event_us: int
    last_event_us: int
    written_at: dt.datetime


@dataclass(frozen=True)
class Segment:
    """A segment read back: its info and its events."""

    info: SegmentInfo
    events: pa.Table


@dataclass(frozen=True)
class EncodedSegment:
    """A segment's file, ready to be written under any number."""

    data: bytes
    info: SegmentInfo  # its ``seq`` is 0 until written


def encode_segment(events: pa.Table, segment_id: str, content_sha256: str) -> EncodedSegment:
    """``events`` (cast to :data:`SEGMENT_SCHEMA`) as a segment's Parquet file, its info in the
    footer (the number is the key's, so a file can be encoded before its number is known)."""
    table = events.select(SEGMENT_SCHEMA.names).cast(SEGMENT_SCHEMA)
    times = table.column("event_time").cast(pa.int64())
    info = SegmentInfo(
        seq=0,
        segment_id=segment_id,
        content_sha256=content_sha256,
        rows=table.num_rows,
        first_event_us=int(pc.min(times).as_py()),
        last_event_us=int(pc.max(times).as_py()),
        written_at=dt.datetime.now(dt.UTC),
    )
    meta = {INFO_KEY: info.model_dump_json(exclude={"seq"}).encode()}
    out = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(meta), out)
    return EncodedSegment(out.getvalue(), info)


class EventsLog:
    """The events log of one store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @property
    def uri(self) -> str:
        """The segments folder (a Parquet folder for a batch run's ``--events``)."""
        return self.store.key_uri(EVENTS_LOG_SEGMENTS)

    def append(
        self, seq: int, events: pa.Table, segment_id: str, content_sha256: str
    ) -> SegmentInfo:
        """Write ``events`` as segment ``seq`` (:meth:`encode`, then :meth:`put`)."""
        return self.put(seq, encode_segment(events, segment_id, content_sha256))

    def put(self, seq: int, segment: EncodedSegment) -> SegmentInfo:
        """Write an encoded segment as number ``seq``, durably, once;
        :class:`infra.store.PreconditionFailed` when another writer has that number already."""
        self.store.put_bytes_if(events_log_segment_key(seq), segment.data, if_none_match=True)
        return segment.info.model_copy(update={"seq": seq})

    def read(self, seq: int) -> Segment | None:
        """Segment ``seq``, None while there is none."""
        try:
            data = self.store.get_bytes(events_log_segment_key(seq))
        except FileNotFoundError:
            return None
        table = pq.read_table(io.BytesIO(data))
        raw = (table.schema.metadata or {}).get(INFO_KEY)
        if raw is None:
            raise StoreError(f"{self.store.key_uri(events_log_segment_key(seq))}: not a segment")
        info = SegmentInfo.model_validate_json(raw).model_copy(update={"seq": seq})
        return Segment(info, table.replace_schema_metadata(None).cast(SEGMENT_SCHEMA))

    def read_info(self, seq: int) -> SegmentInfo | None:
        """Segment ``seq``'s info (its footer only where the store is a folder), None while
        there is none."""
        key = events_log_segment_key(seq)
        local = self.store.local_path(key)
        try:
            source = local if local is not None else io.BytesIO(self.store.get_bytes(key))
            schema = pq.read_schema(source)
        except FileNotFoundError:
            return None
        raw = (schema.metadata or {}).get(INFO_KEY)
        if raw is None:
            raise StoreError(f"{self.store.key_uri(key)}: not a segment")
        return SegmentInfo.model_validate_json(raw).model_copy(update={"seq": seq})

    def head(self) -> int:
        """The newest segment's number (0 for an empty log), from a listing."""
        seqs = [
            s for key in self.store.list(EVENTS_LOG_SEGMENTS) if (s := events_log_segment_seq(key))
        ]
        return max(seqs, default=0)

    def reader_position(self, reader: str) -> int:
        """The last segment ``reader`` recorded as done (0 when it never did)."""
        try:
            return int(json.loads(self.store.get_bytes(events_log_reader_key(reader)))["seq"])
        except FileNotFoundError:
            return 0

    def record_reader_position(self, reader: str, seq: int) -> None:
        """Record that ``reader`` is done with every segment up to ``seq``."""
        body = {"seq": seq, "at": dt.datetime.now(dt.UTC).isoformat()}
        self.store.put_bytes(events_log_reader_key(reader), json.dumps(body).encode())
