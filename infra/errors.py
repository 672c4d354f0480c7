"""The one error type for problems a user can cause and fix (bad input, bad parameters)."""

from __future__ import annotations


class HybridflowInputError(Exception):
    """Bad input or parameters: the CLI prints the message on one line and exits with code 2."""


class StoreError(Exception):
    """The artifact store failed (after retries) or holds something that does not verify."""


class ChecksumMismatchError(StoreError):
    """An object's bytes do not match the sha256 recorded for it."""
