"""``queue:*`` commands: run a worker and manage failed and waiting jobs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from ._core import (
    DURATION,
    QUEUE_NAME,
    State,
    cli,
    connection_option,
    console,
    queue_names,
    run,
)

if TYPE_CHECKING:
    from ..app import App
    from ..drivers import FailedJob, Reserved
    from ..worker import Worker

__all__ = [
    "exception_summary",
    "job_line",
    "queue_clear",
    "queue_failed",
    "queue_flush",
    "queue_forget",
    "queue_retry",
    "queue_size",
    "queue_work",
]

SYNC_REFUSAL = "the sync connection runs jobs inside dispatch(); there is nothing to work"

_OUTCOME_STYLE = {
    "done": "green",
    "retry": "yellow",
    "released": "cyan",
    "failed": "bold red",
    "skipped": "dim",
}


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


def _stamp(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


# ====================================================================== queue:work


def job_line(reserved: Reserved, outcome: str, seconds: float) -> str:
    """The ``queue:work -v`` line (rich markup) for one processed job."""
    message = reserved.message
    name = message.job if message is not None else "<undecodable message>"
    job_id = message.id if message is not None else "-"
    style = _OUTCOME_STYLE.get(outcome, "magenta")
    return (
        f"{_stamp()} [{style}]{outcome.upper():<8}[/] {escape(name)} [dim]{job_id}[/] "
        f"queue={escape(reserved.queue)} attempt={reserved.attempt} {seconds * 1000:.0f}ms"
    )


@contextlib.contextmanager
def _stop_on_signals(worker: Worker, out: Console, task: asyncio.Task[int]) -> Iterator[list[int]]:
    """First SIGTERM/SIGINT: stop claiming and let running jobs finish. Second: abandon them.

    Yields a list that receives the number of the signal that forced the exit, if any.
    """
    loop = asyncio.get_running_loop()
    forced: list[int] = []
    received: list[int] = []

    def handle(signum: int) -> None:
        received.append(signum)
        if len(received) == 1:
            name = signal.Signals(signum).name
            if worker.running:
                out.print(
                    f"{name}: no new jobs; waiting for {worker.running} running job(s). "
                    "Send it again to quit now."
                )
            else:
                out.print(f"{name}: stopping.")
            worker.request_stop()
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
    type=click.IntRange(min=1),
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
@click.option("-v", "--verbose", is_flag=True, help="Print one line per processed job.")
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
) -> None:
    """Run a worker on a connection until stopped (SIGTERM/SIGINT drain running jobs)."""
    queues = _queue_list(queue)
    app = state.app()
    name = app.connection_name(connection)
    options = app.queue_config.connections[name]
    if options["driver"] == "sync" or app.driver(name).inline:
        raise click.ClickException(f'connection "{name}": {SYNC_REFUSAL}')
    out = console()

    async def work(app: App) -> int:
        from ..worker import Worker

        driver = app.driver(name)
        chosen = queues
        if chosen is None and driver.remote:
            chosen = _default_queues(app, name)
        # A local (memory) worker with no --queue takes every queue, like the in-app one.
        pace = sleep if sleep is not None else options.get("sleep") or 1.0
        ceiling = options.get("max_sleep")
        worker = Worker(
            app,
            name,
            chosen,
            concurrency or options.get("concurrency") or 1,
            once=once,
            max_jobs=max_jobs,
            max_time=max_time,
            stop_when_empty=stop_when_empty,
            sleep=pace,
            max_sleep=max(ceiling, pace) if ceiling is not None else None,
            on_job=(lambda r, o, s: out.print(job_line(r, o, s))) if verbose else None,
            control=True,  # follow queue:restart and queue:pause through the store
        )
        loop = asyncio.get_running_loop()
        # Started before the handlers go in: a stop requested earlier would be reset.
        worker.start()
        task = loop.create_task(worker.run())
        # An idle in-process slot sleeps until woken, so it would not see --max-time itself.
        timer = loop.call_later(max_time, worker.request_stop) if max_time is not None else None
        with _stop_on_signals(worker, out, task) as forced:
            # Announced only now, so whoever waits for this line can signal us safely.
            shown = ", ".join(chosen) if chosen else "all"
            out.print(
                f'Working connection "{escape(name)}" (queues: {escape(shown)}, concurrency '
                f"{worker.concurrency}). Ctrl+C or SIGTERM stops after the running jobs."
            )
            try:
                processed = await task
            except asyncio.CancelledError:
                if not forced:
                    raise
                out.print("Stopped without waiting for the running jobs.")
                return 128 + forced[0]
            finally:
                if timer is not None:
                    timer.cancel()
        out.print(f"Worker stopped after {processed} job(s).")
        return 0

    haze_log = logging.getLogger("haze")
    level = haze_log.level
    if verbose:
        # Job logs (job.logger.info) belong in a verbose worker's output too.
        haze_log.setLevel(min(logging.INFO, level or logging.INFO))
    try:
        code = run(state, work)
    finally:
        haze_log.setLevel(level)
    if code:
        click.get_current_context().exit(code)


# ====================================================================== failed jobs


def exception_summary(text: str) -> str:
    """The ``ValueError: boom`` line of a stored traceback (or the text's first line)."""
    lines = text.strip().splitlines()
    if not lines:
        return ""
    if lines[0].startswith("Traceback"):
        # The final exception's summary follows the last indented frame line.
        last_frame = max((i for i, ln in enumerate(lines) if ln[:1].isspace()), default=-1)
        tail = [ln for ln in lines[last_frame + 1 :] if ln.strip()]
        if tail:
            return tail[0]
    return lines[0]


def _failed_table(jobs: Sequence[FailedJob], connection: str) -> Table:
    table = Table(title=f'Failed jobs on "{escape(connection)}"', title_justify="left")
    table.add_column("ID", no_wrap=True, style="dim")
    table.add_column("Job", overflow="fold")
    table.add_column("Queue", overflow="fold")
    table.add_column("Failed at", no_wrap=True)
    table.add_column("Exception", overflow="fold", ratio=1)
    for job in jobs:
        table.add_row(
            escape(job.id),
            escape(job.name),
            escape(job.queue),
            _stamp(job.failed_at),
            escape(exception_summary(job.exception)),
        )
    return table


@cli.command("queue:failed")
@connection_option()
@click.option(
    "--queue",
    type=QUEUE_NAME,
    default=None,
    metavar="NAME",
    help="Only failed jobs from this queue.",
)
@click.pass_obj
def queue_failed(state: State, connection: str | None, queue: str | None) -> None:
    """List the failed jobs of a connection."""

    async def failed(app: App) -> tuple[str, list[FailedJob]]:
        name = app.connection_name(connection)
        return name, await app.manager.failed(name, queue)

    name, jobs = run(state, failed)
    out = console()
    if not jobs:
        out.print(f'No failed jobs on connection "{escape(name)}".')
        return
    out.print(_failed_table(jobs, name))


def _progress(out: Console, total: int) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=out,
        transient=True,
        disable=total < 2 or not out.is_terminal,
    )


@cli.command("queue:retry", short_help="Retry failed jobs (IDs or all).")
@click.argument("ids", nargs=-1, metavar="[ID]... | all")
@connection_option()
@click.option(
    "--queue", type=QUEUE_NAME, default=None, metavar="NAME", help="With 'all': only this queue."
)
@click.pass_obj
def queue_retry(
    state: State, ids: tuple[str, ...], connection: str | None, queue: str | None
) -> None:
    """Put failed jobs back on their queue: the given IDs, or all of them."""
    retry_all = not ids or list(ids) == ["all"]
    if not retry_all and "all" in ids:
        raise click.BadParameter("pass either IDs or 'all', not both", param_hint="'IDS'")
    out = console()

    async def retry(app: App) -> tuple[str, int, list[str]]:
        name = app.connection_name(connection)
        manager = app.manager
        wanted = [j.id for j in await manager.failed(name, queue)] if retry_all else list(ids)
        done = 0
        problems: list[str] = []
        with _progress(out, len(wanted)) as progress:
            task = progress.add_task("Retrying", total=len(wanted))
            for job_id in wanted:
                try:
                    retried = await manager.retry([job_id], connection=name)
                except LookupError as e:
                    # With 'all', another process may have retried or forgotten it meanwhile.
                    if not retry_all:
                        problems.append(str(e).strip("'\""))
                else:
                    if retried:
                        done += 1
                    else:
                        problems.append(f'failed job "{job_id}" cannot be decoded; it was kept')
                progress.advance(task)
        return name, done, problems

    name, done, problems = run(state, retry)
    for problem in problems:
        click.echo(f"Error: {problem}", err=True)
    out.print(f'Retried {done} failed job(s) on connection "{escape(name)}".')
    if problems:
        click.get_current_context().exit(1)


@cli.command("queue:forget")
@click.argument("id")
@connection_option()
@click.pass_obj
def queue_forget(state: State, id: str, connection: str | None) -> None:
    """Delete one failed job."""

    async def forget(app: App) -> tuple[str, bool]:
        name = app.connection_name(connection)
        return name, await app.manager.forget(id, name)

    name, found = run(state, forget)
    if not found:
        raise click.ClickException(f'no failed job with id "{id}" on connection "{name}"')
    console().print(f'Deleted failed job "{escape(id)}".')


@cli.command("queue:flush")
@click.option(
    "--hours",
    type=click.FloatRange(min=0),
    default=None,
    help="Only failed jobs older than this many hours.",
)
@connection_option()
@click.pass_obj
def queue_flush(state: State, hours: float | None, connection: str | None) -> None:
    """Delete all failed jobs (or only those older than --hours)."""

    async def flush(app: App) -> tuple[str, int]:
        name = app.connection_name(connection)
        older_than = hours * 3600 if hours is not None else None
        return name, await app.manager.flush(name, older_than)

    name, n = run(state, flush)
    console().print(f'Deleted {n} failed job(s) on connection "{escape(name)}".')


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
    help="Comma-separated queues (default: the connection's queues, else 'default').",
)
@connection_option()
@click.pass_obj
def queue_size(state: State, queue: str | None, connection: str | None) -> None:
    """Show how many jobs wait (ready and delayed) on each queue."""
    wanted = _queue_list(queue)

    async def size(app: App) -> tuple[str, list[tuple[str, int]]]:
        name = app.connection_name(connection)
        names = wanted if wanted is not None else _default_queues(app, name)
        return name, [(q, await app.manager.size(q, name)) for q in names]

    name, sizes = run(state, size)
    table = Table(title=f'Queues on "{escape(name)}"', title_justify="left")
    table.add_column("Queue")
    table.add_column("Waiting", justify="right")
    for q, n in sizes:
        table.add_row(escape(q), str(n))
    console().print(table)
