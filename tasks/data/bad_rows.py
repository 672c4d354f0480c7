"""The bad-rows policy of validation: a run stops (an input error naming the quarantine) when
more than ``max_bad_fraction`` of its rows were quarantined, or none is left."""

from __future__ import annotations

from typing import Protocol

from infra.errors import HybridflowInputError


class ValidationCounts(Protocol):
    """What the policy reads of a validate result."""

    @property
    def rows_read(self) -> int: ...

    @property
    def rows_valid(self) -> int: ...

    @property
    def rows_quarantined(self) -> int: ...

    @property
    def quarantine_uri(self) -> str: ...


def check_bad_fraction(result: ValidationCounts, max_bad_fraction: float) -> None:
    """Fail (input error naming the quarantine) when too many rows are bad or none is good."""
    bad_fraction = result.rows_quarantined / max(result.rows_read, 1)
    if bad_fraction > max_bad_fraction:
        raise HybridflowInputError(
            f"{result.rows_quarantined} of {result.rows_read} event rows ({bad_fraction:.1%}) "
            f"are bad, over --max-bad-fraction {max_bad_fraction:.1%}: see {result.quarantine_uri}"
        )
    if result.rows_valid == 0:
        raise HybridflowInputError(
            f"no valid events left after validation: see {result.quarantine_uri}"
        )
