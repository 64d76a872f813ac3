"""``@workflow`` and ``Workflow``: define durable workflows, start runs, send them
events, read and cancel them.

>>> @workflow(name="onboard", tries=3)
... async def onboard(run, user_id: int):
...     user = await run.step("fetch", fetch_user, user_id)
...     await run.sleep("cool-off", "2d")
...     answer = await run.wait_for_event("approved", timeout="7d")
...     return {"user": user, "answer": answer}
>>> # rid = await Workflow.start(onboard, user_id=7)
>>> # await Workflow.send_event(rid, "approved", {"by": "ops"})
>>> # (await Workflow.wait(rid, timeout=60)).result

Reads and cancels go through a ``WorkflowRuns`` (where a workflow's runs live): the
app's store for haze's own engine; a platform engine registers its own with
``add_runs_resolver``.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any

from haze._base.durations import Duration, parse_duration
from haze._base.errors import ConfigError, WorkflowResultError, WorkflowRunError
from haze._base.message import new_id
from haze._workflows.cloudflare_runs import CloudflareRuns, cloudflare_runs
from haze._workflows.definition import WorkflowDefinition, find_workflow
from haze._workflows.engine import now, workflow_state
from haze._workflows.lambda_runs import EitherRuns, LambdaRuns, native_runs
from haze._workflows.run import DEFAULT_MAX_STEPS, check_name
from haze._workflows.sealed import sealed_state
from haze.contracts.app import use_app
from haze.contracts.workflow import FINAL_STATES, WorkflowRuns, WorkflowStateStore, WorkflowStatus

__all__ = ["StoreRuns", "Workflow", "add_runs_resolver", "retry", "runs_for", "wake", "workflow"]

log = logging.getLogger("haze")

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

#: (app, workflow name or None) -> the runs' home, or None to let the next one answer.
RunsResolver = Callable[[Any, "str | None"], "WorkflowRuns | None"]
_resolvers: list[RunsResolver] = []


def add_runs_resolver(resolver: RunsResolver) -> None:
    """Route a workflow's reads and cancels elsewhere than the app's store (a platform's
    own engine); the first resolver that answers wins."""
    _resolvers.append(resolver)


class StoreRuns:
    """``WorkflowRuns`` over the app's store (haze's own engine)."""

    def __init__(self, state: WorkflowStateStore) -> None:
        self.state = state

    async def status(self, run_id: str) -> WorkflowStatus | None:
        return await self.state.get_run(run_id)

    async def list(
        self, state: str | None = None, name: str | None = None, limit: int = 50
    ) -> builtins.list[WorkflowStatus]:
        return await self.state.list_runs(state, name, limit)

    async def cancel(self, run_id: str) -> bool:
        # get_run, not run_input: an encrypted run's input needs the key; a cancel does not
        if await self.state.get_run(run_id) is None:
            return False
        return await self.state.finish(run_id, "cancelled", now(), None, "cancelled")


async def _late_event(state: WorkflowStateStore, run: WorkflowStatus, name: str) -> bool:
    """An event whose wait has ended: False when it ended with an event (the first
    wins); else it timed out, and since no later wait of the run can take that name,
    the event is refused rather than kept for nothing."""
    if await state.event(run.id, name) is not None:
        return False
    raise WorkflowRunError(
        f'Workflow.send_event: the wait for the event "{name}" has ended in run {run.id!r} '
        f'of "{run.name}" (it timed out, or the run passed it); the event was not kept'
    )


def _state(app: Any, encrypt: bool = False) -> WorkflowStateStore:
    """The app's run state; sealed values are opened with its key, and a run's user
    data is sealed when ``encrypt`` (an encrypted workflow's start)."""
    return sealed_state(workflow_state(app.manager.state_store()), app, encrypt=encrypt)


_warned: set[str] = set()


def _check_shared(app: Any, wf: WorkflowDefinition) -> None:
    """Warn once when the runs' store is this process's own while other processes run
    the workflow's messages: they would not see the runs started here."""
    driver = app.driver(app.queue_config.routes.connection_for(wf.job.name, wf.job.connection))
    store = app.manager.state_store()
    if driver.remote and not store.shared and driver.name not in _warned:
        _warned.add(driver.name)
        log.warning(
            'The "%s" store keeps workflow runs, but connection "%s" is consumed by other '
            "processes, which cannot see them. Set store='redis' (or 'database') in "
            "config/queue.py.",
            store.name,
            driver.name,
        )


def runs_for(app: Any, name: str | None = None) -> WorkflowRuns:
    """Where the runs of workflow ``name`` (None: any) live, for ``app``."""
    for resolver in _resolvers:
        found = resolver(app, name)
        if found is not None:
            return found
    native = _native(app, name)
    if native is not None:  # a platform's engine ("workflows": "native")
        state = None if name is not None else _state_or_none(app)
        return native if state is None else EitherRuns(StoreRuns(state), native)
    return StoreRuns(_state(app))


def _native(app: Any, name: str | None = None) -> LambdaRuns | CloudflareRuns | None:
    """The platform runs (Lambda durable functions, Cloudflare Workflows) of workflow
    ``name`` (None: of the app's native connection), or None: haze's own engine."""
    found: LambdaRuns | CloudflareRuns | None = native_runs(app, name)
    return found if found is not None else cloudflare_runs(app, name)


def _state_or_none(app: Any) -> WorkflowStateStore | None:
    """The app's workflow state, or None when it has no store that can keep it (an app
    whose workflows all run on a platform's engine needs none)."""
    try:
        return _state(app)
    except ConfigError:
        return None


def _run_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 255:
        raise ValueError(f"{what}: a run id must be a string of 1-255 characters, got {value!r}")
    return value


class Workflow(WorkflowDefinition):
    """A durable workflow (made by ``@workflow``) and the calls on its runs.

    >>> # rid = await Workflow.start(onboard, user_id=7, id="signup-7")
    >>> # st = await Workflow.status(rid)        # WorkflowStatus, or None
    >>> # await Workflow.cancel(rid)             # True when this call cancelled it
    """

    @staticmethod
    async def start(wf: Workflow, /, *, id: str | None = None, **input: Any) -> str:
        """Start a run of ``wf`` with ``input`` as its keyword arguments; the run's id.
        ``id`` is the caller's idempotency key: a second start with it starts nothing."""
        if not isinstance(wf, WorkflowDefinition):
            raise TypeError(f"Workflow.start: expected a @workflow, got {wf!r}")
        run_id = new_id() if id is None else _run_id(id, f'Workflow.start("{wf.name}")')
        try:  # here, not as a failed run in a worker later
            inspect.signature(wf.fn).bind(None, **input)
        except TypeError as e:
            raise TypeError(
                f'Workflow.start("{wf.name}"): {e}; pass the workflow\'s own arguments '
                "(after run) as keywords"
            ) from None
        try:
            text = _encode(input)
        except (TypeError, ValueError) as e:
            raise WorkflowResultError(
                f'Workflow.start("{wf.name}"): the input is not JSON ({e}); pass dicts, '
                "lists, strings, numbers, booleans or None"
            ) from None
        app = use_app()
        native = _native(app, wf.name)
        if native is not None:  # a platform's engine: an execution/instance named by the id
            return await native.start(wf.name, run_id, text)
        state = _state(app, wf.encrypted)
        _check_shared(app, wf)
        if await state.run_input(run_id) is not None:
            return run_id
        # the message first: it carries the input and adds the run itself if this
        # process dies before the record below. Starts racing on one id each queue a
        # message; its token lets only one of them replay the run (definition.replay).
        connection = app.queue_config.routes.connection_for(wf.job.name, wf.job.connection)
        await wf.pending({"run": run_id, "input": text, "start": new_id()}).dispatch()
        await state.create_run(run_id, wf.name, text, now(), connection)
        return run_id

    @staticmethod
    async def send_event(run_id: str, name: str, payload: Any = None) -> bool:
        """Send event ``name`` to a run: a wait for it resumes with ``payload``, and an
        event sent before its wait is kept for it. False when an event of that name was
        already kept (the first wins). ``WorkflowRunError`` for an unknown or finished run,
        or when the wait for that event timed out (no later wait can take it).
        """
        run_id = _run_id(run_id, "Workflow.send_event")
        check_name(name, "event", f"Workflow.send_event({run_id!r})")
        try:
            text = _encode(payload)
        except (TypeError, ValueError) as e:
            raise WorkflowResultError(
                f'Workflow.send_event({run_id!r}, "{name}"): the payload is not JSON ({e})'
            ) from None
        app = use_app()
        native = _native(app)
        if native is not None and _state_or_none(app) is None:
            return await native.send_event(run_id, name, text)  # no store: the platform's
        state = _state(app)
        run = await state.get_run(run_id)
        if run is None and native is not None:  # a run on the platform's engine
            return await native.send_event(run_id, name, text, keep=state)
        if run is None:
            raise WorkflowRunError(
                f"Workflow.send_event: no workflow run {run_id!r}; check the id "
                "(Workflow.start returns it)"
            )
        if run.state in FINAL_STATES:
            raise WorkflowRunError(
                f'Workflow.send_event: run {run_id!r} of "{run.name}" is {run.state}; '
                "an event can only reach a run that has not finished"
            )
        # read unsealed: whether they are kept, not what they say (no key needed)
        raw = workflow_state(app.manager.state_store())
        if await raw.result(run_id, name) is not None:  # its wait has ended
            return await _late_event(raw, run, name)
        kept = await state.put_event(run_id, name, text)
        wf = find_workflow(run.name)
        if wf is not None:  # resume it now, if it waits for this event (definition.replay)
            await wf.pending({"run": run_id, "event": name}).dispatch()
        return kept

    @staticmethod
    async def status(run_id: str) -> WorkflowStatus | None:
        """The run's ``WorkflowStatus`` (state, steps, result, error), or None."""
        return await runs_for(use_app()).status(_run_id(run_id, "Workflow.status"))

    @staticmethod
    async def wait(run_id: str, timeout: Duration | None = None) -> WorkflowStatus:
        """Wait until the run is done, failed or cancelled and return its status;
        ``TimeoutError`` after ``timeout``, like ``Queue.wait``."""
        run_id = _run_id(run_id, "Workflow.wait")
        limit = None if timeout is None else parse_duration(timeout, "Workflow.wait(timeout)")
        runs = runs_for(use_app())
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit
        pause = 0.01
        while True:
            st = await runs.status(run_id)
            if st is None:
                raise WorkflowRunError(f"Workflow.wait: no workflow run {run_id!r}")
            if st.finished:
                return st
            if _due_inline(st):
                await wake(run_id)
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"workflow run {run_id} is still {st.state} after {limit:g}s")
            left = pause if deadline is None else min(pause, max(0.0, deadline - loop.time()))
            await asyncio.sleep(left)
            pause = min(pause * 2, 0.5)

    @staticmethod
    async def cancel(run_id: str) -> bool:
        """Cancel a run that has not finished (its next step does not start). True when
        this call cancelled it; False for an unknown or finished run, like ``Queue.cancel``."""
        return await runs_for(use_app()).cancel(_run_id(run_id, "Workflow.cancel"))

    @staticmethod
    async def list(
        state: str | None = None, name: str | None = None, limit: int = 50
    ) -> builtins.list[WorkflowStatus]:
        """Runs, newest first (``state``/``name`` filter them), without their steps."""
        return await runs_for(use_app(), name).list(state, name, limit)


def _due_inline(st: WorkflowStatus) -> bool:
    """A run whose sleep or wait is due on a driver that has no delayed messages (sync):
    nothing else will resume it, so the caller waiting for it does."""
    if st.resume_at is None or st.resume_at > now():
        return False
    wf = find_workflow(st.name)
    app = use_app()
    if wf is None or app.recorder is not None:
        return False
    return app.driver(app.queue_config.routes.connection_for(wf.job.name, wf.job.connection)).inline


async def wake(run_id: str) -> bool:
    """Queue a resume of a run now (a test's clock moved on, an operator's nudge): a
    sleep or wait that has not ended just ends the attempt again. False when the run is
    unknown, finished, or its workflow is not defined in this process."""
    state = _state(use_app())
    run = await state.get_run(run_id)
    wf = None if run is None or run.finished else find_workflow(run.name)
    if wf is None:
        return False
    await wf.pending({"run": run_id}).dispatch()
    return True


async def _refuse_native_retry(app: Any, run_id: str) -> None:
    """A run the platform's engine keeps is not replayed by haze: say so, rather than
    "unknown" (the platform has the run, and its own retries were the steps')."""
    native = _native(app)
    found = None if native is None else await native.status(run_id)
    if found is not None:
        raise WorkflowRunError(
            f'Workflow.retry: run {run_id!r} of "{found.name}" runs on the platform\'s own '
            "workflow engine, which keeps its runs: haze cannot replay it; start a new run "
            "(Workflow.start) instead"
        )
    if _state_or_none(app) is None:
        _state(app)  # no store and no such run: the store's own one-line ConfigError


async def retry(run_id: str) -> bool:
    """Replay a failed run from its last kept step (its steps' results stay kept; the
    step that failed gets its tries again). False when the run is unknown, not failed,
    or its workflow is not defined in this process."""
    app = use_app()
    state = _state_or_none(app)
    run = None if state is None else await state.get_run(run_id)
    if run is None:
        await _refuse_native_retry(app, run_id)
    wf = None if run is None or run.state != "failed" else find_workflow(run.name)
    if state is None or wf is None or not await state.reopen(run_id):
        return False
    await wf.pending({"run": run_id}).dispatch()
    return True


def workflow(
    fn: Callable[..., Any] | None = None,
    /,
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
) -> Any:
    """Define a durable workflow: ``async def (run, **input)`` whose steps survive crashes.

    >>> @workflow(name="onboard", tries=3)
    ... async def onboard(run, user_id: int):
    ...     user = await run.step("fetch", fetch_user, user_id)
    ...     await run.sleep("cool-off", "2d")
    ...     return user

    ``tries``/``backoff``: deliveries of one message of the run, as for any job (a
    worker that died mid-replay, or an error raised outside any step, uses one; give a
    workflow that must outlive worker crashes ``tries`` above 1). A step that fails for
    good, or a broken rule, fails the run at once, whatever ``tries`` is; ``max_steps``
    (10,000): the steps one run may reach; ``failed(run_id, error)``: called once when
    the run fails; ``queue``/``connection``/``timeout`` as for ``define_job``;
    ``encrypted``: the run's input, step results, events, result and error text are
    stored encrypted with the app key, as an ``encrypted`` job's payload is.
    """

    def decorate(f: Callable[..., Any]) -> Workflow:
        return Workflow(
            f,
            name=name,
            tries=tries,
            backoff=backoff,
            timeout=timeout,
            queue=queue,
            connection=connection,
            max_steps=max_steps,
            failed=failed,
            encrypted=encrypted,
        )

    return decorate(fn) if fn is not None else decorate
