"""A workflow's definition: run as a job whose ``handle()`` replays it (the store
engine), and what happens when a run's message fails for good.

``@workflow`` and the ``Workflow`` calls on runs are in ``haze._workflows.api``.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any, cast

from haze._base.describe import error_line
from haze._base.durations import Duration
from haze._base.errors import JobDefinitionError, WorkflowError
from haze._engine.view import EngineApp
from haze._jobs.context import JobContext
from haze._jobs.definition import JobDefinition, PendingDispatch
from haze._jobs.options import _origin_of
from haze._workflows import engine
from haze._workflows.engine import (
    Stopped,
    StoreEngine,
    Suspend,
    Traced,
    context_state,
    hop,
    now,
)
from haze._workflows.results import StoreResults
from haze._workflows.run import DEFAULT_MAX_STEPS, WorkflowRun, encode_result
from haze._workflows.sealed import sealed_state
from haze.contracts.workflow import KeptRun, WorkflowStateStore

__all__ = ["WorkflowDefinition", "find_workflow", "registered_workflows", "replay"]

log = logging.getLogger("haze")

_workflows: dict[str, WorkflowDefinition] = {}


class WorkflowDefinition:
    """A durable workflow's handler and options, and the job that runs it."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        tries: int = 1,
        backoff: object = 0,
        timeout: Duration | None = None,
        queue: str | None = None,
        connection: str | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        failed: Callable[..., Any] | None = None,
        encrypted: bool = False,
    ) -> None:
        origin = _origin_of(fn)
        self.name = name if name is not None else getattr(fn, "__name__", "")
        where = f'workflow "{self.name}" ({origin})'
        if not inspect.iscoroutinefunction(fn):
            raise JobDefinitionError(f"{where}: a workflow must be an async def (run, **input)")
        if not list(inspect.signature(fn).parameters):
            raise JobDefinitionError(f"{where}: a workflow takes the run first: (run, **input)")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise JobDefinitionError(
                f"{where}: max_steps must be an integer >= 1, got {max_steps!r}"
            )
        if failed is not None and not callable(failed):
            raise JobDefinitionError(f"{where}: failed must be callable, got {failed!r}")
        self.fn = fn
        self.max_steps = max_steps
        self.failed = failed
        #: the run's input, step results, events, result and errors are stored encrypted
        self.encrypted = bool(encrypted)

        async def handle(payload: Any, job: JobContext) -> None:
            await replay(self, payload, job)

        async def on_failed(payload: Any, error: BaseException, job: JobContext) -> None:
            await run_failed(self, payload, error, job)

        self.job: JobDefinition[Any] = JobDefinition(
            handle,
            name=self.name,
            tries=tries,
            backoff=backoff,
            timeout=timeout,
            queue=queue,
            connection=connection,
            failed=on_failed,
            dont_retry=(WorkflowError,),
            encrypted=self.encrypted,
            origin=origin,
        )
        _workflows[self.name] = self

    def __repr__(self) -> str:
        return f"<workflow {self.name!r} from {self.job.origin}>"

    def pending(self, payload: dict[str, Any]) -> PendingDispatch[Any]:
        """A dispatch of this workflow's job (a start or a resume)."""
        return self.job.with_(payload)


def find_workflow(name: str) -> WorkflowDefinition | None:
    return _workflows.get(name)


def registered_workflows() -> dict[str, WorkflowDefinition]:
    return dict(_workflows)


# --------------------------------------------------------------------------- replay


async def replay(wf: WorkflowDefinition, payload: Any, ctx: JobContext) -> None:
    """One delivery of a run's message: replay the workflow until it ends or suspends."""
    state = sealed_state(context_state(ctx), ctx.app, encrypt=wf.encrypted)
    run_id = str(payload["run"])
    kept = await _to_replay(wf, state, run_id, payload, ctx)
    if kept is None or kept.input is None:
        return
    text = kept.input
    driver = ctx.app.driver(ctx.connection)

    async def resume(delay: float, position: int, by: str) -> None:
        pending = wf.pending({"run": run_id, "wake": position, "by": by})
        pending._set(queue=ctx.queue, connection=ctx.connection, delay=hop(driver, delay))
        await pending.dispatch()

    step_engine = StoreEngine(
        state,
        run_id,
        message_id=ctx.id,
        resume=resume,
        # a fake queue records the resume instead of handing it to the sync driver
        inline=driver.inline and ctx.app.recorder is None,
        wake=payload.get("wake"),
        by=payload.get("by"),
        encrypted=wf.encrypted,
        traced=_traced(ctx, wf, run_id),
        kept=kept,
        workflow=wf.name,
    )
    results = _results(ctx, wf, run_id, driver.max_message_size)
    run = WorkflowRun(
        run_id,
        wf.name,
        step_engine,
        max_steps=wf.max_steps,
        max_result_size=driver.max_message_size,
        attempt=ctx.attempt,
        results=results,
    )
    try:
        value = await wf.fn(run, **json.loads(text))
    except (Suspend, Stopped):
        return
    except Exception as e:
        if step_engine.gave_up(e):  # the run's own tries are for crashes, not for this
            # its large results stay: a retry of the failed run replays them
            ctx.fail(e)
            return
        raise
    output = encode_result(value, f'workflow "{wf.name}" (run {run_id})')
    await state.finish(run_id, "done", engine.now(), output, None)
    if results is not None:  # after the finish: a crash before it replays with them
        await results.delete()


def _results(
    ctx: JobContext, wf: WorkflowDefinition, run_id: str, limit: int | None
) -> StoreResults | None:
    """Where this run's large step results go: its connection's offload store."""
    offload = cast("EngineApp", ctx.app).manager.offload
    plan = offload.plan(ctx.connection)
    if plan is None:
        return None
    sealing = ctx.app if wf.encrypted else None
    return StoreResults(offload, plan, ctx.connection, run_id, limit=limit, sealing=sealing)


async def _to_replay(
    wf: WorkflowDefinition,
    state: WorkflowStateStore,
    run_id: str,
    payload: Any,
    ctx: JobContext,
) -> KeptRun | None:
    """What this delivery replays (the one read of the replay: input, states, steps),
    or None when it has nothing to replay."""
    if "input" in payload:  # the start message
        token = payload.get("start")
        if token is not None and await state.keep(run_id, "start", str(token)) != token:
            return None  # another start of this id won the race: its message runs the run
    kept = await state.kept(run_id)
    if kept.input is None and "input" in payload:
        # the start message adds the run when the starter has not (yet, or died first)
        first = str(payload["input"])
        if await state.create_run(run_id, wf.name, first, now(), ctx.connection):
            kept = KeptRun(input=first)
        else:  # the starter added it meanwhile
            kept = await state.kept(run_id)
    if kept.final is not None:
        return None  # a late or duplicate message of a finished run
    if "event" in payload and not await _waits_for(state, run_id, str(payload["event"])):
        return None  # a run not at this wait yet finds the kept event when it gets there
    if kept.input is None:
        log.warning('workflow "%s": no run %s in the store; message dropped', wf.name, run_id)
        return None
    return kept


async def _waits_for(state: WorkflowStateStore, run_id: str, event: str) -> bool:
    run = await state.get_run(run_id)
    return run is not None and run.state == "waiting" and run.waiting_for == event


def _traced(ctx: JobContext, wf: WorkflowDefinition, run_id: str) -> Traced | None:
    """Each try of a step in a span under this delivery's ``process`` span (and so under
    the run's trace, which every resume message carries on)."""
    # a job sees its app through the jobs' view; the layers from the engine up see more
    app = cast("EngineApp", ctx.app)
    telemetry = app.manager.telemetry()
    if telemetry is None:
        return None
    return functools.partial(telemetry.workflow_step, wf.name, run_id, sealed=wf.encrypted)


async def run_failed(
    wf: WorkflowDefinition, payload: Any, error: BaseException, ctx: JobContext
) -> None:
    """The run's message failed for good: the run fails with that reason (kept once),
    then the workflow's ``failed()`` runs: at least once, since a worker that died
    before the engine marked this handler done runs it again."""
    run_id = str(payload["run"])
    state = sealed_state(context_state(ctx), ctx.app, encrypt=wf.encrypted)
    kept = await state.finish(run_id, "failed", now(), None, error_line(error))
    if not kept and await state.final_state(run_id) != "failed":
        return  # cancelled or done meanwhile
    if wf.failed is not None:
        result = wf.failed(run_id, error)
        if inspect.isawaitable(result):
            await result
