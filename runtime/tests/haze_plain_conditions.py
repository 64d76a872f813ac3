"""What lets a plain job take the memory driver's short path, for the tests that count
or detect it (imported by name: a conftest is not importable from every test root)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from haze import App


@contextlib.contextmanager
def plain_conditions(app: App) -> Iterator[None]:
    """What lets a plain job take the short path, set whatever earlier tests in this
    process left behind: no OpenTelemetry recorder (a test that set the global tracer
    provider cannot unset it), no ``before``/``after`` listener, no DEBUG job lines."""
    execution = app.manager.execution
    execution.telemetry.set(None)
    events = execution.events
    before, after = events.before[:], events.after[:]
    job_log = logging.getLogger("haze.job")
    level = job_log.level
    events.before.clear()
    events.after.clear()
    job_log.setLevel(logging.INFO)
    try:
        yield
    finally:
        events.before[:], events.after[:] = before, after
        job_log.setLevel(level)
