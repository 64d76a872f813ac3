"""An INSERT whose connection died before its reply came: did it commit?

The connector cannot tell: the statement may have run to its commit on the server after
the socket went (MariaDB's ``KILL`` shuts the socket at once and lets the statement
finish; a network cut leaves a PostgreSQL backend running), or never have arrived. haze
makes job ids on the client, so the answer is on the server: on a fresh connection the
rows are looked up by id. Present: the dispatch succeeded. Absent: the INSERT is sent
once more (and looked up again if that fails too).

What the connector knows (the error's ``write``) decides how far an answer goes:

- ``write="unsent"``: no connection was had, nothing was written; the error stands at
  once (a down server fails a dispatch fast).
- ``write="unsettled"``: the server process was still running the statement when
  the connector stopped waiting for it, or may have been (an HTTP request whose reply
  was lost: sqld runs a request it read after the client is gone), so "absent" is not
  final. The rows are looked for until they appear; the INSERT is never sent again
  (the first may still commit).
- any other ``DatabaseConnectionError``: the statement ended (or the connector cannot
  ask), so "absent" means it never ran.

When no final answer comes within ``RESOLVE_SECONDS`` the dispatch raises
``DispatchOutcomeUnknownError``: the job may be queued, and the caller is told so rather
than that nothing was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from haze._base.errors import DatabaseConnectionError
from haze.drivers._parts import outcome_unknown

__all__ = ["RESOLVE_SECONDS", "insert_resolved", "look"]

#: how long a dispatch keeps asking whether its rows landed before it gives up
RESOLVE_SECONDS = 3.0

Send = Callable[[], Awaitable[object]]
#: True: the rows are there; False: they are not; None: no way to tell (an id no
#: lookup can search for)
Landed = Callable[[], Awaitable["bool | None"]]


async def insert_resolved(send: Send, landed: Landed, connection: str, ids: Sequence[str]) -> None:
    """``send`` (one INSERT of rows carrying client-made ids ``ids``), so that it either
    returns with the rows written once, raises ``DatabaseConnectionError`` with nothing
    written, or raises ``DispatchOutcomeUnknownError``."""
    for _ in range(2):
        try:
            await send()
            return
        except DatabaseConnectionError as e:
            if e.write == "unsent":
                raise
            error = e
        found = await look(landed, settled=error.write != "unsettled")
        if found:
            return
        if found is None:
            raise outcome_unknown(connection, "INSERT", ids, RESOLVE_SECONDS, error) from None
    raise error


async def look(landed: Landed, *, settled: bool) -> bool | None:
    """``landed()`` on whichever connection answers, asked again while it cannot be
    reached (a storm of killed connections) or, when the statement may still be running
    (not ``settled``), until its rows appear; None when no final answer came within
    ``RESOLVE_SECONDS``. A batch asks it too, about a job whose send lost its reply
    (``DatabaseDriver.holds_job``)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + RESOLVE_SECONDS
    pause = 0.01
    while True:
        try:
            # bounded: a pool waiting for a connection to a server that went away would
            # hold the dispatch for the pool's own timeout
            async with asyncio.timeout(max(end - loop.time(), 0.01)):
                found = await landed()
        except (DatabaseConnectionError, TimeoutError):
            pass
        else:
            if found is None or found or settled:
                return found
        if loop.time() + pause > end:
            return None
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.2)
