"""What OpenTelemetry costs the memory-driver entry (the ``haze-memory`` shape).

Each entry runs the same measurement in a fresh interpreter, so what is imported
differs and nothing else does:

* ``otel-absent``: ``opentelemetry`` cannot be imported (as without ``haze[otel]``);
* ``otel-api-no-sdk``: the API imported by the app (``opentelemetry.trace`` and
  ``.metrics``), no SDK provider set, ``telemetry="auto"`` (the default). The target:
  within 5% of ``otel-absent``;
* ``otel-forced-no-sdk``: ``telemetry=True`` with no SDK, so every job goes through
  the API's no-op tracer and meter (for information);
* ``otel-sdk``: an SDK tracer and meter provider with nothing exporting (for
  information: the cost of recording spans and metrics).

The child prints its Measurement as JSON; its CPU time is its own process's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import Measurement, entry, timer

_HERE = Path(__file__).resolve().parent
MODES = ("otel-absent", "otel-api-no-sdk", "otel-forced-no-sdk", "otel-sdk")


def _spawn(mode: str, n: int) -> Measurement:
    out = subprocess.run(
        [sys.executable, str(_HERE / "otel.py"), "--child", mode, str(n)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"bench child {mode} failed:\n{out.stderr[-2000:]}")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return Measurement(d["n"], d["wall"], d["cpu"], d["phases"])


@entry("otel-absent", group="otel")
def otel_absent(n: int) -> Measurement:
    """haze-memory in a child where opentelemetry cannot be imported."""
    return _spawn("otel-absent", n)


@entry("otel-api-no-sdk", baseline="otel-absent", group="otel", targets={"ratio": 1.05})
def otel_api_no_sdk(n: int) -> Measurement:
    """haze-memory in a child that imported the OpenTelemetry API and set no SDK."""
    return _spawn("otel-api-no-sdk", n)


@entry("otel-forced-no-sdk", baseline="otel-absent", group="otel")
def otel_forced_no_sdk(n: int) -> Measurement:
    """haze-memory with telemetry=True and no SDK (the API's no-op tracer and meter)."""
    return _spawn("otel-forced-no-sdk", n)


@entry("otel-sdk", baseline="otel-absent", group="otel")
def otel_sdk(n: int) -> Measurement:
    """haze-memory with SDK tracer and meter providers, nothing exporting."""
    return _spawn("otel-sdk", n)


# ------------------------------------------------------------------------------ child


def _child(mode: str, n: int) -> dict[str, Any]:
    if mode == "otel-absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import fails
    elif mode in ("otel-api-no-sdk", "otel-forced-no-sdk"):
        import opentelemetry.metrics
        import opentelemetry.trace  # noqa: F401
    elif mode == "otel-sdk":
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        metrics.set_meter_provider(MeterProvider())
    from haze import App, Queue, define_job, define_queue_config

    handled = 0

    @define_job(name="bench.otel_noop")
    async def noop(payload: Any) -> None:
        nonlocal handled
        handled += 1

    telemetry: Any = True if mode == "otel-forced-no-sdk" else "auto"

    async def run(count: int) -> Measurement:
        nonlocal handled
        config = define_queue_config(
            default="memory", connections={"memory": {"driver": "memory"}}, telemetry=telemetry
        )
        async with App(queue=config) as app:
            handled = 0
            with timer() as elapsed:
                dispatch = noop.dispatch
                for i in range(count):
                    await dispatch({"i": i})
                dispatched, _ = elapsed()
                await Queue.idle()
                wall, cpu = elapsed()
            on = app.manager.telemetry() is not None
        if handled != count:
            raise RuntimeError(f"{count} jobs dispatched but {handled} handled")
        if on != (mode in ("otel-forced-no-sdk", "otel-sdk")):
            raise RuntimeError(f"{mode}: telemetry is {'on' if on else 'off'}")
        return Measurement(count, wall, cpu, {"dispatch": dispatched, "drain": wall - dispatched})

    asyncio.run(run(2000))  # warm-up: imports, first app start, code objects
    import gc

    gc.collect()
    m = asyncio.run(run(n))
    if mode == "otel-absent" and any(k.startswith("opentelemetry.") for k in sys.modules):
        raise RuntimeError("opentelemetry was imported")
    return {"n": m.n, "wall": m.wall, "cpu": m.cpu, "phases": m.phases}


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--child":
    sys.path.insert(0, str(_HERE))
    print(json.dumps(_child(sys.argv[2], int(sys.argv[3]))))
