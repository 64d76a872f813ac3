"""Operator ``queue:*`` commands: worker signals, monitoring, pruning and batch retries.

``queue:restart``, ``queue:pause`` and ``queue:continue`` write signals into the queue
store; workers started by ``haze queue:work`` read them about once a second, so they
need a store every process shares (redis or database).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from haze._base.ids import match_id
from haze._engine.control import pause, request_restart, resume
from haze._engine.manager import events
from haze._orchestration.batches import find, prune
from haze._workers.presence import live_workers
from haze._workflows.api import Workflow
from haze._workflows.results import run_of_key
from haze.cli._core import (
    DURATION,
    HOURS,
    QUEUE_NAMES,
    State,
    cli,
    connection_option,
    console,
    queue_names,
    run,
)
from haze.contracts.driver import UncountedQueues

if TYPE_CHECKING:
    from collections.abc import Callable

    from haze._app.app import App
    from haze._orchestration.batches import Batch
    from haze.drivers import FailedJob

__all__ = [
    "parse_target",
    "queue_continue",
    "queue_monitor",
    "queue_pause",
    "queue_prune_batches",
    "queue_prune_failed",
    "queue_prune_offload",
    "queue_restart",
    "queue_retry_batch",
    "unfinished_run",
]

_TARGET_HELP = (
    "expected CONNECTION:QUEUE, e.g. database:default (or QUEUE for the default connection)"
)


def parse_target(app: App, value: str, param_hint: str = "'CONNECTION:QUEUE'") -> tuple[str, str]:
    """``"redis:emails"`` → ``("redis", "emails")``; a bare ``"emails"`` uses the default
    connection (as Laravel does). Raises ``click.BadParameter`` for a malformed value or
    an unknown connection."""
    connection, sep, queue = value.partition(":")
    if not sep:
        connection, queue = app.queue_config.default, value
    connection, queue = connection.strip(), queue.strip()
    if not connection or not queue or "," in queue:
        raise click.BadParameter(f"{value!r}: {_TARGET_HELP}", param_hint=param_hint)
    try:
        queue_names(queue, many=False)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=param_hint) from None
    known = app.queue_config.connections
    if connection not in known:
        raise click.BadParameter(
            f"{value!r}: unknown connection {connection!r}; configured connections: "
            f"{', '.join(known)}",
            param_hint=param_hint,
        )
    return connection, queue


def _require_shared_store(app: App, command: str) -> None:
    """Signals in a process-local store vanish with this command: refuse, and say why."""
    store = app.queue_store
    if not store.shared:
        raise click.ClickException(
            f'{command} needs a store every process shares, but the queue store "{store.name}" '
            "lives in this process only, so no worker would see the signal. Set store= to a "
            "redis or database store in config/queue.py (stores are in config/cache.py)."
        )


def _progress(out: Console, description: str) -> Progress:
    """A bar for long commands, shown only on a terminal (scripts get the summary line)."""
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        console=out,
        transient=True,
        disable=not out.is_terminal,
    )


@contextmanager
def _bar(out: Console, description: str) -> Iterator[Callable[[int, int], None]]:
    """Yields ``update(done, total)`` driving a progress bar."""
    with _progress(out, description) as progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


# ====================================================================== worker signals


@cli.command("queue:restart", short_help="Ask every worker to exit after its running jobs.")
@click.pass_obj
def queue_restart(state: State) -> None:
    """Every queue:work process stops after its running jobs (a supervisor restarts it)."""
    app = state.app()
    _require_shared_store(app, "queue:restart")
    run(state, request_restart)
    console().print("Broadcasting queue restart signal: workers exit after their running jobs.")


@cli.command("queue:pause", short_help="Stop workers claiming jobs from a queue.")
@click.argument("target", metavar="CONNECTION:QUEUE")
@click.pass_obj
def queue_pause(state: State, target: str) -> None:
    """Workers stop claiming from CONNECTION:QUEUE (running jobs finish) until queue:continue."""
    app = state.app()
    connection, queue = parse_target(app, target)
    if app.queue_config.connections[connection]["driver"] == "sync":
        raise click.ClickException(
            f'connection "{connection}" is sync: it runs jobs inside dispatch(), no worker '
            "claims them, so there is nothing to pause"
        )
    _require_shared_store(app, "queue:pause")
    known = run(state, lambda a: _pause(a, connection, queue))
    console().print(
        f'Paused queue "{escape(queue)}" on connection "{escape(connection)}": workers finish '
        "their running jobs and claim no new ones from it until queue:continue."
    )
    if queue not in known:
        # Paused all the same: a queue picked at dispatch (on_queue) is known to no config,
        # yet a typo leaves the queue meant running while the operator believes it paused.
        click.echo(
            f'Warning: no configured queue, job or running worker uses queue "{queue}" on '
            f'connection "{connection}" (they use: {", ".join(known)}); if that was a typo, '
            f"undo it with haze queue:continue {shlex.quote(target)}",
            err=True,
        )


async def _pause(app: App, connection: str, queue: str) -> list[str]:
    """Pause ``queue``; the queues the config, the jobs and the live workers use there."""
    await pause(app, connection, queue)
    known = app.known_queues(connection)
    for record in await live_workers(app) or []:
        if record.get("connection") == connection:
            known.extend(q for q in record.get("queues") or [] if q not in known)
    return known


@cli.command("queue:continue", short_help="Let workers claim from a paused queue again.")
@click.argument("target", metavar="CONNECTION:QUEUE")
@click.pass_obj
def queue_continue(state: State, target: str) -> None:
    """Undo queue:pause for CONNECTION:QUEUE."""
    app = state.app()
    connection, queue = parse_target(app, target)
    _require_shared_store(app, "queue:continue")
    was_paused = run(state, lambda a: resume(a, connection, queue))
    where = f'queue "{escape(queue)}" on connection "{escape(connection)}"'
    if was_paused:
        console().print(f"Resumed {where}: workers claim from it again.")
    else:
        console().print(f"{where[0].upper()}{where[1:]} was not paused.")


# ====================================================================== monitor


@cli.command("queue:monitor", short_help="Show queue sizes; emit queue_busy over --max.")
@click.argument("targets", nargs=-1, metavar="[CONNECTION:QUEUE[,...]]")
@click.option(
    "--max",
    "max_size",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Alert when a queue holds this many jobs or more.",
)
@click.option(
    "--queue",
    "queues",
    type=QUEUE_NAMES,
    default=None,
    metavar="NAMES",
    help="Without targets: these queues (default: the connection's queues and every queue "
    "its registered jobs name).",
)
@connection_option("Without targets: the connection to look at (default: the config default).")
@click.pass_obj
def queue_monitor(
    state: State,
    targets: tuple[str, ...],
    max_size: int,
    queues: list[str] | None,
    connection: str | None,
) -> None:
    """Show how many jobs wait on each queue. A queue holding --max jobs or more is
    marked ALERT and the ``queue_busy`` event fires with (connection, queue, size):
    listen with ``Queue.on("queue_busy", fn)`` in a job module. Run it every minute.
    Without targets: --connection's --queue (default: its queues and every queue its
    registered jobs name)."""
    app = state.app()
    items = [part for t in targets for part in t.split(",") if part.strip()]
    if targets and not items:
        raise click.BadParameter(_TARGET_HELP, param_hint="'CONNECTION:QUEUE'")
    if items and (queues is not None or connection is not None):
        raise click.UsageError("give CONNECTION:QUEUE targets or --connection/--queue, not both")
    name = app.connection_name(connection)
    wanted = list(dict.fromkeys(parse_target(app, item) for item in items)) or [
        (name, q) for q in (queues or app.known_queues(name))
    ]

    notes: dict[str, str] = {}

    async def monitor(app: App) -> list[tuple[str, str, int | None]]:
        sizes: list[tuple[str, str, int | None]] = []
        for c, q in wanted:
            driver = app.driver(c)
            if isinstance(driver, UncountedQueues):  # Vercel Queues tell no depth
                notes[c] = driver.counts_note
                sizes.append((c, q, None))
            else:
                sizes.append((c, q, await app.manager.size(q, c)))
        for c, q, n in sizes:
            if n is not None and n >= max_size:
                await events.emit("queue_busy", c, q, n)
        return sizes

    sizes = run(state, monitor)
    table = Table(title=f"Queue sizes (alert at {max_size})", title_justify="left")
    table.add_column("Connection")
    table.add_column("Queue")
    table.add_column("Size", justify="right")
    table.add_column("Status")
    busy = 0
    for c, q, n in sizes:
        if n is None:
            table.add_row(escape(c), escape(q), "?", escape(notes[c]))
            continue
        alert = n >= max_size
        busy += alert
        status = "[bold yellow]ALERT[/]" if alert else "[green]OK[/]"
        table.add_row(escape(c), escape(q), str(n), status)
    out = console()
    out.print(table)
    if busy:
        out.print(f"{busy} queue(s) at or over {max_size} job(s): queue_busy emitted.")


# ====================================================================== pruning


@cli.command("queue:prune-failed", short_help="Delete failed jobs older than --hours.")
@click.option(
    "--hours",
    type=HOURS,
    default=24.0,
    show_default=True,
    help="Keep the failed jobs of the last this many hours.",
)
@connection_option()
@click.pass_obj
def queue_prune_failed(state: State, hours: float, connection: str | None) -> None:
    """Delete the failed jobs recorded more than --hours ago."""

    async def prune(app: App) -> tuple[str, int]:
        name = app.connection_name(connection)
        return name, await app.manager.flush(name, hours * 3600)

    name, n = run(state, prune)
    console().print(
        f'Pruned {n} failed job(s) older than {hours:g} hour(s) on connection "{escape(name)}".'
    )


@cli.command("queue:prune-offload", short_help="Delete orphaned offloaded payloads.")
@click.option(
    "--older-than",
    "older_than",
    type=DURATION,
    required=True,
    help="Only objects written longer ago than this (e.g. 7d): longer than any delay, "
    "retry backoff or run a queued job may still have ahead of it.",
)
@connection_option()
@click.pass_obj
def queue_prune_offload(state: State, older_than: float, connection: str | None) -> None:
    """Delete offloaded payloads no job will read: objects of the connection's offload
    store written more than --older-than ago that no failed job refers to (left by a
    process that died between writing a payload and queueing its message, or between
    a job's ack and the delete)."""

    async def prune(app: App) -> tuple[str, int]:
        name = app.connection_name(connection)
        return name, await app.manager.prune_offload(older_than, name, spare=unfinished_run)

    name, n = run(state, prune)
    console().print(
        f"Pruned {n} offloaded payload(s) older than {older_than:g}s on connection "
        f'"{escape(name)}".'
    )


async def unfinished_run(key: str) -> bool:
    """Whether ``key`` holds a step result of a workflow run that has not ended (a run
    that sleeps for weeks still reads its results on every replay) or that failed (a
    retry replays it with them)."""
    run_id = run_of_key(key)
    if run_id is None:
        return False
    status = await Workflow.status(run_id)
    return status is not None and (not status.finished or status.state == "failed")


@cli.command("queue:prune-batches", short_help="Delete old batch records.")
@click.option(
    "--hours",
    type=HOURS,
    default=24.0,
    show_default=True,
    help="Delete finished batches that finished more than this many hours ago.",
)
@click.option(
    "--unfinished",
    type=HOURS,
    default=None,
    metavar="HOURS",
    help="Also delete unfinished batches created more than this many hours ago.",
)
@click.option(
    "--cancelled",
    type=HOURS,
    default=None,
    metavar="HOURS",
    help="Also delete cancelled batches created more than this many hours ago.",
)
@click.pass_obj
def queue_prune_batches(
    state: State, hours: float, unfinished: float | None, cancelled: float | None
) -> None:
    """Delete batch state from the batches store (all of it expires after batches.ttl
    anyway; pruning frees it sooner). Schedule it daily."""
    app = state.app()
    out = console()
    store = app.batch_store
    if not store.shared:
        out.print(
            f'The batches store "{escape(store.name)}" lives in each process only; this '
            "process holds no batches. Nothing to prune."
        )
        return
    now = time.time()

    def before(h: float | None) -> float | None:
        return None if h is None else now - h * 3600

    async def prune_batches(app: App) -> int:
        with _bar(out, "Pruning batches") as update:
            finished = before(hours)
            assert finished is not None
            return await prune(
                app.manager,
                finished_before=finished,
                unfinished_before=before(unfinished),
                cancelled_before=before(cancelled),
                progress=update,
            )

    n = run(state, prune_batches)
    out.print(f"Pruned {n} batch(es).")


# ====================================================================== retry-batch


@cli.command("queue:retry-batch", short_help="Retry the failed jobs of a batch.")
@click.argument("batch_id")
@connection_option("The connection holding the failed jobs (default: the batch's connection).")
@click.pass_obj
def queue_retry_batch(state: State, batch_id: str, connection: str | None) -> None:
    """Put every failed job of batch BATCH_ID (full or short) back on its queue."""
    out = console()

    async def retry(app: App) -> tuple[str, Batch | None, int, int, list[str]]:
        nonlocal batch_id
        manager = app.manager
        batch = await find(manager, batch_id)
        if batch is None:
            # A short id (as printed by the worker and queue:failed) names a batch of the
            # failed jobs on the connection.
            failed = await manager.failed(app.connection_name(connection))
            full = match_id(batch_id, {j.batch_id for j in failed if j.batch_id})
            if full is not None:
                batch_id = full
                batch = await find(manager, full)
        conn = connection
        if conn is None and batch is not None:
            conn = batch.options.get("connection")
        name = app.connection_name(conn)
        jobs: list[FailedJob] = [j for j in await manager.failed(name) if j.batch_id == batch_id]
        done = 0
        problems: list[str] = []
        with _bar(out, "Retrying") as update:
            for i, job in enumerate(jobs, 1):
                try:
                    if await manager.retry([job.id], connection=name):
                        done += 1
                    else:
                        problems.append(f'failed job "{job.id}" cannot be decoded; it was kept')
                except LookupError:
                    pass  # retried or forgotten by someone else meanwhile
                update(i, len(jobs))
        return name, batch, len(jobs), done, problems

    name, batch, found, done, problems = run(state, retry)
    where = f'connection "{escape(name)}"'
    if batch is None and not found:
        raise click.ClickException(
            f'no batch "{batch_id}" (unknown, pruned or expired) and no failed jobs of it on '
            f'connection "{name}"'
        )
    if batch is None:
        out.print(
            f'[yellow]Batch "{escape(batch_id)}" is gone from the batches store (pruned or '
            "expired); its failed jobs are retried without batch tracking.[/]"
        )
    elif batch.cancelled and found:
        out.print(
            f'[yellow]Batch "{escape(batch_id)}" is cancelled: its retried jobs are skipped '
            "when they run (use allow_failures() for batches whose jobs may be retried).[/]"
        )
    for problem in problems:
        click.echo(f"Error: {problem}", err=True)
    if not found:
        out.print(f'Batch "{escape(batch_id)}" has no failed jobs on {where}.')
    else:
        out.print(f'Retried {done} failed job(s) of batch "{escape(batch_id)}" on {where}.')
    if problems:
        click.get_current_context().exit(1)
