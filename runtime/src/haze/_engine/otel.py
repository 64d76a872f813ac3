"""OpenTelemetry traces and metrics for haze jobs (extra ``haze-jobs[otel]``).

Built on ``opentelemetry-api`` only: the app picks and configures the SDK and its
exporters, haze records through whatever providers are set. Traces follow the
messaging semantic conventions:

* ``send <queue>`` (PRODUCER) around each dispatch; its W3C ``traceparent`` travels in
  the message (``meta.traceparent``), so the trace survives the hop between processes;
* ``create <queue>`` (PRODUCER) per message of ``Queue.bulk``;
* ``process <queue>`` (CONSUMER) around each execution, a child of the producer's
  context and linked to it, with events ``haze.job.retry``, ``haze.job.release`` and
  ``haze.job.failure``.

Metrics, per ``haze.job.name`` and ``messaging.destination.name`` (the queue):
``haze.jobs.dispatched``, ``haze.jobs.processed``, ``haze.jobs.failed``,
``haze.jobs.retried``, ``haze.jobs.released`` (counters), ``haze.job.wait_time`` and
``haze.job.runtime`` (histograms, seconds), ``haze.jobs.running`` (up-down counter).

When it is on: ``telemetry=True`` in ``config/queue.py`` always; ``"auto"`` (the
default) when, at the app's first dispatch or job, the app has already imported
OpenTelemetry and set a tracer or meter provider; ``False`` never. Off, haze never
imports OpenTelemetry and each dispatch and job pays one attribute check.

>>> from opentelemetry.sdk.trace import TracerProvider   # doctest: +SKIP
>>> from opentelemetry import trace                       # doctest: +SKIP
>>> trace.set_tracer_provider(TracerProvider())           # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from haze._base.deps import require
from haze._base.describe import error_line, error_text
from haze._base.version import __version__
from haze._engine.hooks import Outcome, Run

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze._engine.view import EngineApp
    from haze._jobs.definition import JobDefinition
    from haze.drivers import Driver, Reserved

__all__ = ["Telemetry", "TelemetryHook", "TelemetrySlot", "prometheus_text", "telemetry_for"]

_time = time.time
_perf = time.perf_counter
#: What a span says of an encrypted job's error text.
_SEALED = "(encrypted)"

#: ``messaging.system``: haze is the messaging layer, whatever backend carries it.
SYSTEM = "haze"
#: The counters, in the order ``prometheus_text`` renders them.
COUNTERS = ("dispatched", "processed", "failed", "retried", "released")
#: Histogram buckets (seconds) for the Prometheus rendering of wait time and runtime.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_OUTCOME_COUNTER = {
    "done": "processed",
    "failed": "failed",
    "retry": "retried",
    "released": "released",
}


def _default_providers() -> bool:
    """Whether the process still has OpenTelemetry's placeholder providers (no SDK)."""
    from opentelemetry import metrics, trace

    tracer = trace.get_tracer_provider()
    meter = metrics.get_meter_provider()
    return isinstance(tracer, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)) and type(
        meter
    ).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider")


def telemetry_for(app: EngineApp) -> Telemetry | None:
    """The app's telemetry recorder, or None when telemetry is off (see the module doc)."""
    setting = app.queue_config.telemetry
    if setting is False:
        return None
    if setting == "auto":
        # Never import OpenTelemetry to find out: an app that configured an SDK has
        # imported it already, and an app that did not pays nothing.
        if "opentelemetry.trace" not in sys.modules or _default_providers():
            return None
    else:
        require("opentelemetry.trace", what="telemetry=True", extra="otel")
    return Telemetry()


class _Series:
    """A histogram kept for the Prometheus text: per-bucket counts, sum and count."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one: above every bound
        self.count = 0
        self.sum = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.sum += value
        self.counts[bisect_left(BUCKETS, value)] += 1

    @property
    def buckets(self) -> list[int]:
        """Cumulative counts per bound (``le``), as Prometheus wants them."""
        return list(itertools.accumulate(self.counts[:-1]))


class Telemetry:
    """Spans and metrics for one app's dispatches and executions.

    Besides the OpenTelemetry instruments it keeps this process's totals
    (``counts``, ``histograms``) for :func:`prometheus_text`.
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from opentelemetry import metrics, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        # The global providers unless given (tests, an app with providers of its own).
        self.tracer = trace.get_tracer("haze", __version__, tracer_provider)
        meter = metrics.get_meter("haze", __version__, meter_provider)
        self._counters = {
            name: meter.create_counter(
                f"haze.jobs.{name}", unit="{job}", description=f"Jobs {name}"
            )
            for name in COUNTERS
        }
        self._wait = meter.create_histogram(
            "haze.job.wait_time", unit="s", description="From dispatch to the start of an attempt"
        )
        self._runtime = meter.create_histogram(
            "haze.job.runtime", unit="s", description="How long an attempt ran"
        )
        self._running = meter.create_up_down_counter(
            "haze.jobs.running", unit="{job}", description="Jobs running now"
        )
        self.counts: dict[tuple[str, str, str], int] = {}
        self.histograms: dict[tuple[str, str, str], _Series] = {}
        self.running: dict[tuple[str, str], int] = {}

    # ------------------------------------------------------------------ local totals

    def _count(self, name: str, job: str, queue: str, attrs: dict[str, Any]) -> None:
        self._counters[name].add(1, attrs)
        key = (name, job, queue)
        self.counts[key] = self.counts.get(key, 0) + 1

    def _observe(self, name: str, job: str, queue: str, value: float) -> None:
        series = self.histograms.get((name, job, queue))
        if series is None:
            series = self.histograms[(name, job, queue)] = _Series()
        series.add(value)

    # ------------------------------------------------------------------ producer

    def _attributes(self, message: Message, connection: str) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": message.queue,
            "messaging.message.id": message.id,
            "haze.job.name": message.job,
            "haze.connection": connection,
        }
        if message.chain_id is not None:
            attrs["haze.chain.id"] = message.chain_id
        if message.batch_id is not None:
            attrs["haze.batch.id"] = message.batch_id
        return attrs

    def _stamp(self, message: Message) -> None:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        if carrier:
            # A new dict: the caller's meta may be shared with other messages.
            message.meta = {**(message.meta or {}), **carrier}

    async def send(
        self,
        message: Message,
        delay: float,
        enqueue: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Run ``enqueue`` inside a ``send <queue>`` span whose context ``message`` carries."""
        connection = message.connection or ""
        attrs = self._attributes(message, connection)
        attrs["messaging.operation.type"] = "send"
        attrs["messaging.operation.name"] = "send"
        if delay:
            attrs["haze.job.delay"] = delay
        with self.tracer.start_as_current_span(
            f"send {message.queue}", kind=self._trace.SpanKind.PRODUCER, attributes=attrs
        ) as span:
            self._stamp(message)
            result = await enqueue()
            if result.skipped:
                span.set_attribute("haze.job.skipped", True)
            else:
                self._count(
                    "dispatched",
                    message.job,
                    message.queue,
                    {"haze.job.name": message.job, "messaging.destination.name": message.queue},
                )
            return result

    def created(self, message: Message) -> None:
        """A message of a bulk dispatch: a ``create <queue>`` span whose context it carries."""
        attrs = self._attributes(message, message.connection or "")
        attrs["messaging.operation.type"] = "create"
        attrs["messaging.operation.name"] = "create"
        with self.tracer.start_as_current_span(
            f"create {message.queue}", kind=self._trace.SpanKind.PRODUCER, attributes=attrs
        ):
            self._stamp(message)
        self._count(
            "dispatched",
            message.job,
            message.queue,
            {"haze.job.name": message.job, "messaging.destination.name": message.queue},
        )

    # ------------------------------------------------------------------ consumer

    async def process(
        self,
        job: JobDefinition[Any],
        message: Message,
        reserved: Reserved,
        driver: Driver,
        run: Callable[[], Awaitable[tuple[str, BaseException | None]]],
    ) -> tuple[str, BaseException | None]:
        """Run one execution (``run``) inside a ``process <queue>`` span."""
        trace = self._trace
        parent, links = self._parent(message)
        queue = message.queue
        attrs = self._attributes(message, driver.name)
        attrs["messaging.operation.type"] = "process"
        attrs["messaging.operation.name"] = "process"
        attrs["haze.job.attempt"] = reserved.attempt
        metric_attrs = {"haze.job.name": job.name, "messaging.destination.name": queue}
        self._starting(job.name, message, metric_attrs)
        outcome = "cancelled"
        error: BaseException | None = None
        started = _perf()
        with self.tracer.start_as_current_span(
            f"process {queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=attrs,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                outcome, error = await run()
                return outcome, error
            except BaseException as e:
                error = e
                raise
            finally:
                self._ended(job.name, queue, metric_attrs, outcome, _perf() - started)
                self._outcome(span, outcome, error, job.encrypted)

    async def workflow_step(
        self,
        workflow: str,
        run_id: str,
        step: str,
        position: int,
        attempt: int,
        call: Callable[[int], Awaitable[str]],
        sealed: bool = False,
    ) -> str:
        """One try of a workflow step (``call(attempt)``) in a ``workflow.step <name>``
        span, a child of the current ``process`` span: a run's resumes carry its trace,
        so every step of a run is in one trace. ``sealed``: an encrypted workflow, whose
        error text stays in its encrypted run state: the span gets the type only."""
        attrs: dict[str, Any] = {
            "haze.workflow.name": workflow,
            "haze.workflow.run_id": run_id,
            "haze.workflow.step": step,
            "haze.workflow.step.position": position,
            "haze.workflow.step.attempt": attempt,
        }
        with self.tracer.start_as_current_span(
            f"workflow.step {step}",
            kind=self._trace.SpanKind.INTERNAL,
            attributes=attrs,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                return await call(attempt)
            except Exception as e:
                line = f"{type(e).__name__}: {_SEALED}" if sealed else error_line(e)
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, line))
                if not sealed:
                    span.record_exception(e)
                raise

    def _parent(self, message: Message) -> tuple[Any, Any]:
        """The producer's context carried by ``message``, and a link to its span."""
        trace = self._trace
        meta = message.meta
        if meta is None or "traceparent" not in meta:
            return None, None
        parent = self._propagator.extract(meta)
        producer = trace.get_current_span(parent).get_span_context()
        return parent, [trace.Link(producer)] if producer.is_valid else None

    def _starting(self, job: str, message: Message, metric_attrs: dict[str, Any]) -> None:
        queue = message.queue
        wait = max(0.0, _time() - message.ts) if message.ts else None
        if wait is not None:
            self._wait.record(wait, metric_attrs)
            self._observe("wait_time", job, queue, wait)
        self._running.add(1, metric_attrs)
        key = (job, queue)
        self.running[key] = self.running.get(key, 0) + 1

    def _ended(
        self, job: str, queue: str, metric_attrs: dict[str, Any], outcome: str, elapsed: float
    ) -> None:
        self._running.add(-1, metric_attrs)
        self.running[(job, queue)] -= 1
        self._runtime.record(elapsed, {**metric_attrs, "haze.job.outcome": outcome})
        self._observe("runtime", job, queue, elapsed)
        counter = _OUTCOME_COUNTER.get(outcome)
        if counter is not None:
            self._count(counter, job, queue, metric_attrs)

    def _outcome(self, span: Any, outcome: str, error: BaseException | None, sealed: bool) -> None:
        """``sealed``: an encrypted job, whose error text (often made of its payload) stays
        in its encrypted failed record: the span gets the type only, and no traceback."""
        span.set_attribute("haze.job.outcome", outcome)
        if outcome == "failed" and error is not None:
            text = _SEALED if sealed else error_text(error)
            span.add_event(
                "haze.job.failure",
                {"exception.type": type(error).__name__, "exception.message": text},
            )
            if not sealed:
                span.record_exception(error)
            span.set_attribute("error.type", type(error).__qualname__)
            line = f"{type(error).__name__}: {_SEALED}" if sealed else error_line(error)
            span.set_status(self._trace.StatusCode.ERROR, line)

    def retrying(self, delay: float, error: BaseException, sealed: bool = False) -> None:
        """The running job failed and goes back for another try in ``delay`` seconds."""
        self._trace.get_current_span().add_event(
            "haze.job.retry",
            {
                "haze.job.retry_in": delay,
                "exception.type": type(error).__name__,
                "exception.message": _SEALED if sealed else error_text(error),
            },
        )

    def releasing(self, delay: float) -> None:
        """The running job called ``job.release(delay)``."""
        self._trace.get_current_span().add_event("haze.job.release", {"haze.job.retry_in": delay})


# ====================================================================== Prometheus


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_label(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def prometheus_text(
    telemetry: Telemetry | None = None,
    queues: Iterable[Any] = (),
) -> str:
    """Prometheus text exposition (format 0.0.4) of this process's job totals and of
    queue sizes.

    ``telemetry`` is an app's recorder (``app.manager.telemetry()``); ``queues`` are
    ``QueueStats`` rows (``haze queue:stats``'s numbers) rendered as gauges, a count a
    backend cannot give being left out rather than guessed.

    >>> print(prometheus_text(None, []), end="")
    """
    lines: list[str] = []
    if telemetry is not None:
        _job_lines(telemetry, lines)
    rows = list(queues)
    if rows:
        _queue_lines(rows, lines)
    return "\n".join(lines) + "\n" if lines else ""


def _job_lines(telemetry: Telemetry, lines: list[str]) -> None:
    for name in COUNTERS:
        metric = f"haze_jobs_{name}_total"
        lines.append(f"# HELP {metric} Jobs {name} by this process.")
        lines.append(f"# TYPE {metric} counter")
        for (n, job, queue), value in sorted(telemetry.counts.items()):
            if n == name:
                lines.append(f"{metric}{_labels((('job', job), ('queue', queue)))} {value}")
    lines.append("# HELP haze_jobs_running Jobs running now in this process.")
    lines.append("# TYPE haze_jobs_running gauge")
    for (job, queue), value in sorted(telemetry.running.items()):
        lines.append(f"haze_jobs_running{_labels((('job', job), ('queue', queue)))} {value}")
    for name, what in (
        ("wait_time", "From dispatch to the start of an attempt"),
        ("runtime", "How long an attempt ran"),
    ):
        metric = f"haze_job_{name}_seconds"
        lines.append(f"# HELP {metric} {what}, in seconds.")
        lines.append(f"# TYPE {metric} histogram")
        for (n, job, queue), series in sorted(telemetry.histograms.items()):
            if n != name:
                continue
            base = (("job", job), ("queue", queue))
            for bound, count in zip(BUCKETS, series.buckets, strict=True):
                le = _labels((*base, ("le", _number(bound))))
                lines.append(f"{metric}_bucket{le} {count}")
            lines.append(f"{metric}_bucket{_labels((*base, ('le', '+Inf')))} {series.count}")
            lines.append(f"{metric}_sum{_labels(base)} {_number(series.sum)}")
            lines.append(f"{metric}_count{_labels(base)} {series.count}")


def _queue_lines(rows: list[Any], lines: list[str]) -> None:
    for field, what in (
        ("ready", "Jobs ready to run"),
        ("delayed", "Jobs waiting for their delay"),
        ("running", "Jobs claimed by a worker"),
        ("failed", "Failed jobs kept"),
    ):
        metric = f"haze_queue_{field}"
        lines.append(f"# HELP {metric} {what}.")
        lines.append(f"# TYPE {metric} gauge")
        for row in rows:
            value = getattr(row, field)
            if value is not None:
                labels = _labels((("connection", row.connection), ("queue", row.queue)))
                lines.append(f"{metric}{labels} {value}")
    metric = "haze_queue_oldest_ready_seconds"
    lines.append(f"# HELP {metric} How long the oldest ready job has waited (0: none).")
    lines.append(f"# TYPE {metric} gauge")
    now = time.time()
    for row in rows:
        oldest = getattr(row, "oldest_ready_at", None)
        if oldest is not None:
            waited = max(0.0, now - oldest)
        elif row.ready == 0:
            waited = 0.0
        else:
            continue  # the backend cannot tell (SQS, Cloudflare): left out, not guessed
        labels = _labels((("connection", row.connection), ("queue", row.queue)))
        lines.append(f"{metric}{labels} {_number(round(waited, 3))}")


class TelemetrySlot:
    """An app's recorder, decided at first use (so an SDK set up after the app was
    created still counts); ``set`` puts a recorder of one's own (tests)."""

    def __init__(self, app: EngineApp) -> None:
        self.app = app
        self.value: Telemetry | None = None
        self.resolved = False

    def get(self) -> Telemetry | None:
        if not self.resolved:
            self.set(telemetry_for(self.app))
        return self.value

    def set(self, value: Telemetry | None) -> None:
        self.value, self.resolved = value, True


class TelemetryHook:
    """Outcome hook: a retry or a release is an event of the running job's span."""

    plain_quiet = True  # wants() is False for a plain success (PlainQuiet)

    def __init__(self, slot: TelemetrySlot) -> None:
        self.slot = slot

    def wants(self, run: Run) -> bool:
        return run.outcome in (Outcome.RETRY, Outcome.RELEASED)

    async def settling(self, run: Run) -> None:
        if run.outcome not in (Outcome.RETRY, Outcome.RELEASED):
            return
        otel = self.slot.get()
        if otel is None:
            return
        if run.outcome == Outcome.RETRY:
            assert run.error is not None
            otel.retrying(run.shown_delay, run.error, run.job.encrypted)
        else:
            otel.releasing(run.delay)

    async def settled(self, run: Run) -> None:
        return None
