"""Events sent to ``POST /events``: parsed (a JSON array of objects, or an Arrow IPC stream),
typed and checked by the events contract's rules as the validate stage applies them (the same
casts, defaults and quarantine reasons, in the same order), with nothing applied unless every
row passes.

A malformed body, an unknown or missing column, or a value of the wrong type is a request error
(422 naming the field); a row that breaks a contract rule gets the quarantine's reason
(``missing_customer_id``, ``invalid_event_time``, ``invalid_amount``, ``invalid_quantity``,
``duplicate_event``). The endpoint adds the online state's own (:data:`ONLINE_REASONS`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infra.storage.events_log import SEGMENT_SCHEMA
from serving.bodies import (
    IPC_STREAM_MEDIA_TYPE,
    body_format,
    unsupported_media,
)
from tasks.definitions.contract import (
    CONTRACT_COLUMNS,
    EPOCH_MILLIS_DIGITS,
    EPOCH_SECONDS_DIGITS,
    EVENT_TYPE_SYNONYMS,
    INTEGRAL_DECIMAL_ID,
    OPTIONAL_DEFAULTS,
    QUARANTINE_REASONS,
    REASON_DUPLICATE,
    REASON_INVALID_AMOUNT,
    REASON_INVALID_EVENT_TIME,
    REASON_INVALID_QUANTITY,
    REASON_MISSING_CUSTOMER_ID,
    REQUIRED_COLUMNS,
    WHOLE_DOUBLES,
)

IPC_MEDIA_TYPE = IPC_STREAM_MEDIA_TYPE
ARROW_FILE_MAGIC = b"ARROW1"
REASON_BEFORE_SNAPSHOT = "before_snapshot"
REASON_IN_THE_FUTURE = "in_the_future"
REASON_PURCHASE_OUT_OF_ORDER = "purchase_out_of_order"
ONLINE_REASONS = (REASON_BEFORE_SNAPSHOT, REASON_IN_THE_FUTURE, REASON_PURCHASE_OUT_OF_ORDER)
"""Rows the contract accepts that the online state cannot: at or before the served snapshot's
cutoff (that batch run has them), later than the clock allows, or a purchase before the
customer's last one in the log (the gaps between purchases are kept in order)."""
REASONS = QUARANTINE_REASONS + ONLINE_REASONS
REASON_FIELD = {
    REASON_MISSING_CUSTOMER_ID: "customer_id",
    REASON_INVALID_EVENT_TIME: "event_time",
    REASON_INVALID_AMOUNT: "amount",
    REASON_INVALID_QUANTITY: "quantity",
    REASON_BEFORE_SNAPSHOT: "event_time",
    REASON_IN_THE_FUTURE: "event_time",
    REASON_PURCHASE_OUT_OF_ORDER: "event_time",
}
LISTED_ROWS = 20  # refused rows named in an answer (all are counted)
INT32_MAX = 2**31 - 1
_TIME = pa.timestamp("us", tz="UTC")


class IngestError(Exception):
    """A batch that is refused whole, with its HTTP status and the problems to name."""

    def __init__(self, status: int, problems: list[dict[str, str]], **extra: object) -> None:
        super().__init__("; ".join(f"{p['field']}: {p['message']}" for p in problems))
        self.status, self.problems, self.extra = status, problems, extra


def refused(field: str, message: str, status: int = 422) -> IngestError:
    return IngestError(status, [{"field": field, "message": message}])


# parsing


def parse_events(body: bytes, content_type: str) -> pa.Table:
    """The body's events with contract column names, each column in a type the contract reads
    (event times as UTC timestamps, null where a text does not parse)."""
    form = body_format(content_type)
    if form == "arrow":
        return _parse_ipc(body)
    if form == "json":
        return _parse_json(body)
    problem = unsupported_media(content_type, ("json", "arrow"))
    raise refused(problem.field, problem.message, status=problem.status)


class _NotJson(float):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a body (Python's ``json.dumps`` writes them;
    JSON has no such numbers): kept in place so the refusal names its row and field."""

    def __new__(cls, name: str) -> _NotJson:
        value = super().__new__(cls, name)
        value.name = name
        return value


EPOCH_TIME = "whole epoch seconds (9-10 digits) or milliseconds (12-13 digits)"
_JSON_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "customer_id": ((str, int), "a string or an integer"),
    "event_time": ((str,), f"an ISO-8601 string, or {EPOCH_TIME}"),
    "amount": ((int, float), "a number"),
    "quantity": ((int, float), "a number"),
    "event_type": ((str,), "a string"),
    "category": ((str,), "a string"),
    "channel": ((str,), "a string"),
}
_SCHEMA_TYPES = {str: "string", int: "integer", float: "number"}


def event_json_schema() -> dict[str, object]:
    """JSON Schema of one event object of a JSON body (the API map's), from the types taken."""
    properties: dict[str, object] = {}
    for name, (types, wanted) in _JSON_TYPES.items():
        options = [{"type": _SCHEMA_TYPES[t]} for t in types]
        if name == "event_time":
            options.append({"type": "integer", "description": EPOCH_TIME})
        properties[name] = {"anyOf": [*options, {"type": "null"}], "description": wanted}
    return {
        "type": "object",
        "properties": properties,
        "required": list(REQUIRED_COLUMNS),
        "additionalProperties": False,
    }


def _parse_json(body: bytes) -> pa.Table:
    try:
        rows = json.loads(body, parse_constant=_NotJson)  # a UTF-8 byte-order mark is skipped
    except (ValueError, UnicodeDecodeError) as exc:
        raise refused("body", f"body is not valid JSON ({exc})") from None
    except RecursionError:
        raise refused(
            "body", "body is not valid JSON (arrays or objects nested too deep)"
        ) from None
    if not isinstance(rows, list):
        raise refused("body", "a JSON array of event objects")
    if not rows:
        raise refused("body", "no events")
    columns: dict[str, list[object]] = {c: [None] * len(rows) for c in CONTRACT_COLUMNS}
    seen: set[str] = set()
    problems: list[dict[str, str]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise refused(f"[{i}]", "an event object")
        for key, value in row.items():
            if key not in columns:
                raise refused(
                    f"[{i}].{key}", f"unknown column (known: {', '.join(CONTRACT_COLUMNS)})"
                )
            seen.add(key)
            if value is None:
                continue
            types, wanted = _JSON_TYPES[key]
            if isinstance(value, _NotJson):
                message = f"{value.name} is not a number JSON allows (send null for no value)"
                problems.append({"field": f"[{i}].{key}", "message": message})
                continue
            if key == "event_time" and isinstance(value, int) and not isinstance(value, bool):
                value = _epoch_time(value)  # _NOT_EPOCH is no str: refused below
            if isinstance(value, bool) or not isinstance(value, (*types, dt.datetime)):
                problems.append({"field": f"[{i}].{key}", "message": f"must be {wanted}"})
                continue
            columns[key][i] = value
    if problems:
        raise IngestError(422, problems[:LISTED_ROWS])
    _check_required(seen)
    ids = [v if v is None or isinstance(v, str) else str(v) for v in columns["customer_id"]]
    arrays = {
        "customer_id": pa.array(ids, pa.string()),
        "event_time": pa.array([_iso_time(v) for v in columns["event_time"]], _TIME),
        "amount": _doubles(columns["amount"], "amount"),
    }
    quantity = columns["quantity"]
    if "quantity" in seen:
        if all(v is None or isinstance(v, int) for v in quantity):
            arrays["quantity"] = _ints(quantity)
        else:
            arrays["quantity"] = _doubles(quantity, "quantity")
    for name in ("event_type", "category", "channel"):
        if name in seen:
            arrays[name] = pa.array(columns[name], pa.string())
    return pa.table(arrays)


def _doubles(values: list[object], name: str) -> pa.Array:
    try:
        return pa.array(values, pa.float64())
    except (OverflowError, pa.ArrowInvalid):
        raise refused(name, "a number beyond the range of a double") from None


def _ints(values: list[object]) -> pa.Array:
    """Whole numbers as int64, those outside its range as doubles (refused as quantities)."""
    try:
        return pa.array(values, pa.int64())
    except OverflowError:
        return _doubles(values, "quantity")


_NOT_EPOCH = object()
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _epoch_time(value: int) -> dt.datetime | object:
    """A whole number as the validate stage reads an epoch text: seconds with 9-10 digits,
    milliseconds with 12-13 (``pandas.DataFrame.to_json``'s default); ``_NOT_EPOCH`` else."""
    return _epoch_digits(str(value)) if value > 0 else _NOT_EPOCH


def _epoch_digits(text: str) -> dt.datetime | object:
    """A text of ASCII digits by the validate stage's epoch rule (its length: 9-10 seconds,
    12-13 milliseconds); ``_NOT_EPOCH`` for other texts."""
    if not (text.isascii() and text.isdigit()):
        return _NOT_EPOCH
    if len(text) in EPOCH_SECONDS_DIGITS:
        return _EPOCH + dt.timedelta(seconds=int(text))
    if len(text) in EPOCH_MILLIS_DIGITS:
        return _EPOCH + dt.timedelta(milliseconds=int(text))
    return _NOT_EPOCH


def _iso_time(value: object) -> dt.datetime | None:
    """An ISO-8601 text as an aware UTC time (naive = UTC), a text of epoch digits
    (``"1700000000"``, ``"1700000000000"``) as :func:`_epoch_digits` reads it, an epoch time
    as it is; None when it does not parse."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value
    text = str(value).strip()
    epoch = _epoch_digits(text)
    if isinstance(epoch, dt.datetime):
        return epoch
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


def _parse_ipc(body: bytes) -> pa.Table:
    """An Arrow IPC stream, or an Arrow IPC file (``ARROW1`` magic: what ``pyarrow.ipc.new_file``
    and ``pyarrow.feather.write_feather`` write), whichever Content-Type named it."""
    is_file = body[: len(ARROW_FILE_MAGIC)] == ARROW_FILE_MAGIC
    try:
        if is_file:
            table = pa.ipc.open_file(pa.py_buffer(body)).read_all()
        else:
            table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        kind = "file" if is_file else "stream"
        raise refused("body", f"body is not an Arrow IPC {kind} ({exc})") from None
    if table.num_rows == 0:
        raise refused("body", "no events")
    unknown = [c for c in table.column_names if c not in CONTRACT_COLUMNS]
    if unknown:
        raise refused(unknown[0], f"unknown column (known: {', '.join(CONTRACT_COLUMNS)})")
    if len(set(table.column_names)) != len(table.column_names):
        raise refused("body", "a column appears twice")
    _check_required(set(table.column_names))
    arrays = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        arrays[name] = _ipc_column(name, column)
    return pa.table(arrays)


def _ipc_column(name: str, column: pa.Array) -> pa.Array:
    t = column.type
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    whole = pa.types.is_integer(t)
    if name == "customer_id" and (text or whole):
        return column.cast(pa.string())
    if name == "customer_id" and pa.types.is_floating(t):
        return _float_ids(column)
    if name == "event_time":
        if pa.types.is_timestamp(t) and t.unit == "ns":
            # pandas' unit (pyarrow.Table.from_pandas): to the microsecond, as Spark reads them
            column = pc.floor_temporal(column, unit="microsecond").cast(_TIME, safe=False)
        if pa.types.is_timestamp(t) or pa.types.is_date32(t) or pa.types.is_date64(t):
            try:
                return column.cast(_TIME)
            except pa.ArrowInvalid as exc:
                raise refused(name, f"times out of range ({exc})") from None
        if text:
            return pa.array([_iso_time(v) for v in column.to_pylist()], _TIME)
        message = "timestamps (naive = UTC), dates, or ISO-8601 strings"
        raise refused(name, f"type {t}: send {message}")
    if name in ("amount", "quantity") and (whole or pa.types.is_floating(t)):
        return column if name == "quantity" and whole else column.cast(pa.float64())
    if name in ("event_type", "category", "channel") and (text or whole or pa.types.is_boolean(t)):
        return column.cast(pa.string())
    raise refused(name, f"type {t} is not one the contract reads for {name}")


def _float_ids(column: pa.Array) -> pa.Array:
    """Float ids (pandas' type for an integer id column with a gap) as validation reads them:
    a whole number as its integer text (``13085.0`` is ``13085``), NaN none (the row's
    ``missing_customer_id``); any other value is refused, naming one."""
    numbers = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
    whole = pc.and_(
        pc.equal(pc.round(numbers), numbers), pc.less(pc.abs(numbers), float(WHOLE_DOUBLES))
    )
    if not pc.all(pc.or_kleene(whole, pc.is_null(numbers))).as_py():
        bad = pc.filter(numbers, pc.invert(whole)).to_pylist()[0]
        raise refused("customer_id", f"float ids must be whole numbers, not {bad!r}: send text")
    return numbers.cast(pa.int64()).cast(pa.string())


def _check_required(present: set[str]) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in present]
    if missing:
        raise refused(missing[0], f"required column(s) {', '.join(missing)} missing")


# the contract's rules


@dataclass(frozen=True)
class CheckedEvents:
    """A batch after the contract's rules: its rows typed as the validate stage publishes
    them (:data:`infra.storage.events_log.SEGMENT_SCHEMA`) and each row's reason (:meth:`reason`)."""

    events: pa.Table
    codes: np.ndarray  # uint8 per row: 0 valid, else 1 + the reason's index in REASONS
    sent: pa.Table  # the values as sent, for naming them

    @property
    def rows(self) -> int:
        return len(self.codes)

    def reason(self, row: int) -> str | None:
        """Row ``row``'s reason, None when it is valid."""
        code = int(self.codes[row])
        return REASONS[code - 1] if code else None

    def valid(self) -> np.ndarray:
        return self.codes == 0

    def refuse_where(self, mask: np.ndarray, reason: str) -> CheckedEvents:
        """These checks with ``reason`` for the rows of ``mask`` that had none."""
        codes = self.codes.copy()
        codes[mask & (codes == 0)] = REASONS.index(reason) + 1
        return CheckedEvents(self.events, codes, self.sent)

    def counts(self) -> dict[str, int]:
        """Rows refused for each reason."""
        found = np.bincount(self.codes, minlength=len(REASONS) + 1)
        return {r: int(n) for r, n in zip(REASONS, found[1:], strict=True) if n}

    def problem(self) -> IngestError | None:
        """The refusal naming the bad rows (the first :data:`LISTED_ROWS`, all counted), or
        None when every row is valid."""
        bad = np.flatnonzero(self.codes)
        if bad.size == 0:
            return None
        counts = self.counts()
        listed = []
        for i in bad[:LISTED_ROWS].tolist():
            reason = self.reason(i)
            field = REASON_FIELD.get(reason or "")
            if field:
                table = self.sent if field in self.sent.column_names else self.events
                shown = f" ({_shown(table.column(field)[i].as_py())})"
                listed.append({"field": f"[{i}].{field}", "message": f"{reason}{shown}"})
            else:
                listed.append({"field": f"[{i}]", "message": f"{reason}"})
        summary = ", ".join(f"{n} {r}" for r, n in counts.items())
        listed.insert(
            0,
            {
                "field": "body",
                "message": f"{bad.size} of {self.rows} events refused ({summary}); "
                "nothing was applied",
            },
        )
        return IngestError(422, listed, refused=counts)


def _shown(value: object) -> str:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return "null" if value is None else repr(value)


def check_contract(raw: pa.Table, purchase_event: str | None = None) -> CheckedEvents:
    """The contract's casts, defaults and quarantine reasons (in the validate stage's order:
    customer id, event time, amount, quantity; then extra copies of a valid event);
    ``purchase_event``: the log's own name for a purchase, as the validate stage reads it."""
    n = raw.num_rows
    ids = pc.replace_substring_regex(  # as validation reads ids: "13085.0" is 13085
        pc.utf8_trim(raw.column("customer_id").combine_chunks().cast(pa.string()), " "),
        INTEGRAL_DECIMAL_ID,
        r"\1",
    )
    times = raw.column("event_time").combine_chunks()
    amount = pc.add(raw.column("amount").combine_chunks().cast(pa.float64()), 0.0)  # -0.0 -> 0.0
    columns = {
        "customer_id": ids,
        "event_time": times,
        "amount": amount,
        "event_type": _event_type_names(
            _text_or(raw, "event_type", OPTIONAL_DEFAULTS["event_type"]), purchase_event
        ),
        "category": _text_or(raw, "category", None),
        "channel": _text_or(raw, "channel", None),
    }
    bad_quantity = np.zeros(n, dtype=bool)
    if "quantity" in raw.column_names:
        columns["quantity"], bad_quantity = _quantity(raw.column("quantity").combine_chunks())
    else:
        columns["quantity"] = pa.array(np.ones(n, dtype=np.int32))
    events = pa.table([columns[c] for c in SEGMENT_SCHEMA.names], schema=SEGMENT_SCHEMA)
    rules: list[tuple[str, Callable[[], np.ndarray]]] = [
        (
            REASON_MISSING_CUSTOMER_ID,
            lambda: _flags(pc.or_kleene(pc.is_null(ids), pc.equal(ids, ""))),
        ),
        (REASON_INVALID_EVENT_TIME, lambda: _flags(pc.is_null(times))),
        (
            REASON_INVALID_AMOUNT,
            lambda: _flags(
                pc.or_kleene(
                    pc.is_null(amount),
                    pc.or_kleene(pc.invert(pc.is_finite(amount)), pc.less(amount, 0.0)),
                )
            ),
        ),
        (REASON_INVALID_QUANTITY, lambda: bad_quantity),
    ]
    codes = np.zeros(n, dtype=np.uint8)
    for reason, flags in rules:
        codes[flags() & (codes == 0)] = REASONS.index(reason) + 1
    valid = np.flatnonzero(codes == 0)
    if valid.size > 1:
        codes[_extra_copies(events, valid)] = REASONS.index(REASON_DUPLICATE) + 1
    return CheckedEvents(events, codes, raw)


def _flags(mask: pa.Array) -> np.ndarray:
    return pc.fill_null(mask, True).to_numpy(zero_copy_only=False)


_SYNONYMS = pa.array(list(EVENT_TYPE_SYNONYMS), pa.string())
_NAMES = pa.array(list(EVENT_TYPE_SYNONYMS.values()), pa.string())


def _event_type_names(types: pa.Array, purchase_event: str | None = None) -> pa.Array:
    """Event types as validation names them (``transaction`` is ``purchase``:
    :data:`EVENT_TYPE_SYNONYMS`; ``purchase_event``, any case, is ``purchase`` too:
    :func:`~tasks.definitions.contract.event_type_name`), others kept."""
    lower = pc.utf8_lower(types)
    at = pc.index_in(lower, value_set=_SYNONYMS)
    named = pc.if_else(pc.is_valid(at), pc.take(_NAMES, at), types)
    if purchase_event is None:
        return named
    own = pc.fill_null(pc.equal(lower, purchase_event.strip().lower()), False)
    return pc.if_else(own, pa.scalar("purchase", pa.string()), named)


def _text_or(raw: pa.Table, name: str, default: str | None) -> pa.Array:
    """A text column trimmed of spaces, empty or null as ``default`` (a column not sent: all
    ``default``)."""
    if name not in raw.column_names:
        return pa.array([default] * raw.num_rows, pa.string())
    text = pc.utf8_trim(raw.column(name).combine_chunks().cast(pa.string()), " ")
    empty = pc.fill_null(pc.equal(text, ""), True)
    return pc.if_else(empty, pa.scalar(default, pa.string()), text)


def _quantity(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The quantity as int32 (null: the default 1) and the rows whose given quantity is not a
    whole number from 1 to 2**31 - 1."""
    given = pc.is_valid(column).to_numpy(zero_copy_only=False)
    values = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        ok = ~given | (np.isfinite(values) & (values == np.floor(values)) & (values >= 1))
        ok &= ~given | (values <= INT32_MAX)
    whole = np.where(given & ok, values, 1.0).astype(np.int32)
    return pa.array(whole), ~ok


def _extra_copies(events: pa.Table, valid: np.ndarray) -> np.ndarray:
    """The rows among ``valid`` (positions in ``events``, ascending) that repeat an earlier
    valid row exactly (every column equal, nulls equal to nulls). Copies share their time:
    only rows that share it with another are compared whole, as rows of codes (a text's code
    in its column's distinct values, a number's bits)."""
    times = pc.fill_null(events.column("event_time").combine_chunks().cast(pa.int64()), 0)
    t = times.to_numpy(zero_copy_only=False)[valid]
    in_order = bool((t[1:] >= t[:-1]).all())  # batches are sent in time order, often
    order = np.arange(t.size) if in_order else np.argsort(t, kind="stable")
    same = t[order][1:] == t[order][:-1]
    if not same.any():
        return np.zeros(0, dtype=np.intp)
    shared = np.zeros(t.size, dtype=bool)
    shared[order[1:][same]] = True
    shared[order[:-1][same]] = True
    rows = valid[shared]
    candidates = events.take(pa.array(rows))
    keys = np.empty((rows.size, candidates.num_columns), dtype=np.int64)
    for j, column in enumerate(candidates.columns):
        keys[:, j] = _codes(column.combine_chunks())
    _, first = np.unique(keys, axis=0, return_index=True)
    copy = np.ones(rows.size, dtype=bool)
    copy[first] = False
    return rows[copy]


def _codes(column: pa.Array) -> np.ndarray:
    """Equal values as equal int64s: a text's index in its distinct values (-1 for null), a
    number's bits (the columns checked here have no null numbers; -0.0 is 0.0 already)."""
    if pa.types.is_string(column.type):
        indices = pc.dictionary_encode(column).indices
        return pc.fill_null(indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_floating(column.type):
        return column.to_numpy(zero_copy_only=False).astype(np.float64).view(np.int64)
    return column.cast(pa.int64()).to_numpy(zero_copy_only=False)
