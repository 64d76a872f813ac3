"""HazeAwsApp: every AWS component a :class:`~haze_infra.config.StackConfig` needs."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

with warnings.catch_warnings():  # some modules warn about their deprecated resources
    warnings.simplefilter("ignore", DeprecationWarning)

from haze_infra.aws.container_worker import ContainerSettings, HazeContainerWorker
from haze_infra.aws.drain_schedule import HazeDrainSchedule
from haze_infra.aws.lambda_consumer import HazeLambdaConsumer
from haze_infra.aws.resources import DEFAULT_RUNTIME, _check, _child, lambda_archive
from haze_infra.aws.schedule_rules import HazeScheduleRules
from haze_infra.aws.sqs_queue import HazeSqsQueue
from haze_infra.config import (
    ConnectionPlan,
    StackConfig,
)
from haze_infra.rules import (
    LAMBDA_MAX_TIMEOUT,
    InfraConfigError,
    drain_margin,
    lambda_timeout,
    min_visibility_timeout,
)

__all__ = ["HazeAwsApp"]


def _sqs_url_value(queue: HazeSqsQueue, template_name: str | None) -> pulumi.Output[str]:
    """The ``queue_url`` for the app: the default queue's URL, or a ``{queue}`` template
    with the same scheme, host and account."""
    if template_name is None:
        return queue.url
    return queue.url.apply(lambda u: u.rstrip("/").rsplit("/", 1)[0] + "/" + template_name)


class HazeAwsApp(pulumi.ComponentResource):
    """Everything a haze app needs on AWS, from its :class:`StackConfig`:

    - each ``sqs`` connection: a :class:`HazeSqsQueue` per haze queue and a
      :class:`HazeLambdaConsumer`;
    - each ``database``/``redis`` connection: a :class:`HazeDrainSchedule` when
      ``drain_schedule`` is given (a schedule expression), and a
      :class:`HazeContainerWorker` when ``container`` is given.

    ``connections`` restricts which connections are deployed; ``function_timeout``,
    ``batch_size``, ``batching_window`` and ``visibility_timeout`` override the derived
    values per connection name (and are checked like everything else). An SQS queue the
    app's ``queue_url`` does not name is called ``<name_prefix>-<connection>-<queue>``
    and the Lambda gets the variable ``queue_url`` is read from.
    """

    queues: dict[str, dict[str, HazeSqsQueue]]
    consumers: dict[str, HazeLambdaConsumer]
    drains: dict[str, HazeDrainSchedule]
    workers: dict[str, HazeContainerWorker]

    def __init__(
        self,
        name: str,
        *,
        stack: StackConfig,
        archive: str | Path | pulumi.Archive | None = None,
        dist_dir: str | Path | None = None,
        connections: Sequence[str] | None = None,
        name_prefix: str | None = None,
        runtime: str = DEFAULT_RUNTIME,
        memory_size: int = 512,
        environment: Mapping[str, pulumi.Input[str]] | None = None,
        function_timeout: Mapping[str, int] | None = None,
        batch_size: Mapping[str, int] | None = None,
        batching_window: Mapping[str, int] | None = None,
        visibility_timeout: Mapping[str, int] | None = None,
        max_concurrency: Mapping[str, int] | None = None,
        drain_schedule: str | None = None,
        container: ContainerSettings | None = None,
        vpc_config: Mapping[str, Any] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:aws:HazeAwsApp", name, None, opts)
        self.queues, self.consumers, self.drains, self.workers = {}, {}, {}, {}
        self._queue_url_env: dict[str, Any] = {}
        selected = _selected(stack, connections, drain_schedule, container)
        code: list[pulumi.Archive] = []

        def bundle() -> pulumi.Archive:  # found once, and only when a function needs it
            if not code:
                code.append(lambda_archive(archive, dist_dir, stack.app_root))
            return code[0]

        shared = _Shared(
            name, name_prefix or name, runtime, memory_size, environment, vpc_config, container
        )
        for plan in selected:
            if plan.driver == "sqs":
                overrides = (
                    function_timeout,
                    batch_size,
                    batching_window,
                    visibility_timeout,
                    max_concurrency,
                )
                tuning = _Tuning(*((m or {}).get(plan.name) for m in overrides))
                self._sqs(plan, shared, bundle(), tuning)
            elif plan.driver in ("database", "redis"):
                self._worker(plan, shared, bundle if drain_schedule else None, drain_schedule)
            else:
                raise InfraConfigError(
                    f"connection {plan.name!r} uses the {plan.driver} driver, which has "
                    "nothing to deploy on AWS",
                    source=stack.source,
                    key="connections",
                )
        self.schedules = self._schedules(stack, shared, bundle) if stack.schedules else None
        queue_urls = {c: {q: v.url for q, v in qs.items()} for c, qs in self.queues.items()}
        functions = {c: v.function.arn for c, v in self.consumers.items()}
        self.register_outputs({"queue_urls": queue_urls, "functions": functions})

    def _schedules(
        self, stack: StackConfig, shared: _Shared, bundle: Callable[[], pulumi.Archive]
    ) -> HazeScheduleRules:
        # The dispatcher sends to every queue the stack made and sees the variables the
        # consumers read their queue URLs from.
        return HazeScheduleRules(
            f"{shared.name}-schedules",
            rules=stack.schedules,
            archive=bundle(),
            send_queue_arns=[q.arn for qs in self.queues.values() for q in qs.values()],
            runtime=shared.runtime,
            memory_size=shared.memory_size,
            environment={**self._queue_url_env, **dict(shared.environment or {})},
            vpc_config=shared.vpc_config,
            opts=_child(self),
        )

    def _sqs(
        self, plan: ConnectionPlan, shared: _Shared, code: pulumi.Archive, tuning: _Tuning
    ) -> None:
        sqs = plan.aws
        assert sqs is not None
        batch = sqs.batch_size if tuning.batch is None else tuning.batch
        window = sqs.batching_window if tuning.window is None else tuning.window
        timeout = tuning.timeout
        if timeout is None:
            timeout = lambda_timeout(plan.max_job_timeout, batch, sqs.concurrency)
        # Jobs longer than Lambda allows go to a container worker, whose receives ask for
        # retry_after and whose heartbeat extends it: the queue default only has to match.
        use_container = timeout > LAMBDA_MAX_TIMEOUT and shared.container is not None
        visibility = tuning.visibility
        if visibility is None:
            visibility = (
                math.ceil(sqs.retry_after)
                if use_container
                else min_visibility_timeout(timeout, window)
            )
        queues = self._sqs_queues(plan, shared, visibility)
        url_env = self._queue_url(plan, shared, queues["default"])
        if use_container:
            self._sqs_container(plan, shared, queues, url_env)
            return
        self.consumers[plan.name] = HazeLambdaConsumer(
            f"{shared.name}-{plan.name}-consumer",
            queues=list(queues.values()),
            connection=plan.name,
            archive=code,
            timeout=timeout,
            job_timeout=plan.max_job_timeout,
            max_tries=plan.max_tries,
            concurrency=sqs.concurrency,
            batch_size=batch,
            maximum_batching_window_in_seconds=window,
            max_concurrency=tuning.max_concurrency,
            runtime=shared.runtime,
            memory_size=shared.memory_size,
            environment=shared.environment,
            queue_url_env=sqs.queue_url_env,
            queue_url_value=url_env.get(sqs.queue_url_env or ""),
            vpc_config=shared.vpc_config,
            opts=_child(self),
        )

    def _sqs_queues(
        self, plan: ConnectionPlan, shared: _Shared, visibility: int
    ) -> dict[str, HazeSqsQueue]:
        """A queue per haze queue: the name ``queue_url`` gives, else
        ``<prefix>-<connection>-<queue>``."""
        sqs = plan.aws
        assert sqs is not None
        suffix = ".fifo" if sqs.fifo else ""
        queues: dict[str, HazeSqsQueue] = {}
        for q, sqs_name in sqs.queue_names.items():
            queue_name = (
                sqs_name or f"{shared.prefix}-{plan.name}-{q.removesuffix('.fifo')}{suffix}"
            )
            queues[q] = HazeSqsQueue(
                f"{shared.name}-{plan.name}-{q.replace('.', '-')}",
                queue_name=queue_name,
                fifo=sqs.fifo,
                max_tries=plan.max_tries,
                visibility_timeout_seconds=visibility,
                opts=_child(self),
            )
        self.queues[plan.name] = queues
        return queues

    def _queue_url(
        self, plan: ConnectionPlan, shared: _Shared, default: HazeSqsQueue
    ) -> dict[str, pulumi.Output[str]]:
        """``{variable: queue_url}`` for the variable the app reads its ``queue_url`` from
        (empty when it names none); the schedules' function sees it too."""
        sqs = plan.aws
        assert sqs is not None
        if not sqs.queue_url_env:
            return {}
        if sqs.queue_url is None:
            suffix = ".fifo" if sqs.fifo else ""
            template: str | None = f"{shared.prefix}-{plan.name}-{{queue}}{suffix}"
        elif "{queue}" in sqs.queue_url:
            template = sqs.queue_url.rstrip("/").rsplit("/", 1)[-1]
        else:
            template = None
        value = _sqs_url_value(default, template)
        self._queue_url_env[sqs.queue_url_env] = value
        return {sqs.queue_url_env: value}

    def _sqs_container(
        self,
        plan: ConnectionPlan,
        shared: _Shared,
        queues: dict[str, HazeSqsQueue],
        url_env: dict[str, pulumi.Output[str]],
    ) -> None:
        container = shared.container
        assert container is not None
        pulumi.log.warn(
            f"haze: connection {plan.name}: jobs outlive Lambda; consumed by a "
            "container worker instead"
        )
        self.workers[plan.name] = self._container(
            plan,
            shared.name,
            container,
            queues=plan.queues,
            environment={**container.environment, **url_env},
            sqs_queue_arns=[v.arn for v in queues.values()],
        )

    def _container(
        self,
        plan: ConnectionPlan,
        name: str,
        container: ContainerSettings,
        *,
        queues: Sequence[str],
        environment: Mapping[str, pulumi.Input[str]],
        sqs_queue_arns: Sequence[pulumi.Input[str]] = (),
    ) -> HazeContainerWorker:
        return HazeContainerWorker(
            f"{name}-{plan.name}-worker",
            connection=plan.name,
            image=container.image,
            subnet_ids=container.subnet_ids,
            security_group_ids=container.security_group_ids,
            assign_public_ip=container.assign_public_ip,
            queues=queues,
            job_timeout=plan.max_job_timeout,
            cluster_arn=container.cluster_arn,
            cpu=container.cpu,
            memory=container.memory,
            desired_count=container.desired_count,
            environment=environment,
            sqs_queue_arns=sqs_queue_arns,
            opts=_child(self),
        )

    def _worker(
        self,
        plan: ConnectionPlan,
        shared: _Shared,
        bundle: Callable[[], pulumi.Archive] | None,
        schedule: str | None,
    ) -> None:
        worker, name = plan.worker, shared.name
        assert worker is not None
        _check(
            bool(schedule) or shared.container is not None,
            f"connection {plan.name!r} ({plan.driver}) has no trigger on AWS: pass "
            "drain_schedule= (a scheduled Lambda drain) or container= (an ECS worker)",
            f"{name}.connections",
        )
        if schedule and bundle is not None:
            _check(
                plan.max_job_timeout is None
                or drain_margin(plan.max_job_timeout) + 10 <= LAMBDA_MAX_TIMEOUT,
                f"connection {plan.name!r}: jobs of up to {plan.max_job_timeout}s cannot be "
                "drained from Lambda; use container=",
                f"{name}.drain_schedule",
            )
            self.drains[plan.name] = HazeDrainSchedule(
                f"{name}-{plan.name}-drain",
                connection=plan.name,
                queues=list(worker.queues),
                archive=bundle(),
                schedule_expression=schedule,
                job_timeout=plan.max_job_timeout,
                runtime=shared.runtime,
                memory_size=shared.memory_size,
                environment=shared.environment,
                vpc_config=shared.vpc_config,
                opts=_child(self),
            )
        if shared.container is not None:
            environment = {**dict(shared.environment or {}), **shared.container.environment}
            self.workers[plan.name] = self._container(
                plan, name, shared.container, queues=list(worker.queues), environment=environment
            )


@dataclass(frozen=True)
class _Shared:
    """What every function and worker of one :class:`HazeAwsApp` is given."""

    name: str
    prefix: str
    runtime: str
    memory_size: int
    environment: Mapping[str, Any] | None
    vpc_config: Mapping[str, Any] | None
    container: ContainerSettings | None


@dataclass(frozen=True)
class _Tuning:
    """One ``sqs`` connection's overrides of the derived values (None: derive)."""

    timeout: int | None
    batch: int | None
    window: int | None
    visibility: int | None
    max_concurrency: int | None


def _selected(
    stack: StackConfig,
    connections: Sequence[str] | None,
    drain_schedule: str | None,
    container: ContainerSettings | None,
) -> list[ConnectionPlan]:
    """The connections to deploy: those named, else every ``sqs`` one (and the
    ``database``/``redis`` ones when they get a drain or a container)."""
    selected = (
        [stack.connection(c) for c in connections]
        if connections is not None
        else [
            c
            for c in stack.connections.values()
            if c.driver == "sqs"
            or (c.driver in ("database", "redis") and (drain_schedule or container))
        ]
    )
    if not selected and not stack.schedules:
        raise InfraConfigError(
            "nothing to deploy on AWS: config/queue.py has no sqs connection (and no "
            "database/redis connection with drain_schedule= or container=)",
            source=stack.source,
            key="connections",
        )
    return selected
