"""``haze workflow:list|show|cancel|retry``: durable workflow runs from the command line.

They read through ``runs_for(app)`` (the app's store for haze's own engine, or a
platform's API for a native connection), so they show the same runs ``Workflow.status``
and the dashboard do.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from haze._workflows.api import retry, runs_for
from haze.cli._core import State, cli, console, run
from haze.contracts.workflow import RUN_STATES, StepStatus, WorkflowStatus

if TYPE_CHECKING:
    from haze._app.app import App

__all__ = ["workflow_cancel", "workflow_list", "workflow_retry", "workflow_show"]

_STATE = click.Choice(RUN_STATES)


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s"


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"


def _run_id(value: str) -> str:
    value = value.strip()
    if not value or len(value) > 255:
        raise click.BadParameter("a run id is 1-255 characters", param_hint="'RUN_ID'")
    return value


def _waiting(st: WorkflowStatus) -> str:
    if st.state == "waiting" and st.waiting_for:
        until = f" until {_when(st.resume_at)}" if st.resume_at else ""
        return f'event "{st.waiting_for}"{until}'
    if st.state == "sleeping" and st.resume_at:
        return f"resumes {_when(st.resume_at)}"
    return ""


@cli.command("workflow:list", short_help="List workflow runs, newest first.")
@click.option("--state", "state_", type=_STATE, default=None, help="Only runs in this state.")
@click.option("--name", default=None, metavar="WORKFLOW", help="Only runs of this workflow.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.pass_obj
def workflow_list(state: State, state_: str | None, name: str | None, limit: int) -> None:
    """List workflow runs (newest first) with their state and what they wait for."""

    async def listing(app: App) -> list[WorkflowStatus]:
        return await runs_for(app, name).list(state_, name, limit)

    runs = run(state, listing)
    out = console()
    if not runs:
        what = " ".join(filter(None, [state_, f'of "{name}"' if name else None]))
        out.print(f"No {what + ' ' if what else ''}workflow runs.")
        return
    table = Table("id", "workflow", "state", "started", "updated", "waiting", box=None)
    for st in runs:
        table.add_row(
            escape(st.id),
            escape(st.name),
            st.state,
            _when(st.created_at),
            _when(st.updated_at),
            escape(_waiting(st)),
        )
    out.print(table)


def _steps_table(steps: list[StepStatus]) -> Table:
    table = Table("#", "step", "kind", "state", "attempts", "duration", "result", box=None)
    for s in steps:
        table.add_row(
            str(s.position),
            escape(s.name),
            s.kind,
            s.state + (f": {escape(s.error)}" if s.error else ""),
            str(s.attempts),
            _seconds(s.duration),
            _size(s.result_size),
        )
    return table


_HIDDEN = "(encrypted with the app key; set APP_KEY to show it)"


def _shown(value: Any) -> str:
    return escape(json.dumps(value, ensure_ascii=False, default=str)[:2000])


@cli.command("workflow:show", short_help="Show one run: its steps and pending wait.")
@click.argument("run_id")
@click.pass_obj
def workflow_show(state: State, run_id: str) -> None:
    """Show run RUN_ID: state, input, result or error, each step and what it waits for."""
    rid = _run_id(run_id)

    async def show(app: App) -> WorkflowStatus | None:
        return await runs_for(app).status(rid)

    st = run(state, show)
    if st is None:
        raise click.ClickException(f'no workflow run "{rid}" (check the id: workflow:list)')
    out = console()
    out.print(f"[bold]{escape(st.name)}[/bold] run {escape(st.id)}: {st.state}")
    out.print(f"  started {_when(st.created_at)}, updated {_when(st.updated_at)}")
    if _waiting(st):
        out.print(f"  waiting: {escape(_waiting(st))}")
    hidden = st.encrypted and st.input is None  # no key to open them
    out.print(f"  input:   {_HIDDEN if hidden else _shown(st.input)}")
    if st.state == "done":
        out.print(f"  result:  {_HIDDEN if hidden else _shown(st.result)}")
    if st.error:
        out.print(f"  error:   {escape(st.error)}")
    if st.steps:
        out.print(_steps_table(st.steps))
    else:
        out.print("  no steps reached yet")


@cli.command("workflow:cancel", short_help="Cancel a run that has not finished.")
@click.argument("run_id")
@click.pass_obj
def workflow_cancel(state: State, run_id: str) -> None:
    """Cancel run RUN_ID: its next step does not start."""
    rid = _run_id(run_id)

    async def cancel(app: App) -> tuple[bool, WorkflowStatus | None]:
        runs = runs_for(app)
        return await runs.cancel(rid), await runs.status(rid)

    cancelled, st = run(state, cancel)
    if st is None:
        raise click.ClickException(f'no workflow run "{rid}" (check the id: workflow:list)')
    if not cancelled:
        raise click.ClickException(f'run "{rid}" of "{st.name}" is {st.state}: nothing to cancel')
    console().print(f'Cancelled run {escape(rid)} of "{escape(st.name)}".')


@cli.command("workflow:retry", short_help="Retry a failed run from its last kept step.")
@click.argument("run_id")
@click.pass_obj
def workflow_retry(state: State, run_id: str) -> None:
    """Replay failed run RUN_ID: kept step results are reused, the step that failed
    runs again."""
    rid = _run_id(run_id)

    async def again(app: App) -> tuple[bool, WorkflowStatus | None]:
        return await retry(rid), await runs_for(app).status(rid)

    retried, st = run(state, again)
    if st is None:
        raise click.ClickException(f'no workflow run "{rid}" (check the id: workflow:list)')
    if not retried and st.state == "failed":
        raise click.ClickException(
            f'run "{rid}" is of workflow "{st.name}", which this app does not define; '
            "retry it from the app that does"
        )
    if not retried:
        raise click.ClickException(
            f'run "{rid}" of "{st.name}" is {st.state}: only a failed run is retried'
        )
    console().print(f'Retrying run {escape(rid)} of "{escape(st.name)}".')
