"""OpenTelemetry spans per workflow step (``workflow.step <name>``), each a child of the
``process`` span of the delivery that ran it, and every delivery of a run (its start and
each resume after a sleep) in the run's one trace.

The SDK's in-memory exporter collects the spans; the provider is handed to the app's
recorder instead of being set globally (as in runtime/tests/test_otel.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from haze import App, Workflow, define_queue_config, workflow
from haze._engine.otel import Telemetry
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

tries: dict[str, int] = {}


def flaky() -> str:
    tries["flaky"] = tries.get("flaky", 0) + 1
    if tries["flaky"] == 1:
        raise ValueError("first try fails")
    return "ok"


@workflow(name="otel.flow")
async def flow(run: Any) -> Any:
    a = await run.step("fetch", lambda: 1)
    await run.sleep("pause", 0.2)  # a resume: a second delivery, a second process span
    b = await run.step("flaky", flaky, tries=2)
    return [a, b]


@pytest.fixture
async def traced() -> AsyncIterator[tuple[App, InMemorySpanExporter]]:
    tries.clear()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    app = App(queue=define_queue_config(connections={"memory": {"driver": "memory"}}))
    async with app:
        app.manager._otel = Telemetry(tracer_provider=provider)
        yield app, spans


async def test_each_step_try_is_a_span_under_the_runs_one_trace(
    traced: tuple[App, InMemorySpanExporter],
) -> None:
    _app, exporter = traced
    rid = await Workflow.start(flow)
    st = await Workflow.wait(rid, timeout=20)
    assert st.state == "done" and st.result == [1, "ok"], st
    spans = exporter.get_finished_spans()
    steps = [s for s in spans if s.name.startswith("workflow.step ")]
    assert [(s.name, s.attributes["haze.workflow.step.attempt"]) for s in steps] == [
        ("workflow.step fetch", 1),
        ("workflow.step flaky", 1),
        ("workflow.step flaky", 2),
    ]
    for s in steps:
        assert s.kind == SpanKind.INTERNAL
        assert s.attributes["haze.workflow.name"] == "otel.flow"
        assert s.attributes["haze.workflow.run_id"] == rid
    failed, passed = steps[1], steps[2]
    assert failed.status.status_code == StatusCode.ERROR
    assert "first try fails" in (failed.status.description or "")
    assert passed.status.status_code != StatusCode.ERROR

    by_id = {s.context.span_id: s for s in spans}
    parents = [by_id[s.parent.span_id] for s in steps if s.parent is not None]
    assert len(parents) == 3 and all(p.kind == SpanKind.CONSUMER for p in parents)
    # fetch ran in the start's delivery, flaky in the resume's: two process spans
    assert parents[0].context.span_id != parents[1].context.span_id
    assert parents[1].context.span_id == parents[2].context.span_id
    # ... and one trace from the start's send span to the last step
    assert len({s.context.trace_id for s in spans}) == 1, [
        (s.name, s.context.trace_id) for s in spans
    ]


async def test_no_step_spans_when_telemetry_is_off() -> None:
    app = App(
        queue=define_queue_config(connections={"memory": {"driver": "memory"}}, telemetry=False)
    )
    async with app:
        rid = await Workflow.start(flow)
        st = await Workflow.wait(rid, timeout=20)
        assert st.state == "done"
        assert app.manager.telemetry() is None
