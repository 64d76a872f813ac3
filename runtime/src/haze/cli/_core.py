"""The root ``haze`` group and what every command module shares.

Command modules register with ``@cli.command("group:name")`` and get the app with
``state.app()``; :func:`run` executes a coroutine against it and closes it afterwards.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console

from haze._app.app import App, run_in_app
from haze._base.durations import parse_duration
from haze._base.errors import HazeError
from haze._base.version import __version__

__all__ = [
    "DURATION",
    "QUEUE_NAME",
    "QUEUE_NAMES",
    "State",
    "cli",
    "connection_option",
    "console",
    "find_root",
    "run",
]

T = TypeVar("T")
FC = TypeVar("FC", bound="Callable[..., Any] | click.Command")


@dataclass
class State:
    """Per-invocation state: the app root, and the app once a command asks for it."""

    root: Path
    _app: App | None = field(default=None, repr=False)

    def app(self) -> App:
        """The app at ``root``, created on first use so ``make:*`` works with a broken config."""
        if self._app is None:
            self._app = App(root=self.root)
        return self._app


class HazeGroup(click.Group):
    """A group that turns haze's own errors into a one-line message and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HazeError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:
            # Unreachable backends and unwritable paths are the user's to fix, not a bug.
            raise click.ClickException(f"{type(e).__name__}: {e}") from None
        except Exception as e:
            # A client library's own "cannot connect" error (redis-py's is no OSError).
            state = ctx.obj
            app = state._app if isinstance(state, State) else None
            down = app.manager.unavailable(e) if app is not None else None
            if down is not None:
                raise click.ClickException(str(down)) from None
            if _caused_by_os_error(e):  # e.g. a store's client that could not connect
                reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise click.ClickException(f"{type(e).__name__}: {reason}") from None
            raise


def _caused_by_os_error(error: BaseException) -> bool:
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _version() -> str:
    return __version__


@click.group(
    cls=HazeGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog='Shell completion: add eval "$(_HAZE_COMPLETE=bash_source haze)" to ~/.bashrc '
    "(zsh_source for ~/.zshrc; fish: _HAZE_COMPLETE=fish_source haze | source).",
)
@click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    envvar="HAZE_APP_ROOT",
    default=None,
    show_default="$HAZE_APP_ROOT, else the nearest folder at or above the current one that "
    "holds config/queue.py, else the current directory",
    help="The app root (holds config/ and app/job/).",
)
@click.version_option(_version(), prog_name="haze")
@click.pass_context
def cli(ctx: click.Context, root: Path | None) -> None:
    """haze: background jobs for serverless and edge-first Python apps."""
    ctx.obj = State(root=root.resolve() if root is not None else find_root(Path.cwd()))


def find_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` holding ``config/queue.py`` (the way git
    finds its repository), else ``start``: ``haze`` works from any folder of the app."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / "config" / "queue.py").is_file():
            return folder
    return start


def console() -> Console:
    """A console on the current stdout (CliRunner swaps it per invocation)."""
    tty = sys.stdout.isatty()
    return Console(file=sys.stdout, highlight=False, soft_wrap=not tty, width=_width(tty))


# Below this the tables cut ids and counts to "…": a script reading them would lose data.
MIN_COLUMNS = 80


def _width(tty: bool) -> int | None:
    """COLUMNS when it is a whole number above 0 (at least MIN_COLUMNS), else as if unset:
    the terminal's, 200 when piped. CI runners and ``docker exec`` set COLUMNS=0, at which
    rich draws every table as nothing."""
    raw = os.environ.get("COLUMNS", "").strip()
    if raw.isdecimal() and int(raw) > 0:
        return max(int(raw), MIN_COLUMNS)
    if not tty:
        # Piped output is read by scripts and grep: wide tables beat wrapped cells there.
        return 200
    # Given no width, rich would read the unusable COLUMNS itself; shutil skips it.
    return shutil.get_terminal_size().columns if raw else None


def run(
    state: State,
    fn: Callable[[App], Awaitable[T]],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    *,
    closing: Callable[[], float | None] | None = None,
) -> T:
    """Run ``fn(app)`` in a fresh event loop with the app current, then close the app.

    ``loop_factory`` makes that loop (``--loop uvloop``); ``None`` is asyncio's own.
    ``closing`` says, when ``fn`` has returned, how many seconds closing the app may
    take (None: as long as it takes); past them the command exits without it."""
    app = state.app()

    async def runner() -> T:
        async def call() -> T:
            return await fn(app)

        try:
            return await run_in_app(app, call)
        finally:
            await _close(app, closing() if closing is not None else None)

    # What asyncio.run does, with the loop chosen (its loop_factory is Python 3.12+).
    with asyncio.Runner(loop_factory=loop_factory) as loop:
        return loop.run(runner())


async def _close(app: App, within: float | None) -> None:
    if within is None:
        await app.stop()
        return
    try:
        await asyncio.wait_for(app.stop(), within)
    except TimeoutError:
        click.echo(
            f"closing the app took longer than {within:.1f}s (its backend does not "
            "answer): exiting without it",
            err=True,
        )


if TYPE_CHECKING:
    _ParamType = click.ParamType[float, Any]
else:  # click < 8.2 has no type parameters here
    _ParamType = click.ParamType


class DurationType(_ParamType):
    """Seconds or a duration string (``5``, ``1.5``, ``"500ms"``, ``"5m"``), > 0."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        flag = param.opts[0] if param is not None and param.opts else "duration"
        try:
            return parse_duration(value, flag, allow_zero=False)
        except ValueError as e:
            # click already prefixes "Invalid value for '--flag'".
            message = str(e).removeprefix(f"{flag}: ")
            self.fail(message, param, ctx)


DURATION = DurationType()


class HoursType(click.FloatRange):
    """``--hours N``: hours, at least 0. ``nan`` is refused (every comparison with it is
    false, so a plain range takes it and the command then matches nothing), as is ``inf``."""

    def __init__(self) -> None:
        super().__init__(min=0)

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        hours = float(super().convert(value, param, ctx))
        if not math.isfinite(hours):
            self.fail(f"{value!r} is not a number of hours; give one such as 24 or 0.5", param, ctx)
        return hours


HOURS = HoursType()

#: The longest queue name every driver can store (a MariaDB ``VARCHAR(255)`` column).
MAX_QUEUE_NAME = 255


def queue_names(value: str, *, many: bool) -> list[str]:
    """The queue names in a ``--queue`` value, or ``ValueError`` saying what is wrong.

    A name is 1-255 characters once trimmed; a list has no empty entry. An empty value is
    refused rather than read as "the default queue", so a slip never empties that queue.
    """
    example = "e.g. high,default" if many else "e.g. emails"
    if not value.strip(" ,"):
        raise ValueError(f"{value!r} is empty; give a queue name, {example}")
    names = [part.strip() for part in value.split(",")]
    if "" in names:
        raise ValueError(f"{value!r} has an empty entry; {example}")
    if len(names) > 1 and not many:
        raise ValueError(f"{value!r}: this command takes one queue, not a list")
    for name in names:
        if len(name) > MAX_QUEUE_NAME:
            raise ValueError(
                f"the queue name {name[:20]!r}... has {len(name)} characters; a queue name "
                f"has at most {MAX_QUEUE_NAME}"
            )
    return names


if TYPE_CHECKING:
    _StrType = click.ParamType[str, Any]
    _ListType = click.ParamType[list[str], Any]
else:  # click < 8.2 has no type parameters here
    _StrType = _ListType = click.ParamType


class QueueNameType(_StrType):
    """``--queue NAME``: exactly one queue name (see :func:`queue_names`)."""

    name = "queue"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return queue_names(str(value), many=False)[0]
        except ValueError as e:
            self.fail(str(e), param, ctx)


class QueueNamesType(_ListType):
    """``--queue NAMES``: comma-separated queue names in priority order."""

    name = "queues"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> list[str]:
        if isinstance(value, list):
            return value
        try:
            return queue_names(str(value), many=True)
        except ValueError as e:
            self.fail(str(e), param, ctx)


QUEUE_NAME = QueueNameType()
QUEUE_NAMES = QueueNamesType()


def connection_option(
    help: str = "The queue connection (default: the config default).",
) -> Callable[[FC], FC]:
    """The ``--connection`` option every queue command takes."""
    return click.option("--connection", "connection", default=None, metavar="NAME", help=help)
