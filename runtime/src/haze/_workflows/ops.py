"""Operator actions on runs kept by haze's own engine (``haze workflow:retry``).

A failed run is retried in place: its final state is forgotten and a resume message
queued, so the replay returns every kept step result and runs the failed step again
(with its tries). Two retries at once queue two resumes; the steps' results are still
kept once (insert-if-absent), and the second replay finds the run finished or catches
up with the first.

Crash windows: dying after the final state is forgotten and before the resume is
queued leaves the run ``running`` with nothing queued; ``workflow:retry`` finds it not
failed, so ``workflow:show`` says so and a new ``Workflow.send_event`` or retry of the
message queues it again.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from haze._kernel.errors import WorkflowRunError
from haze._workflows.definition import find_workflow
from haze._workflows.engine import workflow_state

__all__ = ["Reopens", "retry_run"]


@runtime_checkable
class Reopens(Protocol):
    """A state store that can forget a run's final state (the key/value state does)."""

    async def reopen(self, run_id: str, state: str) -> bool:
        """Forget the final state while it is ``state``; True when this call did."""


async def retry_run(app: Any, run_id: str) -> bool:
    """Replay failed run ``run_id`` from its last kept step. False when the run is not
    failed; ``WorkflowRunError`` for an unknown run or a workflow this app lacks."""
    state = workflow_state(app.manager.state_store())
    run = await state.get_run(run_id)
    if run is None:
        raise WorkflowRunError(f"no workflow run {run_id!r}; check the id (haze workflow:list)")
    wf = find_workflow(run.name)
    if wf is None:
        raise WorkflowRunError(
            f'run {run_id!r} is of workflow "{run.name}", which this app does not define; '
            "retry it from the app that does"
        )
    if run.state != "failed" or not isinstance(state, Reopens):
        return False
    if not await state.reopen(run_id, "failed"):
        return False
    await wf.pending({"run": run_id}).dispatch()
    return True
