"""A trace crosses processes through a real Redis queue.

This process dispatches with the SDK's in-memory exporter; a ``haze queue:work
--stop-when-empty`` process, whose app (``otel_app``) sets its own SDK provider and
writes its spans and metrics as JSON, runs the jobs. Each consumer span must be a child
of, and linked to, the producer span of its dispatch, in the same trace.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from haze import App, define_job, define_queue_config
from haze._engine.otel import Telemetry
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis_spec import REDIS_URL, needs_redis

APP_ROOT = Path(__file__).parent / "otel_app"


@define_job(name="otx_work", tries=2, backoff=0)
async def otx_work(payload: dict[str, Any]) -> None:
    raise AssertionError("runs in the worker process only")


@needs_redis
async def test_the_consumer_span_in_the_worker_continues_the_dispatch_trace(
    redis_prefix: str, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    conn = {"driver": "redis", "url": REDIS_URL, "prefix": redis_prefix}
    app = App(queue=define_queue_config(default="r", connections={"r": conn}))
    async with app:
        # this process's recorder, on the test's provider (a global one cannot be unset)
        app.manager._otel = Telemetry(tracer_provider=provider)
        plain = await otx_work.dispatch({"key": "a"})
        flaky = await otx_work.dispatch({"key": "b", "fail_once": True})

    spans_file = tmp_path / "spans.jsonl"
    env = {
        **os.environ,
        "OTX_REDIS_URL": REDIS_URL,
        "OTX_PREFIX": redis_prefix,
        "OTX_SPANS_FILE": str(spans_file),
    }
    cmd = [sys.executable, "-m", "haze.cli", "--root", str(APP_ROOT), "queue:work"]
    done = await asyncio.to_thread(
        subprocess.run,
        [*cmd, "--stop-when-empty"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    sends = {s.attributes["messaging.message.id"]: s for s in exporter.get_finished_spans()}
    assert set(sends) == {plain, flaky}
    worker = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert {w["pid"] for w in worker} != {os.getpid()}
    by_id: dict[str, list[dict[str, Any]]] = {}
    for w in worker:
        assert w["name"] == "process default" and w["kind"] == "CONSUMER"
        by_id.setdefault(w["attributes"]["messaging.message.id"], []).append(w)
    assert sorted(len(v) for v in by_id.values()) == [1, 2]  # b ran twice
    for job_id, runs in by_id.items():
        send = sends[job_id]
        for run in runs:
            assert run["trace_id"] == f"{send.context.trace_id:032x}"
            assert run["parent"] == f"{send.context.span_id:016x}"
            assert run["links"] == [f"{send.context.span_id:016x}"]
            assert run["attributes"]["haze.job.name"] == "otx_work"
            assert run["attributes"]["haze.connection"] == "r"
    attempts = sorted((r["attributes"]["haze.job.attempt"], r["events"]) for r in by_id[flaky])
    assert attempts == [(1, ["haze.job.retry"]), (2, [])]

    metrics = json.loads((tmp_path / "spans.jsonl.metrics.json").read_text())
    counted = {name: sum(v for _, v in points) for name, points in metrics.items()}
    assert counted["haze.jobs.processed"] == 2
    assert counted["haze.jobs.retried"] == 1
    assert counted["haze.job.runtime"] == 3
    assert counted["haze.jobs.running"] == 0
