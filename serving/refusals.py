"""Refused connections and requests in the log: one WARNING line per interval with the counts by
reason and the busiest clients, never one line per refusal (a flood of bad clients must not
flood the log too). The counts per refusal are in ``/metrics`` as they happen."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter

log = logging.getLogger("serving.refusals")
TOP_CLIENTS = 3


class RefusalLog:
    """Counts refusals by reason and client; :meth:`note` logs at most one line per
    ``interval_s`` (the first refusal after a quiet interval at once, the rest when the
    interval is over)."""

    def __init__(self, interval_s: float, logger: logging.Logger = log) -> None:
        self.interval_s = interval_s
        self.logger = logger
        self.reasons: Counter[str] = Counter()
        self.clients: Counter[str] = Counter()
        self.last_line = -math.inf
        self._timer: asyncio.TimerHandle | None = None

    def note(self, reason: str, client: str, loop: asyncio.AbstractEventLoop) -> None:
        """One refusal for ``reason`` of a connection from ``client``."""
        self.reasons[reason] += 1
        self.clients[client] += 1
        now = loop.time()
        if self._timer is not None:
            return
        if now - self.last_line >= self.interval_s:
            self.flush(now)
        else:
            self._timer = loop.call_later(
                self.last_line + self.interval_s - now, lambda: self.flush(loop.time())
            )

    def flush(self, now: float) -> None:
        """Log the counts since the last line (if any) and start a new interval."""
        self._timer = None
        if not self.reasons:
            return
        total = sum(self.reasons.values())
        reasons = ", ".join(f"{n} {reason}" for reason, n in self.reasons.most_common())
        busiest = ", ".join(f"{c} ({n})" for c, n in self.clients.most_common(TOP_CLIENTS))
        since = "" if math.isinf(self.last_line) else f" in the last {now - self.last_line:.0f}s"
        self.logger.warning(
            "refused %d connection%s or request%s%s: %s; busiest clients: %s",
            total,
            "" if total == 1 else "s",
            "" if total == 1 else "s",
            since,
            reasons,
            busiest,
        )
        self.reasons.clear()
        self.clients.clear()
        self.last_line = now
