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

from haze._app.config import read_env
from haze._base.durations import parse_duration
from haze._base.errors import ConfigError
from haze._base.sizes import parse_size

__all__ = ["env_duration", "env_size", "parse_size"]

_cache: dict[tuple[str, str, str], float | int] = {}


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
