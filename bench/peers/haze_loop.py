"""The event loop of the haze bench peers: asyncio's own, or uvloop for the
``haze-uvloop`` rows (``BENCH_LOOP=uvloop``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any


def run(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)``, on uvloop when ``BENCH_LOOP=uvloop``."""
    if os.environ.get("BENCH_LOOP", "asyncio") == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)
    else:
        asyncio.run(main)
