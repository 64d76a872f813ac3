"""``make:queue-tables`` and ``db:migrate``: the schema of the database queue driver."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape

from haze._base.errors import HazeError
from haze.cli._core import State, cli, connection_option, console, run
from haze.connectors import missing_column
from haze.connectors.migrations import (
    MIGRATIONS_DIR,
    MigrationResult,
    convert_hint,
    dialect_specific,
    migrate,
    pending_migrations,
)
from haze.connectors.migrations import make_queue_tables as write

if TYPE_CHECKING:
    from haze._app.app import App

__all__ = ["db_migrate", "make_queue_tables"]


@cli.command("make:queue-tables", short_help="Write the migration for the jobs tables.")
@connection_option(
    "The database queue connection whose tables to write (default: the default connection "
    "if it uses the database driver, else the first one that does)."
)
@click.option("--force", is_flag=True, help="Rewrite the migration if it exists.")
@click.pass_obj
def make_queue_tables(state: State, connection: str | None, force: bool) -> None:
    """Write database/migrations/<stamp>_create_<jobs>_and_<failed>_tables.py, which
    creates the tables on whichever database `haze db:migrate` applies it to."""

    async def make(app: App) -> tuple[Path, bool]:
        before = set(pending_migrations(app))
        path = write(app, connection, force=force)
        return path, path in before

    path, existed = run(state, make)
    out = console()
    if existed and not force and dialect_specific(path):
        out.print(f"Migration {path}: {convert_hint(path)}", markup=False)
        return
    if existed and not force:
        out.print(f"Migration already exists: {path} (pass --force to rewrite it)", markup=False)
    elif existed:
        out.print(f"Migration rewritten: {path}", markup=False)
    else:
        out.print(f"Migration written to {path}", markup=False)
    out.print("Apply it with: haze db:migrate", markup=False)


@cli.command("db:migrate", short_help="Apply the app's pending SQL migrations.")
@click.option(
    "--database",
    default=None,
    metavar="NAME",
    help="The connection in config/database.py (default: its default connection).",
)
@click.pass_obj
def db_migrate(state: State, database: str | None) -> None:
    """Apply database/migrations/*.sql and *.py not applied yet (recorded in
    haze_migrations), then upgrade the tables an earlier haze version created."""

    dialect = ""  # the migrated database's, to read its errors by
    progress = MigrationResult([], [])  # names the migration that failed

    async def apply(app: App) -> tuple[str, bool, MigrationResult]:
        nonlocal dialect
        name = database or app.database_config.default
        dialect = app.database(database).dialect
        has_files = bool(pending_migrations(app))
        return name, has_files, await migrate(app, database, progress)

    try:
        name, has_files, result = run(state, apply)
    except (click.ClickException, HazeError, OSError):
        raise
    except Exception as e:
        # The database's own error (bad SQL, a table that exists): the user's to fix. Its
        # first line only: PostgreSQL adds the statement and a caret under it.
        first = (str(e).strip().splitlines() or [""])[0]
        hint = (
            '; a table of the queue\'s name exists with other columns: set "table" and '
            '"failed_table" on the queue connection in config/queue.py to free names, '
            "delete the migration that failed, and run haze make:queue-tables again"
            if missing_column(e, dialect)
            else ""
        )
        where = f"{MIGRATIONS_DIR / progress.current}: " if progress.current else ""
        raise click.ClickException(
            f"db:migrate stopped: {where}{type(e).__name__}: {first}{hint} (migrations "
            "applied before it stay applied)"
        ) from None
    out = console()
    for table in result.upgraded:
        out.print(f"[green]Upgraded[/] table {escape(table)} to this version's definition")
    if not has_files:
        out.print(
            f"No migrations in {MIGRATIONS_DIR}/; write one with: haze make:queue-tables",
            markup=False,
        )
        return
    for file in result.skipped:
        out.print(f"[dim]Skipped {escape(file)} (already applied)[/]")
    for file in result.applied:
        out.print(f"[green]Applied[/] {escape(file)}")
    if result.applied:
        out.print(f'Applied {len(result.applied)} migration(s) on database "{escape(name)}".')
    else:
        out.print(f'Nothing to migrate on database "{escape(name)}".')
