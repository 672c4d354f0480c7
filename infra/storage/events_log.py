"""The events log in the store: accepted events as immutable, numbered segments.

Segment ``n`` is one Parquet file at :func:`infra.layout.events_log_segment_key` with the
validated events' columns (:data:`SEGMENT_SCHEMA`, what the validate stage publishes) and, in its
footer, a :class:`SegmentInfo` (number, segment id, content hash, rows, event time span). A
segment is written once, by a conditional create (``If-None-Match: *`` on S3, a lock and an
atomic rename in a folder), so two writers can never both take a number: the loser gets
:class:`infra.storage.store.PreconditionFailed`, reads what the winner wrote and tries the next number.
Numbers are dense (a writer only writes ``n + 1`` after reading ``n``), so a reader follows the
log by reading ``n + 1`` until it is absent. The segments folder is a plain Parquet folder: a
batch run reads it like any events input.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel

from infra.errors import HybridflowInputError, StoreError
from infra.layout import (
    EVENTS_LOG_SEGMENTS,
    events_log_reader_key,
    events_log_segment_key,
    events_log_segment_seq,
)
from infra.storage import fs
from infra.storage.store import ObjectStore

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
    # statistics for the times only (what a reader prunes by; those of the texts would double
    # the time this takes); dictionaries for the texts with few values only (most ids of a
    # batch differ: their dictionary costs time and bytes)
    pq.write_table(
        table.replace_schema_metadata(meta),
        out,
        write_statistics=["event_time"],
        use_dictionary=["event_type", "category", "channel"],
    )
    return EncodedSegment(out.getvalue(), info)


def decode_segment(seq: int, data: bytes, where: str) -> Segment:
    """Segment ``seq`` from its file's bytes (``where``: its address, for the error when it is
    not a segment)."""
    table = pq.read_table(io.BytesIO(data))
    raw = (table.schema.metadata or {}).get(INFO_KEY)
    if raw is None:
        raise StoreError(f"{where}: not a segment")
    info = SegmentInfo.model_validate_json(raw).model_copy(update={"seq": seq})
    return Segment(info, table.replace_schema_metadata(None).cast(SEGMENT_SCHEMA))


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
        :class:`infra.storage.store.PreconditionFailed` when another writer has that number already."""
        self.store.put_bytes_if(events_log_segment_key(seq), segment.data, if_none_match=True)
        return segment.info.model_copy(update={"seq": seq})

    def read(self, seq: int) -> Segment | None:
        """Segment ``seq``, None while there is none."""
        data = self.read_bytes(seq)
        return None if data is None else decode_segment(seq, data, self.segment_uri(seq))

    def read_bytes(self, seq: int) -> bytes | None:
        """Segment ``seq``'s file as written (:func:`decode_segment` reads it), None while
        there is none."""
        try:
            return self.store.get_bytes(events_log_segment_key(seq))
        except FileNotFoundError:
            return None

    def segment_uri(self, seq: int) -> str:
        return self.store.key_uri(events_log_segment_key(seq))

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


def export_segments(log: EventsLog, folder: Path, like: pa.Schema | None = None) -> list[Path]:
    """Copy the log's segments that ``folder`` lacks into it as ``segment-<n>.parquet``, so a
    batch run reads them from a folder: on their own, or beside the original events when
    ``folder`` is inside theirs. Each file is written durably under a hidden name, then
    renamed: a reader never sees half a file. ``like``: the original files' schema, whose column
    order and types the copies take (then every file of the folder has one schema and the
    validate stage reads them in process). Returns the files written."""
    if like is not None:
        missing = [name for name in SEGMENT_SCHEMA.names if name not in like.names]
        extra = [name for name in like.names if name not in SEGMENT_SCHEMA.names]
        if missing or extra:
            raise HybridflowInputError(
                f"the events log's columns ({', '.join(SEGMENT_SCHEMA.names)}) differ from "
                f"those of the files to match: missing {missing or 'none'}, extra {extra or 'none'}"
            )
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    seq = 1
    while True:
        target = folder / f"segment-{seq:012d}.parquet"
        if not target.exists():
            segment = log.read(seq)
            if segment is None:
                return written
            table = segment.events
            if like is not None:
                table = table.select(like.names).cast(
                    pa.schema([f.with_nullable(True) for f in like])
                )
            out = io.BytesIO()
            pq.write_table(table, out)
            fs.write_bytes_durably(target, out.getvalue(), str(target))
            written.append(target)
        seq += 1


LOG_SUBFOLDER = "events-log"  # where the log's segments go inside an events folder


def export_into(log: EventsLog, events_folder: Path) -> list[Path]:
    """:func:`export_segments` into ``<events_folder>/events-log/``, in the schema of the
    folder's own Parquet files (the first one's), so a run on ``events_folder`` reads the
    original events and the log's in one pass; the files written."""
    like = None
    if events_folder.is_dir():
        own = sorted(
            p
            for p in events_folder.rglob("*")
            if p.is_file()
            and not any(part.startswith((".", "_")) for part in p.relative_to(events_folder).parts)
            and p.relative_to(events_folder).parts[0] != LOG_SUBFOLDER
        )
        if own and not all(p.suffix.lower() in (".parquet", ".pq") for p in own):
            raise HybridflowInputError(
                f"{events_folder} holds files other than Parquet ({own[0].name}): the log's "
                "Parquet segments cannot join them; export them to a folder of their own"
            )
        like = pq.read_schema(own[0]).remove_metadata() if own else None
    return export_segments(log, events_folder / LOG_SUBFOLDER, like)
