"""``schedule:*`` commands: run the scheduler, list schedules, fire one now."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from haze._base.errors import ScheduleError
from haze._orchestration.scheduling import Scheduler, registered_schedules, run_now
from haze.cli._core import State, cli, run
from haze.cli._loop import event_loop, loop_option

if TYPE_CHECKING:
    from haze._app.app import App
    from haze._orchestration.scheduling import Schedule

__all__ = ["check_runnable", "schedule_list", "schedule_run", "schedule_work", "start_scheduler"]

NO_SCHEDULES = (
    "no schedules are declared: add config/schedule.py with schedule(job, cron='0 9 * * *') "
    "or schedule(job, every='15m') (from haze import schedule)"
)


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _local(sched: Schedule, at: datetime) -> str:
    return at.astimezone(sched._zone or UTC).strftime("%Y-%m-%d %H:%M:%S %Z")


def check_runnable(app: App, *, in_worker: bool) -> list[Schedule]:
    """The schedules a scheduler process can run, or ``ScheduleError`` saying why not.

    ``schedule:work`` refuses a schedule whose job goes to a memory connection: the
    jobs would stay inside the scheduler. ``queue:work --schedule`` runs them itself.
    """
    schedules = list(registered_schedules().values())
    if not schedules:
        raise ScheduleError(NO_SCHEDULES)
    for sched in schedules:
        conn, _ = app.manager.resolve(sched.pending)  # an unknown connection: one line now
        if not in_worker and not app.driver(conn).remote and not app.driver(conn).inline:
            raise ScheduleError(
                f'schedule "{sched.name}" dispatches to connection "{conn}", a memory '
                "queue that lives inside one process: run haze queue:work --schedule on "
                "it instead, or send the job to a database or redis connection"
            )
    return schedules


def start_scheduler(
    app: App, say: Callable[[str], None]
) -> tuple[Scheduler, asyncio.Task[None], asyncio.Event]:
    """Start a scheduler task in the running loop; set the event to stop it."""

    def fired(sched: Schedule, at: datetime) -> None:
        say(f'Schedule "{sched.name}" dispatched {sched.job_name} (tick {_local(sched, at)})')

    scheduler = Scheduler(app, on_fire=fired)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(scheduler.run(stop))
    return scheduler, task, stop


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


@cli.command("schedule:work", short_help="Run a scheduler until stopped.")
@loop_option()
@click.pass_obj
def schedule_work(state: State, loop: str | None = None) -> None:
    """Dispatch the app's schedules on time until SIGTERM/SIGINT.

    Run as many as you like: each tick's job runs once, dispatched by whichever holds the lease."""
    chosen_loop = event_loop(loop)

    def say(line: str) -> None:
        click.echo(f"{_stamp()} {line}")

    async def work(app: App) -> int:
        schedules = check_runnable(app, in_worker=False)
        scheduler, task, stop = start_scheduler(app, say)
        with _stop_on_signals(stop):
            say(
                f"Scheduler running {len(schedules)} schedule(s) "
                f'(store "{scheduler.store.name}", loop {chosen_loop.name}). '
                "Ctrl+C or SIGTERM stops."
            )
            await task
        say(f"Scheduler stopped after dispatching {scheduler.dispatched} tick(s).")
        return 0

    run(state, work, chosen_loop.factory)


@cli.command("schedule:list", short_help="List schedules and their next fire times.")
@click.pass_obj
def schedule_list(state: State) -> None:
    """Each schedule: name, job, when, and its next three fire times (in its time zone)."""

    async def listing(app: App) -> list[Schedule]:
        return list(registered_schedules().values())

    schedules = run(state, listing)
    if not schedules:
        click.echo(NO_SCHEDULES)
        return
    now = datetime.now(UTC)
    for sched in schedules:
        times = sched.fire_times(now)
        upcoming = ", ".join(_local(sched, next(times)) for _ in range(3))
        click.echo(f"{sched.name}  {sched.job_name}  {sched.describe()}  next: {upcoming}")


@cli.command("schedule:run", short_help="Dispatch one schedule's job now.")
@click.argument("name")
@click.pass_obj
def schedule_run(state: State, name: str) -> None:
    """Dispatch the job of schedule NAME once now, outside its timetable."""

    async def fire(app: App) -> Schedule:
        return await run_now(app, name)

    sched = run(state, fire)
    click.echo(f'Dispatched schedule "{sched.name}" ({sched.job_name}).')
