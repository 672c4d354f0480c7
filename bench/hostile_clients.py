"""Hostile HTTP clients for the serving soak, in one background thread: idle kept-alive
connections, slowloris senders (headers trickled a byte a second, never finished) and header
floods (megabytes of one header), each from its own loopback addresses (127.0.6.x, 127.0.7.x,
127.0.8.1) so that the endpoint's per-client cap sees them as the separate clients they would
be. Whatever the endpoint closes is opened again (at most ``reopen_per_tick`` a tick), so the
pressure lasts the whole soak. :meth:`HostileClients.stop` returns what happened to them.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections import Counter

IDLE_REQUEST = b"GET /health HTTP/1.1\r\nHost: soak\r\n\r\n"
SLOW_START = b"GET /health HTTP/1.1\r\nHost: soak\r\nX-Slow: "
TICK_S = 0.25


class HostileClients:
    """``idle`` idle connections and ``slowloris`` slow senders, ``per_address`` per source
    address, and one header flood of ``flood_bytes`` every ``flood_every_s``."""

    def __init__(
        self,
        url: str,
        idle: int = 300,
        slowloris: int = 300,
        per_address: int = 50,
        flood_bytes: int = 4 * 1024 * 1024,
        flood_every_s: float = 0.5,
        reopen_per_tick: int = 40,
    ) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.address = (host, int(port))
        self.idle_target, self.slow_target = idle, slowloris
        self.per_address = per_address
        self.flood_bytes, self.flood_every_s = flood_bytes, flood_every_s
        self.reopen_per_tick = reopen_per_tick
        self.counts: Counter[str] = Counter()
        self._idle: list[socket.socket] = []
        self._slow: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-clients", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> dict[str, int]:
        """Stop, close every connection; the counts."""
        self._stop.set()
        self._thread.join(timeout=60)
        for sock in self._idle + self._slow:
            sock.close()
        return dict(sorted(self.counts.items()))

    def _run(self) -> None:
        last_trickle = last_flood = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            self._reap(self._idle, "idle")
            self._reap(self._slow, "slowloris")
            self._refill_idle()
            self._refill_slow()
            if now - last_trickle >= 1.0:
                self._trickle()
                last_trickle = now
            if now - last_flood >= self.flood_every_s:
                self._flood()
                last_flood = now
            self._stop.wait(TICK_S)

    def _connect(self, source: str) -> socket.socket | None:
        try:
            return socket.create_connection(self.address, timeout=5, source_address=(source, 0))
        except OSError:
            self.counts["connect_failed"] += 1
            return None

    def _source(self, prefix: str, i: int) -> str:
        return f"{prefix}.{i // self.per_address + 1}"

    def _refill_idle(self) -> None:
        for _ in range(min(self.reopen_per_tick, self.idle_target - len(self._idle))):
            sock = self._connect(self._source("127.0.6", len(self._idle)))
            if sock is None:
                return
            try:
                sock.sendall(IDLE_REQUEST)
                answer = _response(sock)
            except OSError:
                answer = b""
            if answer.startswith(b"HTTP/1.1 200 "):
                self.counts["idle_opened"] += 1
                self._idle.append(sock)
            else:
                self.counts[f"idle_refused_{answer[9:12].decode() or 'closed'}"] += 1
                sock.close()

    def _refill_slow(self) -> None:
        for _ in range(min(self.reopen_per_tick, self.slow_target - len(self._slow))):
            sock = self._connect(self._source("127.0.7", len(self._slow)))
            if sock is None:
                return
            try:
                sock.sendall(SLOW_START)
            except OSError:
                sock.close()
                continue
            self.counts["slowloris_opened"] += 1
            self._slow.append(sock)

    def _reap(self, socks: list[socket.socket], kind: str) -> None:
        """Drop the connections the server answered or closed, counting its answers."""
        if not socks:
            return
        poller = select.poll()
        by_fd = {sock.fileno(): sock for sock in socks}
        for fd in by_fd:
            poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        for fd, _ in poller.poll(0):
            sock = by_fd[fd]
            try:
                answer = sock.recv(65536)
            except OSError:
                answer = b""
            status = answer[9:12].decode(errors="replace") if answer else "closed"
            self.counts[f"{kind}_closed_by_server_{status}"] += 1
            socks.remove(sock)
            sock.close()

    def _trickle(self) -> None:
        for sock in list(self._slow):
            try:
                sock.send(b"a")
            except OSError:
                self.counts["slowloris_closed_by_server_reset"] += 1
                self._slow.remove(sock)
                sock.close()

    def _flood(self) -> None:
        sock = self._connect("127.0.8.1")
        if sock is None:
            return
        chunk = b"a" * 65536
        with sock:
            sent = 0
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: soak\r\nX-Flood: ")
                while sent < self.flood_bytes:
                    sock.sendall(chunk)
                    sent += len(chunk)
            try:
                answer = sock.recv(65536)
            except OSError:
                answer = b""
            self.counts["floods"] += 1
            self.counts[f"floods_{answer[9:12].decode() if answer else 'reset'}"] += 1


def _response(sock: socket.socket) -> bytes:
    """One whole response (headers and its Content-Length of body); what came before a close."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return data
