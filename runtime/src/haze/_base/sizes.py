"""Sizes in bytes from text: ``"10MB"``, ``"512KiB"``, ``"1048576"`` (one parser for
environment variables and config values alike)."""

from __future__ import annotations

import math
import re

__all__ = ["parse_size"]

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
