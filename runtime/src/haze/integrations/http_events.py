"""Send a workflow event over HTTP: the event half of the signed dispatch endpoint.

A body with ``"event"`` instead of ``"job"`` delivers an event to a workflow run (a
payment provider's webhook, a button in another service), with the same
authentication, size limits and entrypoints as a dispatch
(``haze.integrations.http_dispatch``)::

    {"event": "paid", "run": "<run id>", "payload": {"amount": 1200}}

Answers: ``202 {"run": ..., "event": ..., "kept": bool}`` (``kept`` is False when an
event of that name had already reached the run: the first one wins), ``400`` for a
body without a run id or event name, ``404`` for an unknown run, ``409`` for a run that
has finished, ``503`` when the store cannot be reached.
"""

from __future__ import annotations

import logging
from typing import Any

from haze._base.current import run_in_app
from haze._base.errors import BackendUnavailableError, WorkflowRunError
from haze._workflows.api import Workflow

__all__ = ["EVENT_KEYS", "send_event_request"]

log = logging.getLogger("haze.http")

#: The keys an event body may carry.
EVENT_KEYS = frozenset({"event", "run", "payload"})


async def send_event_request(
    app: object, data: dict[str, Any], where: str
) -> tuple[int, dict[str, Any]]:
    """The status and JSON body answering an event request whose body is ``data``."""
    run_id, name = data.get("run"), data.get("event")
    if not isinstance(name, str) or not name:
        return 400, {"error": 'the body needs "event": the name of the event to send'}
    if not isinstance(run_id, str) or not run_id:
        return 400, {"error": 'an event needs "run": the id Workflow.start returned'}

    async def send() -> tuple[int, dict[str, Any]]:
        st = await Workflow.status(run_id)
        if st is None:
            return 404, {"error": f"there is no workflow run {run_id!r}"}
        if st.finished:
            return 409, {
                "error": f'run {run_id!r} of "{st.name}" is {st.state}: it takes no events'
            }
        try:
            kept = await Workflow.send_event(run_id, name, data.get("payload"))
        except WorkflowRunError as e:  # it finished meanwhile
            return 409, {"error": str(e)}
        return 202, {"run": run_id, "event": name, "kept": kept}

    try:
        return await run_in_app(app, send)
    except BackendUnavailableError as e:
        log.error(
            "%s: cannot send event %s to %s: %s: %s", where, name, run_id, type(e).__name__, e
        )
        return 503, {
            "error": f"the store is unavailable ({type(e).__name__}); the event was not kept, "
            "try again later"
        }
    except (TypeError, ValueError) as e:
        return 400, {"error": str(e)}
