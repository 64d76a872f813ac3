"""OpenTelemetry (haze.otel): spans, metrics, the Prometheus text, and when it is on.

The SDK's in-memory exporter and reader collect what haze records. The providers are
handed to the app's recorder instead of being set globally: a global provider cannot be
unset, and would switch telemetry on for every other test in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from haze import App, JobContext, Queue, define_job, define_queue_config
from haze._base.errors import ConfigError
from haze._engine.otel import Telemetry, prometheus_text
from haze.contracts.driver import QueueCounts
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

calls: dict[str, int] = {}


@define_job(name="otel_ok", queue="mail")
async def otel_ok(payload: dict[str, Any]) -> None:
    calls["ok"] = calls.get("ok", 0) + 1


@define_job(name="otel_flaky", tries=2, backoff=0)
async def otel_flaky(payload: dict[str, Any]) -> None:
    calls["flaky"] = calls.get("flaky", 0) + 1
    raise ValueError("boom")


@define_job(name="otel_release")
async def otel_release(payload: dict[str, Any], job: JobContext) -> None:
    calls["release"] = calls.get("release", 0) + 1
    if calls["release"] == 1:
        job.release(0)


class Recorded:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tp = TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.telemetry = Telemetry(
            tracer_provider=tp, meter_provider=MeterProvider(metric_readers=[self.reader])
        )

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        assert data is not None
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = list(m.data.data_points)
        return out


@pytest.fixture
async def traced() -> Any:
    calls.clear()
    app = App(
        queue=define_queue_config(connections={"memory": {"driver": "memory", "concurrency": 1}})
    )
    rec = Recorded()
    async with app:
        app.manager._otel = rec.telemetry  # the recorder the app would build from globals
        yield app, rec


async def test_dispatch_and_run_make_a_producer_and_a_linked_consumer_span(traced: Any) -> None:
    _app, rec = traced
    result = await otel_ok.dispatch({"n": 1})
    await Queue.idle()
    spans = {s.name: s for s in rec.spans.get_finished_spans()}
    send, process = spans["send mail"], spans["process mail"]
    assert send.kind == SpanKind.PRODUCER
    assert process.kind == SpanKind.CONSUMER
    assert process.context.trace_id == send.context.trace_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    for span in (send, process):
        attrs = span.attributes
        assert attrs["messaging.system"] == "haze"
        assert attrs["messaging.destination.name"] == "mail"
        assert attrs["messaging.message.id"] == result
        assert attrs["haze.job.name"] == "otel_ok"
        assert attrs["haze.connection"] == "memory"
    assert send.attributes["messaging.operation.type"] == "send"
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["haze.job.attempt"] == 1
    assert process.attributes["haze.job.outcome"] == "done"


async def test_retry_and_failure_are_span_events_and_counted(traced: Any) -> None:
    _app, rec = traced
    await otel_flaky.dispatch({})
    await Queue.idle()
    processes = [s for s in rec.spans.get_finished_spans() if s.name == "process default"]
    assert [s.attributes["haze.job.attempt"] for s in processes] == [1, 2]
    first, last = processes
    assert [e.name for e in first.events] == ["haze.job.retry"]
    assert first.events[0].attributes["exception.type"] == "ValueError"
    assert "haze.job.failure" in [e.name for e in last.events]
    assert last.status.status_code == StatusCode.ERROR
    assert last.attributes["error.type"] == "ValueError"
    # both attempts belong to the dispatch's trace
    send = next(s for s in rec.spans.get_finished_spans() if s.name == "send default")
    assert {s.context.trace_id for s in processes} == {send.context.trace_id}
    metrics = rec.metrics()
    assert [p.value for p in metrics["haze.jobs.retried"]] == [1]
    assert [p.value for p in metrics["haze.jobs.failed"]] == [1]
    assert metrics["haze.jobs.failed"][0].attributes == {
        "haze.job.name": "otel_flaky",
        "messaging.destination.name": "default",
    }


@define_job(name="otel_secret", tries=2, backoff=0, encrypted=True)
async def otel_secret(payload: dict[str, Any]) -> None:
    raise ValueError(f"card {payload['card']} declined")


async def test_an_encrypted_jobs_error_text_stays_out_of_its_spans(
    traced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze.crypto import generate_key

    monkeypatch.setenv("APP_KEY", generate_key())
    _app, rec = traced
    await otel_secret.dispatch({"card": "4242-OTEL"})
    await Queue.idle()
    processes = [s for s in rec.spans.get_finished_spans() if s.name == "process default"]
    assert len(processes) == 2
    seen = repr([(s.attributes, [(e.name, e.attributes) for e in s.events]) for s in processes])
    seen += repr([s.status.description for s in processes])
    assert "4242-OTEL" not in seen
    first, last = processes
    assert first.events[0].attributes["exception.message"] == "(encrypted)"
    assert last.status.status_code == StatusCode.ERROR
    assert last.attributes["error.type"] == "ValueError"


async def test_release_is_an_event_and_the_metrics_count_each_outcome(traced: Any) -> None:
    _app, rec = traced
    await otel_release.dispatch({})
    await otel_ok.dispatch({})
    await Queue.idle()
    released = [s for s in rec.spans.get_finished_spans() if s.name == "process default"]
    assert [e.name for e in released[0].events] == ["haze.job.release"]
    m = rec.metrics()
    by_job = {p.attributes["haze.job.name"]: p.value for p in m["haze.jobs.dispatched"]}
    assert by_job == {"otel_release": 1, "otel_ok": 1}
    assert {p.attributes["haze.job.name"]: p.value for p in m["haze.jobs.processed"]} == {
        "otel_release": 1,
        "otel_ok": 1,
    }
    assert [p.value for p in m["haze.jobs.released"]] == [1]
    assert all(p.value == 0 for p in m["haze.jobs.running"])
    runtime = {p.attributes["haze.job.name"]: p.count for p in m["haze.job.runtime"]}
    assert runtime["otel_ok"] == 1
    assert sum(p.count for p in m["haze.job.wait_time"]) == 3  # two runs of one job, one other
    assert all(p.min >= 0 for p in m["haze.job.wait_time"])


async def test_bulk_gives_each_message_a_create_span(traced: Any) -> None:
    _app, rec = traced
    await Queue.bulk([otel_ok.with_({"n": i}) for i in range(3)])
    await Queue.idle()
    spans = rec.spans.get_finished_spans()
    creates = [s for s in spans if s.name == "create mail"]
    processes = [s for s in spans if s.name == "process mail"]
    assert len(creates) == 3 and len(processes) == 3
    assert {p.parent.span_id for p in processes} == {c.context.span_id for c in creates}


async def test_a_running_job_is_counted_and_its_span_is_current(traced: Any) -> None:
    _app, rec = traced
    seen: dict[str, Any] = {}

    @define_job(name="otel_inside")
    async def inside(payload: None) -> None:
        from opentelemetry import trace

        seen["span"] = trace.get_current_span().get_span_context().span_id
        seen["running"] = dict(rec.telemetry.running)

    await inside.dispatch(None)
    await Queue.idle()
    process = next(s for s in rec.spans.get_finished_spans() if s.name == "process default")
    assert seen["span"] == process.context.span_id
    assert seen["running"] == {("otel_inside", "default"): 1}


async def test_prometheus_text_renders_the_totals_and_queue_gauges(traced: Any) -> None:
    _app, rec = traced
    await otel_ok.dispatch({})
    await otel_flaky.dispatch({})
    await Queue.idle()

    class Row:
        connection, queue = "memory", 'we"ird'
        ready, delayed, running, failed = 3, 0, None, 1

    text = prometheus_text(rec.telemetry, [Row()])
    lines = text.splitlines()
    assert text.endswith("\n")
    assert "# TYPE haze_jobs_processed_total counter" in lines
    assert 'haze_jobs_processed_total{job="otel_ok",queue="mail"} 1' in lines
    assert 'haze_jobs_failed_total{job="otel_flaky",queue="default"} 1' in lines
    assert 'haze_jobs_retried_total{job="otel_flaky",queue="default"} 1' in lines
    assert "# TYPE haze_job_runtime_seconds histogram" in lines
    assert 'haze_job_runtime_seconds_count{job="otel_flaky",queue="default"} 2' in lines
    assert 'haze_job_runtime_seconds_bucket{job="otel_flaky",queue="default",le="+Inf"} 2' in lines
    buckets = [
        int(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith('haze_job_wait_time_seconds_bucket{job="otel_ok"')
    ]
    assert buckets == sorted(buckets) and buckets[-1] == 1  # cumulative
    assert 'haze_queue_ready{connection="memory",queue="we\\"ird"} 3' in lines
    assert not any(line.startswith("haze_queue_running{") for line in lines)  # unknown: left out
    # every sample line is NAME{labels} VALUE, every family has HELP and TYPE
    for line in lines:
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            float(value)
            assert name.split("{")[0].replace("_", "").isalnum()
    assert prometheus_text(None, []) == ""
    assert QueueCounts(1, 2, None).running is None


def test_telemetry_setting_is_checked() -> None:
    with pytest.raises(ConfigError) as e:
        App(queue=define_queue_config(telemetry="yes")).queue_config  # noqa: B018
    assert "telemetry" in str(e.value)


def _child(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (global providers unset) and read its JSON."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_auto_is_off_without_an_sdk_and_never_imports_opentelemetry() -> None:
    got = _child(
        """
        import asyncio, json, sys
        from haze import App, Queue, define_job, define_queue_config

        @define_job(name="auto_off")
        async def job(p): pass

        async def main():
            async with App(queue=define_queue_config()) as app:
                await job.dispatch(1)
                await Queue.idle()
                return app.manager.telemetry()

        t = asyncio.run(main())
        print(json.dumps({"on": t is not None,
                          "imported": any(m.startswith("opentelemetry") for m in sys.modules)}))
        """
    )
    assert got == {"on": False, "imported": False}


def test_auto_is_on_once_the_app_has_set_a_provider() -> None:
    got = _child(
        """
        import asyncio, json
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from haze import App, Queue, define_job, define_queue_config

        exporter = InMemorySpanExporter()

        @define_job(name="auto_on")
        async def job(p): pass

        async def main(config):
            async with App(queue=config) as app:
                await job.dispatch(1)
                await Queue.idle()
                return app.manager.telemetry()

        before = asyncio.run(main(define_queue_config()))  # API imported, no SDK yet
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        after = asyncio.run(main(define_queue_config()))
        off = asyncio.run(main(define_queue_config(telemetry=False)))
        print(json.dumps({"before": before is not None, "after": after is not None,
                          "off": off is not None,
                          "spans": sorted(s.name for s in exporter.get_finished_spans())}))
        """
    )
    assert got == {
        "before": False,
        "after": True,
        "off": False,
        "spans": ["process default", "send default"],
    }
