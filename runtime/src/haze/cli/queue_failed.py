"""``queue:failed``, ``queue:retry`` and ``queue:forget``: list, show, retry and delete
failed jobs (by id, ``all``, or filters)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from haze._jobs.definition import registered_jobs
from haze._kernel.crypto import failed_is_encrypted, open_failed
from haze._kernel.errors import HazeError, UnknownJobError
from haze._kernel.ids import match_id, short_id
from haze.cli._core import (
    QUEUE_NAME,
    State,
    cli,
    connection_option,
    console,
    run,
)
from haze.cli._failed_filters import FailedFilter, build_filter, filter_options

if TYPE_CHECKING:
    from haze._app.app import App
    from haze.drivers import FailedJob

__all__ = ["exception_summary", "queue_failed", "queue_forget", "queue_retry"]


def _stamp(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


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


def _failed_table(
    jobs: Sequence[FailedJob],
    connection: str,
    width: int,
    numbers: Sequence[int] | None = None,
) -> Table:
    """Failed jobs, one line each, within ``width`` columns: short ids, and the job name,
    queue and exception cut with "…" (``queue:failed ID`` shows one in full). ``numbers``
    adds the ``#`` column that ``--range`` counts in."""
    table = Table(
        title=f'Failed jobs on "{escape(connection)}"',
        title_justify="left",
        box=None,
        padding=(0, 1),
        pad_edge=False,
        header_style="bold",
    )
    rows = [
        [
            short_id(job.id),
            _cut(job.name, 24),
            _cut(job.queue, 12),
            time.strftime("%m-%d %H:%M:%S", time.localtime(job.failed_at)),
            exception_summary(job.exception),
        ]
        for job in jobs
    ]
    headers = ["ID", "Job", "Queue", "Failed at", "Exception"]
    if numbers is not None:
        headers.insert(0, "#")
        for row, n in zip(rows, numbers, strict=True):
            row.insert(0, str(n))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:-1])]
    # Two spaces between cells; the exception gets the rest of the line.
    left = max(12, width - sum(widths) - 2 * len(widths))
    for header in headers:
        table.add_column(
            header,
            no_wrap=True,
            style="dim" if header in ("ID", "#") else None,
            justify="right" if header == "#" else "left",
        )
    for row in rows:
        row[-1] = _cut(row[-1], left)
        table.add_row(*(escape(cell) for cell in row))
    return table


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _attempts(job: FailedJob) -> str:
    attempt = job.attempt
    if attempt is None:
        return "unknown (recorded before haze kept the attempt)"
    return f"failed on attempt {attempt}"


def _readable(app: App, job: FailedJob) -> tuple[FailedJob, str | None]:
    """An encrypted job's record with its payload and exception decrypted with the app
    key; without a key that opens them, the record as stored and why it is hidden."""
    if not failed_is_encrypted(job):
        return job, None
    if not app.key:
        return job, "encrypted with the app key; set APP_KEY to show it"
    try:
        payload, exception = open_failed(app, job)
    except HazeError as e:
        return job, f"encrypted: {e}"
    return dataclasses.replace(job, payload=payload, exception=exception), None


def _failed_job(job: FailedJob, hidden: str | None = None) -> Table:
    """One failed job in full: every field, the payload and the whole exception
    (``hidden``: why an encrypted job's payload and exception cannot be shown)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    payload = json.dumps(job.payload, indent=2, ensure_ascii=False, default=str)
    exception = job.exception.rstrip()
    if hidden is not None:
        payload, exception = f"({hidden})", f"{exception} ({hidden})"
    rows = [
        ("ID", job.id),
        ("Job", job.name),
        ("Connection", job.connection),
        ("Queue", job.queue),
        ("Failed at", _stamp(job.failed_at)),
        ("Attempts", _attempts(job)),
        ("Chain", job.chain_id),
        ("Batch", job.batch_id),
        ("Payload", payload),
        ("Exception", exception),
    ]
    for label, value in rows:
        if value is not None:
            table.add_row(label, escape(value))
    return table


async def _find_failed(app: App, connection: str, token: str) -> FailedJob:
    """The failed job ``token`` names (a full id or a short one) on ``connection``."""
    jobs = {j.id: j for j in await app.manager.failed(connection)}
    found = match_id(token, jobs)
    if found is None:
        raise click.ClickException(
            f'no failed job with id "{token}" on connection "{connection}" '
            "(haze queue:failed lists them)"
        )
    return jobs[found]


@cli.command("queue:failed", short_help="List failed jobs, or show one in full.")
@click.argument("id", required=False)
@connection_option()
@click.option(
    "--queue",
    type=QUEUE_NAME,
    default=None,
    metavar="NAME",
    help="Only failed jobs from this queue.",
)
@filter_options()
@click.pass_obj
def queue_failed(
    state: State,
    id: str | None,
    connection: str | None,
    queue: str | None,
    f_job: str | None,
    f_exception: str | None,
    f_since: str | None,
    f_ranges: tuple[str, ...],
) -> None:
    """List the failed jobs of a connection, oldest first and numbered (the numbers
    --range takes), or with ID (full or short) show one in full."""
    selection = build_filter(queue, f_job, f_exception, f_since, f_ranges)
    if id is not None and selection.active:
        raise click.UsageError("give an ID or filters, not both")

    async def failed(app: App) -> tuple[str, list[tuple[int, FailedJob]], str | None]:
        name = app.connection_name(connection)
        if id is not None:
            job, hidden = _readable(app, await _find_failed(app, name, id))
            return name, [(1, job)], hidden
        found = selection.numbered(await app.manager.failed(name, queue))
        return name, [(n, _readable(app, job)[0]) for n, job in found], None

    name, numbered, hidden = run(state, failed)
    out = console()
    if id is not None:
        out.print(_failed_job(numbered[0][1], hidden))
        return
    if not numbered:
        matching = f" matching {escape(selection.describe())}" if selection.active else ""
        out.print(f'No failed jobs{matching} on connection "{escape(name)}".')
        return
    jobs = [job for _, job in numbered]
    out.print(_failed_table(jobs, name, out.width, [n for n, _ in numbered]))
    out.print("[dim]One in full: haze queue:failed ID · retry: haze queue:retry ID|all[/]")


def _progress(out: Console, total: int) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=out,
        transient=True,
        disable=total < 2 or not out.is_terminal,
    )


def _ids_or_filters(command: str, ids: tuple[str, ...], selection: FailedFilter) -> bool:
    """Check a command's IDs against its filters; True when the filters (or 'all') pick
    the jobs rather than IDs."""
    if not ids and not selection.active:
        # As Laravel does: acting on everything is asked for, never the default.
        raise click.UsageError(
            f"say which failed jobs to {command}: 'haze queue:{command} all', their IDs as "
            f"'haze queue:failed' lists them ('haze queue:{command} ID [ID]...'), or filters "
            "(--queue, --job, --exception, --since, --range)"
        )
    every = list(ids) == ["all"]
    if not every and "all" in ids:
        raise click.BadParameter("pass either IDs or 'all', not both", param_hint="'IDS'")
    if ids and not every and selection.active:
        raise click.UsageError("give IDs or filters, not both ('all' with filters narrows it)")
    return every or selection.active


@cli.command("queue:retry", short_help="Retry failed jobs (IDs, all, or filters).")
@click.argument("ids", nargs=-1, metavar="ID... | all")
@connection_option()
@click.option(
    "--queue", type=QUEUE_NAME, default=None, metavar="NAME", help="Only failed jobs of this queue."
)
@filter_options()
@click.pass_obj
def queue_retry(
    state: State,
    ids: tuple[str, ...],
    connection: str | None,
    queue: str | None,
    f_job: str | None,
    f_exception: str | None,
    f_since: str | None,
    f_ranges: tuple[str, ...],
) -> None:
    """Put failed jobs back on their queue: the given IDs (full or short), all, or those
    the filters pick (``--queue emails``, ``--range 1-5`` as queue:failed numbers them)."""
    selection = build_filter(queue, f_job, f_exception, f_since, f_ranges)
    retry_all = _ids_or_filters("retry", ids, selection)
    out = console()

    async def retry(app: App) -> tuple[str, int, list[str]]:
        name = app.connection_name(connection)
        failed = await app.manager.failed(name, queue if retry_all else None)
        problems: list[str] = []
        wanted = selection.apply(failed) if retry_all else _by_ids(failed, ids, name, problems)
        jobs = registered_jobs()
        done = 0
        with _progress(out, len(wanted)) as progress:
            task = progress.add_task("Retrying", total=len(wanted))
            for job in wanted:
                problem = await _retry_failed(app, job, name, jobs, quiet_if_gone=retry_all)
                if problem is None:
                    done += 1
                elif problem:
                    problems.append(problem)
                progress.advance(task)
        return name, done, problems

    name, done, problems = run(state, retry)
    for problem in problems:
        click.echo(f"Error: {problem}", err=True)
    out.print(f'Retried {done} failed job(s) on connection "{escape(name)}".')
    if problems:
        click.get_current_context().exit(1)


def _by_ids(
    failed: Sequence[FailedJob], ids: Sequence[str], connection: str, problems: list[str]
) -> list[FailedJob]:
    """The failed jobs the (full or short) ``ids`` name; a problem per id that names none."""
    by_id = {j.id: j for j in failed}
    wanted = []
    for token in dict.fromkeys(ids):
        found = match_id(token, by_id)
        if found is None:
            problems.append(f'no failed job with id "{token}" on connection "{connection}"')
        else:
            wanted.append(by_id[found])
    return wanted


async def _retry_failed(
    app: App, job: FailedJob, connection: str, jobs: Collection[str], *, quiet_if_gone: bool
) -> str | None:
    """Retry one failed job: None when it is back on its queue, else the problem ("" for
    one not worth reporting: with ``quiet_if_gone``, a job another process took first)."""
    if not job.name.startswith("<") and job.name not in jobs:
        # It would only fail again: keep it, and say what is missing.
        return f'failed job "{job.id}" was kept: {UnknownJobError(job.name, jobs)}'
    try:
        retried = await app.manager.retry([job.id], connection=connection)
    except LookupError as e:
        # With 'all', another process may have retried or forgotten it meanwhile.
        return "" if quiet_if_gone else (e.args[0] if e.args else str(e))
    return None if retried else f'failed job "{job.id}" cannot be decoded; it was kept'


@cli.command("queue:forget", short_help="Delete failed jobs (IDs, all, or filters).")
@click.argument("ids", nargs=-1, metavar="ID... | all")
@connection_option()
@click.option(
    "--queue", type=QUEUE_NAME, default=None, metavar="NAME", help="Only failed jobs of this queue."
)
@filter_options()
@click.pass_obj
def queue_forget(
    state: State,
    ids: tuple[str, ...],
    connection: str | None,
    queue: str | None,
    f_job: str | None,
    f_exception: str | None,
    f_since: str | None,
    f_ranges: tuple[str, ...],
) -> None:
    """Delete failed jobs: the given IDs (full or short), all, or those the filters pick."""
    selection = build_filter(queue, f_job, f_exception, f_since, f_ranges)
    by_filter = _ids_or_filters("forget", ids, selection)

    async def forget(app: App) -> tuple[str, list[str], list[str]]:
        name = app.connection_name(connection)
        if by_filter:
            wanted = selection.apply(await app.manager.failed(name, queue))
            gone = [job.id for job in wanted if await app.manager.forget(job.id, name)]
            return name, gone, []
        deleted, missing = [], []
        for token in dict.fromkeys(ids):
            job = await _find_failed(app, name, token)
            if await app.manager.forget(job.id, name):
                deleted.append(job.id)
            else:  # forgotten by another process meanwhile
                missing.append(token)
        return name, deleted, missing

    name, deleted, missing = run(state, forget)
    if missing:
        for token in missing:
            click.echo(f'Error: no failed job with id "{token}" on connection "{name}"', err=True)
        if not deleted:
            click.get_current_context().exit(1)
    out = console()
    if not by_filter and len(deleted) == 1:
        out.print(f'Deleted failed job "{escape(deleted[0])}".')
    else:
        matching = f" matching {escape(selection.describe())}" if selection.active else ""
        out.print(f'Deleted {len(deleted)} failed job(s){matching} on connection "{escape(name)}".')
    if missing:
        click.get_current_context().exit(1)
