"""Jobs finished per minute, per queue, counted by the workers in the queue store.

A worker of a remote connection (database, redis, sqs, cloudflare) counts each job it
finishes (done, failed, retried or released) in memory and adds the counts to per-minute
keys of the app's queue store at most every few seconds, so a job costs a dict update,
not a store write. ``haze queue:stats`` and ``queue:top`` read the last five minutes;
the dashboard charts the last hour, with the failed jobs counted apart (``:failed``
keys) for its failure rate, and the percentiles of wait time (dispatch to start) and
of runtime per job name (per connection, whatever the queue), from bucket counts per
ten-minute window (``LATENCY_BUCKETS``;
a percentile is reported as the upper bound of its bucket). Every key lives
``HAZE_METRICS_RETENTION`` (a duration, default ``2h``, at most ``7d``), so the series
stays bounded.
The store must be one every process shares (redis or database); with a process-local
store there is nothing to read, and the commands say so.

>>> minute_key("redis", "emails", 29_000_000)
'haze:throughput:redis:emails:29000000'
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from haze._base.errors import ConfigError, HazeError

if TYPE_CHECKING:
    from haze._engine.view import EngineApp

__all__ = [
    "FLUSH_EVERY",
    "LATENCY_BUCKETS",
    "RETENTION_ENV",
    "WINDOW",
    "Latency",
    "Tally",
    "minute_key",
    "per_minute",
    "retention",
    "runtimes",
    "series",
    "wait_time",
]

log = logging.getLogger("haze")

#: Seconds between two writes of a worker's counts.
FLUSH_EVERY = 5.0
#: Minutes ``per_minute`` averages over.
WINDOW = 5
_KEEP = 2 * 3600  # seconds a minute's key lives, unless HAZE_METRICS_RETENTION says
#: The environment variable of the retention (a duration).
RETENTION_ENV = "HAZE_METRICS_RETENTION"
_MAX_KEEP = 7 * 86400
_monotonic = time.monotonic


def minute_key(connection: str, queue: str, minute: int, kind: str = "") -> str:
    """The key of one minute's count (``kind="failed"``: the failed jobs among them)."""
    return f"haze:throughput:{connection}:{queue}:{minute}" + (f":{kind}" if kind else "")


#: Upper bounds (seconds) of the wait-time and runtime buckets; the last is open.
LATENCY_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, math.inf,
)  # fmt: skip
#: Minutes per latency window.
_SPAN = 10


def _bucket(seconds: float) -> int:
    return bisect.bisect_left(LATENCY_BUCKETS, max(0.0, seconds))


def _window_key(connection: str, queue: str, window: int, kind: str) -> str:
    return f"haze:throughput:{connection}:{queue}:w{window}:{kind}"


#: Reads a duration setting: (name, default) -> seconds (``haze._app.env.env_duration``).
ReadDuration = Callable[[str, float], float]


def retention(read: ReadDuration) -> float:
    """Seconds a minute's counts are kept (``HAZE_METRICS_RETENTION``, default 2 hours),
    read with ``read`` (the app's settings reader)."""
    keep = read(RETENTION_ENV, _KEEP)
    if not 60 <= keep <= _MAX_KEEP:
        raise ConfigError(
            f"HAZE_METRICS_RETENTION: expected a duration from 1m to 7d, got {keep:g}s"
        )
    return keep


class Tally:
    """One process's finished jobs not yet written to the store."""

    def __init__(self, app: EngineApp, read: ReadDuration | None = None) -> None:
        self.app = app
        self.counts: dict[tuple[str, str, str], int] = {}
        try:
            self.keep = retention(read) if read is not None else float(_KEEP)
        except HazeError as e:
            # Read once per worker: one clear line, and the default rather than no counts.
            log.error("haze: %s; keeping job counts for 2h", e)
            self.keep = float(_KEEP)
        self.flushed = _monotonic()

    def add(
        self,
        connection: str,
        queue: str,
        outcome: str = "",
        *,
        job: str | None = None,
        wait: float | None = None,
        runtime: float | None = None,
    ) -> bool:
        """Count one finished job (``outcome="failed"``: counted among the failed too),
        and its wait time and runtime (``job`` names it for the runtime); True when the
        counts are due to be written."""
        counts = self.counts
        kinds = [""]
        if outcome == "failed":
            kinds.append("failed")
        if wait is not None:
            kinds.append(f"w:wait:{_bucket(wait)}")
        for kind in kinds:
            key = (connection, queue, kind)
            counts[key] = counts.get(key, 0) + 1
        if runtime is not None and job is not None:
            key = (connection, "*", f"w:run:{job}:{_bucket(runtime)}")
            counts[key] = counts.get(key, 0) + 1
        return _monotonic() - self.flushed >= FLUSH_EVERY

    async def flush(self) -> None:
        """Add the counts to this minute's keys. Never raises: a store that cannot be
        reached keeps the counts for the next flush."""
        self.flushed = _monotonic()
        if not self.counts:
            return
        store = self.app.queue_store
        if not store.shared:
            self.counts.clear()  # no other process could read them
            return
        minute = int(time.time() // 60)
        counts, self.counts = self.counts, {}
        keep = self.keep
        for (connection, queue, kind), n in counts.items():
            if kind.startswith("w:"):
                store_key = _window_key(connection, queue, minute // _SPAN, kind[2:])
            else:
                store_key = minute_key(connection, queue, minute, kind)
            try:
                await store.increment(store_key, n, keep)
            except Exception as e:
                log.debug("haze: could not record throughput of %s/%s: %s", connection, queue, e)
                key = (connection, queue, kind)
                self.counts[key] = self.counts.get(key, 0) + n


async def per_minute(app: EngineApp, connection: str, queue: str) -> float | None:
    """Jobs finished per minute on ``queue`` over the last ``WINDOW`` minutes (the current
    one counted for the part that has passed); None when the queue store is process-local."""
    store = app.queue_store
    if not store.shared:
        return None
    now = time.time()
    minute = int(now // 60)
    total = 0
    for m in range(minute - WINDOW + 1, minute + 1):
        value = await store.get(minute_key(connection, queue, m))
        total += int(value or 0)
    elapsed = WINDOW - 1 + (now % 60) / 60
    return total / elapsed


async def series(
    app: EngineApp, connection: str, queue: str, minutes: int = 60
) -> list[tuple[int, int, int]] | None:
    """``(minute, finished, failed)`` for each of the last ``minutes`` minutes, oldest
    first (``minute`` is epoch minutes; the last one is still running); None when the
    queue store is process-local."""
    store = app.queue_store
    if not store.shared:
        return None
    now = int(time.time() // 60)
    span = list(range(now - minutes + 1, now + 1))
    keys = [minute_key(connection, queue, m, kind) for kind in ("", "failed") for m in span]
    values = await store.get_many(keys)
    done, failed = values[: len(span)], values[len(span) :]
    return [(m, int(d or 0), int(f or 0)) for m, d, f in zip(span, done, failed, strict=True)]


@dataclass(frozen=True)
class Latency:
    """Percentiles over the last hour, each the upper bound of its bucket in seconds
    (``math.inf``: above the largest bound)."""

    count: int
    p50: float
    p95: float


def _percentiles(counts: list[int]) -> Latency | None:
    total = sum(counts)
    if not total:
        return None
    out = []
    for q in (0.5, 0.95):
        rank, seen = math.ceil(q * total), 0
        for bound, n in zip(LATENCY_BUCKETS, counts, strict=True):
            seen += n
            if seen >= rank:
                out.append(bound)
                break
    return Latency(total, out[0], out[1])


async def _hour(
    app: EngineApp, connection: str, queue: str, kinds: list[str]
) -> list[Latency | None]:
    """Percentiles of each latency ``kind`` over the last hour (the last six ten-minute
    windows, the current one included), in one read."""
    now = int(time.time() // 60) // _SPAN
    windows = range(now - 60 // _SPAN + 1, now + 1)
    n = len(LATENCY_BUCKETS)
    keys = [
        _window_key(connection, queue, w, f"{kind}:{i}")
        for kind in kinds
        for w in windows
        for i in range(n)
    ]
    values = await app.queue_store.get_many(keys)
    per_kind = len(windows) * n
    out = []
    for k in range(len(kinds)):
        chunk = values[k * per_kind : (k + 1) * per_kind]
        counts = [sum(int(chunk[w * n + i] or 0) for w in range(len(windows))) for i in range(n)]
        out.append(_percentiles(counts))
    return out


async def wait_time(app: EngineApp, connection: str, queue: str) -> Latency | None:
    """Wait time (dispatch to start) on ``queue`` over the last hour; None with no job
    started in that hour, or a process-local queue store."""
    if not app.queue_store.shared:
        return None
    return (await _hour(app, connection, queue, ["wait"]))[0]


async def runtimes(app: EngineApp, connection: str, jobs: list[str]) -> dict[str, Latency] | None:
    """Runtime of each of ``jobs`` on ``connection`` over the last hour (a job with no
    run in that hour is left out); None when the queue store is process-local."""
    if not app.queue_store.shared:
        return None
    if not jobs:
        return {}
    found = await _hour(app, connection, "*", [f"run:{job}" for job in jobs])
    return {job: lat for job, lat in zip(jobs, found, strict=True) if lat is not None}
