"""``queue:stats`` (the numbers, for people or ``--json`` for scripts) and ``queue:top``
(the same numbers live, with the jobs running now).

Per queue: ready, delayed and running jobs (drivers that count by state: memory,
database, redis; SQS approximately), the failed jobs kept, jobs finished per minute
(counted by the workers in the queue store, see :mod:`haze.throughput`) and whether
the queue is paused. Where a backend cannot tell, the value is null and ``unknown``
says why: nothing is guessed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from haze._base.durations import format_age
from haze._base.ids import short_id
from haze._engine.control import paused_queues
from haze._engine.throughput import per_minute
from haze.cli._core import DURATION, QUEUE_NAMES, State, cli, connection_option, console, run
from haze.contracts.driver import Driver, QueueInspector, RunningJob

if TYPE_CHECKING:
    from haze._app.app import App

__all__ = ["QueueStats", "collect", "queue_stats", "queue_top", "render"]

#: The most running jobs ``--jobs`` lists per queue: more is no listing a person reads, and
#: past 2**63 the database refuses the number (a count "n/a" for every queue).
MAX_LISTED_JOBS = 10_000
#: What a driver without counts by state gives instead, and why.
_NO_COUNTS = {
    "cloudflare": "Cloudflare reports one backlog for the whole queue (all haze queues on "
    "the connection), not ready/delayed/running per queue",
}
#: Why SQS has no age of its oldest ready message.
_NO_OLDEST = (
    "SQS keeps the age of its oldest message only as the CloudWatch metric "
    "ApproximateAgeOfOldestMessage, not as a queue attribute"
)
_NO_RUNNING = {
    "sqs": "SQS cannot list the messages in flight",
    "cloudflare": "Cloudflare cannot list the messages being delivered",
}


@dataclass
class QueueStats:
    """One queue's numbers (None: the backend cannot tell; ``unknown`` says why)."""

    connection: str
    queue: str
    driver: str
    ready: int | None = None
    delayed: int | None = None
    running: int | None = None
    #: ready + delayed (+ running where the backend counts them together): ``size()``
    waiting: int | None = None
    failed: int | None = None
    #: When the oldest ready job became ready (epoch seconds); None: none is ready, or
    #: the backend cannot tell (``unknown`` then says why).
    oldest_ready_at: float | None = None
    per_minute: float | None = None
    paused: bool | None = None
    running_jobs: list[RunningJob] | None = None
    unknown: dict[str, str] = field(default_factory=dict)

    def oldest_ready_seconds(self, now: float | None = None) -> float | None:
        """How long the oldest ready job has waited (None: see ``oldest_ready_at``)."""
        if self.oldest_ready_at is None:
            return None
        now = time.time() if now is None else now
        return round(max(0.0, now - self.oldest_ready_at), 1)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "connection": self.connection,
            "queue": self.queue,
            "driver": self.driver,
            "ready": self.ready,
            "delayed": self.delayed,
            "running": self.running,
            "waiting": self.waiting,
            "failed": self.failed,
            "oldest_ready_at": self.oldest_ready_at,
            "oldest_ready_seconds": self.oldest_ready_seconds(),
            "per_minute": None if self.per_minute is None else round(self.per_minute, 2),
            "paused": self.paused,
            "running_jobs": None
            if self.running_jobs is None
            else [
                {
                    "id": j.id,
                    "job": j.name,
                    "attempt": j.attempt,
                    "started_at": j.started_at,
                }
                for j in self.running_jobs
            ],
        }
        if self.unknown:
            d["unknown"] = dict(self.unknown)
        return d


def _reason(app: App, error: BaseException) -> str:
    down = app.manager.unavailable(error)
    if down is not None:
        return str(down)
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


async def collect(
    app: App, connection: str, queues: list[str], *, jobs: int = 0
) -> list[QueueStats]:
    """The numbers of ``queues`` on ``connection``; with ``jobs`` > 0 also up to that many
    running jobs per queue."""
    driver = app.driver(connection)
    kind = str(app.queue_config.connections[connection].get("driver"))
    rows = [QueueStats(connection, q, kind) for q in queues]
    failed, failed_error = await _failed_per_queue(app, driver)
    paused, shared_error = await _paused(app, connection, queues)
    inspector = driver if isinstance(driver, QueueInspector) else None
    for row in rows:
        q = row.queue
        if failed is not None:
            row.failed = failed.get(q, 0)
        else:
            row.unknown["failed"] = failed_error
        if paused is not None:
            row.paused = q in paused
        else:
            row.unknown["paused"] = shared_error
        try:
            row.waiting = await driver.size(q)
            await _counts(row, inspector, jobs)
        except Exception as e:
            reason = _reason(app, e)
            for name in ("waiting", "ready", "delayed", "running", "oldest_ready"):
                row.unknown.setdefault(name, reason)
        try:
            row.per_minute = await per_minute(app, connection, q) if not shared_error else None
        except Exception as e:
            row.unknown["per_minute"] = _reason(app, e)
        else:
            if row.per_minute is None:
                row.unknown["per_minute"] = shared_error or "no store every process shares"
    return rows


async def _failed_per_queue(app: App, driver: Driver) -> tuple[dict[str, int] | None, str]:
    """Failed jobs per queue, or None and why they could not be counted."""
    try:
        failed: dict[str, int] = {}
        for job in await driver.failed.list(None):
            failed[job.queue] = failed.get(job.queue, 0) + 1
    except Exception as e:
        return None, _reason(app, e)
    return failed, ""


async def _paused(app: App, connection: str, queues: list[str]) -> tuple[set[str] | None, str]:
    """The paused queues, or None and why pauses (and throughput) cannot be read."""
    try:
        if app.queue_store.shared:
            return await paused_queues(app, connection, queues), ""
        return None, (
            f'the queue store "{app.queue_store.name}" lives in each process only; '
            "set store= in config/queue.py to a redis or database store"
        )
    except Exception as e:
        return None, _reason(app, e)


async def _counts(row: QueueStats, inspector: QueueInspector | None, jobs: int) -> None:
    """Ready, delayed, running and the oldest ready job (and up to ``jobs`` running jobs)
    where the driver can tell, else why not."""
    kind = row.driver
    if inspector is not None:
        counts = await inspector.counts(row.queue)
        row.ready, row.delayed, row.running = counts.ready, counts.delayed, counts.running
        row.oldest_ready_at = counts.oldest_ready_at
        if kind == "sqs":
            row.unknown["counts"] = "SQS counts are approximate"
            row.unknown["oldest_ready"] = _NO_OLDEST
    else:
        why = _NO_COUNTS.get(kind, f"the {kind} driver cannot count jobs by state")
        for name in ("ready", "delayed", "running", "oldest_ready"):
            row.unknown[name] = why
    if jobs > 0:
        listed = await inspector.running(row.queue, jobs) if inspector is not None else None
        row.running_jobs = listed
        if listed is None:
            row.unknown["running_jobs"] = _NO_RUNNING.get(
                kind, f"the {kind} driver cannot list running jobs"
            )


def _queues(app: App, connection: str, value: list[str] | None) -> list[str]:
    return app.known_queues(connection) if value is None else value


def _n(value: int | float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _oldest(row: QueueStats, now: float) -> str:
    waited = row.oldest_ready_seconds(now)
    if waited is not None:
        return format_age(waited)
    # Nothing ready is a known answer; "n/a" is for what the backend cannot tell.
    return "n/a" if "oldest_ready" in row.unknown or row.ready is None else "-"


def render(rows: list[QueueStats], *, now: float | None = None, title: str = "") -> Group:
    """The table of queues, then the running jobs and what the backend cannot tell."""
    now = time.time() if now is None else now
    table = Table(title=title or None, title_justify="left", header_style="bold")
    headers = ("Queue", "Ready", "Oldest ready", "Delayed", "Running", "Failed", "Done/min")
    for header in (*headers, "Paused"):
        table.add_column(header, justify="left" if header == "Queue" else "right")
    for r in rows:
        paused = "n/a" if r.paused is None else ("[yellow]yes[/]" if r.paused else "no")
        table.add_row(
            escape(r.queue),
            _n(r.ready),
            _oldest(r, now),
            _n(r.delayed),
            _n(r.running),
            _n(r.failed),
            _n(r.per_minute),
            paused,
        )
    parts: list[Any] = [table]
    running = [(r.queue, j) for r in rows for j in (r.running_jobs or [])]
    if running:
        jobs = Table(title="Running now", title_justify="left", header_style="bold", box=None)
        for header in ("ID", "Job", "Queue", "Attempt", "For"):
            jobs.add_column(header)
        for queue, j in sorted(running, key=lambda p: p[1].started_at or now):
            took = "n/a" if j.started_at is None else f"{max(0.0, now - j.started_at):.0f}s"
            jobs.add_row(short_id(j.id), escape(j.name), escape(queue), str(j.attempt), took)
        parts.append(jobs)
    reasons: dict[str, list[str]] = {}
    for r in rows:
        for name, why in r.unknown.items():
            reasons.setdefault(why, []).append(f"{r.queue}:{name}")
    for why, where in reasons.items():
        fields = sorted({w.split(":", 1)[1] for w in where})
        parts.append(Text(f"n/a ({', '.join(fields)}): {why}", style="dim"))
    return Group(*parts)


@cli.command("queue:stats", short_help="Ready/delayed/running/failed counts per queue.")
@click.option(
    "--queue",
    "queue",
    type=QUEUE_NAMES,
    default=None,
    metavar="NAMES",
    help="Comma-separated queues (default: the connection's queues and every queue its "
    "registered jobs name).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@click.option(
    "--jobs",
    type=click.IntRange(min=0, max=MAX_LISTED_JOBS),
    default=0,
    show_default=True,
    help="Also list up to this many running jobs per queue.",
)
@connection_option()
@click.pass_obj
def queue_stats(
    state: State, queue: list[str] | None, as_json: bool, jobs: int, connection: str | None
) -> None:
    """Show each queue's ready, delayed and running jobs, failed jobs, jobs finished per
    minute (last 5 minutes) and paused state. "n/a" (null in --json) is what the backend
    cannot tell, with the reason."""

    async def stats(app: App) -> tuple[str, list[QueueStats]]:
        name = app.connection_name(connection)
        return name, await collect(app, name, _queues(app, name, queue), jobs=jobs)

    name, rows = run(state, stats)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "connection": name,
                    "at": round(time.time(), 3),
                    "queues": [r.to_dict() for r in rows],
                }
            )
        )
        return
    console().print(render(rows, title=f'Queues on "{escape(name)}"'))


@cli.command("queue:top", short_help="A live view of the queues and the running jobs.")
@click.option(
    "--queue",
    "queue",
    type=QUEUE_NAMES,
    default=None,
    metavar="NAMES",
    help="Comma-separated queues.",
)
@click.option(
    "--interval",
    type=DURATION,
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many refreshes (default: until Ctrl-C).",
)
@connection_option()
@click.pass_obj
def queue_top(
    state: State,
    queue: list[str] | None,
    interval: float,
    iterations: int | None,
    connection: str | None,
) -> None:
    """Watch the queues of a connection: ready, delayed, running, failed, jobs finished
    per minute, and the jobs running now. Ctrl-C quits."""
    out = console()

    async def top(app: App) -> None:
        name = app.connection_name(connection)
        names = _queues(app, name, queue)
        await watch(app, name, names, out, interval=interval, iterations=iterations)

    try:
        run(state, top)
    except KeyboardInterrupt:
        pass


async def watch(
    app: App,
    connection: str,
    queues: list[str],
    out: Console,
    *,
    interval: float,
    iterations: int | None,
) -> None:
    """Refresh the view every ``interval`` seconds (``iterations`` times, or forever)."""
    n = 0

    async def frame() -> Group:
        rows = await collect(app, connection, queues, jobs=20)
        stamp = time.strftime("%H:%M:%S")
        return render(rows, title=f'haze queue:top · "{escape(connection)}" · {stamp}')

    with Live(await frame(), console=out, auto_refresh=False, transient=False) as live:
        n = 1
        while iterations is None or n < iterations:
            await asyncio.sleep(interval)
            live.update(await frame(), refresh=True)
            n += 1
