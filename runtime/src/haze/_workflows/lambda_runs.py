"""Runs of workflows on Lambda durable functions, through the durable-execution API.

An sqs connection with ``"workflows": "native"`` runs its workflows as executions of
one durable function (handler ``handler.workflows``, ``haze_lambda.workflow_handler``),
named by ``HAZE_WORKFLOW_FUNCTION`` (haze_infra sets it on every function it makes).
boto3 talks to Lambda with the connection's ``region`` and ``credentials``; its
standard ``AWS_ENDPOINT_URL_LAMBDA`` points it elsewhere (a local engine).

- ``Workflow.start``: an asynchronous ``Invoke`` whose ``DurableExecutionName`` is the
  run id (an id Lambda cannot take as a name, past 64 characters of ``[A-Za-z0-9_-]``,
  is named by its hash instead), with ``{"workflow", "input", "id"}``; a start of an id
  that exists starts nothing.
- ``send_event``: the pending callback of that name, from the execution's history,
  completed with the payload; before the run waits for it, the event is kept in the
  app's store, where the wait finds it (and the callback is completed if the wait began
  meanwhile).
- ``status``/``wait``/``list``/``cancel``: ``GetDurableExecution``, its history,
  ``ListDurableExecutionsByFunction`` and ``StopDurableExecution``.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import json
import os
import re
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import unquote

from haze._base.deps import require
from haze._base.errors import ConfigError, WorkflowRunError
from haze._workflows.definition import find_workflow, registered_workflows
from haze.contracts.workflow import (
    FINAL_STATES,
    StepStatus,
    WorkflowRuns,
    WorkflowStateStore,
    WorkflowStatus,
)

__all__ = [
    "DISPATCH_SUB_TYPE",
    "FUNCTION_ENV",
    "INTERNAL",
    "EitherRuns",
    "LambdaRuns",
    "execution_name",
    "lambda_refusals",
    "native_runs",
    "operation_name",
    "shown_name",
]

T = TypeVar("T")

#: The variable naming the durable function that runs the app's native workflows.
FUNCTION_ENV = "HAZE_WORKFLOW_FUNCTION"

_EXECUTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_OPERATION_NAME = re.compile(r"[\x20-\x7e]{1,256}")
_STATES = {
    "RUNNING": "running",
    "PAUSING": "running",
    "PAUSED": "running",
    "SUCCEEDED": "done",
    "FAILED": "failed",
    "TIMED_OUT": "failed",
    "STOPPED": "cancelled",
}
_KINDS = {"Step": "step", "Wait": "sleep", "Callback": "event"}
#: The prefix of haze's own operations (not the workflow's steps: not shown).
INTERNAL = "haze:"
#: The operation sub-type of a ``run.dispatch`` step (shown as kind ``dispatch``).
DISPATCH_SUB_TYPE = "HazeDispatch"


def execution_name(run_id: str) -> str:
    """The durable execution's name for a run id (Lambda takes 1-64 of ``[A-Za-z0-9_-]``)."""
    if _EXECUTION_NAME.fullmatch(run_id):
        return run_id
    return "h-" + hashlib.sha256(run_id.encode()).hexdigest()[:62]


def operation_name(name: str) -> str:
    """The operation's name for a step name (Lambda takes 1-256 printable ASCII
    characters): others are %-escaped, with a hash when that is too long."""
    if _OPERATION_NAME.fullmatch(name) and "%" not in name:
        return name
    escaped = "".join(c if " " <= c <= "~" and c != "%" else _escape(c) for c in name)
    if len(escaped) <= 256:
        return escaped
    return f"{escaped[:230]}~{hashlib.sha256(name.encode()).hexdigest()[:24]}"


def _escape(c: str) -> str:
    return "".join(f"%{b:02X}" for b in c.encode())


class LambdaRuns:
    """``WorkflowRuns`` (and the start and events) of one native sqs connection."""

    def __init__(self, connection: str, options: Mapping[str, Any]) -> None:
        self.connection = connection
        self.options = options
        self._client: Any = None
        self._lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------

    @property
    def function(self) -> str:
        name = os.environ.get(FUNCTION_ENV)
        if not name:
            raise ConfigError(
                f"queue connection {self.connection!r} runs workflows on Lambda "
                f'("workflows": "native"): set {FUNCTION_ENV} to the name or ARN of the '
                "durable function whose handler is handler.workflows (haze_infra sets it)"
            )
        return name

    def _lambda(self) -> Any:
        with self._lock:
            if self._client is None:
                boto3 = require("boto3", what="native workflows on Lambda", extra="sqs")
                creds = dict(self.options.get("credentials") or {})
                session = boto3.session.Session(
                    aws_access_key_id=creds.get("access_key_id"),
                    aws_secret_access_key=creds.get("secret_access_key"),
                    aws_session_token=creds.get("session_token"),
                    region_name=self.options.get("region"),
                )
                self._client = session.client("lambda")
            return self._client

    async def _call(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        return await asyncio.to_thread(fn, **kwargs)

    async def _find(self, run_id: str) -> dict[str, Any] | None:
        """The run's execution (``GetDurableExecution`` with its input), or None."""
        client = self._lambda()
        found = await self._call(
            client.list_durable_executions_by_function,
            FunctionName=self.function,
            DurableExecutionName=execution_name(run_id),
        )
        executions = found.get("DurableExecutions") or []
        if not executions:
            return None
        arn = executions[0]["DurableExecutionArn"]
        got: dict[str, Any] = await self._call(
            client.get_durable_execution, DurableExecutionArn=arn, IncludeExecutionData=True
        )
        return got

    async def _history(self, arn: str) -> list[dict[str, Any]]:
        client, marker = self._lambda(), None
        events: builtins.list[dict[str, Any]] = []
        while True:
            page = await self._call(
                client.get_durable_execution_history,
                DurableExecutionArn=arn,
                IncludeExecutionData=True,
                **({"Marker": marker} if marker else {}),
            )
            events.extend(page.get("Events") or [])
            marker = page.get("NextMarker")
            if not marker:
                return events

    # -- calls ------------------------------------------------------------------------

    async def start(self, workflow: str, run_id: str, input_text: str) -> str:
        """Start a run (nothing when the id exists); the run id."""
        if await self._find(run_id) is not None:
            return run_id
        payload = json.dumps({"workflow": workflow, "input": json.loads(input_text), "id": run_id})
        await self._call(
            self._lambda().invoke,
            FunctionName=self.function,
            InvocationType="Event",
            DurableExecutionName=execution_name(run_id),
            Payload=payload.encode(),
        )
        return run_id

    async def send_event(
        self,
        run_id: str,
        name: str,
        payload_text: str,
        keep: WorkflowStateStore | None = None,
    ) -> bool:
        """Complete the run's pending wait for event ``name``; False when that wait
        already has its event. An event sent before its wait is kept in ``keep`` (the
        app's store, shared with the function), where the wait finds it; without one it
        is a ``WorkflowRunError``, as is an unknown or finished run."""
        execution = await self._found(run_id, "Workflow.send_event")
        workflow = _input(execution).get("workflow", "?")
        state = _STATES.get(str(execution.get("Status")), "running")
        if state in FINAL_STATES:
            raise WorkflowRunError(
                f'Workflow.send_event: run {run_id!r} of "{workflow}" is {state}; '
                "an event can only reach a run that has not finished"
            )
        arn = execution["DurableExecutionArn"]
        done = await self._complete(arn, name, payload_text)
        if done is not None:
            return done
        if keep is None:
            raise WorkflowRunError(
                f'Workflow.send_event: run {run_id!r} of "{workflow}" is not waiting for '
                f'"{name}" yet, and this app has no store to keep the event until it does; '
                "set store= in config/queue.py, or send it once Workflow.status(id)."
                "waiting_for names it"
            )
        # Kept for the wait, which reads the store after its callback exists: a wait that
        # began before this write is completed below, one that begins after it reads it.
        kept = await keep.put_event(run_id, name, payload_text)
        again = await self._complete(arn, name, payload_text)
        return kept if again is None else (again or kept)

    async def _complete(self, arn: str, name: str, payload_text: str) -> bool | None:
        """Complete the pending callback of event ``name``: True; False when it has its
        event already; None when the run has not reached that wait."""
        events = await self._history(arn)
        wanted = operation_name(name)
        started = {e["Id"]: e for e in events if e["EventType"] == "CallbackStarted"}
        ended = {
            e["Id"]
            for e in events
            if e["EventType"].startswith("Callback") and e["EventType"] != "CallbackStarted"
        }
        for op_id, event in started.items():
            if event.get("Name") != wanted:
                continue
            if op_id in ended:
                return False
            callback = event["CallbackStartedDetails"]["CallbackId"]
            await self._call(
                self._lambda().send_durable_execution_callback_success,
                CallbackId=callback,
                Result=payload_text.encode(),
            )
            return True
        return None

    async def _found(self, run_id: str, what: str) -> dict[str, Any]:
        execution = await self._find(run_id)
        if execution is None:
            raise WorkflowRunError(
                f"{what}: no workflow run {run_id!r}; check the id (Workflow.start returns it)"
            )
        return execution

    async def status(self, run_id: str) -> WorkflowStatus | None:
        execution = await self._find(run_id)
        if execution is None:
            return None
        events = await self._history(execution["DurableExecutionArn"])
        return _status(run_id, execution, events)

    async def list(
        self, state: str | None = None, name: str | None = None, limit: int = 50
    ) -> builtins.list[WorkflowStatus]:
        statuses = [k for k, v in _STATES.items() if v == state] if state else None
        found = await self._call(
            self._lambda().list_durable_executions_by_function,
            FunctionName=self.function,
            ReverseOrder=True,
            **({"Statuses": statuses} if statuses else {}),
        )
        out: builtins.list[WorkflowStatus] = []
        for summary in found.get("DurableExecutions") or []:
            execution = await self._call(
                self._lambda().get_durable_execution,
                DurableExecutionArn=summary["DurableExecutionArn"],
                IncludeExecutionData=True,
            )
            st = _status(_run_of(execution), execution, [])
            if (name is None or st.name == name) and (state is None or st.state == state):
                out.append(st)
            if len(out) >= limit:
                break
        return out

    async def cancel(self, run_id: str) -> bool:
        execution = await self._find(run_id)
        if execution is None or _STATES.get(str(execution.get("Status"))) in FINAL_STATES:
            return False
        await self._call(
            self._lambda().stop_durable_execution,
            DurableExecutionArn=execution["DurableExecutionArn"],
        )
        return True


# ------------------------------------------------------------------------ the read side


def _input(execution: Mapping[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(execution.get("InputPayload") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _run_of(execution: Mapping[str, Any]) -> str:
    return str(_input(execution).get("id") or execution.get("DurableExecutionName"))


def _epoch(value: Any) -> float | None:
    return None if value is None else float(value.timestamp())


def _payload(details: Mapping[str, Any] | None, key: str) -> str | None:
    box = (details or {}).get(key) or {}
    payload = box.get("Payload")
    return None if payload is None else str(payload)


def _status(
    run_id: str, execution: Mapping[str, Any], events: builtins.list[dict[str, Any]]
) -> WorkflowStatus:
    """A ``WorkflowStatus`` from the execution and its history (steps in first-reached
    order; a running run sleeping or waiting says so, with when and for what)."""
    given = _input(execution)
    state = _STATES.get(str(execution.get("Status")), "running")
    steps, resume_at, waiting_for = _steps(events)
    if state == "running" and steps:
        last = steps[-1]
        if last.state in ("sleeping", "waiting"):
            state = last.state
    error = execution.get("Error")
    text = None
    if error:
        kind, message = error.get("ErrorType"), error.get("ErrorMessage")
        text = f"{kind}: {message}" if kind and message else str(kind or message)
    elif state == "cancelled":
        text = "cancelled"
    result = execution.get("Result")
    return WorkflowStatus(
        id=run_id,
        name=str(given.get("workflow") or "?"),
        state=state,
        steps=steps,
        result=None if result is None else json.loads(result),
        error=text,
        input=given.get("input"),
        created_at=_epoch(execution.get("StartTimestamp")),
        updated_at=_epoch(execution.get("EndTimestamp") or execution.get("StartTimestamp")),
        resume_at=resume_at if state == "sleeping" else None,
        waiting_for=waiting_for if state == "waiting" else None,
    )


def _steps(
    events: builtins.list[dict[str, Any]],
) -> tuple[builtins.list[StepStatus], float | None, str | None]:
    order: builtins.list[str] = []
    seen: dict[str, dict[str, Any]] = {}
    waits: builtins.list[dict[str, Any]] = []
    for e in events:
        kind, _, what = _split(e["EventType"])
        if str(e.get("Name") or "").startswith(INTERNAL):
            # a wait's look for an event sent before it: one found is the wait's event
            early = _payload(e.get("StepSucceededDetails"), "Result")
            if what == "Succeeded" and early not in (None, "null") and waits:
                waits[-1].update(state="done", finished_at=_epoch(e.get("EventTimestamp")))
                waits[-1]["result_size"] = len(str(early).encode())
            continue
        if kind not in _KINDS:
            continue
        s = seen.get(e["Id"])
        if s is None:
            shown = "dispatch" if e.get("SubType") == DISPATCH_SUB_TYPE else _KINDS[kind]
            s = {"name": shown_name(e.get("Name") or e["Id"]), "kind": shown, "attempts": 0}
            s.update(started_at=_epoch(e.get("EventTimestamp")), state="running")
            seen[e["Id"]] = s
            order.append(e["Id"])
            if kind == "Callback":
                waits.append(s)
        _apply(s, kind, what, e)
    resume = next((seen[k]["_due"] for k in reversed(order) if "_due" in seen[k]), None)
    steps = [
        StepStatus(position=i, **{k: v for k, v in seen[o].items() if k != "_due"})
        for i, o in enumerate(order)
    ]
    waiting = next((st.name for st in reversed(steps) if st.state == "waiting"), None)
    return steps, resume, waiting


def _split(event_type: str) -> tuple[str, str, str]:
    for kind in _KINDS:
        if event_type.startswith(kind):
            return kind, "", event_type[len(kind) :]
    return "", "", event_type


def _apply(s: dict[str, Any], kind: str, what: str, e: Mapping[str, Any]) -> None:
    at = _epoch(e.get("EventTimestamp"))
    if what == "Started":
        if kind == "Step":
            s["attempts"] += 1
        elif kind == "Wait":
            s["state"] = "sleeping"
            s["_due"] = _epoch((e.get("WaitStartedDetails") or {}).get("ScheduledEndTimestamp"))
        else:
            s["state"] = "waiting"
    elif what == "Succeeded":
        s.update(state="done", finished_at=at)
        details = e.get(f"{kind}SucceededDetails")
        payload = _payload(details, "Result")
        s["result_size"] = None if payload is None else len(payload.encode())
    elif what == "TimedOut":
        s.update(state="done", finished_at=at)
    elif what == "Failed":
        retry = (e.get("StepFailedDetails") or {}).get("RetryDetails") or {}
        if kind != "Step" or not retry.get("NextAttemptDelaySeconds"):
            s.update(
                state="failed",
                finished_at=at,
                error=_payload(e.get(f"{kind}FailedDetails"), "Error"),
            )


def shown_name(name: str) -> str:
    """A step name as the workflow wrote it (undoing ``operation_name``'s escapes)."""
    if "%" not in name:
        return name
    return unquote(name.rsplit("~", 1)[0] if "~" in name else name)


# ------------------------------------------------------------------- which runs are where

_runs: weakref.WeakKeyDictionary[Any, dict[str, LambdaRuns]] = weakref.WeakKeyDictionary()


def native_runs(app: Any, workflow: str | None = None) -> LambdaRuns | None:
    """The Lambda runs of workflow ``workflow`` (None: of the app's native sqs
    connection, if it has one), or None when they run on haze's own engine."""
    connections: Mapping[str, Mapping[str, Any]] = app.queue_config.connections
    if workflow is not None:
        wf = find_workflow(workflow)
        own = (
            None
            if wf is None
            else app.queue_config.routes.connection_for(wf.job.name, wf.job.connection)
        )
        name = own or app.queue_config.default
        options = connections.get(name)
        if not _is_native(options):
            return None
    else:
        found = [n for n, o in connections.items() if _is_native(o)]
        if not found:
            return None
        name = found[0]
    kept = _runs.setdefault(app, {})
    if name not in kept:
        kept[name] = LambdaRuns(name, connections[name])
    return kept[name]


def _is_native(options: Mapping[str, Any] | None) -> bool:
    if not options:
        return False
    return options.get("driver") == "sqs" and options.get("workflows") == "native"


class EitherRuns:
    """``WorkflowRuns`` of an app whose workflows run on both engines: a run is looked
    up in the store first, then on the platform's (Lambda, Cloudflare)."""

    def __init__(self, store: WorkflowRuns, native: WorkflowRuns) -> None:
        self.store = store
        self.native = native

    async def status(self, run_id: str) -> WorkflowStatus | None:
        found = await self.store.status(run_id)
        return found if found is not None else await self.native.status(run_id)

    async def list(
        self, state: str | None = None, name: str | None = None, limit: int = 50
    ) -> builtins.list[WorkflowStatus]:
        both = [
            *await self.store.list(state, name, limit),
            *await self.native.list(state, name, limit),
        ]
        both.sort(key=lambda st: st.created_at or 0.0, reverse=True)
        return both[:limit]

    async def cancel(self, run_id: str) -> bool:
        if await self.store.status(run_id) is not None:
            return await self.store.cancel(run_id)
        return await self.native.cancel(run_id)


def lambda_refusals(app: Any) -> builtins.list[str]:
    """One line per workflow of a native sqs connection that uses a haze rule Lambda
    durable functions cannot honour (``haze build`` refuses the app with them)."""
    out: builtins.list[str] = []
    for name, wf in sorted(registered_workflows().items()):
        if native_runs(app, name) is None:
            continue
        if wf.job.tries > 1:
            out.append(
                f'workflow "{name}" ({wf.job.origin}): tries={wf.job.tries} replays the whole '
                "run after an error outside its steps, which Lambda durable functions do not "
                "do (a failed execution stays failed); retry the steps instead "
                '(run.step(..., tries=3)) or run it on haze\'s engine ("workflows": "store")'
            )
    return out
