"""Which connections the endpoint keeps open: a table of every open connection, its client and
its phase, and the rule that admits a new one.

A connection is ``waiting`` (opened, or its next request's headers are arriving), ``active`` (a
request is being read after its headers, handled or answered) or ``idle`` (kept alive between
requests). Only active connections cost the server work; the others cost a socket. So when a new
connection would go over a cap (its client's, or the endpoint's), the longest-idle connection
under that cap is closed first, then the one that has waited longest for its headers (a slow
sender: a client that sends its headers at once is never the oldest waiter for long); only when
every connection under the cap is active is the new one refused. A connection idle for less
than ``IDLE_GRACE_S`` is closed only after the waiting ones: its client may have sent its next
request already (the keep-alive race), and a busy client's connections are never idle longer.
Nothing here does I/O: the
protocol (:mod:`serving.connections`) closes what :meth:`ConnectionTable.admit` names.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Literal

Phase = Literal["waiting", "active", "idle"]
IDLE_GRACE_S = 1.0


@dataclass
class _Entry:
    client: str
    phase: Phase
    since: float


@dataclass
class Admission:
    """A new connection's fate: admitted (after closing ``evicted``, each with the phase it was
    in), or refused for ``refused`` (``client_limit`` or ``connection_limit``)."""

    evicted: list[tuple[Hashable, Phase]] = field(default_factory=list)
    refused: str | None = None

    @property
    def admitted(self) -> bool:
        return self.refused is None


class ConnectionTable:
    """Every open connection by key, with at most ``max_open`` of them and ``max_per_client``
    from one client address."""

    def __init__(self, max_open: int, max_per_client: int) -> None:
        self.max_open = max_open
        self.max_per_client = max_per_client
        self._open: dict[Hashable, _Entry] = {}
        self._by_client: dict[str, set[Hashable]] = {}
        self._phases: dict[str, int] = dict.fromkeys(("waiting", "active", "idle"), 0)

    def __len__(self) -> int:
        return len(self._open)

    def of_client(self, client: str) -> int:
        """Open connections from ``client``."""
        return len(self._by_client.get(client, ()))

    def phases(self) -> dict[str, int]:
        """How many open connections are in each phase."""
        return dict(self._phases)

    def admit(self, key: Hashable, client: str, now: float) -> Admission:
        """Make room for a new connection from ``client`` and register it as waiting, or refuse
        it. The evicted connections are already out of the table; the caller closes them."""
        admission = Admission()
        if self.of_client(client) >= self.max_per_client:
            victim = self._victim(self._by_client[client], now)
            if victim is None:
                admission.refused = "client_limit"
                return admission
            admission.evicted.append((victim, self._open[victim].phase))
            self.remove(victim)
        if len(self._open) >= self.max_open:
            victim = self._victim(self._open, now)
            if victim is None:
                admission.refused = "connection_limit"
                return admission
            admission.evicted.append((victim, self._open[victim].phase))
            self.remove(victim)
        self._open[key] = _Entry(client, "waiting", now)
        self._phases["waiting"] += 1
        self._by_client.setdefault(client, set()).add(key)
        return admission

    def set_phase(self, key: Hashable, phase: Phase, now: float) -> None:
        """``key`` entered ``phase`` at ``now`` (ignored for a connection no longer here)."""
        entry = self._open.get(key)
        if entry is not None and entry.phase != phase:
            self._phases[entry.phase] -= 1
            self._phases[phase] += 1
            entry.phase, entry.since = phase, now

    def phase(self, key: Hashable) -> Phase | None:
        """The phase of ``key``; None once it left the table."""
        entry = self._open.get(key)
        return entry.phase if entry is not None else None

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (closed, or on its way out)."""
        entry = self._open.pop(key, None)
        if entry is not None:
            self._phases[entry.phase] -= 1
            keys = self._by_client[entry.client]
            keys.discard(key)
            if not keys:
                del self._by_client[entry.client]

    def _victim(self, keys, now: float) -> Hashable | None:
        """The connection among ``keys`` to close first: the longest idle (for at least
        ``IDLE_GRACE_S``), else the longest waiting for its headers, else the longest idle;
        None when all of them are active."""
        idle, waiting = [], []
        for i, key in enumerate(keys):
            entry = self._open[key]
            if entry.phase == "idle":
                idle.append((entry.since, i, key))
            elif entry.phase == "waiting":
                waiting.append((entry.since, i, key))
        oldest_idle = min(idle, default=None)
        if oldest_idle is not None and now - oldest_idle[0] >= IDLE_GRACE_S:
            return oldest_idle[2]
        for oldest in (min(waiting, default=None), oldest_idle):
            if oldest is not None:
                return oldest[2]
        return None
