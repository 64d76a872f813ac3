"""The example app: dispatch a few jobs, work them off, print what happened.

Run it with the README's first command (``./scripts/demo``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

from haze import App, JobContext, Queue

ROOT = Path(__file__).parent
T0 = time.perf_counter()


class _Brief(logging.Formatter):
    """Log lines without tracebacks: the demo shows outcomes, not stack traces."""

    def formatException(self, ei: object) -> str:  # noqa: N802 (logging's name)
        return ""

    def format(self, record: logging.LogRecord) -> str:
        return f"  {time.perf_counter() - T0:5.2f}s  log      {record.getMessage()}"


def say(line: str) -> None:
    print(f"  {time.perf_counter() - T0:5.2f}s  {line}")


@Queue.on("after")
def _done(job: JobContext) -> None:
    say(f"done     {job.name} (attempt {job.attempt}/{job.tries})")


@Queue.on("failing")
def _failed(job: JobContext, error: BaseException) -> None:
    say(f"failed   {job.name} after {job.attempt} attempt(s): {error}")


async def main() -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_Brief())
    logging.getLogger("haze").addHandler(handler)
    logging.getLogger("haze").setLevel(logging.WARNING)
    app = App(root=ROOT)  # reads config/*.py and imports app/job/**
    from app.job.charge_card import charge_card
    from app.job.send_invoice import send_invoice
    from app.job.send_reminder import send_reminder

    async with app:
        say(f"dispatching on the {app.queue_config.default!r} connection")
        await send_invoice.dispatch({"invoice_id": 42})  # fails once, then succeeds
        await charge_card.dispatch({"card": "4000-0000-0000-0002"})  # fails both tries
        await send_reminder.dispatch({"user_id": 7}, delay="200ms")  # runs 200 ms later
        await Queue.idle()
        failed = await Queue.failed()
        for f in failed:
            say(f"kept     {f.name} in failed jobs: {f.exception.splitlines()[-1]}")
        say(f"{len(failed)} failed job(s); retry them with Queue.retry()")


if __name__ == "__main__":
    asyncio.run(main())
