"""``queue:*`` commands: run a worker and manage waiting jobs (failed jobs:
``haze.cli.queue_failed``)."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from haze._app.env import env_duration
from haze._engine.throughput import retention
from haze._workers.worker import Worker
from haze.cli._core import (
    DURATION,
    HOURS,
    QUEUE_NAME,
    State,
    cli,
    connection_option,
    console,
    queue_names,
    run,
)
from haze.cli._loop import event_loop, loop_option
from haze.cli._worker_output import WorkerOutput, worker_output
from haze.cli.queue_failed import exception_summary, queue_failed, queue_forget, queue_retry
from haze.cli.schedule import check_runnable, start_scheduler
from haze.contracts.driver import Advises, QueueInspector

if TYPE_CHECKING:
    from haze._app.app import App

__all__ = [
    "exception_summary",
    "queue_clear",
    "queue_failed",
    "queue_flush",
    "queue_forget",
    "queue_retry",
    "queue_size",
    "queue_work",
]

SYNC_REFUSAL = "the sync connection runs jobs inside dispatch(); there is nothing to work"
MEMORY_REFUSAL = (
    "is a memory queue: it lives inside the process that dispatches to it, so a worker in "
    "another process would never see its jobs. Point config/queue.py at a database or redis "
    "connection (memory jobs run inside your app, under async with App(...))"
)


def _queue_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    try:
        return queue_names(value, many=True)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--queue'") from None


def _default_queues(app: App, connection: str) -> list[str]:
    configured: list[str] | None = app.queue_config.connections[connection].get("queues")
    return list(configured) if configured else ["default"]


# ====================================================================== queue:work


#: After a stop signal, once the running jobs have ended: how long the worker's own
#: last writes (buffered acks, leaving the Workers page, throughput counters) and closing
#: its connections may take. A stuck backend answers none of them; past this the worker
#: exits without them (an unsent ack runs its job again after retry_after).
STOP_GRACE = 5.0

#: A worker builds one slot per job it may run at once, before its start line: past this
#: many, building them takes seconds of silence (and 10**20 all the memory). One process's
#: heartbeat cannot renew that many leases in time anyway: run more processes.
MAX_CONCURRENCY = 100_000


async def _exit_after_grace(
    worker: Worker, task: asyncio.Task[int], say: Callable[..., None], deadline: list[float]
) -> None:
    """Once no job runs, give the worker ``STOP_GRACE`` seconds to finish, then end it."""
    while worker.running:
        await asyncio.sleep(0.05)
    deadline.append(time.monotonic() + STOP_GRACE)
    done, _ = await asyncio.wait({task}, timeout=STOP_GRACE)
    if not done:
        say(
            f"the running jobs have ended, but the backend has not answered the worker's "
            f"last writes within {STOP_GRACE:g}s: exiting without them (a job whose ack "
            "was not sent runs again after retry_after)",
            level="WARNING",
        )
        task.cancel()


@contextlib.contextmanager
def _stop_on_signals(
    worker: Worker, say: Callable[..., None], task: asyncio.Task[int], deadline: list[float]
) -> Iterator[list[int]]:
    """First SIGTERM/SIGINT: stop claiming and let running jobs finish, then allow
    ``STOP_GRACE`` seconds for the rest (``deadline`` receives when it ends). Second:
    abandon the running jobs.

    Yields a list that receives the number of the signal that forced the exit, if any.
    """
    loop = asyncio.get_running_loop()
    forced: list[int] = []
    received: list[int] = []
    grace: list[asyncio.Task[None]] = []

    def handle(signum: int) -> None:
        received.append(signum)
        if len(received) == 1:
            name = signal.Signals(signum).name
            if worker.running:
                say(
                    f"{name}: no new jobs; waiting for {worker.running} running job(s). "
                    "Send it again to quit now."
                )
            else:
                say(f"{name}: stopping.")
            worker.request_stop()
            grace.append(loop.create_task(_exit_after_grace(worker, task, say, deadline)))
        elif not forced:
            forced.append(signum)
            task.cancel()

    installed: list[signal.Signals] = []
    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, handle, int(sig))
            installed.append(sig)
        except (NotImplementedError, RuntimeError):
            # No loop signal support (Windows): a process-wide handler hops onto the loop.
            with contextlib.suppress(ValueError):  # not the main thread: nothing to install
                previous[sig] = signal.signal(
                    sig, lambda s, _f: loop.call_soon_threadsafe(handle, s)
                )
    try:
        yield forced
    finally:
        for t in grace:
            t.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@cli.command("queue:work", short_help="Run a worker until stopped.")
@connection_option()
@click.option(
    "--queue",
    "queue",
    default=None,
    metavar="NAMES",
    help="Queues in priority order, comma-separated (default: the connection's queues, "
    "else 'default').",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1, max=MAX_CONCURRENCY),
    default=None,
    help="Jobs run at once (default: the connection's concurrency, else 1).",
)
@click.option("--once", is_flag=True, help="Run one job (if any) and exit.")
@click.option("--max-jobs", type=click.IntRange(min=1), default=None, help="Exit after N jobs.")
@click.option("--max-time", type=DURATION, default=None, help="Exit after this long (e.g. 1h).")
@click.option("--stop-when-empty", is_flag=True, help="Exit once the queues are empty.")
@click.option(
    "--sleep",
    type=DURATION,
    default=None,
    help="Idle polling interval, doubling while idle (default: the connection's, else 1s).",
)
@click.option(
    "-v", "--verbose", is_flag=True, help="Also print the jobs' INFO logs and tracebacks."
)
@click.option("-q", "--quiet", is_flag=True, help="No line per job (warnings still print).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, for log shippers.")
@click.option(
    "--schedule",
    "with_schedule",
    is_flag=True,
    help="Also run a scheduler for the app's schedules (see schedule:work).",
)
@loop_option()
@click.pass_obj
def queue_work(
    state: State,
    connection: str | None,
    queue: str | None,
    concurrency: int | None,
    once: bool,
    max_jobs: int | None,
    max_time: float | None,
    stop_when_empty: bool,
    sleep: float | None,
    verbose: bool,
    quiet: bool,
    as_json: bool,
    with_schedule: bool = False,
    loop: str | None = None,
) -> None:
    """Run a worker on a connection until stopped (SIGTERM/SIGINT drain running jobs).

    Prints one line per job state: time, job, short id, then RUNNING, DONE 12ms,
    RETRY in 10s or FAILED with the exception (its traceback with -v)."""
    if quiet and as_json:
        raise click.UsageError("--quiet and --json exclude each other")
    queues = _queue_list(queue)
    chosen_loop = event_loop(loop)
    app = state.app()
    name = app.connection_name(connection)
    _refuse_unworkable(app, name, with_schedule)
    _ = app.queue_store  # no usable lock store is a start-up error, not a warning a second
    retention(env_duration)  # a bad HAZE_METRICS_RETENTION stops the worker here, in one line
    output = WorkerOutput(
        mode="json" if as_json else "quiet" if quiet else "lines", verbose=verbose
    )
    plan = _WorkPlan(
        name=name,
        queues=queues,
        options=app.queue_config.connections[name],
        concurrency=concurrency,
        once=once,
        max_jobs=max_jobs,
        max_time=max_time,
        stop_when_empty=stop_when_empty,
        sleep=sleep,
        with_schedule=with_schedule,
        output=output,
        loop=chosen_loop.name,
    )
    with worker_output(output):
        code = run(
            state, lambda app: _work(app, plan), chosen_loop.factory, closing=plan.closing_time
        )
    if code:
        click.get_current_context().exit(code)


def _refuse_unworkable(app: App, name: str, with_schedule: bool) -> None:
    if app.queue_config.connections[name]["driver"] == "sync" or app.driver(name).inline:
        raise click.ClickException(f'connection "{name}": {SYNC_REFUSAL}')
    # With --schedule the scheduler dispatches into this process: a memory queue works.
    if not app.driver(name).remote and not with_schedule:
        raise click.ClickException(f'connection "{name}" {MEMORY_REFUSAL}')


@dataclass(frozen=True)
class _WorkPlan:
    """What ``queue:work`` was asked to run (its options, checked)."""

    name: str
    queues: list[str] | None
    options: dict[str, Any]
    concurrency: int | None
    once: bool
    max_jobs: int | None
    max_time: float | None
    stop_when_empty: bool
    sleep: float | None
    with_schedule: bool
    output: WorkerOutput
    loop: str = "asyncio"
    #: when the time a stop signal leaves for the last writes and closing ends
    stop_deadline: list[float] = field(default_factory=list)

    def closing_time(self) -> float | None:
        """Seconds closing the app may take: the rest of ``STOP_GRACE`` after a stop
        signal (at least a moment), else as long as it takes."""
        if not self.stop_deadline:
            return None
        return max(0.5, self.stop_deadline[0] - time.monotonic())


def _new_worker(app: App, plan: _WorkPlan) -> tuple[Worker, list[str] | None]:
    """The worker ``plan`` asks for, and the queues it takes (None: every queue)."""
    options = plan.options
    chosen = plan.queues
    if chosen is None and app.driver(plan.name).remote:
        chosen = _default_queues(app, plan.name)
    # A local (memory) worker with no --queue takes every queue, like the in-app one.
    pace = plan.sleep if plan.sleep is not None else options.get("sleep") or 1.0
    ceiling = options.get("max_sleep")
    worker = Worker(
        app,
        plan.name,
        chosen,
        plan.concurrency or options.get("concurrency") or 1,
        once=plan.once,
        max_jobs=plan.max_jobs,
        max_time=plan.max_time,
        stop_when_empty=plan.stop_when_empty,
        sleep=pace,
        max_sleep=max(ceiling, pace) if ceiling is not None else None,
        control=True,  # follow queue:restart and queue:pause through the store
    )
    return worker, chosen


async def _work(app: App, plan: _WorkPlan) -> int:
    """Run the worker (and with --schedule a scheduler) until it stops; the exit code."""
    say = plan.output.say
    if plan.with_schedule:  # a schedule it cannot run stops it before any job is taken
        check_runnable(app, in_worker=True)
    worker, chosen = _new_worker(app, plan)
    loop = asyncio.get_running_loop()
    # Started before the handlers go in: a stop requested earlier would be reset.
    worker.start()
    task = loop.create_task(worker.run())
    scheduling = start_scheduler(app, say) if plan.with_schedule else None
    # An idle in-process slot sleeps until woken, so it would not see --max-time itself.
    max_time = plan.max_time
    timer = loop.call_later(max_time, worker.request_stop) if max_time is not None else None
    with _stop_on_signals(worker, say, task, plan.stop_deadline) as forced:
        # Announced only now, so whoever waits for this line can signal us safely.
        shown = ", ".join(chosen) if chosen else "all"
        say(
            f'Working connection "{plan.name}" (queues: {shown}, concurrency '
            f"{worker.concurrency}, loop {plan.loop}). Ctrl+C or SIGTERM stops after the "
            "running jobs."
        )
        for line in unconsumed_queues(app, plan.name, chosen or []):
            say(line, level="WARNING")
        driver = app.driver(plan.name)
        for line in await driver.advice() if isinstance(driver, Advises) else []:
            say(line, level="WARNING")
        for line in app.manager.stores.worker_warnings(driver):
            say(line, level="WARNING")
        try:
            processed = await task
        except asyncio.CancelledError:
            if forced:
                say("Stopped without waiting for the running jobs.")
                return 128 + forced[0]
            if not plan.stop_deadline:
                raise
            processed = worker.processed  # the grace ran out after the last job
        finally:
            if timer is not None:
                timer.cancel()
            if scheduling is not None:
                scheduling[2].set()
                await scheduling[1]
    if plan.stop_when_empty or plan.once:
        await _stopped_when_empty(app, worker, chosen or [], say)
    say(f"Worker stopped after {processed} job(s).")
    return 0


async def _stopped_when_empty(
    app: App, worker: Worker, queues: Sequence[str], say: Callable[..., None]
) -> None:
    """A worker that stopped on an empty queue: refuse one that never read its queues
    (a failed claim looks empty), and name the retries and delays still waiting."""
    if not worker.reached:
        e = worker.outage_error  # its message is on the warning line above
        cause = f" ({type(e).__name__})" if e is not None else ""
        raise click.ClickException(
            f'connection "{worker.connection}" was never reachable, so no queue was read'
            f"{cause}; start the server or fix its URL"
        )
    if worker.outage_error is not None:
        # A claim that failed in an outage also ends the drain, but the queues were not
        # seen empty: status 0 would tell a cron drain or a CI step that all is done.
        e = worker.outage_error
        raise click.ClickException(
            f'connection "{worker.connection}" became unreachable after '
            f"{worker.processed} job(s) ({type(e).__name__}), so its queues were not "
            "drained; the jobs left wait there for the next worker"
        )
    driver = app.driver(worker.connection)
    if not isinstance(driver, QueueInspector) or worker.once:
        return
    try:
        counts = [await driver.counts(q) for q in queues]
    except Exception:  # an outage after the last claim: the stop line says enough
        return
    delayed = sum(c.delayed or 0 for c in counts)
    due = [c.next_delayed_at for c in counts if c.next_delayed_at is not None]
    if delayed:
        when = f"; the next is due in {max(0.0, min(due) - time.time()):.0f}s" if due else ""
        say(f"{delayed} job(s) wait for a retry or a delay{when}.")


def unconsumed_queues(app: App, connection: str, consumed: Sequence[str]) -> list[str]:
    """One line per queue that registered jobs use on ``connection`` and a worker on
    ``consumed`` would never take, with the ``--queue`` value that takes them too."""
    missing = {q: jobs for q, jobs in app.job_queues(connection).items() if q not in consumed}
    if not missing:
        return []
    # Quoted for the shell: a queue name may hold spaces, and the advice is pasted.
    flag = shlex.quote(",".join([*missing, *consumed]))
    lines = []
    for q, jobs in missing.items():
        who = f"job {jobs[0]} uses" if len(jobs) == 1 else f"jobs {', '.join(jobs)} use"
        lines.append(f'{who} queue "{q}", which this worker does not consume: add --queue {flag}')
    return lines


@cli.command("queue:flush")
@click.option(
    "--hours",
    type=HOURS,
    default=None,
    help="Only failed jobs older than this many hours.",
)
@click.option(
    "--queue",
    type=QUEUE_NAME,
    default=None,
    metavar="NAME",
    help="Only failed jobs from this queue.",
)
@connection_option()
@click.pass_obj
def queue_flush(
    state: State, hours: float | None, queue: str | None, connection: str | None
) -> None:
    """Delete all failed jobs (or only those older than --hours, or from --queue)."""

    async def flush(app: App) -> tuple[str, int]:
        name = app.connection_name(connection)
        older_than = hours * 3600 if hours is not None else None
        return name, await app.manager.flush(name, older_than, queue=queue)

    name, n = run(state, flush)
    where = f'from queue "{escape(queue)}" ' if queue is not None else ""
    console().print(f'Deleted {n} failed job(s) {where}on connection "{escape(name)}".')


# ====================================================================== waiting jobs


@cli.command("queue:clear")
@click.option(
    "--queue",
    type=QUEUE_NAME,
    default=None,
    metavar="NAME",
    help="The queue to clear (default: 'default').",
)
@connection_option()
@click.pass_obj
def queue_clear(state: State, queue: str | None, connection: str | None) -> None:
    """Delete the jobs waiting (ready and delayed) on a queue."""

    async def clear(app: App) -> tuple[str, int]:
        name = app.connection_name(connection)
        return name, await app.manager.clear(queue, name)

    name, n = run(state, clear)
    console().print(
        f'Cleared {n} job(s) from queue "{escape(queue or "default")}" on connection '
        f'"{escape(name)}".'
    )


@cli.command("queue:size")
@click.option(
    "--queue",
    "queue",
    default=None,
    metavar="NAMES",
    help="Comma-separated queues (default: the connection's queues and every queue its "
    "registered jobs name).",
)
@connection_option()
@click.pass_obj
def queue_size(state: State, queue: str | None, connection: str | None) -> None:
    """Show how many jobs wait (ready and delayed) on each queue."""
    wanted = _queue_list(queue)

    async def size(app: App) -> tuple[str, list[tuple[str, int]]]:
        name = app.connection_name(connection)
        names = wanted if wanted is not None else app.known_queues(name)
        return name, [(q, await app.manager.size(q, name)) for q in names]

    name, sizes = run(state, size)
    table = Table(title=f'Queues on "{escape(name)}"', title_justify="left")
    table.add_column("Queue")
    table.add_column("Waiting", justify="right")
    for q, n in sizes:
        table.add_row(escape(q), str(n))
    console().print(table)
