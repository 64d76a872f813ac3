"""What a deploy stack needs to know about a haze app, derived from ``config/queue.py``
and the job definitions, so the infrastructure and the app cannot drift apart.

This module imports no Pulumi: ``haze infra:config`` prints :func:`stack_config` as
JSON or text, and the Pulumi components (``haze_infra.aws``, ``haze_infra.cloudflare``)
take the same :class:`StackConfig`::

    from haze_infra import stack_config
    stack = stack_config("path/to/app")          # App(root=...) + its jobs
    stack.connections["sqs"].aws.max_receive_count

**Which jobs count on a connection.** A job pinned with ``connection="x"`` counts on
``x`` only; a job with no ``connection`` counts on *every* connection (the default
connection is usually chosen by an environment variable such as
``QUEUE_CONNECTION``, and ``.on_connection()`` can send it anywhere). A job pinned to
one connection but dispatched to another with ``.on_connection()`` is not seen: pin it
where it runs. A job the ``routes`` of ``config/queue.py`` send to a connection (and
whose definition names none) counts as pinned there, and the queue a route gives it
is one of that connection's queues. With an app root, the jobs are those defined in
files under the root; without one (``App(queue=...)``), every job of the process-wide
registry.

**The rules** (each is one function below, shared by the components and the tests):

- SQS redrive ``maxReceiveCount`` = the most ``tries`` of a job on the connection + 2
  (:data:`SQS_RECEIVE_SLACK`): one receive of slack for a crash on the last try (haze
  then records the failure itself instead of SQS dead-lettering it unseen) and one for
  a FIFO hold (a delayed FIFO message's first receive does not run it). Releases and
  long-delay forwarding re-send a *new* message, whose receive count starts at zero,
  so they use none of it. On FIFO, 10 × the most ``tries`` + 2
  (:data:`FIFO_BATCH`): a record reported unprocessed behind each retry of the up to
  9 records ahead of it in its Lambda batch is received again without using a try. A
  job with ``retry_until`` has no try limit: 1000, SQS's maximum.
- Lambda timeout >= the longest job ``timeout`` × the waves of one batch
  (``ceil(batch_size / concurrency)``) + the handler's 5 s margin (``HAZE_SQS_MARGIN``);
  the default adds :data:`LAMBDA_SLACK` seconds for a cold start.
- SQS visibility timeout >= 6 × the Lambda timeout + the batching window (AWS's
  guidance for SQS event sources).
- Cloudflare consumer ``max_retries`` = tries - 1: Cloudflare counts *retries* (the
  first delivery is not one), haze counts *tries*. Past ``max_retries`` Cloudflare
  moves the message to the dead-letter queue itself; with exactly ``tries - 1`` haze's
  own final failure (``failed()`` callbacks, the failed store) happens first.
- Container workers: ECS stop timeout >= the longest job timeout + 5 s, so a deploy
  lets running jobs finish (``haze queue:work`` drains on SIGTERM); Fargate allows 120 s.
- Scheduled drains (``haze_lambda.schedule_handler``): ``HAZE_SCHEDULE_MARGIN`` >= the
  longest job timeout + 5 s, so a job claimed at the end of the budget still finishes
  before Lambda's deadline.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import haze
from haze.build.cloudflare_plan import (
    CF_DEFAULT_BATCH_SIZE,
    CF_DEFAULT_BATCH_TIMEOUT,
    CF_MAX_BATCH_SIZE,
    CF_MAX_BATCH_TIMEOUT,
    CF_MAX_RETRIES,
    CloudflarePlan,
    D1Plan,
    KvPlan,
    app_jobs,
    cloudflare_consumer,
    cloudflare_max_retries,
    cloudflare_storage,
)
from haze.driver_api import App, ConfigError, platform_triggers

from haze_infra.rules import (
    DRAIN_WINDOW,
    FARGATE_MAX_STOP_TIMEOUT,
    FIFO_BATCH,
    LAMBDA_MAX_TIMEOUT,
    LAMBDA_SLACK,
    SQS_HANDLER_MARGIN,
    SQS_MAX_RECEIVE_COUNT,
    SQS_MAX_VISIBILITY,
    SQS_RECEIVE_SLACK,
    VISIBILITY_FACTOR,
    InfraConfigError,
    container_stop_timeout,
    drain_margin,
    lambda_timeout,
    max_receive_count,
    min_lambda_timeout,
    min_visibility_timeout,
)

__all__ = [
    "CF_DEFAULT_BATCH_SIZE",
    "CF_DEFAULT_BATCH_TIMEOUT",
    "CF_MAX_BATCH_SIZE",
    "CF_MAX_BATCH_TIMEOUT",
    "CF_MAX_RETRIES",
    "FARGATE_MAX_STOP_TIMEOUT",
    "FIFO_BATCH",
    "LAMBDA_MAX_TIMEOUT",
    "LAMBDA_SLACK",
    "SQS_HANDLER_MARGIN",
    "SQS_MAX_RECEIVE_COUNT",
    "SQS_MAX_VISIBILITY",
    "SQS_RECEIVE_SLACK",
    "VISIBILITY_FACTOR",
    "CloudflarePlan",
    "ConnectionPlan",
    "D1Plan",
    "EnvRead",
    "InfraConfigError",
    "KvPlan",
    "SqsPlan",
    "StackConfig",
    "WorkerPlan",
    "cloudflare_max_retries",
    "container_stop_timeout",
    "drain_margin",
    "format_text",
    "lambda_timeout",
    "load_app",
    "max_receive_count",
    "min_lambda_timeout",
    "min_visibility_timeout",
    "stack_config",
]

# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class EnvRead:
    """An environment variable the app's config read (its value is never recorded)."""

    name: str
    default: str | None
    set: bool


@dataclass(frozen=True)
class SqsPlan:
    """An ``sqs`` connection as AWS resources: queues, redrive, Lambda consumer."""

    queue_url: str | None
    """The configured ``queue_url``, or None when it comes from an unset variable."""
    queue_url_env: str | None
    """The environment variable ``queue_url`` is read from (the stack sets it)."""
    fifo: bool
    queue_names: dict[str, str | None]
    """haze queue -> SQS queue name (None: the stack chooses one)."""
    max_receive_count: int
    function_timeout: int
    min_function_timeout: int
    visibility_timeout: int
    batch_size: int
    batching_window: int
    concurrency: int
    retry_after: float
    workflows: str = "store"
    """``"native"``: the connection's workflows run on Lambda durable functions."""


@dataclass(frozen=True)
class WorkerPlan:
    """A long-running worker (container) or a scheduled drain for a connection."""

    queues: tuple[str, ...]
    concurrency: int
    stop_timeout: int
    drain_margin: int
    drain_function_timeout: int


@dataclass(frozen=True)
class ConnectionPlan:
    """One connection of ``config/queue.py`` and the jobs that can land on it."""

    name: str
    driver: str
    default: bool
    queues: tuple[str, ...]
    jobs: tuple[str, ...]
    max_tries: int | None
    """The most tries of a job here; None when a job has ``retry_until`` (unbounded)."""
    max_job_timeout: float | None
    jobs_without_timeout: tuple[str, ...]
    aws: SqsPlan | None = None
    cloudflare: CloudflarePlan | None = None
    worker: WorkerPlan | None = None


@dataclass(frozen=True)
class StackConfig:
    """Everything a stack derives from the app; :meth:`to_dict` is what the CLI prints."""

    app_root: str | None
    source: str
    default_connection: str
    connections: dict[str, ConnectionPlan]
    d1: tuple[D1Plan, ...] = ()
    kv: tuple[KvPlan, ...] = ()
    env: tuple[EnvRead, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    schedules: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """EventBridge ``cron(...)`` expression -> the names of the schedules of
    ``config/schedule.py`` it wakes (see ``haze.scheduling.eventbridge_cron``)."""

    def connection(self, name: str) -> ConnectionPlan:
        try:
            return self.connections[name]
        except KeyError:
            raise InfraConfigError(
                f"no connection {name!r}; connections: {', '.join(self.connections)}",
                source=self.source,
                key="connections",
            ) from None

    def by_driver(self, *drivers: str) -> list[ConnectionPlan]:
        return [c for c in self.connections.values() if c.driver in drivers]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- loading


class _EnvPlaceholder(str):
    """What an unset variable without a default reads as while deriving, so that an
    ``sqs`` ``queue_url`` taken from it still validates and is recognisable."""

    env_name: str

    def __new__(cls, name: str) -> _EnvPlaceholder:
        s = super().__new__(cls, "${" + name + "}")
        s.env_name = name
        return s


_trace_lock = threading.RLock()


@contextmanager
def _traced_env(reads: dict[str, EnvRead], placeholders: bool, root: Path) -> Iterator[None]:
    """Patch ``haze.env`` while the app's config files run, recording the reads made by
    files under ``root`` (not haze's own fallbacks)."""
    original: Callable[..., Any] = haze.env

    def env(name: str, default: object = None) -> object:
        value = original(name, default)
        caller = Path(sys._getframe(1).f_code.co_filename)
        if not caller.is_absolute() or not caller.resolve().is_relative_to(root):
            return value
        is_set = name in os.environ
        reads[name] = EnvRead(name, None if default is None else str(default), is_set)
        if value is None and placeholders and not is_set:
            return _EnvPlaceholder(name)
        return value

    with _trace_lock:
        # Config files call haze.env (``from haze import env`` reads it at their import).
        setattr(haze, "env", env)  # noqa: B010
        try:
            yield
        finally:
            setattr(haze, "env", original)  # noqa: B010


def load_app(root: str | Path) -> tuple[Any, tuple[EnvRead, ...]]:
    """``App(root=root)`` (config read, jobs imported), and the variables its config read.

    An unset variable without a default reads as ``"${NAME}"`` so that an ``sqs``
    ``queue_url`` the stack will provide validates; if that breaks another value, the
    app is loaded again without placeholders and that error is raised.
    """
    reads: dict[str, EnvRead] = {}
    base = Path(root).resolve()
    try:
        with _traced_env(reads, placeholders=True, root=base):
            app = App(root=root)
    except ConfigError:
        reads.clear()
        with _traced_env(reads, placeholders=False, root=base):
            app = App(root=root)
    return app, tuple(sorted(reads.values(), key=lambda r: r.name))


# --------------------------------------------------------------------------- deriving


def stack_config(
    app: Any = None, *, jobs: Iterable[Any] | None = None, env: Sequence[EnvRead] = ()
) -> StackConfig:
    """Derive the :class:`StackConfig` of an app: an ``App``, or an app root path
    (default: the current directory). ``jobs`` narrows the job definitions considered
    (default: the app's, see the module docstring)."""
    if app is None or isinstance(app, (str, Path)):
        app, env = load_app(app if app is not None else ".")
    qc = app.queue_config
    job_list = list(jobs) if jobs is not None else app_jobs(app)
    warnings: list[str] = []
    for job in job_list:
        if job.connection is not None and job.connection not in qc.connections:
            warnings.append(
                f'job "{job.name}" is pinned to connection {job.connection!r}, '
                "which config/queue.py does not define"
            )
    connections: dict[str, ConnectionPlan] = {}
    for name, options in qc.connections.items():
        connections[name] = _plan_connection(app, name, options, job_list, env, warnings)
    d1, kv = cloudflare_storage(app)
    root = str(app.root) if app.root is not None else None
    # A schedule no EventBridge rule can express raises its one-line ScheduleError here.
    rules = platform_triggers("eventbridge", app.root)
    return StackConfig(
        app_root=root,
        source=qc.source,
        default_connection=qc.default,
        connections=connections,
        d1=d1,
        kv=kv,
        env=tuple(env),
        warnings=tuple(warnings),
        schedules={rule: tuple(names) for rule, names in rules.items()},
    )


def _plan_connection(
    app: Any,
    name: str,
    options: dict[str, Any],
    all_jobs: list[Any],
    env: Sequence[EnvRead],
    warnings: list[str],
) -> ConnectionPlan:
    driver = str(options["driver"])
    routes = app.queue_config.routes
    jobs = sorted(
        (j for j in all_jobs if routes.connection_for(j.name, j.connection) in (None, name)),
        key=lambda j: j.name,
    )
    queues: list[str] = list(options.get("queues") or [])
    routed = {q for j in jobs if (q := routes.queue_for(j.name, j.queue))}
    for q in ["default", *sorted(routed)]:
        if q not in queues:
            queues.append(q)
    unbounded = [j.name for j in jobs if j.retry_until is not None]
    max_tries = None if unbounded else max((int(j.tries) for j in jobs), default=1)
    timeouts = [float(j.timeout) for j in jobs if j.timeout is not None]
    max_job_timeout = max(timeouts) if timeouts else None
    without = tuple(j.name for j in jobs if j.timeout is None)
    plan = ConnectionPlan(
        name=name,
        driver=driver,
        default=name == app.queue_config.default,
        queues=tuple(queues),
        jobs=tuple(j.name for j in jobs),
        max_tries=max_tries,
        max_job_timeout=max_job_timeout,
        jobs_without_timeout=without,
    )
    concurrency = int(options.get("concurrency") or 1)
    if driver == "sqs":
        aws = _plan_sqs(name, options, plan, env, warnings)
        return _replace(plan, aws=aws, worker=_plan_worker(plan, concurrency))
    if driver == "cloudflare":
        return _replace(plan, cloudflare=_plan_cloudflare(app, name, options, plan, warnings))
    if driver in ("database", "redis"):
        return _replace(plan, worker=_plan_worker(plan, concurrency))
    return plan


def _replace(plan: ConnectionPlan, **changes: Any) -> ConnectionPlan:
    from dataclasses import replace

    return replace(plan, **changes)


def _queue_name_of(url: str) -> str:
    return urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]


def _plan_sqs(
    name: str,
    options: dict[str, Any],
    plan: ConnectionPlan,
    env: Sequence[EnvRead],
    warnings: list[str],
) -> SqsPlan:
    url, url_env = _queue_url(options.get("queue_url"), env)
    fifo_opt = options.get("fifo")
    fifo = (
        bool(fifo_opt)
        if fifo_opt is not None
        else bool(url and _queue_name_of(url).endswith(".fifo"))
    )
    names = _sqs_queue_names(url, plan.queues, fifo)
    concurrency = int(options.get("concurrency") or 1)
    batch = max(1, min(10, concurrency))
    window = 0
    timeout = lambda_timeout(plan.max_job_timeout, batch, concurrency)
    if timeout > LAMBDA_MAX_TIMEOUT:
        warnings.append(
            f"connection {name!r}: its longest job ({plan.max_job_timeout:g}s) does not fit "
            f"in a Lambda invocation ({LAMBDA_MAX_TIMEOUT}s); consume it with a container "
            "worker (HazeContainerWorker) instead"
        )
    if plan.jobs_without_timeout:
        warnings.append(
            f"connection {name!r}: jobs without a timeout ({', '.join(plan.jobs_without_timeout)})"
            f" are cut off by the Lambda timeout ({timeout}s unless set); give them one"
        )
    return SqsPlan(
        queue_url=url,
        queue_url_env=url_env,
        fifo=fifo,
        queue_names=names,
        max_receive_count=max_receive_count(plan.max_tries, fifo),
        function_timeout=timeout,
        min_function_timeout=min_lambda_timeout(plan.max_job_timeout, batch, concurrency),
        visibility_timeout=min_visibility_timeout(timeout, window),
        batch_size=batch,
        batching_window=window,
        concurrency=concurrency,
        retry_after=float(options.get("retry_after") or 90.0),
        workflows=str(options.get("workflows") or "store"),
    )


def _plan_cloudflare(
    app: Any, name: str, options: dict[str, Any], plan: ConnectionPlan, warnings: list[str]
) -> CloudflarePlan:
    cf = cloudflare_consumer(app, name, options, plan.max_tries, warnings)
    if plan.max_job_timeout is not None and plan.max_job_timeout > LAMBDA_MAX_TIMEOUT:
        warnings.append(
            f"connection {name!r}: a job runs up to {plan.max_job_timeout:g}s; a "
            "Queue consumer invocation has 15 minutes of wall time"
        )
    return cf


def _plan_worker(plan: ConnectionPlan, concurrency: int) -> WorkerPlan:
    margin = drain_margin(plan.max_job_timeout)
    return WorkerPlan(
        queues=plan.queues,
        concurrency=concurrency,
        stop_timeout=container_stop_timeout(plan.max_job_timeout),
        drain_margin=margin,
        drain_function_timeout=min(LAMBDA_MAX_TIMEOUT, margin + DRAIN_WINDOW),
    )


# --------------------------------------------------------------------------- text output


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:g}s"


def _queue_url(url: Any, env: Sequence[EnvRead]) -> tuple[str | None, str | None]:
    """(``queue_url`` as configured, the variable it came from): an unset variable's
    placeholder is no URL, only a variable the stack has to set."""
    if isinstance(url, _EnvPlaceholder):
        return None, url.env_name
    url_env: str | None = None
    for read in env:  # the variable the configured value came from, if any
        came_from = os.environ.get(read.name) if read.set else read.default
        if url is not None and came_from == url:
            url_env = read.name
    return url, url_env


def _sqs_queue_names(url: str | None, queues: Sequence[str], fifo: bool) -> dict[str, str | None]:
    """Each haze queue's SQS queue name as ``queue_url`` gives it (None: the stack names it)."""
    names: dict[str, str | None] = {}
    for q in queues:
        if url is None:
            names[q] = None
        elif "{queue}" in url:
            names[q] = _queue_name_of(url).replace("{queue}", q)
        elif q == "default":
            names[q] = _queue_name_of(url)
        else:
            names[q] = q + ".fifo" if fifo and not q.endswith(".fifo") else q
    return names


def _connection_text(c: ConnectionPlan) -> list[str]:
    lines: list[str] = []
    lines.append(f"connection {c.name} ({c.driver}){' [default]' if c.default else ''}")
    lines.append(f"  queues: {', '.join(c.queues)}")
    lines.append(f"  jobs: {', '.join(c.jobs) or 'none'}")
    tries = "unbounded (retry_until)" if c.max_tries is None else str(c.max_tries)
    lines.append(f"  max tries: {tries}; longest job timeout: {_seconds(c.max_job_timeout)}")
    if c.aws is not None:
        a = c.aws
        url = a.queue_url or "(set by the stack)"
        lines.append(
            f"  sqs: queue_url {url}" + (f" (env {a.queue_url_env})" if a.queue_url_env else "")
        )
        for q, n in a.queue_names.items():
            lines.append(f"    queue {q}: {n or '(named by the stack)'}")
        lines.append(
            f"    redrive maxReceiveCount {a.max_receive_count}; visibility "
            f"{a.visibility_timeout}s; fifo {'yes' if a.fifo else 'no'}"
        )
        lines.append(
            f"    lambda timeout {a.function_timeout}s (>= {a.min_function_timeout}"
            f"s); batch size {a.batch_size}; batching window {a.batching_window}s"
        )
    if c.cloudflare is not None:
        f = c.cloudflare
        lines.append(
            f"  cloudflare: binding {f.binding}; queue "
            f"{f.queue_name or '(named by the stack)'}; dead letter queue "
            f"{f.dead_letter_queue or '(named by the stack)'}"
        )
        lines.append(
            f"    max_retries {f.max_retries} (>= {f.min_max_retries}); "
            f"max_batch_size {f.max_batch_size}; max_batch_timeout "
            f"{f.max_batch_timeout:g}s"
        )
    if c.worker is not None and c.driver != "sqs":
        w = c.worker
        cap = (
            f" (Fargate allows {FARGATE_MAX_STOP_TIMEOUT}s)"
            if w.stop_timeout > FARGATE_MAX_STOP_TIMEOUT
            else ""
        )
        lines.append(
            f"  worker: stop timeout {w.stop_timeout}s{cap}; scheduled drain margin "
            f"{w.drain_margin}s, function timeout {w.drain_function_timeout}s"
        )
    return lines


def format_text(stack: StackConfig) -> str:
    """The human-readable form ``haze infra:config`` prints by default."""
    lines = [
        f"app: {stack.app_root or '(no root)'}",
        f"config: {stack.source}",
        f"default connection: {stack.default_connection}",
    ]
    for c in stack.connections.values():
        lines.append("")
        lines.extend(_connection_text(c))
    if stack.d1 or stack.kv:
        lines.append("")
        for d in stack.d1:
            lines.append(
                f"d1 binding {d.binding}"
                + (f" (connection {d.connection})" if d.connection else "")
            )
        for k in stack.kv:
            lines.append(f"kv binding {k.binding}" + (f" (store {k.store})" if k.store else ""))
    if stack.env:
        lines.append("")
        lines.append(
            "environment read by the config: "
            + ", ".join(f"{r.name}{'' if r.set else ' (unset)'}" for r in stack.env)
        )
    if stack.warnings:
        lines.append("")
        lines.extend(f"warning: {w}" for w in stack.warnings)
    return "\n".join(lines)
