"""``queue_check()``: a health check for readiness probes and dashboards.

>>> # report = await queue_check(max_size=1000, max_failed=0)
>>> # report.ok, report.sizes, report.failed, report.error
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from haze._app.app import use_app
from haze.contracts.driver import UncountedQueues

__all__ = ["QueueHealth", "queue_check"]


@dataclass
class QueueHealth:
    """The answer of ``queue_check``; ``ok`` is False when unreachable or over a limit."""

    connection: str
    ok: bool
    reachable: bool
    sizes: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    #: What the backend does not tell (Vercel Queues: no queue depth, so no ``sizes``).
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "connection": self.connection,
            "ok": self.ok,
            "reachable": self.reachable,
            "sizes": dict(self.sizes),
            "failed": self.failed,
            "error": self.error,
            "problems": list(self.problems),
            "notes": list(self.notes),
        }


async def queue_check(
    connection: str | None = None,
    max_size: int | None = None,
    max_failed: int | None = None,
    *,
    queues: list[str] | None = None,
) -> QueueHealth:
    """Whether a connection answers, its queue sizes and failed count, against limits."""
    app = use_app()
    name = app.connection_name(connection)
    driver = app.driver(name)
    names = queues or list(app.queue_config.connections[name].get("queues") or ["default"])
    report = QueueHealth(connection=name, ok=True, reachable=True)
    try:
        if isinstance(driver, UncountedQueues):
            await driver.probe(names[0])
            report.notes.append(driver.counts_note)
        else:
            for q in names:
                report.sizes[q] = await driver.size(q)
        report.failed = len(await driver.failed.list())
    except Exception as e:
        report.ok = report.reachable = False
        report.error = f"{type(e).__name__}: {e}"
        return report
    if max_size is not None:
        for q, n in report.sizes.items():
            if n > max_size:
                report.problems.append(f"queue {q!r} holds {n} jobs (max {max_size})")
    if max_failed is not None and report.failed > max_failed:
        report.problems.append(f"{report.failed} failed jobs (max {max_failed})")
    report.ok = not report.problems
    return report
