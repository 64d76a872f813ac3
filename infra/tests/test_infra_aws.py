"""The AWS components under Pulumi's mocks: the graph, least privilege, and the
redrive / visibility / timeout relations, against the jobs of the test app."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from infra_apps import EXPECTED_JOB_TIMEOUT, EXPECTED_TRIES, require_pulumi

require_pulumi()

import pulumi  # noqa: E402
from haze_infra.aws import (  # noqa: E402
    CONSUMER_SQS_ACTIONS,
    LOG_ACTIONS,
    SEND_SQS_ACTIONS,
    ContainerSettings,
    HazeAwsApp,
    HazeLambdaConsumer,
    HazeSqsQueue,
)
from haze_infra.config import InfraConfigError, StackConfig  # noqa: E402
from infra_mocks import ACCOUNT, REGION, RecordingMocks, deploy, policy_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated:DeprecationWarning")

QUEUE = "aws:sqs/queue:Queue"
FUNCTION = "aws:lambda/function:Function"
MAPPING = "aws:lambda/eventSourceMapping:EventSourceMapping"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
CONTAINER = ContainerSettings(
    image=f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/inf:1",
    subnet_ids=["subnet-1"],
    security_group_ids=["sg-1"],
)


def full_app(stack: StackConfig, **kwargs: Any) -> RecordingMocks:
    return deploy(
        lambda: HazeAwsApp(
            "inf", stack=stack, drain_schedule="rate(1 minute)", container=CONTAINER, **kwargs
        )
    )


@pytest.fixture(scope="module")
def deployed(inf_stack: StackConfig) -> RecordingMocks:
    return full_app(inf_stack)


# --------------------------------------------------------------------------- checks
# The invariants, computed from the test app's jobs (infra_apps.EXPECTED_*), not from
# haze_infra.config: a stale or wrong stack makes them fail (see the mutation tests).


def aws_violations(mocks: RecordingMocks) -> list[str]:
    """Everything wrong with the deployed sqs connection, as messages."""
    problems: list[str] = []
    tries, job_timeout = EXPECTED_TRIES["sqs"], EXPECTED_JOB_TIMEOUT["sqs"]
    fn = mocks.one(FUNCTION, "inf-sqs-consumer")
    timeout = fn.inputs["timeout"]
    if not job_timeout + 5 <= timeout <= 900:
        problems.append(f"Lambda timeout {timeout} vs job timeout {job_timeout}")
    sources = [q for q in mocks.of(QUEUE) if "redrivePolicy" in q.inputs]
    dlq_arns = {q.outputs["arn"] for q in mocks.of(QUEUE) if "redrivePolicy" not in q.inputs}
    window = max(m.inputs.get("maximumBatchingWindowInSeconds", 0) for m in mocks.of(MAPPING))
    for q in sources:
        redrive = json.loads(q.inputs["redrivePolicy"])
        if redrive["maxReceiveCount"] < tries + 2:
            problems.append(
                f"{q.name}: maxReceiveCount {redrive['maxReceiveCount']:g} < tries {tries} + 2"
            )
        if redrive["deadLetterTargetArn"] not in dlq_arns:
            problems.append(f"{q.name}: redrive target is not a DLQ of the stack")
        if q.inputs["visibilityTimeoutSeconds"] < 6 * timeout + window:
            problems.append(
                f"{q.name}: visibility {q.inputs['visibilityTimeoutSeconds']:g} < "
                f"6 x {timeout:g} + {window:g}"
            )
    source_arns = {q.outputs["arn"] for q in sources}
    for m in mocks.of(MAPPING):
        if m.inputs.get("functionResponseTypes") != ["ReportBatchItemFailures"]:
            problems.append(f"{m.name}: no ReportBatchItemFailures")
        if m.inputs["eventSourceArn"] not in source_arns:
            problems.append(f"{m.name}: consumes {m.inputs['eventSourceArn']}")
    problems += policy_violations(policy_of(mocks, "inf-sqs-consumer-policy"), source_arns)
    return problems


def policy_violations(policy: dict[str, Any], queue_arns: set[str]) -> list[str]:
    """Least privilege: the consumer actions and SendMessage on the queues, logs on the
    function's log group, nothing else."""
    allowed_sqs = set(CONSUMER_SQS_ACTIONS) | set(SEND_SQS_ACTIONS)
    problems = []
    granted: dict[str, set[str]] = {}
    for st in policy["Statement"]:
        if st.get("Effect") != "Allow":
            continue
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        for action in actions:
            if "*" in action:
                problems.append(f"wildcard action {action}")
            for res in resources:
                granted.setdefault(action, set()).add(res)
                if res == "*" or (action.startswith("sqs:") and res not in queue_arns):
                    problems.append(f"{action} on {res}")
                if action.startswith("logs:") and not res.startswith(
                    f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/lambda/haze-"
                ):
                    problems.append(f"{action} on {res}")
            if action not in allowed_sqs and action not in LOG_ACTIONS:
                problems.append(f"unexpected action {action}")
    for action in CONSUMER_SQS_ACTIONS:
        if granted.get(action) != queue_arns:
            problems.append(f"{action} is not granted on exactly the consumed queues")
    return problems


# --------------------------------------------------------------------------- the graph


def test_the_graph_is_what_the_docs_promise(deployed: RecordingMocks) -> None:
    types = deployed.types()
    assert types["haze:aws:HazeAwsApp"] == 1
    # sqs: one HazeSqsQueue (queue + DLQ) per haze queue (high, default), one consumer
    assert types["haze:aws:HazeSqsQueue"] == 2
    assert types[QUEUE] == 4
    assert types["haze:aws:HazeLambdaConsumer"] == 1
    assert types[MAPPING] == 2
    # database: a scheduled drain and a container worker
    assert types["haze:aws:HazeDrainSchedule"] == 1
    assert types["aws:cloudwatch/eventRule:EventRule"] == 1
    assert types["aws:cloudwatch/eventTarget:EventTarget"] == 1
    assert types["aws:lambda/permission:Permission"] == 1
    assert types["haze:aws:HazeContainerWorker"] == 1
    assert types["aws:ecs/service:Service"] == 1
    assert types[FUNCTION] == 2  # the consumer and the drain
    # the memory connection and the cloudflare one have nothing on AWS
    assert not any("memory" in r.name or "edge" in r.name for r in deployed.resources)
    # parents, from the URNs
    assert deployed.one(FUNCTION, "inf-sqs-consumer").parent == "haze:aws:HazeLambdaConsumer"
    assert deployed.one(FUNCTION, "inf-database-drain").parent == "haze:aws:HazeDrainSchedule"
    for q in deployed.of(QUEUE):
        assert q.parent == "haze:aws:HazeSqsQueue"
    for m in deployed.of(MAPPING):
        assert m.parent == "haze:aws:HazeLambdaConsumer"
    assert deployed.one("aws:ecs/service:Service").parent == "haze:aws:HazeContainerWorker"
    for component in (
        "HazeSqsQueue",
        "HazeLambdaConsumer",
        "HazeDrainSchedule",
        "HazeContainerWorker",
    ):
        for r in deployed.of(f"haze:aws:{component}"):
            assert r.parent == "haze:aws:HazeAwsApp"


def test_the_deployed_sqs_connection_has_no_violations(deployed: RecordingMocks) -> None:
    assert aws_violations(deployed) == []


def test_queue_names_and_the_queue_url_the_lambda_gets(deployed: RecordingMocks) -> None:
    names = {q.inputs["name"] for q in deployed.of(QUEUE)}
    assert names == {"inf-sqs-high", "inf-sqs-default", "inf-sqs-high-dlq", "inf-sqs-default-dlq"}
    env = deployed.one(FUNCTION, "inf-sqs-consumer").inputs["environment"]["variables"]
    assert env["HAZE_SQS_CONNECTION"] == "sqs"
    # config/queue.py reads queue_url from INF_SQS_URL: the stack sets it to a template
    template = env["INF_SQS_URL"]
    assert template == f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/inf-sqs-{{queue}}"
    # ... which the real driver (what haze_lambda.sqs_handler uses) maps back to each
    # haze queue from the ARN an SQS trigger delivers
    pytest.importorskip("boto3")
    from haze.drivers.sqs import SqsDriver

    driver = SqsDriver("sqs", {"queue_url": template})
    for q in deployed.of(QUEUE):
        if "redrivePolicy" in q.inputs:
            url = driver.url_for_arn(q.outputs["arn"])
            assert url == q.outputs["url"]
            assert driver.queue_for_name(q.inputs["name"]) in ("high", "default")


def test_redrive_visibility_and_timeouts_follow_the_jobs(deployed: RecordingMocks) -> None:
    fn = deployed.one(FUNCTION, "inf-sqs-consumer")
    assert fn.inputs["handler"] == "handler.sqs"
    assert fn.inputs["timeout"] == 50  # 40s job + 10s (handler margin and boot)
    for q in deployed.of(QUEUE):
        if "redrivePolicy" in q.inputs:
            assert json.loads(q.inputs["redrivePolicy"])["maxReceiveCount"] == 4 + 2
            assert q.inputs["visibilityTimeoutSeconds"] == 6 * 50
    for m in deployed.of(MAPPING):
        assert m.inputs["batchSize"] == 2  # the connection's concurrency
        assert m.inputs["maximumBatchingWindowInSeconds"] == 0
        assert m.inputs["functionName"] == fn.outputs["arn"]


def test_the_consumer_role_is_least_privilege(deployed: RecordingMocks) -> None:
    policy = policy_of(deployed, "inf-sqs-consumer-policy")
    sources = {q.outputs["arn"] for q in deployed.of(QUEUE) if "redrivePolicy" in q.inputs}
    assert policy_violations(policy, sources) == []
    actions = {a for st in policy["Statement"] for a in st["Action"]}
    assert actions == {*CONSUMER_SQS_ACTIONS, *SEND_SQS_ACTIONS, *LOG_ACTIONS}
    resources = {r for st in policy["Statement"] for r in st["Resource"]}
    assert not any(r.endswith("-dlq") for r in resources)  # SQS moves to the DLQ itself
    role = deployed.one("aws:iam/role:Role", "inf-sqs-consumer-role")
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "lambda.amazonaws.com"
    }
    assert not role.inputs.get("managedPolicyArns")


def test_the_drain_schedule(deployed: RecordingMocks) -> None:
    fn = deployed.one(FUNCTION, "inf-database-drain")
    assert fn.inputs["handler"] == "handler.schedule"
    env = fn.inputs["environment"]["variables"]
    margin = int(env["HAZE_SCHEDULE_MARGIN"].rstrip("s"))
    assert margin >= EXPECTED_JOB_TIMEOUT["database"] + 5
    assert margin + 10 <= fn.inputs["timeout"] <= 900
    target = deployed.one("aws:cloudwatch/eventTarget:EventTarget")
    assert json.loads(target.inputs["input"]) == {"connection": "database", "queues": ["default"]}
    assert target.inputs["arn"] == fn.outputs["arn"]
    rule = deployed.one("aws:cloudwatch/eventRule:EventRule")
    assert rule.inputs["scheduleExpression"] == "rate(1 minute)"
    permission = deployed.one("aws:lambda/permission:Permission")
    assert permission.inputs["principal"] == "events.amazonaws.com"
    assert permission.inputs["sourceArn"] == rule.outputs["arn"]
    # the drain only writes logs (the database is reached over the network)
    actions = {
        a
        for st in policy_of(deployed, "inf-database-drain-policy")["Statement"]
        for a in st["Action"]
    }
    assert actions == set(LOG_ACTIONS)


def test_the_container_worker(deployed: RecordingMocks) -> None:
    task = deployed.one("aws:ecs/taskDefinition:TaskDefinition")
    assert task.inputs["requiresCompatibilities"] == ["FARGATE"]
    (container,) = json.loads(task.inputs["containerDefinitions"])
    assert container["command"] == [
        "haze",
        "queue:work",
        "--connection",
        "database",
        "--queue",
        "default",
    ]
    assert container["image"] == CONTAINER.image
    # a 5-minute job outlives Fargate's 120 s stop timeout: the most Fargate allows
    assert container["stopTimeout"] == 120
    assert container["logConfiguration"]["options"]["awslogs-region"] == REGION
    service = deployed.one("aws:ecs/service:Service")
    assert service.inputs["launchType"] == "FARGATE"
    assert service.inputs["networkConfiguration"]["subnets"] == ["subnet-1"]
    # the task role has no policy at all; the execution role pulls and logs
    policies = {p.name for p in deployed.of(ROLE_POLICY)}
    assert "inf-database-worker-task-policy" not in policies
    execution = policy_of(deployed, "inf-database-worker-execution-policy")
    assert {a for st in execution["Statement"] for a in st["Action"]} <= {
        *LOG_ACTIONS,
        "ecr:GetAuthorizationToken",
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
        "ecr:BatchCheckLayerAvailability",
    }


def test_a_short_stop_timeout_is_refused(inf_stack: StackConfig) -> None:
    from haze_infra.aws import HazeContainerWorker

    with pytest.raises(InfraConfigError, match="stop timeout 30s is shorter"):
        deploy(
            lambda: HazeContainerWorker(
                "inf-w",
                connection="database",
                image="haze:1",
                subnet_ids=["s"],
                job_timeout=60,
                stop_timeout=30,
            )
        )


# --------------------------------------------------------------------------- wrong configs


def test_a_visibility_below_six_times_the_timeout_is_refused(inf_stack: StackConfig) -> None:
    with pytest.raises(InfraConfigError, match=r"visibility timeout 100s is below 6 × "):
        deploy(lambda: HazeAwsApp("inf", stack=inf_stack, visibility_timeout={"sqs": 100}))


def test_a_lambda_timeout_below_the_longest_job_is_refused(inf_stack: StackConfig) -> None:
    with pytest.raises(InfraConfigError, match="too short for jobs of up to 40s"):
        deploy(lambda: HazeAwsApp("inf", stack=inf_stack, function_timeout={"sqs": 30}))


def test_a_max_receive_count_below_the_tries_is_refused() -> None:
    with pytest.raises(InfraConfigError, match="below tries"):
        deploy(lambda: HazeSqsQueue("inf-q", queue_name="inf-q", max_tries=5, max_receive_count=5))
    with pytest.raises(InfraConfigError, match="below 10 x tries \\+ 2 = 52"):
        deploy(
            lambda: HazeSqsQueue(
                "inf-f", queue_name="inf-f.fifo", fifo=True, max_tries=5, max_receive_count=8
            )
        )


def test_a_queue_made_for_fewer_tries_than_the_consumer_is_refused(tmp_path: Path) -> None:
    def program() -> None:
        q = HazeSqsQueue("inf-q", queue_name="inf-q", max_tries=1, visibility_timeout_seconds=600)
        HazeLambdaConsumer(
            "inf-c",
            queues=[q],
            connection="sqs",
            archive=str(zip_),
            timeout=60,
            job_timeout=30,
            max_tries=4,
        )

    zip_ = tmp_path / "bundle.zip"
    zip_.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    with pytest.raises(InfraConfigError, match="maxReceiveCount 3 is below 6"):
        deploy(program)


def test_big_batches_need_a_batching_window(inf_stack: StackConfig) -> None:
    with pytest.raises(InfraConfigError, match="batching window of at least 1 s"):
        deploy(lambda: HazeAwsApp("inf", stack=inf_stack, batch_size={"sqs": 20}))


def test_jobs_longer_than_lambda_are_refused(inf_stack: StackConfig) -> None:
    plan = inf_stack.connections["sqs"]
    slow = replace(inf_stack, connections={"sqs": replace(plan, max_job_timeout=1200.0)})
    with pytest.raises(InfraConfigError, match="needs a container worker"):
        deploy(lambda: HazeAwsApp("inf", stack=slow))


def test_a_database_connection_needs_a_trigger(inf_stack: StackConfig) -> None:
    with pytest.raises(InfraConfigError, match="has no trigger on AWS"):
        deploy(lambda: HazeAwsApp("inf", stack=inf_stack, connections=["database"]))


def test_jobs_longer_than_lambda_go_to_a_container_worker(inf_stack: StackConfig) -> None:
    plan = inf_stack.connections["sqs"]
    slow = replace(inf_stack, connections={"sqs": replace(plan, max_job_timeout=1200.0)})
    mocks = deploy(lambda: HazeAwsApp("inf", stack=slow, container=CONTAINER))
    assert not mocks.of(FUNCTION)
    (container,) = json.loads(
        mocks.one("aws:ecs/taskDefinition:TaskDefinition").inputs["containerDefinitions"]
    )
    assert container["command"][:4] == ["haze", "queue:work", "--connection", "sqs"]
    names = {e["name"] for e in container["environment"]}
    assert "INF_SQS_URL" in names
    for q in mocks.of(QUEUE):
        if "redrivePolicy" in q.inputs:
            assert q.inputs["visibilityTimeoutSeconds"] == 90  # the connection's retry_after
    task_policy = policy_of(mocks, "inf-sqs-worker-task-policy")
    sources = {q.outputs["arn"] for q in mocks.of(QUEUE) if "redrivePolicy" in q.inputs}
    assert {r for st in task_policy["Statement"] for r in st["Resource"]} == sources


def test_a_missing_bundle_says_to_build_first(inf_stack: StackConfig, tmp_path: Path) -> None:
    with pytest.raises(InfraConfigError, match="haze build --preset aws-lambda"):
        deploy(lambda: HazeAwsApp("inf", stack=inf_stack, dist_dir=tmp_path))


def tamper(mutate: Any) -> pulumi.ResourceTransformation:
    """A Pulumi transformation applied after the component's own checks."""

    def transformation(
        args: pulumi.ResourceTransformationArgs,
    ) -> pulumi.ResourceTransformationResult | None:
        props = mutate(args.type_, dict(args.props))
        if props is None:
            return None
        return pulumi.ResourceTransformationResult(props, args.opts)

    return transformation


def test_the_checks_catch_a_stale_stack(inf_stack: StackConfig) -> None:
    """A StackConfig derived before a job got more tries (here: 1 instead of 4) deploys
    without complaint from the components, but the checks against the app fail."""
    plan = inf_stack.connections["sqs"]
    stale = replace(
        inf_stack, connections={**inf_stack.connections, "sqs": replace(plan, max_tries=1)}
    )
    mocks = deploy(lambda: HazeAwsApp("inf", stack=stale, connections=["sqs"]))
    problems = aws_violations(mocks)
    assert any("maxReceiveCount 3 < tries 4 + 2" in p for p in problems), problems


def test_the_checks_catch_tampered_resources(inf_stack: StackConfig) -> None:
    """The same checks fail on a deployment altered behind the components' back: a low
    visibility timeout and a broad SQS grant."""

    def mutate(type_: str, props: dict[str, Any]) -> dict[str, Any] | None:
        if type_ == QUEUE and props.get("redrive_policy") is not None:
            return {**props, "visibility_timeout_seconds": 60}
        if type_ == ROLE_POLICY:
            policy = pulumi.Output.from_input(props["policy"]).apply(
                lambda p: json.dumps(
                    {
                        **json.loads(p),
                        "Statement": [
                            *json.loads(p)["Statement"],
                            {"Effect": "Allow", "Action": ["sqs:*"], "Resource": ["*"]},
                        ],
                    }
                )
            )
            return {**props, "policy": policy}
        return None

    mocks = deploy(
        lambda: HazeAwsApp(
            "inf",
            stack=inf_stack,
            connections=["sqs"],
            opts=pulumi.ResourceOptions(transformations=[tamper(mutate)]),
        )
    )
    problems = aws_violations(mocks)
    assert any("visibility 60 < 6 x 50" in p for p in problems), problems
    assert any("wildcard action sqs:*" in p for p in problems), problems
    assert any("on *" in p for p in problems), problems
