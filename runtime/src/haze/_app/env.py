"""Sizes and durations read from ``HAZE_*`` environment variables.

Each entrypoint reads its settings when it starts (``DispatchApp(...)``, the Lambda
boot, the Worker's app boot), so a bad value stops it with one line naming the
variable and the value, instead of failing every request. A parsed value is kept per
raw string: a request never parses it again.

Sizes are bytes (``1048576``) or a number and a unit: ``B``, ``KB``/``MB``/``GB``
(powers of 1000) or ``KiB``/``MiB``/``GiB`` (powers of 1024), case-insensitive, e.g.
``10MB``, ``512KiB``, ``1.5 MiB``. Durations are seconds or ``500ms``, ``30s``, ``5m``,
``1h``, ``1d`` (:func:`haze.durations.parse_duration`).
"""

from __future__ import annotations

import math
import re

from haze._app.config import read_env
from haze._base.durations import parse_duration
from haze._base.errors import ConfigError

__all__ = ["env_duration", "env_size", "parse_size"]

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_SIZE_HELP = "use bytes (1048576) or a size like 512KiB, 10MB, 1GiB (KB = 1000 bytes, KiB = 1024)"

_cache: dict[tuple[str, str, str], float | int] = {}


def parse_size(value: str, option: str) -> int:
    """Bytes in ``value`` (``"10MB"``, ``"512KiB"``, ``"1048576"``); ``ValueError`` naming
    ``option`` when it is not a size or not above zero.

    >>> parse_size("512KiB", "HAZE_HTTP_MAX_BODY")
    524288
    """
    m = _SIZE.match(value)
    unit = _SIZE_UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ValueError(f"{option}={value!r} is not a size; {_SIZE_HELP}")
    size = float(m.group(1)) * unit
    if not math.isfinite(size) or int(size) < 1:
        raise ValueError(f"{option}={value!r}: a size must be at least 1 byte")
    return int(size)


def env_size(name: str, default: int) -> int:
    """``parse_size`` of the variable ``name`` (unset or empty: ``default``), or a
    ``ConfigError`` naming the variable and its value."""
    raw = (read_env(name) or "").strip()
    if not raw:
        return default
    key = ("size", name, raw)
    cached = _cache.get(key)
    if cached is None:
        try:
            cached = _cache[key] = parse_size(raw, name)
        except ValueError as e:
            raise ConfigError(f"environment variable {e}") from None
    return int(cached)


def env_duration(name: str, default: float) -> float:
    """Seconds in the variable ``name`` (unset or empty: ``default``), or a
    ``ConfigError`` naming the variable and its value."""
    raw = (read_env(name) or "").strip()
    if not raw:
        return default
    key = ("duration", name, raw)
    cached = _cache.get(key)
    if cached is None:
        try:
            cached = _cache[key] = parse_duration(raw, name)
        except ValueError as e:
            message = str(e).removeprefix(f"{name}: ")
            raise ConfigError(f"environment variable {name}={raw!r}: {message}") from None
    return float(cached)
