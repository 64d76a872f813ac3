"""Which event loop a long-running command (``queue:work``, ``schedule:work``) runs on.

``--loop auto|asyncio|uvloop``, else ``HAZE_LOOP``, else ``auto``: uvloop when it is
installed (``pip install 'haze-jobs[uvloop]'``), else asyncio's own loop, as uvicorn chooses.
A worker spends much of its CPU in the loop's socket round trips to its backend, where
uvloop costs about a quarter of asyncio's (bench/README.md). uvloop is imported only when
chosen, so the runtime still loads where it cannot exist (Pyodide, Windows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from haze._app.config import read_env
from haze._base.errors import ConfigError, MissingDependencyError
from haze._base.hints import install_hint

__all__ = ["LOOPS", "LOOP_ENV", "EventLoop", "event_loop", "loop_option"]

#: The values ``--loop`` and ``HAZE_LOOP`` take.
LOOPS = ("auto", "asyncio", "uvloop")
LOOP_ENV = "HAZE_LOOP"

FC = TypeVar("FC", bound="Callable[..., Any] | click.Command")


@dataclass(frozen=True)
class EventLoop:
    """The loop a command runs on: its name, and the factory ``asyncio.Runner`` takes
    (``None``: asyncio's default loop)."""

    name: str
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None


class _LoopError(click.ClickException):
    """A loop that cannot be had: one line and exit code 2, as a bad option gives."""

    exit_code = 2


def loop_option() -> Callable[[FC], FC]:
    """The ``--loop`` option of the commands that run until stopped."""
    return click.option(
        "--loop",
        "loop",
        type=click.Choice(LOOPS),
        default=None,
        help=f"The event loop: uvloop ({install_hint('uvloop')}) costs less CPU per "
        "backend round trip; auto takes it when installed (default: $HAZE_LOOP, else auto).",
    )


def _uvloop() -> Any:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def _chosen(flag: str | None) -> str:
    """``flag``, else ``HAZE_LOOP``, else ``auto``; ``ConfigError`` for a bad variable."""
    if flag is not None:
        return flag
    raw = (read_env(LOOP_ENV) or "").strip()
    if not raw:
        return "auto"
    if raw.lower() not in LOOPS:
        raise ConfigError(
            f"environment variable {LOOP_ENV}={raw!r} is not an event loop; "
            f"use {', '.join(LOOPS[:-1])} or {LOOPS[-1]}"
        )
    return raw.lower()


def event_loop(flag: str | None) -> EventLoop:
    """The loop that ``--loop flag`` (``None``: not given) selects, or a one-line
    click error with exit code 2: a bad ``HAZE_LOOP``, or uvloop asked for but missing."""
    try:
        chosen = _chosen(flag)
        if chosen == "asyncio":
            return EventLoop("asyncio")
        uvloop = _uvloop()
        if uvloop is None:
            if chosen == "auto":
                return EventLoop("asyncio")
            asked = f"--loop {flag}" if flag is not None else f"{LOOP_ENV}=uvloop"
            raise MissingDependencyError(asked, "uvloop", "uvloop")
    except (ConfigError, MissingDependencyError) as e:
        raise _LoopError(str(e)) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return EventLoop("uvloop", factory)
