"""``haze_lambda.workflow_handler``: the app's workflows as one Lambda durable function.

The function's event is ``{"workflow": name, "input": {...}, "id": run_id}`` (``id``
is optional: ``Workflow.start`` sets it, and also names the durable execution after
the run). The handler finds the app's ``@workflow`` of that name and runs it through
the AWS durable execution SDK: every ``run.step``/``sleep``/``wait_for_event``/
``gather``/``dispatch`` becomes the SDK's operation of the same name
(``haze_lambda.durable``), so Lambda keeps the results, replays the function after a
wait or a retry, and holds nothing while a run sleeps (up to a year).

The rules of a run are haze's (``WorkflowRun``): the same step names, limits and
errors as on haze's own engine. A step's result is at most 255 KiB here (Lambda's
checkpoint limit), whatever the connection's ``max_message_size``.

Deploy it with a durable configuration (``haze_infra`` does, for an app with a
``"workflows": "native"`` sqs connection); ``dist/aws-lambda/handler.py`` re-exports it
as ``workflows``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from haze_lambda._boot import run

if TYPE_CHECKING:
    from aws_durable_execution_sdk_python.context import DurableContext
    from haze import App

__all__ = ["MAX_RESULT_SIZE", "workflow_handler"]

#: The largest step result or output kept: Lambda's checkpoint limit (256 KiB) less
#: room for the operation around it.
MAX_RESULT_SIZE = 255 * 1024

_handler: list[Callable[[Any, Any], Any]] = []


def workflow_handler(event: Any, context: Any) -> Any:
    """The durable handler (``@durable_execution``) that runs any of the app's workflows.

    >>> # dist/aws-lambda/handler.py: from haze_lambda import workflow_handler as workflows
    >>> # Lambda invokes it with {"workflow": "onboard", "input": {"user_id": 7}}
    """
    if not _handler:  # the SDK is loaded by the first invocation, not at import
        from aws_durable_execution_sdk_python import durable_execution

        _handler.append(durable_execution(_execute))
    return _handler[0](event, context)


def _execute(event: Any, context: DurableContext) -> Any:
    return run(lambda app: run_workflow(app, event, context))


def _events(app: App) -> Any:
    """The app's store, where an event sent before its wait is kept (None without one)."""
    from haze.driver_api import ConfigError, workflow_state

    try:
        return workflow_state(app.manager.state_store())
    except ConfigError:
        return None


async def run_workflow(app: App, event: Any, context: DurableContext) -> Any:
    """Run the workflow ``event`` names on ``context``; its output (JSON)."""
    from haze.driver_api import (
        WorkflowRun,
        WorkflowRunError,
        encode_result,
        find_workflow,
        registered_workflows,
    )

    from haze_lambda.durable import LambdaStepEngine

    if not isinstance(event, Mapping) or not isinstance(event.get("workflow"), str):
        raise WorkflowRunError(
            'haze_lambda.workflow_handler: expected the event {"workflow": name, "input": '
            f"{{...}}}}, got {str(event)[:200]!r}"
        )
    name = event["workflow"]
    wf = find_workflow(name)
    if wf is None:
        known = ", ".join(sorted(registered_workflows())) or "none"
        raise WorkflowRunError(
            f"haze_lambda.workflow_handler: no workflow named {name!r} in this app "
            f"(its workflows: {known})"
        )
    given = event.get("input") or {}
    if not isinstance(given, Mapping):
        raise WorkflowRunError(
            f'workflow "{name}": the input must be a JSON object (the workflow\'s keyword '
            f"arguments), got {type(given).__name__}"
        )
    run_id = str(event.get("id") or context.state.durable_execution_arn)
    engine = LambdaStepEngine(context, asyncio.get_running_loop(), run_id, _events(app))
    workflow_run = WorkflowRun(
        run_id, wf.name, engine, max_steps=wf.max_steps, max_result_size=MAX_RESULT_SIZE
    )
    value = await wf.fn(workflow_run, **given)
    return json.loads(encode_result(value, f'workflow "{wf.name}" (run {run_id})', MAX_RESULT_SIZE))
