"""The filters ``queue:failed``, ``queue:retry`` and ``queue:forget`` share.

``--queue`` (an exact queue), ``--job`` (an exact job name), ``--exception`` (a piece of
the stored exception text, case-insensitive), ``--since`` (a duration back from now,
``30m``/``1h``/``2d``, or an ISO 8601 time, local unless it names its zone) and
``--range N-M`` (the N-th to M-th failed jobs, counted from 1 in the order
``queue:failed`` lists them, oldest first, after the other filters).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from haze._base.durations import parse_duration

if TYPE_CHECKING:
    from haze.drivers import FailedJob

__all__ = ["FailedFilter", "build_filter", "filter_options", "parse_range", "parse_since"]

F = TypeVar("F", bound=Callable[..., Any])


def parse_since(value: str, *, now: float | None = None) -> float:
    """``--since``: the epoch time a duration ago, or an ISO 8601 time.

    >>> parse_since("1h", now=7200.0)
    3600.0
    """
    text = value.strip()
    try:
        seconds = parse_duration(text, "--since")
    except ValueError:
        pass
    else:
        return (time.time() if now is None else now) - seconds
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a duration (30m, 1h, 2d) nor an ISO 8601 time "
            "(2026-12-01 or 2026-12-01T09:30, optionally with +02:00 or Z)",
            param_hint="'--since'",
        ) from None
    return when.timestamp()  # a naive time is local time, as queue:failed prints it


def parse_range(value: str) -> tuple[int, int]:
    """``--range``: ``"3"`` or ``"1-5"`` (1-based, inclusive) as ``(first, last)``.

    >>> parse_range("1-5")
    (1, 5)
    """
    first, sep, last = value.strip().partition("-")
    try:
        lo = int(first)
        hi = int(last) if sep else lo
    except ValueError:
        lo = hi = -1
    if lo < 1 or hi < lo:
        raise click.BadParameter(
            f"{value!r} is not a range; give positions as queue:failed numbers them, "
            "e.g. 1-5 or 3 (first <= last, counted from 1)",
            param_hint="'--range'",
        )
    return lo, hi


@dataclass(frozen=True)
class FailedFilter:
    """Which failed jobs a command applies to (every field None/empty = no filter)."""

    queue: str | None = None
    job: str | None = None
    exception: str | None = None
    since: float | None = None
    ranges: tuple[tuple[int, int], ...] = ()

    @property
    def active(self) -> bool:
        return any(
            v is not None for v in (self.queue, self.job, self.exception, self.since)
        ) or bool(self.ranges)

    def describe(self) -> str:
        """``queue "emails", job "send", exception ~ "timeout"``, for messages."""
        parts = []
        if self.queue is not None:
            parts.append(f'queue "{self.queue}"')
        if self.job is not None:
            parts.append(f'job "{self.job}"')
        if self.exception is not None:
            parts.append(f'exception containing "{self.exception}"')
        if self.since is not None:
            parts.append(
                "failed since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
            )
        for lo, hi in self.ranges:
            parts.append(f"#{lo}" if lo == hi else f"#{lo}-{hi}")
        return ", ".join(parts)

    def matches(self, job: FailedJob) -> bool:
        """Every filter but ``--range`` (which counts the jobs that match these)."""
        if self.queue is not None and job.queue != self.queue:
            return False
        if self.job is not None and job.name != self.job:
            return False
        if self.exception is not None and self.exception.casefold() not in job.exception.casefold():
            return False
        return self.since is None or job.failed_at >= self.since

    def numbered(self, jobs: Sequence[FailedJob]) -> list[tuple[int, FailedJob]]:
        """The jobs that pass with their position (from 1, oldest first, counted before
        ``--range`` picks among them)."""
        kept = sorted((j for j in jobs if self.matches(j)), key=lambda j: j.failed_at)
        pairs = list(enumerate(kept, 1))
        if not self.ranges:
            return pairs
        return [(i, j) for i, j in pairs if any(lo <= i <= hi for lo, hi in self.ranges)]

    def apply(self, jobs: Sequence[FailedJob]) -> list[FailedJob]:
        """The jobs that pass, oldest first."""
        return [job for _, job in self.numbered(jobs)]


def filter_options(*, ranges: bool = True) -> Callable[[F], F]:
    """Add ``--job``, ``--exception``, ``--since`` (and ``--range``) to a command; pass
    their values with the command's ``--queue`` to :func:`build_filter`."""

    def decorate(fn: F) -> F:
        options = [
            click.option("--job", "f_job", default=None, metavar="NAME", help="Only this job."),
            click.option(
                "--exception",
                "f_exception",
                default=None,
                metavar="TEXT",
                help="Only failed jobs whose exception contains TEXT (any case).",
            ),
            click.option(
                "--since",
                "f_since",
                default=None,
                metavar="WHEN",
                help="Only jobs that failed since WHEN: a duration back from now (30m, 1h, "
                "2d) or an ISO time (2026-12-01T09:30).",
            ),
        ]
        if ranges:
            options.append(
                click.option(
                    "--range",
                    "f_ranges",
                    multiple=True,
                    metavar="N-M",
                    help="The N-th to M-th failed jobs as queue:failed numbers them (repeatable).",
                )
            )
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


def build_filter(
    queue: str | None,
    f_job: str | None,
    f_exception: str | None,
    f_since: str | None,
    f_ranges: Sequence[str] = (),
) -> FailedFilter:
    """The filter from the options ``filter_options`` adds (and the command's --queue)."""
    if f_job is not None and not f_job.strip():
        raise click.BadParameter("is empty; give a job name", param_hint="'--job'")
    if f_exception is not None and not f_exception:
        raise click.BadParameter(
            "is empty; give part of the exception text", param_hint="'--exception'"
        )
    return FailedFilter(
        queue=queue,
        job=f_job.strip() if f_job is not None else None,
        exception=f_exception,
        since=parse_since(f_since) if f_since is not None else None,
        ranges=tuple(parse_range(r) for r in f_ranges),
    )
