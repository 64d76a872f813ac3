"""Named SQL blocks in ``.sql`` files kept beside the code that runs them.

A file holds blocks introduced by ``-- name: <block>`` lines; ``--`` comment lines
inside a block are dropped.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

__all__ = ["sql_blocks"]

_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.M)


@cache
def sql_blocks(path: Path) -> dict[str, str]:
    parts = _BLOCK.split(path.read_text())
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        out[name] = "\n".join(lines).strip()
    return out
