"""The columns of the training examples and snapshots besides the features, shared by the stages
that write them (:mod:`tasks.data`) and the trainer that reads them (:mod:`tasks.ml`)."""

from __future__ import annotations

LABEL = "label"  # 1.0 when the customer purchased in the horizon after the example's cutoff
ORIGIN = "origin"  # the day of the cutoff (origin) an example was taken at (a date)
SEQUENCE_PREFIX = "seq_"  # the columns of a customer's last events before the cutoff


def sequence_columns(columns: list[str]) -> list[str]:
    """The sequence columns among ``columns`` (in their order)."""
    return [c for c in columns if c.startswith(SEQUENCE_PREFIX)]


def sequence_element(column: str, position: int) -> str:
    """The model input that is position ``position`` of the list column ``column``
    (``seq_amount[3]``): how a model names the sequence values it reads, one input each."""
    return f"{column}[{position}]"


def split_element(name: str) -> tuple[str, int] | None:
    """``(column, position)`` of a :func:`sequence_element` name; None for a plain column."""
    if not name.endswith("]") or "[" not in name:
        return None
    column, _, position = name[:-1].rpartition("[")
    return (column, int(position)) if position.isdigit() and column else None


# Codes in the sequence columns (tasks/data/sequences.py writes them, a sequence model embeds
# them): 0 is padding (no event) or no value.
EVENT_TYPE_CODES: dict[str, int] = {"purchase": 1, "view": 2, "add_to_cart": 3, "return": 4}
OTHER_EVENT_TYPE = 5
CODE_BUCKETS = 1024  # category and channel values hash into 1 .. CODE_BUCKETS - 1
