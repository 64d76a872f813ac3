"""Platform triggers (Cloudflare Cron Triggers, EventBridge rules): a schedule as the
platform's UTC cron, and which schedules each trigger wakes.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta

from haze._base.errors import ScheduleError
from haze._orchestration.schedules import Schedule, _format_every, registered_schedules

_UTC_NAMES = {"UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/GMT", "GMT", "Zulu", "Etc/Zulu"}


def _whole_hour_zone(sched: Schedule) -> bool:
    """True when every offset of the zone this year and next is a whole number of hours."""
    year = datetime.now(UTC).year
    for y in (year, year + 1):
        for month in range(1, 13):
            for day in (1, 15):
                offset = datetime(y, month, day, 12, tzinfo=UTC).astimezone(sched._zone)
                delta = offset.utcoffset() or timedelta(0)
                if delta.total_seconds() % 3600:
                    return False
    return True


def utc_cron(sched: Schedule, platform: str = "Cloudflare") -> str:
    """The 5-field UTC cron of the trigger that wakes ``sched`` on a platform whose cron
    triggers run in UTC at minute resolution. ``ScheduleError`` when there is none.

    A schedule with a time zone gets a trigger every hour at its minutes (the hour and
    day in UTC move with daylight saving time); the handler dispatches it only at the
    triggers where it is due in its zone.
    """
    where = f'schedule "{sched.name}" ({sched.origin})'
    if sched.every is not None:
        seconds = sched.every
        minutes, rest = divmod(seconds, 60)
        if not rest:
            m = int(minutes)
            if m < 60 and 60 % m == 0:
                return "* * * * *" if m == 1 else f"*/{m} * * * *"
            if m % 60 == 0:
                h = m // 60
                if h < 24 and 24 % h == 0:
                    return "0 * * * *" if h == 1 else f"0 */{h} * * *"
                if h == 24:
                    return "0 0 * * *"
        raise ScheduleError(
            f"{where}: every={_format_every(seconds)} has no {platform} cron trigger, which "
            "fires on whole minutes: use an interval that divides an hour (1m, 5m, 15m, 30m) "
            "or a day (1h, 2h, 6h, 12h, 1d), or cron="
        )
    assert sched.cron is not None
    fields = sched.cron.split()
    if len(fields) == 6:
        if fields[0] != "0":
            raise ScheduleError(
                f"{where}: cron {sched.cron!r} has a seconds field; {platform} cron triggers "
                "fire on whole minutes: use 5 fields"
            )
        fields = fields[1:]
    if sched.tz is None or sched.tz in _UTC_NAMES:
        return " ".join(_days(fields, sched, where))
    if not _whole_hour_zone(sched):
        raise ScheduleError(
            f"{where}: tz {sched.tz!r} is not a whole number of hours from UTC, and {platform} "
            "cron triggers run in UTC: write the cron in UTC (drop tz)"
        )
    return f"{fields[0]} * * * *"


def _trigger_dow(value: str, where: str) -> str:
    """Cron day-of-week (0-7, Sunday 0 or 7) to the triggers' (1-7, Sunday 1): Cloudflare
    Cron Triggers and EventBridge count weekdays the Quartz way."""

    def one(day: int) -> int:
        return day % 7 + 1

    out: list[str] = []
    for item in value.split(","):
        suffix = ""
        if "#" in item:
            item, nth = item.split("#", 1)
            suffix = f"#{nth}"
        elif item.endswith("L") and item[:-1].isdigit():
            item, suffix = item[:-1], "L"
        base, _, every = item.partition("/")
        if item.isdigit():
            out.append(f"{one(int(item))}{suffix}")
        elif (base == "*" or re.fullmatch(r"\d-\d", base)) and (not every or every.isdigit()):
            lo, hi = (0, 6) if base == "*" else (int(p) for p in base.split("-"))
            days = [one(d) for d in range(lo, hi + 1, int(every or 1))]
            if not every and base != "*" and days == list(range(days[0], days[-1] + 1)):
                out.append(f"{days[0]}-{days[-1]}{suffix}")  # still a range: 1-5 -> 2-6
            else:
                out.extend(str(d) for d in days)
        elif all(p.isalpha() and len(p) == 3 for p in item.split("-", 1)):
            out.append(item.upper() + suffix)  # MON, MON-FRI: the triggers take the names
        else:
            raise ScheduleError(
                f"{where}: day-of-week {value!r} has no cron trigger form; use numbers, "
                "ranges or names (MON-FRI)"
            )
    return ",".join(dict.fromkeys(out))


def _days(fields: list[str], sched: Schedule, where: str) -> list[str]:
    """``fields`` (5, UTC) with the weekday counted from Sunday = 1; refuses a day of the
    month together with a day of the week (cron fires on either: no trigger says OR)."""
    minute, hour, dom, month, dow = fields
    if dow not in ("*", "?"):
        if dom not in ("*", "?"):
            raise ScheduleError(
                f"{where}: cron {sched.cron!r} names both a day of the month and a day of the "
                "week (it fires on either), which platform cron triggers cannot combine: "
                "split it into two schedules"
            )
        dow = _trigger_dow(dow, where)
    return [minute, hour, dom, month, dow]


def eventbridge_cron(sched: Schedule) -> str:
    """The ``cron(...)`` expression of the EventBridge rule that wakes ``sched`` (UTC,
    6 fields with a year, ``?`` in the day field it leaves open). See :func:`utc_cron`.
    """
    minute, hour, dom, month, dow = utc_cron(sched, "EventBridge").split()

    def step(field: str, start: str) -> str:
        return start + field[1:] if field.startswith("*/") else field

    minute, hour = step(minute, "0"), step(hour, "0")
    dom, month = step(dom, "1"), step(month, "1")
    if dow in ("*", "?"):
        dow = "?"
    else:
        dom = "?"
    return f"cron({minute} {hour} {dom} {month} {dow} *)"


def trigger_schedules(platform: str, trigger: str) -> list[Schedule]:
    """The schedules whose ``platform`` trigger (``"cloudflare"``: :func:`utc_cron`,
    ``"eventbridge"``: :func:`eventbridge_cron`) is ``trigger``."""
    wanted = " ".join(trigger.split())
    return [sched for sched, each in _triggered(platform) if each == wanted]


def _triggered(platform: str) -> list[tuple[Schedule, str]]:
    """Each schedule that has a ``platform`` trigger, with it."""
    convert = utc_cron if platform == "cloudflare" else eventbridge_cron
    found = []
    for sched in registered_schedules().values():
        try:
            found.append((sched, convert(sched)))
        except ScheduleError:
            continue  # the build reported it
    return found


def app_schedules(root: str | os.PathLike[str] | None) -> list[Schedule]:
    """The schedules declared in files under ``root`` (all of them without a root)."""
    from pathlib import Path

    schedules = list(registered_schedules().values())
    if root is None:
        return schedules
    base = Path(root).resolve()
    mine = []
    for sched in schedules:
        try:
            if Path(sched.origin.rsplit(":", 1)[0]).resolve().is_relative_to(base):
                mine.append(sched)
        except (OSError, ValueError):
            continue
    return mine


def bundle_packages(root: str | os.PathLike[str] | None) -> tuple[str, ...]:
    """The packages a bundle (Worker, Lambda zip) needs for the schedules under ``root``:
    cronsim for cron expressions, tzdata for time zones (Pyodide and slim images have no
    system zone database)."""
    schedules = app_schedules(root)
    extra: list[str] = []
    if any(s.cron is not None for s in schedules):
        extra.append("cronsim")
    if any(s.tz is not None for s in schedules):
        extra.append("tzdata")
    return tuple(extra)


def platform_triggers(
    platform: str, root: str | os.PathLike[str] | None = None
) -> dict[str, list[str]]:
    """Each distinct trigger of the schedules (declared under ``root``) on ``platform``
    -> their names. Raises the first ``ScheduleError`` (the build reports it)."""
    convert = utc_cron if platform == "cloudflare" else eventbridge_cron
    out: dict[str, list[str]] = {}
    for sched in app_schedules(root):
        out.setdefault(convert(sched), []).append(sched.name)
    return out
