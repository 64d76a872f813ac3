"""The dashboard's Workflows pages: the runs, and one run with its steps and its wait.

They read through ``runs_for(app)``, as ``Workflow.status`` and ``haze workflow:*`` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from haze._workflows.api import runs_for
from haze.contracts.workflow import RUN_STATES

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["run_detail", "runs"]

#: Runs listed on the page (newest first).
PAGE = 50


async def runs(d: Any, request: Request) -> Response:
    """``/workflows``: the newest runs, filtered by ``?state=`` and ``?name=``."""
    q = request.query_params
    state = q.get("state") or None
    name = q.get("name") or None
    if state is not None and state not in RUN_STATES:
        message = f"unknown run state {state!r}; one of: {', '.join(RUN_STATES)}"
        return d.render(request, "error.html", 400, message=message, page="workflows")  # type: ignore[no-any-return]
    found = await d.call(lambda app: runs_for(app, name).list(state, name, PAGE))
    return d.render(  # type: ignore[no-any-return]
        request,
        "workflows.html",
        runs=found,
        states=RUN_STATES,
        state=state or "",
        name=name or "",
        page="workflows",
    )


async def run_detail(d: Any, request: Request) -> Response:
    """``/workflows/{run_id}``: one run, its steps (state, attempts, duration, result
    size) and what it waits for."""
    run_id = request.path_params["run_id"]
    st = await d.call(lambda app: runs_for(app).status(run_id))
    if st is None:
        message = f'no workflow run "{run_id}"'
        return d.render(request, "error.html", 404, message=message, page="workflows")  # type: ignore[no-any-return]
    return d.render(request, "workflow_detail.html", run=st, page="workflows")  # type: ignore[no-any-return]
