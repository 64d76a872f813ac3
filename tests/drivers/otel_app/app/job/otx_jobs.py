"""The worker's jobs, and its OpenTelemetry SDK: spans and metrics written as JSON to
the files the test names (an exporter of the app's own, as an app would ship to its
collector). Telemetry is "auto" in config/queue.py: on because a provider is set here."""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Sequence
from typing import Any

from haze import define_job
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

runs: dict[str, int] = {}


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as f:
            for s in spans:
                f.write(
                    json.dumps(
                        {
                            "name": s.name,
                            "kind": s.kind.name,
                            "trace_id": f"{s.context.trace_id:032x}",
                            "span_id": f"{s.context.span_id:016x}",
                            "parent": f"{s.parent.span_id:016x}" if s.parent else None,
                            "links": [f"{link.context.span_id:016x}" for link in s.links],
                            "attributes": dict(s.attributes or {}),
                            "events": [e.name for e in s.events],
                            "pid": os.getpid(),
                        }
                    )
                    + "\n"
                )
        return SpanExportResult.SUCCESS


spans_file = os.environ.get("OTX_SPANS_FILE")
if spans_file:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(spans_file)))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    @atexit.register
    def _dump_metrics() -> None:
        data = reader.get_metrics_data()
        out: dict[str, Any] = {}
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out[m.name] = [
                        [dict(p.attributes or {}), getattr(p, "value", getattr(p, "count", None))]
                        for p in m.data.data_points
                    ]
        with open(spans_file + ".metrics.json", "w") as f:
            json.dump(out, f)


@define_job(name="otx_work", tries=2, backoff=0)
async def otx_work(payload: dict[str, Any]) -> None:
    if payload.get("fail_once") and runs.setdefault(payload["key"], 0) == 0:
        runs[payload["key"]] = 1
        raise RuntimeError("first try fails")
