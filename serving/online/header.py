"""An online state's header: the block (:mod:`serving.online.blocks`) through which the process
that changes the state tells the processes that read it what is changing, as a seqlock.

Words (int64): the version (odd while a change is under way), the ring's newest day, the
newest event applied, the generation of the layout (moves when an array moved to a new block),
how many rows are changing (-1: every row) and which (sorted, at most :data:`CHANGING_MAX`),
then the layout itself: which block holds which array, as JSON.

The writer lists the rows, makes the version odd, changes them, publishes the day and the
newest event, makes the version even. A reader notes the version, copies what it needs, and
keeps the copy if the version is the same afterwards (and the version was even, or odd with its
rows not among the changing ones); else it copies again. This relies on the stores of one
process being seen by another in the order they were made and loads not moving before earlier
loads (x86-64's memory order; the numpy operations that write the rows are separate calls, each
one after the version is odd and before it is even again).
"""

from __future__ import annotations

import json

import numpy as np

VERSION, RING_DAY, NEWEST, GENERATION, CHANGING, LAYOUT_LEN = range(6)
ROWS_AT = 8
CHANGING_MAX = 4_096
LAYOUT_AT = (ROWS_AT + CHANGING_MAX) * 8
LAYOUT_BYTES = 16 * 1024
HEADER_BYTES = LAYOUT_AT + LAYOUT_BYTES


class Header:
    """A state's header over a block of :data:`HEADER_BYTES` (uint8)."""

    __slots__ = ("bytes", "words", "_rows")

    def __init__(self, block: np.ndarray) -> None:
        if block.dtype != np.uint8 or block.size < HEADER_BYTES:
            raise ValueError("not a header block")
        self.bytes = block
        self.words = memoryview(block[:LAYOUT_AT]).cast("q")  # a word read costs no numpy call
        self._rows = block[ROWS_AT * 8 : LAYOUT_AT].view(np.int64)

    # the writer

    def changing(self, rows: np.ndarray | None) -> None:
        """Rows ``rows`` (sorted; None: every row) are about to change."""
        if rows is None or rows.size > CHANGING_MAX:
            self.words[CHANGING] = -1
        else:
            self._rows[: rows.size] = rows
            self.words[CHANGING] = rows.size
        version = self.words[VERSION]
        self.words[VERSION] = version + (1 if version % 2 == 0 else 2)

    def changed(self, ring_day: int, newest: int) -> None:
        """The change is made: the day and newest event published, the version even."""
        self.words[RING_DAY] = ring_day
        self.words[NEWEST] = newest
        self.words[CHANGING] = 0
        self.words[VERSION] = self.words[VERSION] + 1

    def publish_layout(self, layout: dict) -> None:
        """Name the blocks of the arrays (while every row is changing)."""
        text = json.dumps(layout, separators=(",", ":")).encode()
        if len(text) > LAYOUT_BYTES:
            raise ValueError(f"an online state layout of {len(text)} bytes: at most {LAYOUT_BYTES}")
        self.bytes[LAYOUT_AT : LAYOUT_AT + len(text)] = np.frombuffer(text, dtype=np.uint8)
        self.words[LAYOUT_LEN] = len(text)
        self.words[GENERATION] = self.words[GENERATION] + 1

    # a reader

    def may_read(self, version: int, row: int) -> bool:
        """Whether a copy of ``row`` taken at ``version`` can hold (the version even, or odd
        with ``row`` not among the changing rows)."""
        if version % 2 == 0:
            return True
        count = self.words[CHANGING]
        if count < 0:
            return False
        i = int(np.searchsorted(self._rows[:count], row))
        return not (i < count and int(self._rows[i]) == row)

    def layout(self) -> dict:
        size = self.words[LAYOUT_LEN]
        return json.loads(self.bytes[LAYOUT_AT : LAYOUT_AT + size].tobytes())
