"""Connections of the control plane: how many a client may hold, and for how long.

- :class:`ConnectionGuard` (uvicorn's HTTP protocol): at most ``max_connections`` open
  connections, kept below the process's file-descriptor limit so that ``accept`` never runs
  out of descriptors. A new connection past the bound closes the oldest *idle* one (no
  request in progress: a client that connected and sent nothing, or a kept-alive one), so
  a flood of half-open connections can never keep ``/healthz`` and ``/readyz`` from being
  answered; a connection idle for ``read_timeout_s`` (no complete request header) is closed.
  One whose client reads none of its answers (bytes unsent, none read: e.g. pipelined
  requests never read, which keep it busy for ever) is closed after ``read_timeout_s``
  too, and first to make room when no connection is idle, so that such clients cannot
  hold every connection either.
- :class:`RateLimitFilter`: a logging filter that lets one record of a kind through per
  interval, counting the rest (accept errors, "Too many open files", invalid requests).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import resource
import time
from collections import OrderedDict
from collections.abc import Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 1024
READ_TIMEOUT_S = 10.0
BACKLOG = 128  # connections the kernel queues before accept (uvicorn's default is 2048)
FD_RESERVE = 256  # descriptors kept for everything but connections (RocksDB, Triton, Kafka)
SWEEP_S = 1.0
LOG_INTERVAL_S = 10.0


def fd_bound(max_connections: int, backlog: int = BACKLOG) -> int:
    """``max_connections`` lowered so that connections, plus a full accept batch and
    :data:`FD_RESERVE` (or a quarter of the limit if more), stay under ``RLIMIT_NOFILE``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    reserve = max(FD_RESERVE, soft // 4) + backlog + 1
    return max(8, min(max_connections, soft - reserve))


class ConnectionGuard:
    """Bounds the open connections of one uvicorn server. ``protocol()`` is the HTTP
    protocol class to serve with.

    A connection is *idle* with no request in progress and nothing left to send, *busy*
    with a request in progress, and *stalled* when bytes of its answers wait unsent, their
    count unchanged, for ``read_timeout_s``. Bytes wait in the transport
    (``get_write_buffer_size``) only when the kernel's socket buffer is full, so an
    unchanged count means the client read nothing meanwhile; past the transport's
    high-water mark uvicorn's next write waits for the client to read (its
    ``flow.write_paused``, ``flow.drain()``), so a client that pipelines requests and never
    reads keeps its connection busy for ever. Closed:

    - past ``max_connections``, to make room: the oldest idle one, else the one whose
      unsent bytes waited longest, else the new one (``evicted``, ``refused``);
    - idle for ``read_timeout_s`` (``timed_out``);
    - stalled (``stalled``): a client reading a large answer slowly, some of it between two
      looks (:data:`SWEEP_S`), is not.

    A connection closed with bytes unsent is aborted (``transport.abort``): ``close`` would
    wait, holding its descriptor, for a client that never reads them."""

    def __init__(self, max_connections: int, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        # open connections, oldest first -> monotonic time since which it is idle (None: busy
        # or sending)
        self._open: OrderedDict[H11Protocol, float | None] = OrderedDict()
        # connections with bytes unsent at the last look -> (since when that count is
        # unchanged, the count)
        self._unsent: dict[H11Protocol, tuple[float, int]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._logged = 0.0
        self.evicted = 0  # idle (else stalled-looking) connections closed to make room
        self.refused = 0  # new connections closed: every open one was busy, none sending
        self.timed_out = 0  # idle past read_timeout_s
        self.stalled = 0  # bytes unsent, none read, past read_timeout_s

    @property
    def open(self) -> int:
        return len(self._open)

    @property
    def sending(self) -> int:
        """Open connections with bytes of their answers unsent at the last look (their
        client reads slower than they are written, or not at all)."""
        return len(self._unsent)

    def protocol(self) -> type[H11Protocol]:
        guard = self

        class GuardedH11Protocol(H11Protocol):
            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
                super().connection_made(transport)
                guard.opened(self)

            def connection_lost(self, exc: Exception | None) -> None:
                guard._forget(self)
                super().connection_lost(exc)

        return GuardedH11Protocol

    @staticmethod
    def _busy(conn: H11Protocol) -> bool:
        cycle = conn.cycle
        return cycle is not None and not cycle.response_complete

    @staticmethod
    def _unsent_bytes(conn: H11Protocol) -> int:
        return conn.transport.get_write_buffer_size()

    def opened(self, conn: H11Protocol) -> None:
        self._open[conn] = time.monotonic()
        if self._sweeper is None:
            self._sweeper = conn.loop.call_later(SWEEP_S, self._sweep, conn.loop)
        if len(self._open) <= self.max_connections:
            return
        victim = self._victim(conn)
        if victim is conn:
            self.refused += 1
        else:
            self.evicted += 1
        self._close(victim)
        now = time.monotonic()
        if now - self._logged >= LOG_INTERVAL_S:
            self._logged = now
            log.warning(
                "%d connections open (the limit): closing the oldest idle ones, else those "
                "whose answers go unread (%d closed, %d refused so far)",
                self.max_connections,
                self.evicted,
                self.refused,
            )

    def _victim(self, new: H11Protocol) -> H11Protocol:
        """The connection to close for ``new``: the oldest idle one, else the one whose
        unsent bytes waited longest, else ``new`` itself."""
        sending = []
        for c in self._open:
            if c is new:
                continue
            if self._unsent_bytes(c):
                sending.append(c)
            elif not self._busy(c):
                return c
        if not sending:
            return new
        now = time.monotonic()
        return min(sending, key=lambda c: self._unsent.get(c, (now, 0))[0])

    def _forget(self, conn: H11Protocol) -> None:
        self._open.pop(conn, None)
        self._unsent.pop(conn, None)

    def _close(self, conn: H11Protocol) -> None:
        unsent = self._unsent_bytes(conn)
        self._forget(conn)
        if unsent:
            conn.transport.abort()  # close() would wait for the client to read them
        else:
            conn.transport.close()

    def _stalled(self, conn: H11Protocol, unsent: int, now: float) -> bool:
        """``unsent`` bytes, the same count as at the last looks, for longer than the
        timeout; a count that changed starts the wait again."""
        seen = self._unsent.get(conn)
        if seen is None or seen[1] != unsent:
            self._unsent[conn] = (now, unsent)
            return False
        return now - seen[0] > self.read_timeout_s

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close connections idle (no request in progress, nothing to send), or stalled
        (bytes unsent, none read), for longer than the timeout."""
        now = time.monotonic()
        expired = []
        stalled = []
        for conn, since in self._open.items():
            unsent = self._unsent_bytes(conn)
            if unsent:
                self._open[conn] = None
                if self._stalled(conn, unsent, now):
                    stalled.append(conn)
                continue
            self._unsent.pop(conn, None)
            if self._busy(conn):
                self._open[conn] = None
            elif since is None:
                self._open[conn] = now
            elif now - since > self.read_timeout_s:
                expired.append(conn)
        for conn in expired:
            self.timed_out += 1
            self._close(conn)
        for conn in stalled:
            self.stalled += 1
            self._close(conn)
        if stalled and now - self._logged >= LOG_INTERVAL_S:
            self._logged = now
            log.warning(
                "closed %d connections whose answers went unread for %.0f s (%d so far)",
                len(stalled),
                self.read_timeout_s,
                self.stalled,
            )
        self._sweeper = loop.call_later(SWEEP_S, self._sweep, loop) if self._open else None


# -- logs ----------------------------------------------------------------------------------


def resource_exhaustion(record: logging.LogRecord) -> bool:
    """Records about accept failing or descriptors running out, and invalid requests."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS):
        return True
    text = record.getMessage()
    return any(
        s in text for s in ("out of system resource", "Too many open files", "Invalid HTTP request")
    )


class RateLimitFilter(logging.Filter):
    """Lets one record of each kind (logger, first line) that ``match`` selects through per
    ``interval_s``; the next one let through says how many were dropped meanwhile."""

    def __init__(
        self,
        match: Callable[[logging.LogRecord], bool] = resource_exhaustion,
        interval_s: float = LOG_INTERVAL_S,
    ) -> None:
        super().__init__()
        self.match = match
        self.interval_s = interval_s
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.match(record):
            return True
        # numbers aside: "failed (after 0ms ...)" and "(after 3ms ...)" are one kind
        key = (record.name, _DIGITS.sub("#", record.getMessage().split("\n", 1)[0][:200]))
        now = time.monotonic()
        last, dropped = self._seen.get(key, (float("-inf"), 0))
        if now - last < self.interval_s:
            self._seen[key] = (last, dropped + 1)
            return False
        if len(self._seen) > 1000:  # kinds are few; never let the table itself grow
            self._seen.clear()
        self._seen[key] = (now, 0)
        if dropped:
            record.msg = f"{record.getMessage()} ({dropped} more like it not logged)"
            record.args = ()
        return True


_DIGITS = re.compile(r"\d+")
LIMITED_LOGGERS = ("asyncio", "uvicorn.error", "uvicorn")
DRIVER_LOGGER = "hps.updates.librdkafka"  # the Kafka clients' lines (hps.updates.kafka)


def limit_repeated_logs(interval_s: float = LOG_INTERVAL_S) -> RateLimitFilter:
    """Install one :class:`RateLimitFilter` on the loggers accept errors come from, and one
    for every line of the Kafka clients (a broker down: dozens of alike lines a read)."""
    flt = RateLimitFilter(interval_s=interval_s)
    for name in LIMITED_LOGGERS:
        logging.getLogger(name).addFilter(flt)
    logging.getLogger(DRIVER_LOGGER).addFilter(
        RateLimitFilter(lambda record: True, interval_s=interval_s)
    )
    return flt
