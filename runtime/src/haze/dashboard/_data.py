"""What the dashboard shows, read through the driver and store protocols only.

Nothing here knows HTTP: each function takes the haze ``App`` and returns plain data,
so every page, the JSON endpoints and ``/metrics`` agree on the numbers.
"""

from __future__ import annotations

import builtins
import math
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from haze._base.crypto import failed_is_encrypted, open_failed
from haze._base.durations import parse_duration
from haze._base.errors import HazeError
from haze._base.ids import match_id
from haze._base.message import decode, envelope_of
from haze._engine.control import paused_queues
from haze._engine.throughput import WINDOW, runtimes, series, wait_time
from haze._jobs.status import read
from haze._orchestration.batches import find, recent_ids
from haze._workers.presence import live_workers
from haze.contracts.driver import (
    Driver,
    GroupBacklog,
    JobLookup,
    JobRecord,
    QueueInspector,
    UncountedQueues,
)
from haze.contracts.failed import FailedPages

if TYPE_CHECKING:
    from haze._app.app import App
    from haze._engine.throughput import Latency
    from haze._jobs.status import JobStatus
    from haze._orchestration.batches import Batch
    from haze.drivers import FailedJob

__all__ = [
    "FailedFilter",
    "QueueRow",
    "decrypted",
    "failed_jobs",
    "find_failed",
    "lookup",
    "overview",
    "recent_batches",
]

#: Why an SQS queue shows no oldest ready job.
_NO_OLDEST = (
    "SQS keeps the age of its oldest message only as the CloudWatch metric "
    "ApproximateAgeOfOldestMessage, not as a queue attribute"
)

#: Where the driver has no count to give, the page says so instead of guessing.
_NO_SIZE = {
    "cloudflare": (
        "Cloudflare Queues tell their backlog only to a consumer as it pulls (one number for "
        "the whole queue), so this page cannot count them: see the queue in Cloudflare's "
        "dashboard"
    ),
    "sqs": "SQS counts are approximate (its ApproximateNumberOf* attributes)",
}


@dataclass
class QueueRow:
    """One queue of one connection, as the overview shows it."""

    connection: str
    queue: str
    driver: str
    #: Ready + delayed (``Driver.size``); None when the backend could not be asked.
    waiting: int | None
    failed: int | None
    paused: bool | None
    #: By state, from drivers that can count them (``QueueInspector``); None otherwise.
    ready: int | None = None
    delayed: int | None = None
    running: int | None = None
    #: When the oldest ready job became ready (epoch seconds); None with nothing ready
    #: or when the backend cannot tell (``oldest_note`` then says why).
    oldest_ready_at: float | None = None
    oldest_note: str = ""
    #: The tenant groups with the most queued jobs, largest first (``GroupBacklog``).
    groups: builtins.list[tuple[str, int]] = field(default_factory=list)
    #: Jobs finished per minute over the last few minutes (the workers' counts).
    per_minute: float | None = None
    #: Over the last hour: jobs finished, how many of them failed for good, and the
    #: finished count of each minute (oldest first) for the chart.
    finished_hour: int | None = None
    failed_hour: int | None = None
    minutes: builtins.list[int] = field(default_factory=list)
    #: Dispatch-to-start percentiles over the last hour.
    wait: Latency | None = None

    @property
    def failure_rate(self) -> float | None:
        """Failed / finished over the last hour (None with nothing finished)."""
        if not self.finished_hour or self.failed_hour is None:
            return None
        return self.failed_hour / self.finished_hour

    note: str = ""
    error: str = ""


#: Seconds the failed-job counts of a connection are reused: a store without
#: ``FailedPages`` counts by listing its failed jobs, too much for every 5-second refresh.
FAILED_COUNTS_TTL = 15.0


class FailedCounts:
    """Failed jobs per queue of each connection, read at most every ``FAILED_COUNTS_TTL``
    seconds (one per dashboard; actions on failed jobs clear it)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, dict[str, int]]] = {}

    async def get(self, app: App, connection: str) -> dict[str, int]:
        now = time.monotonic()
        hit = self._seen.get(connection)
        if hit is not None and now - hit[0] < FAILED_COUNTS_TTL:
            return hit[1]
        store = app.driver(connection).failed
        counts: dict[str, int] = {}
        if isinstance(store, FailedPages):
            counts = await store.counts()
        else:
            for job in await store.list(None):
                counts[job.queue] = counts.get(job.queue, 0) + 1
        self._seen[connection] = (now, counts)
        return counts

    def clear(self) -> None:
        self._seen.clear()


async def overview(
    app: App, connection: str | None = None, failed_counts: FailedCounts | None = None
) -> list[QueueRow]:
    """One row per queue of every connection (or of ``connection``)."""
    failed_counts = failed_counts or FailedCounts()
    names = [connection] if connection else list(app.queue_config.connections)
    rows: list[QueueRow] = []
    for name in names:
        options = app.queue_config.connections[name]
        kind = str(options.get("driver"))
        if kind in ("sync", "failover"):
            # sync runs jobs inside dispatch() and failover routes to other connections:
            # neither holds a queue of its own.
            continue
        queues = app.known_queues(name)
        paused: set[str] | None = None
        # Pause signals only reach workers through a store they share: with a
        # process-local one there is no pause state to show and none to set.
        if shared_store(app):
            paused = await paused_queues(app, name, queues)
        failed_by_queue: dict[str, int] | None = None
        error = ""
        try:
            failed_by_queue = await failed_counts.get(app, name)
        except Exception as e:
            failed_by_queue, error = None, reason(app, e)
        extra = sorted(set(failed_by_queue or {}) - set(queues))
        for queue in [*queues, *extra]:
            row = QueueRow(
                connection=name,
                queue=queue,
                driver=kind,
                waiting=None,
                failed=None if failed_by_queue is None else failed_by_queue.get(queue, 0),
                paused=None if paused is None else queue in paused,
                note=_NO_SIZE.get(kind, ""),
                error=error,
            )
            try:
                await _sizes(app.driver(name), row)
            except Exception as e:
                row.error = row.error or reason(app, e)
            try:
                await _rates(app, row)
            except Exception as e:
                row.error = row.error or reason(app, e)
            rows.append(row)
    return rows


#: How many tenant groups a queue's row lists (those with the most queued jobs).
_GROUPS_SHOWN = 10


async def _sizes(driver: Driver, row: QueueRow) -> None:
    """The queue's size, and its per-state counts where the driver can tell."""
    kind = row.driver
    # A Cloudflare driver's size is the backlog of its own last pull: in
    # this process, which never pulls, it would be a made-up 0.
    if isinstance(driver, UncountedQueues):
        row.oldest_note = driver.counts_note  # Vercel Queues tell no depth at all
        return
    if kind != "cloudflare":
        row.waiting = await driver.size(row.queue)
    if isinstance(driver, QueueInspector):
        counts = await driver.counts(row.queue)
        row.ready, row.delayed, row.running = counts.ready, counts.delayed, counts.running
        row.oldest_ready_at = counts.oldest_ready_at
        if kind == "sqs":
            row.oldest_note = _NO_OLDEST
    if isinstance(driver, GroupBacklog):
        row.groups = await driver.group_backlog(row.queue, _GROUPS_SHOWN)
    if not isinstance(driver, QueueInspector):
        row.oldest_note = f"the {kind} driver cannot count jobs by state"


async def _rates(app: App, row: QueueRow) -> None:
    minutes = await series(app, row.connection, row.queue, 60)
    if minutes is None:  # a process-local store: no worker's counts are visible here
        return
    row.minutes = [done for _, done, _ in minutes]
    row.finished_hour = sum(row.minutes)
    row.failed_hour = sum(failed for _, _, failed in minutes)
    # As queue:stats computes it: the last WINDOW minutes, the current one in part.
    elapsed = WINDOW - 1 + (time.time() % 60) / 60
    row.per_minute = sum(row.minutes[-WINDOW:]) / elapsed
    row.wait = await wait_time(app, row.connection, row.queue)


@dataclass
class JobRuntime:
    """Runtime percentiles of one job over the last hour."""

    connection: str
    job: str
    latency: Latency


async def job_runtimes(app: App, connection: str | None = None) -> builtins.list[JobRuntime] | None:
    """Runtime per job name on each connection, for the jobs whose definition sends them
    there (jobs that ran in the last hour); None when the queue store is process-local."""
    out: builtins.list[JobRuntime] = []
    names = [connection] if connection else list(app.queue_config.connections)
    for name in names:
        if app.queue_config.connections[name].get("driver") in ("sync", "failover"):
            continue
        jobs = sorted({j for js in app.job_queues(name).values() for j in js})
        found = await runtimes(app, name, jobs)
        if found is None:
            return None
        out.extend(JobRuntime(name, job, lat) for job, lat in found.items())
    return out


def seconds(value: float) -> str:
    """``0.25`` → ``"≤ 250 ms"``: a percentile is the upper bound of its bucket."""
    if math.isinf(value):
        return "> 1 h"
    if value < 1:
        return f"≤ {value * 1000:g} ms"
    if value < 60:
        return f"≤ {value:g} s"
    if value < 3600:
        return f"≤ {value / 60:g} min"
    return f"≤ {value / 3600:g} h"


def sparkline(values: builtins.list[int], width: int = 120, height: int = 24) -> str:
    """SVG polyline points for ``values`` (numbers only, so safe in an attribute)."""
    if not values:
        return ""
    top = max(values) or 1
    step = width / max(1, len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in enumerate(values)
    )


def shared_store(app: App) -> bool:
    """Whether the queue store is one every process sees (pauses, workers, counts)."""
    try:
        return bool(app.queue_store.shared)
    except HazeError:  # sqs/cloudflare with no store configured
        return False


def reason(app: App, error: BaseException) -> str:
    """One line for a page: the outage message, else the error's type and first line."""
    down = app.manager.unavailable(error)
    if down is not None:
        return str(down)
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


# --------------------------------------------------------------------------- failed


@dataclass
class FailedFilter:
    """A failed-jobs search: every given field must match (case-insensitive substrings)."""

    connection: str
    queue: str = ""
    job: str = ""
    exception: str = ""
    since: str = ""
    until: str = ""
    since_ts: float | None = field(default=None, init=False)
    until_ts: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.since_ts = _when(self.since, "since") if self.since else None
        self.until_ts = _when(self.until, "until") if self.until else None

    def matches(self, job: FailedJob) -> bool:
        if self.queue and job.queue != self.queue:
            return False
        if self.job and self.job.lower() not in job.name.lower():
            return False
        if self.exception and self.exception.lower() not in job.exception.lower():
            return False
        if self.since_ts is not None and job.failed_at < self.since_ts:
            return False
        return self.until_ts is None or job.failed_at <= self.until_ts

    def params(self, page: int | None = None) -> dict[str, str]:
        """The filter as query parameters (empty fields left out), and ``page`` if given."""
        d = {
            "connection": self.connection,
            "queue": self.queue,
            "job": self.job,
            "exception": self.exception,
            "since": self.since,
            "until": self.until,
            "page": "" if page is None else str(page),
        }
        return {k: v for k, v in d.items() if v}


def _when(value: str, what: str) -> float:
    """``"2h"`` (that long ago) or an ISO date/time (UTC unless it names a zone)."""
    value = value.strip()
    try:
        return time.time() - parse_duration(value, what)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{what}: expected a duration ago like '2h' or a date like '2026-01-31T09:00', "
            f"got {value!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


async def failed_jobs(app: App, flt: FailedFilter) -> builtins.list[FailedJob]:
    """Failed jobs matching ``flt``, newest first."""
    jobs = await app.driver(flt.connection).failed.list(flt.queue or None)
    found = [j for j in jobs if flt.matches(j)]
    found.sort(key=lambda j: j.failed_at, reverse=True)
    return found


#: Failed jobs on one page of the list, and the characters of each exception it shows
#: (the first line is displayed; the job's own page shows the whole text).
PAGE_SIZE = 50
LIST_TEXT = 2000
#: Rows read at a time when a search by job name or exception text scans the store.
_SCAN = 100


def _trimmed(job: FailedJob) -> FailedJob:
    if len(job.exception) <= LIST_TEXT:
        return job
    return replace(job, exception=job.exception[:LIST_TEXT], body="", payload=None)


async def failed_page(
    app: App, flt: FailedFilter, page: int
) -> tuple[builtins.list[FailedJob], int]:
    """Page ``page`` (from 1) of the failed jobs matching ``flt``, newest first, with
    their exceptions trimmed, and how many match in all.

    A store with ``FailedPages`` counts and pages at the backend; a search by job name
    or exception text reads it ``_SCAN`` rows at a time, so memory stays flat (time
    grows with the failed jobs). Other stores are listed whole and cut here.
    """
    store = app.driver(flt.connection).failed
    start = (page - 1) * PAGE_SIZE
    if not isinstance(store, FailedPages):
        every = await failed_jobs(app, flt)
        return [_trimmed(j) for j in every[start : start + PAGE_SIZE]], len(every)
    bounds = (flt.queue or None, flt.since_ts, flt.until_ts)
    if not (flt.job or flt.exception):
        jobs = await store.page(*bounds, offset=start, limit=PAGE_SIZE, text=LIST_TEXT)
        return jobs, await store.count(*bounds)
    found: builtins.list[FailedJob] = []
    total = offset = 0
    while True:
        chunk = await store.page(*bounds, offset=offset, limit=_SCAN)
        for job in chunk:
            if flt.matches(job):
                if start <= total < start + PAGE_SIZE:
                    found.append(_trimmed(job))
                total += 1
        if len(chunk) < _SCAN:
            return found, total
        offset += _SCAN


async def find_failed(app: App, connection: str, job_id: str) -> FailedJob | None:
    return await app.driver(connection).failed.find(job_id)


def decrypted(app: App, job: FailedJob) -> tuple[Any, str]:
    """``(payload, exception)`` of an encrypted job, decrypted with the app key (raises
    ``HazeError`` when no key opens them)."""
    return open_failed(app, job)


def attempts(job: FailedJob) -> int | None:
    """The attempt the job failed on (kept in its stored message); None when unknown."""
    return job.attempt


def chain_links(job: FailedJob) -> builtins.list[str]:
    """The job names of the chain links that were still to run after this job."""
    # envelope_of, the one reader of a stored body: a body too deep to parse has none
    data = envelope_of(job.body) if job.body else None
    links = data.get("chain") if data is not None else None
    if not isinstance(links, list):
        return []
    return [str(link.get("job")) for link in links if isinstance(link, dict)]


def is_encrypted(job: FailedJob) -> bool:
    return failed_is_encrypted(job)


# --------------------------------------------------------------------------- batches


async def recent_batches(app: App, limit: int = 50) -> builtins.list[Batch]:
    """The newest batches still in the batches store (newest first)."""
    ids = await recent_ids(app.manager, limit)
    out = []
    for batch_id in ids:
        batch = await find(app.manager, batch_id)
        if batch is not None:
            out.append(batch)
    return out


# --------------------------------------------------------------------------- lookup


#: What a job lookup on a connection of each driver cannot see, said on the page.
_LOOKUP_LIMITS = {
    "database": (
        "the database driver deletes a job when it ends: a finished job is found only "
        "when it failed or its job is tracked"
    ),
    "redis": (
        "the redis driver keeps the newest completed jobs (keep_completed, 1000 per queue "
        "by default) and looks at up to 2000 jobs of each state"
    ),
}


@dataclass
class QueuedJob:
    """A job a driver holds (``JobLookup``), with its place in a chain or batch."""

    connection: str
    record: JobRecord
    chain_id: str | None = None
    #: The job names of the chain links still to run after this one.
    next_links: builtins.list[str] = field(default_factory=list)
    batch_id: str | None = None


@dataclass
class Lookup:
    """What the dashboard found under an id."""

    failed: builtins.list[FailedJob] = field(default_factory=list)
    batch: Batch | None = None
    #: The status record of a job defined with ``track=True`` (any state).
    status: JobStatus | None = None
    #: ``(worker record, running job)`` pairs: the job is running on that worker now.
    running: builtins.list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    #: Jobs found through the drivers that can look one up by id.
    queued: builtins.list[QueuedJob] = field(default_factory=list)
    #: What the lookup could not see, per connection (the page says so).
    limits: builtins.list[str] = field(default_factory=list)
    errors: builtins.list[str] = field(default_factory=list)


async def _from_drivers(app: App, found: Lookup, candidates: builtins.list[str]) -> None:
    """Ask each connection whose driver can look a job up by id (``JobLookup``)."""
    for name, options in app.queue_config.connections.items():
        kind = str(options.get("driver"))
        if kind in ("sync", "failover"):
            continue
        try:
            driver = app.driver(name)
        except Exception as e:
            found.errors.append(f"{name}: {reason(app, e)}")
            continue
        if not isinstance(driver, JobLookup):
            found.limits.append(
                f'"{name}" ({kind}): this driver cannot look up a queued or finished job by id'
            )
            continue
        if kind in _LOOKUP_LIMITS:
            found.limits.append(f'"{name}" ({kind}): {_LOOKUP_LIMITS[kind]}')
        for job_id in candidates:
            try:
                record = await driver.find_job(job_id, app.known_queues(name))
            except Exception as e:
                found.errors.append(f"{name}: {reason(app, e)}")
                break
            if record is not None:
                found.queued.append(_queued(name, record))
                break


def _queued(connection: str, record: JobRecord) -> QueuedJob:
    try:
        message = decode(record.body)
    except Exception:
        return QueuedJob(connection, record)
    links = [str(link.get("job")) for link in message.chain or [] if isinstance(link, dict)]
    return QueuedJob(connection, record, message.chain_id, links, message.batch_id)


async def lookup(app: App, token: str, *, decrypt: bool = False) -> Lookup:
    """Failed jobs (on every connection), running jobs of listed workers, jobs the drivers
    hold (``JobLookup``, by full id), status records and the batch that ``token`` names
    (full or short id). An encrypted job's status fields are decrypted only on
    ``decrypt``."""
    found = Lookup()
    token = token.strip()
    for name, options in app.queue_config.connections.items():
        if options.get("driver") in ("sync", "failover"):
            continue
        try:
            jobs = await app.driver(name).failed.list(None)
            job_id = match_id(token, [j.id for j in jobs])
        except Exception as e:
            found.errors.append(f"{name}: {reason(app, e)}")
            continue
        found.failed.extend(j for j in jobs if j.id == job_id)
    if shared_store(app):
        try:
            workers = await live_workers(app) or []
            pairs = [(w, j) for w in workers for j in w.get("running") or [] if j.get("id")]
            job_id = match_id(token, [j["id"] for _, j in pairs])
            found.running = [(w, j) for w, j in pairs if j["id"] == job_id]
        except HazeError:
            raise  # an ambiguous short id: the page says so
        except Exception as e:
            found.errors.append(f"workers: {reason(app, e)}")
    # Tracked jobs keep a status record under their full id, and drivers find a job by
    # its full id: try the id as given, then the full id a short one matched above.
    candidates = list(
        dict.fromkeys([token, *(j.id for j in found.failed), *(j["id"] for _, j in found.running)])
    )
    await _from_drivers(app, found, candidates)
    for candidate in candidates:
        try:
            found.status = await read(app.manager, candidate, decrypt=decrypt)
        except Exception as e:
            found.errors.append(f"status: {reason(app, e)}")
            break
        if found.status is not None:
            break
    try:
        found.batch = await find(app.manager, token)
    except Exception as e:
        found.errors.append(f"batches: {reason(app, e)}")
    return found
