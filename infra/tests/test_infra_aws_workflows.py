"""The Lambda durable function of an app with native workflows, under Pulumi's mocks:
the function and its durable configuration, and who may start and read its runs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from infra_apps import require_pulumi

require_pulumi()

from haze_infra.aws import LOG_ACTIONS, SEND_SQS_ACTIONS, HazeAwsApp  # noqa: E402
from haze_infra.aws_workflows import (  # noqa: E402
    DURABLE_ACTIONS,
    FUNCTION_ENV,
    MAX_EXECUTION_TIMEOUT,
    RUN_CLIENT_ACTIONS,
    HazeWorkflowFunction,
)
from haze_infra.config import InfraConfigError, StackConfig  # noqa: E402
from infra_mocks import RecordingMocks, deploy, policy_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated:DeprecationWarning")

FUNCTION = "aws:lambda/function:Function"
QUEUE = "aws:sqs/queue:Queue"
WF_ARN = "arn:aws:lambda:*:*:function:inf-sqs-workflows"


def native(stack: StackConfig, *names: str) -> StackConfig:
    conns = dict(stack.connections)
    for name in names:
        plan = conns[name]
        assert plan.aws is not None
        conns[name] = replace(plan, aws=replace(plan.aws, workflows="native"))
    return replace(stack, connections=conns)


@pytest.fixture(scope="module")
def deployed(inf_stack: StackConfig) -> RecordingMocks:
    return deploy(lambda: HazeAwsApp("inf", stack=native(inf_stack, "sqs"), connections=["sqs"]))


def actions_on(policy: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow"
        for a in st["Action"]:
            out.setdefault(a, set()).update(st["Resource"])
    return out


def test_the_workflow_function_is_durable(deployed: RecordingMocks) -> None:
    assert deployed.types()["haze:aws:HazeWorkflowFunction"] == 1
    fn = deployed.one(FUNCTION, "inf-sqs-workflows")
    assert fn.parent == "haze:aws:HazeWorkflowFunction"
    assert fn.inputs["handler"] == "handler.workflows"
    assert fn.inputs["name"] == "inf-sqs-workflows"
    assert fn.inputs["durableConfig"] == {
        "executionTimeout": MAX_EXECUTION_TIMEOUT,
        "retentionPeriod": 14,
    }
    assert fn.inputs["runtime"] == "python3.13"  # durable functions start at 3.13
    assert fn.inputs["timeout"] == 900
    env = fn.inputs["environment"]["variables"]
    assert env["INF_SQS_URL"].endswith("/inf-sqs-{queue}")  # run.dispatch reaches the queues


def test_the_workflow_function_acts_on_its_own_executions_only(deployed: RecordingMocks) -> None:
    allowed = actions_on(policy_of(deployed, "inf-sqs-workflows-policy"))
    queues = {q.outputs["arn"] for q in deployed.of(QUEUE) if "redrivePolicy" in q.inputs}
    assert set(allowed) == {*DURABLE_ACTIONS, *SEND_SQS_ACTIONS, *LOG_ACTIONS}
    for action in DURABLE_ACTIONS:
        assert allowed[action] == {WF_ARN, f"{WF_ARN}:*"}
    assert allowed["sqs:SendMessage"] == queues


def test_the_dispatchers_may_start_read_and_cancel_runs(deployed: RecordingMocks) -> None:
    consumer = deployed.one(FUNCTION, "inf-sqs-consumer")
    assert consumer.inputs["environment"]["variables"][FUNCTION_ENV] == "inf-sqs-workflows"
    allowed = actions_on(policy_of(deployed, "inf-sqs-consumer-policy"))
    for action in RUN_CLIENT_ACTIONS:
        assert allowed[action] == {WF_ARN, f"{WF_ARN}:*"}, action
    assert not any(a.startswith("lambda:") for a in set(allowed) - set(RUN_CLIENT_ACTIONS))


def test_a_store_engine_app_gets_no_workflow_function(inf_stack: StackConfig) -> None:
    mocks = deploy(lambda: HazeAwsApp("inf", stack=inf_stack, connections=["sqs"]))
    assert "haze:aws:HazeWorkflowFunction" not in mocks.types()
    consumer = mocks.one(FUNCTION, "inf-sqs-consumer")
    assert FUNCTION_ENV not in consumer.inputs["environment"]["variables"]
    allowed = actions_on(policy_of(mocks, "inf-sqs-consumer-policy"))
    assert not any(a.startswith("lambda:") for a in allowed)


def test_native_workflows_on_two_connections_are_one_line(inf_stack: StackConfig) -> None:
    plan = inf_stack.connections["sqs"]
    both = {"sqs": plan, "sqs2": replace(plan, name="sqs2")}
    two = native(replace(inf_stack, connections=both), "sqs", "sqs2")
    with pytest.raises(InfraConfigError) as e:
        deploy(lambda: HazeAwsApp("inf", stack=two, connections=["sqs", "sqs2"]))
    assert "one durable function" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({"execution_timeout": MAX_EXECUTION_TIMEOUT + 1}, "366 days"),
        ({"retention_days": 0}, "1-90"),
    ],
)
def test_a_durable_setting_out_of_range_is_refused(setting: dict[str, int], says: str) -> None:
    with pytest.raises(InfraConfigError, match=says):
        deploy(
            lambda: HazeWorkflowFunction(
                "wf",
                connection="sqs",
                archive=_archive(),
                **setting,  # type: ignore[arg-type]
            )
        )


def _archive() -> Any:
    import pulumi

    return pulumi.AssetArchive({"handler.py": pulumi.StringAsset("")})
