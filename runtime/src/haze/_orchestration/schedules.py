"""Declaring schedules and their fire times: ``schedule(...)``, ``Schedule`` and the
registry of declared schedules.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from haze._base.durations import Duration, parse_duration
from haze._base.errors import MissingDependencyError, ScheduleError
from haze._base.hints import did_you_mean
from haze._jobs.definition import JobDefinition, PendingDispatch

#: The shortest ``every=``: a tick is claimed in the store, which is no sub-second clock.
MIN_EVERY = 1.0


@dataclass(eq=False)
class Schedule:
    """One declared schedule: what to dispatch and when. Made by :func:`schedule`."""

    name: str
    pending: PendingDispatch[Any]
    cron: str | None
    every: float | None
    tz: str | None
    catch_up: bool
    origin: str
    _zone: Any = field(default=None, repr=False)

    @property
    def job_name(self) -> str:
        return self.pending.job.name

    def describe(self) -> str:
        """``cron 0 9 * * * (Europe/Paris)`` or ``every 15m``."""
        if self.cron is not None:
            return f"cron {self.cron}" + (f" ({self.tz})" if self.tz else " (UTC)")
        assert self.every is not None
        return f"every {_format_every(self.every)}"

    def next_after(self, t: datetime) -> datetime:
        """The first fire time strictly after ``t`` (aware, UTC)."""
        return next(self.fire_times(t))

    def fire_times(self, after: datetime, until: datetime | None = None) -> Iterator[datetime]:
        """Fire times in ``(after, until]`` (unbounded without ``until``), in UTC."""
        if self.every is not None:
            step = self.every
            n = math.floor(after.timestamp() / step) + 1
            while True:
                at = datetime.fromtimestamp(n * step, UTC)
                if until is not None and at > until:
                    return
                yield at
                n += 1
        from cronsim import CronSim

        assert self.cron is not None
        start = after.astimezone(self._zone or UTC)
        # CronSim works in whole seconds and yields times after its start.
        it = CronSim(self.cron, start.replace(microsecond=0))
        for local in it:
            at = local.astimezone(UTC)
            if at <= after:
                continue
            if until is not None and at > until:
                return
            yield at

    def latest_at_or_before(self, t: datetime) -> datetime | None:
        """The last fire time at or before ``t`` (UTC), None when there is none in a year."""
        if self.every is not None:
            return datetime.fromtimestamp(math.floor(t.timestamp() / self.every) * self.every, UTC)
        from cronsim import CronSim

        assert self.cron is not None
        local = t.astimezone(self._zone or UTC)
        if local.microsecond == 0:
            local = local + timedelta(microseconds=1)  # reverse iteration starts below t
        it = CronSim(self.cron, local, reverse=True)
        for candidate in it:
            at = candidate.astimezone(UTC)
            if at <= t:
                return at
            if t - at > timedelta(days=366):  # pragma: no cover - defensive
                return None
        return None  # pragma: no cover

    def is_due_at(self, t: datetime) -> bool:
        """True when ``t`` (to the second) is one of this schedule's fire times."""
        t = t.astimezone(UTC).replace(microsecond=0)
        return self.next_after(t - timedelta(seconds=1)) == t

    def tick_key(self, at: datetime) -> str:
        return f"haze:schedule:{self.name}:{round(at.timestamp() * 1000)}"

    def __repr__(self) -> str:
        return f"<Schedule {self.name!r} {self.describe()} -> {self.job_name}>"


_registry: dict[str, Schedule] = {}


def registered_schedules() -> dict[str, Schedule]:
    """Every declared schedule by name, in declaration order."""
    return dict(_registry)


def _format_every(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _caller_origin() -> str:
    frame = sys._getframe(2)  # the caller of schedule()
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _zone(tz: str, where: str) -> Any:
    try:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    except ImportError:  # pragma: no cover - every supported Python has zoneinfo
        raise ScheduleError(f"{where}: tz needs the zoneinfo module") from None
    try:
        return ZoneInfo(tz)
    except ZoneInfoNotFoundError:
        raise ScheduleError(
            f"{where}: tz {tz!r} is not a known time zone; use an IANA name such as "
            "'Europe/Paris' or 'America/New_York' (where the system has no zone database, "
            "pip install tzdata)"
        ) from None
    except (ValueError, TypeError) as e:
        raise ScheduleError(f"{where}: tz {tz!r} is not a time zone name ({e})") from None


def _check_cron(cron: object, where: str) -> str:
    if not isinstance(cron, str) or not cron.strip():
        raise ScheduleError(
            f"{where}: cron must be a cron expression such as '0 9 * * *', got {cron!r}"
        )
    expr = " ".join(cron.split())
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:
        raise MissingDependencyError("schedule(cron=...)", "schedule", "cronsim") from None
    fields = len(expr.split())
    if fields not in (5, 6):
        raise ScheduleError(
            f"{where}: cron {cron!r} has {fields} fields; give 5 (minute hour day-of-month "
            "month day-of-week, e.g. '0 9 * * *') or 6 with seconds first"
        )
    try:
        CronSim(expr, datetime.now(UTC))
    except CronSimError as e:
        raise ScheduleError(
            f"{where}: cron {cron!r} is not a valid cron expression ({e}); fields are minute "
            "hour day-of-month month day-of-week, e.g. '0 9 * * *'"
        ) from None
    return expr


def schedule(
    job_or_pending: JobDefinition[Any] | PendingDispatch[Any],
    cron: str | None = None,
    every: Duration | None = None,
    tz: str | None = None,
    name: str | None = None,
    catch_up: bool = False,
) -> Schedule:
    """Dispatch a job periodically: on a ``cron`` expression (in ``tz``, default UTC) or
    ``every`` fixed interval (aligned to the Unix epoch, so ``every="15m"`` fires at
    :00, :15, :30 and :45).

    ``name`` (default: the job's name) identifies the schedule: it must be unique, and
    ``haze schedule:run NAME`` fires it. A tick missed while no scheduler ran is skipped,
    or, with ``catch_up=True``, the latest missed tick is dispatched when one starts.

    >>> # schedule(send_report.with_({"kind": "daily"}), cron="0 9 * * *",
    >>> #          tz="Europe/Paris", name="daily-report")
    >>> # schedule(prune_tokens, every="15m")
    """
    origin = _caller_origin()
    pending = _pending_of(job_or_pending, origin)
    label = pending.job.name if name is None else name
    if not isinstance(label, str) or not label.strip() or len(label) > 200:
        raise ScheduleError(
            f"schedule ({origin}): name must be a non-empty string of at most 200 "
            f"characters, got {name!r}"
        )
    where = f'schedule "{label}" ({origin})'
    if (cron is None) == (every is None):
        raise ScheduleError(f"{where}: give exactly one of cron='0 9 * * *' or every='15m'")
    if not isinstance(catch_up, bool):
        raise ScheduleError(f"{where}: catch_up must be True or False, got {catch_up!r}")
    zone = None
    if tz is not None:
        zone = _zone_of(tz, every, where)
    seconds: float | None = None
    expr: str | None = None
    if every is not None:
        seconds = _every_seconds(every, where)
    else:
        expr = _check_cron(cron, where)
    made = Schedule(label, pending, expr, seconds, tz, catch_up, origin, zone)
    existing = _registry.get(label)
    if existing is not None and existing.origin != origin:
        raise ScheduleError(
            f'two schedules are named "{label}": {existing.origin} and {origin}; '
            'pass name="..." to one of them'
        )
    _registry[label] = made  # the same declaration read again (another App) replaces itself
    return made


def _pending_of(job_or_pending: object, origin: str) -> PendingDispatch[Any]:
    if isinstance(job_or_pending, JobDefinition):
        pending: PendingDispatch[Any] = job_or_pending.with_()
        return pending
    if isinstance(job_or_pending, PendingDispatch):
        return job_or_pending
    raise ScheduleError(
        f"schedule ({origin}): expected a job (from @define_job) or job.with_(payload), "
        f"got {type(job_or_pending).__name__} {job_or_pending!r}"
    )


def _zone_of(tz: object, every: Duration | None, where: str) -> Any:
    if every is not None:
        raise ScheduleError(
            f"{where}: tz applies to cron schedules; every= counts from the Unix epoch. "
            "For a time of day in a zone use cron, e.g. cron='0 0 * * *', tz=" + repr(tz)
        )
    if not isinstance(tz, str) or not tz:
        raise ScheduleError(f"{where}: tz must be a time zone name, got {tz!r}")
    return _zone(tz, where)


def _every_seconds(every: Duration, where: str) -> float:
    try:
        seconds = parse_duration(every, f"{where}: every", allow_zero=False)
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    if seconds < MIN_EVERY:
        raise ScheduleError(f"{where}: every={every!r} is under 1s; the shortest is '1s'")
    return seconds


def get_schedule(name: str) -> Schedule:
    """The schedule called ``name``, or ``ScheduleError`` listing the known ones."""
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(_registry) or "none are declared (config/schedule.py)"
        raise ScheduleError(
            f"no schedule named {name!r}{did_you_mean(name, _registry)}; schedules: {known}"
        ) from None
