"""The columns of the training examples and snapshots besides the features, shared by the stages
that write them (:mod:`tasks.data`) and the trainer that reads them (:mod:`tasks.ml`)."""

from __future__ import annotations

LABEL = "label"  # 1.0 when the customer purchased in the horizon after the example's cutoff
ORIGIN = "origin"  # the day of the cutoff (origin) an example was taken at (a date)
SEQUENCE_PREFIX = "seq_"  # the columns of a customer's last events before the cutoff


def sequence_columns(columns: list[str]) -> list[str]:
    """The sequence columns among ``columns`` (in their order)."""
    return [c for c in columns if c.startswith(SEQUENCE_PREFIX)]
