"""Durations and backoff: the one place that parses ``"30s"``, ``"5m"``, ``[10, 60]``.

>>> parse_duration("90s", "timeout")
90.0
>>> backoff_delay([10, 60], 3)
60.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from haze._base.errors import DelayTooLongError

__all__ = [
    "MAX_DELAY",
    "Backoff",
    "Duration",
    "backoff_delay",
    "check_delay",
    "format_age",
    "parse_backoff",
    "parse_delay",
    "parse_duration",
]

Duration = int | float | str
Backoff = int | float | str | Sequence[int | float | str]

#: The longest delay haze queues a job for: 365 days. A driver with a lower cap keeps it
#: (Cloudflare 12 h); SQS re-queues a longer wait in 15-minute hops.
MAX_DELAY = 365 * 86400.0

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")


#: The shortest lease of a concurrency slot (``limit_concurrency``'s and a queue's or a
#: group's ``expire_after``): renewed every third of it, a shorter one lapses under a
#: store's latency and the slot goes to another job while this one still runs.
MIN_SLOT_LEASE = 1.0


def parse_duration(value: object, option: str, *, allow_zero: bool = True) -> float:
    """Turn a number of seconds or a string like ``"500ms"``, ``"30s"``, ``"7d"`` into seconds.

    ``option`` names what is being parsed, so the error says where the bad value is.
    """
    if isinstance(value, bool):
        raise ValueError(f"{option}: expected seconds or a duration like '30s', got {value!r}")
    amount = _past_float(value)
    if amount is not None:
        raise ValueError(
            f"{option}: {amount} is too long to be a duration (more than a float holds); "
            "use a shorter one"
        )
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # a negative int past a float's range
            seconds = -math.inf
    elif isinstance(value, str):
        m = _PATTERN.match(value)
        if m is None:
            try:
                seconds = float(value.strip())
            except ValueError:
                raise ValueError(
                    f"{option}: {_shown(value)} is not a duration; use seconds (30, 1.5) or a "
                    "string like '500ms', '30s', '5m', '1h', '1d', '7d'"
                ) from None
        else:
            seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise ValueError(
            f"{option}: expected seconds or a duration like '30s', got {type(value).__name__} "
            f"{_shown(value)}"
        )
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(f"{option}: duration must be a finite number >= 0, got {_shown(value)}")
    if not allow_zero and seconds == 0:
        raise ValueError(f"{option}: duration must be greater than 0, got {value!r}")
    return seconds


def _past_float(value: object) -> str | None:
    """``value`` as an error shows it when it is a finite, positive number of seconds
    past a float's range (``10**400``, ``"1e400"``, 400 digits and a unit: a float
    reads them as infinity, which they are not); else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            return f"{_shown(value)} seconds" if value > 0 else None
        return None
    if not isinstance(value, str):
        return None
    m = _PATTERN.match(value)
    try:
        seconds = float(m.group(1)) * _UNITS[m.group(2)] if m else float(value.strip())
    except ValueError:
        return None
    # "inf" and "infinity" spell infinity itself; digits read as infinity do not
    return _shown(value) if seconds == math.inf and "i" not in value.lower() else None


def _shown(value: object) -> str:
    """``value`` as an error message shows it: short (an int of thousands of digits
    cannot even be written out past Python's limit, and a page of digits helps no one)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"about {'-' if value < 0 else ''}1e{int(value.bit_length() * 0.30103)}"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:50]}…{text[-1]}"


def check_delay(seconds: float, option: str = "delay") -> float:
    """Return ``seconds`` if a job can be queued that far ahead, else raise.

    Not finite or negative: ``ValueError``; over 365 days: ``DelayTooLongError``
    (nothing is enqueued either way).

    >>> check_delay(3600.0)
    3600.0
    """
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        raise ValueError(f"{option}: expected seconds, got {_shown(seconds)}")
    if isinstance(seconds, int) and seconds > MAX_DELAY:  # 10**400 is no float
        raise _delay_too_long(option, f"{_shown(seconds)}s")
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        raise ValueError(
            f"{option}: a delay must be a finite number of seconds >= 0, got {_shown(seconds)}"
        )
    if seconds > MAX_DELAY:
        raise _delay_too_long(option, f"{seconds:g}s")
    return float(seconds)


def parse_delay(value: object, option: str = "delay") -> float:
    """``parse_duration`` then ``check_delay``: a delay's seconds, or its error (a delay
    too long for a float too is a ``DelayTooLongError``).

    >>> parse_delay("2h")
    7200.0
    """
    amount = _past_float(value)
    if amount is not None:
        raise _delay_too_long(option, amount)
    return check_delay(parse_duration(value, option), option)


def _delay_too_long(option: str, amount: str) -> DelayTooLongError:
    return DelayTooLongError(
        f"{option}: {amount} is longer than the longest delay haze queues "
        f"(365 days = {MAX_DELAY:g}s); schedule the job closer to its time instead "
        "(nothing was enqueued)"
    )


def parse_backoff(value: object, option: str = "backoff") -> float | tuple[float, ...] | str:
    """Validate a backoff option once, at definition time.

    Returns seconds, a tuple of seconds (indexed by retry number, last repeats) or
    ``"exponential"``.
    """
    if value == "exponential":
        return "exponential"
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{option}: a backoff list needs at least one entry")
        return tuple(parse_delay(v, f"{option}[{i}]") for i, v in enumerate(value))
    return parse_delay(value, option)


def backoff_delay(backoff: float | tuple[float, ...] | str, retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (1 = the first retry, i.e. attempt 2)."""
    if retry < 1:
        retry = 1
    if isinstance(backoff, str):  # "exponential": 2, 4, 8, ...
        return float(2 ** min(retry, 40))
    if isinstance(backoff, tuple):
        return backoff[min(retry, len(backoff)) - 1]
    return backoff


def format_age(seconds: float) -> str:
    """A wait as people read it (``queue:stats``, the dashboard's oldest ready job).

    >>> format_age(12.4), format_age(245), format_age(7380)
    ('12s', '4m 05s', '2h 03m')
    """
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"
