"""``queue:routes``: the ``routes`` table of ``config/queue.py``, each row with the
registered jobs that take it and where they land (``--json`` for scripts)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from haze._jobs.definition import registered_jobs
from haze.cli._core import State, cli, console

if TYPE_CHECKING:
    from haze._app.app import App
    from haze._base.routes import JobRoute

__all__ = ["queue_routes", "route_rows"]

NO_ROUTES = (
    "no routes: add routes={'mail.*': {'queue': 'mail'}} to define_queue_config(...) in "
    "config/queue.py to send jobs by name to a queue or connection"
)


def route_rows(app: App) -> list[dict[str, Any]]:
    """Each route in table order: its pattern, queue and connection, and the registered
    jobs that take it, each with where it lands and what its definition sets itself
    (``own``: those fields win over the route)."""
    routes = app.queue_config.routes
    taken: dict[str, list[dict[str, Any]]] = {r.pattern: [] for r in routes}
    for name, job in sorted(registered_jobs().items()):
        route = routes.match(name)
        if route is None:
            continue
        own = [f for f in ("queue", "connection") if getattr(job, f) is not None]
        taken[route.pattern].append(
            {
                "job": name,
                "queue": routes.queue_for(name, job.queue) or "default",
                "connection": routes.connection_for(name, job.connection)
                or app.queue_config.default,
                "own": own,
            }
        )
    return [_row(r, taken[r.pattern]) for r in routes]


def _row(route: JobRoute, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "pattern": route.pattern,
        "queue": route.queue,
        "connection": route.connection,
        "jobs": jobs,
    }


def _jobs_cell(row: dict[str, Any]) -> str:
    if not row["jobs"]:
        return "[dim]no registered job[/]"
    cells = []
    for j in row["jobs"]:
        cell = escape(j["job"])
        if j["own"]:
            mine = ", ".join(f"{f} {j[f]}" for f in j["own"])
            cell += f" [yellow](own {escape(mine)} wins)[/]"
        cells.append(cell)
    return "\n".join(cells)


@cli.command("queue:routes", short_help="The job routes of config/queue.py.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, for scripts.")
@click.pass_obj
def queue_routes(state: State, as_json: bool) -> None:
    """Show each route (job-name pattern -> queue/connection), in the order it is tried,
    with the registered jobs that take it. A pattern without * ? [ names one job and
    wins over every glob; otherwise the first matching glob wins. A job's own queue= or
    connection= (define_job), and on_queue()/on_connection() at dispatch, win over its
    route."""
    app = state.app()
    rows = route_rows(app)
    if as_json:
        click.echo(json.dumps({"source": app.queue_config.source, "routes": rows}))
        return
    if not rows:
        click.echo(NO_ROUTES)
        return
    table = Table(title="Job routes", title_justify="left", header_style="bold")
    for header in ("Pattern", "Queue", "Connection", "Jobs"):
        table.add_column(header)
    for row in rows:
        table.add_row(
            escape(row["pattern"]),
            escape(row["queue"] or "-"),
            escape(row["connection"] or "-"),
            _jobs_cell(row),
        )
    console().print(table)
