"""What haze's mapping costs per step on Lambda durable functions.

Both entries run one workflow of ``n`` steps (each returns a small dict) to its end on
the same engine, AWS's local durable-execution engine
(``aws-durable-execution-sdk-python-testing``'s ``DurableFunctionTestRunner``), and
report the time per step:

* ``lambda-durable-hand``: a durable function written for the SDK by hand
  (``context.step`` per step);
* ``lambda-durable-haze``: the same steps as a haze ``@workflow`` run by
  ``haze_lambda.workflow_handler`` (the run's rules, the nondeterminism check, the JSON
  text of each result, the hops between the SDK's threads and haze's event loop).

The ratio haze/hand is haze's mapping overhead; the engine's own work (checkpoints,
the invocation) is in both.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from harness import Measurement, entry, timer


def _skip() -> str | None:
    try:
        import aws_durable_execution_sdk_python_testing  # noqa: F401
    except ImportError:
        return "aws-durable-execution-sdk-python-testing is not installed"
    return None


def _value(i: int) -> dict[str, Any]:
    return {"i": i, "ok": True}


_defined: list[Any] = []


def _define_once() -> None:
    """The workflow, registered once per process (the harness repeats entries)."""
    if _defined:
        return
    from haze import workflow

    @workflow(name="bench_lambda_steps")
    async def steps(run: Any, n: int) -> int:
        out = [await run.step(f"step {i}", _value, i) for i in range(n)]
        return len(out)

    _defined.append(steps)


def _hand(n: int) -> Measurement:
    from aws_durable_execution_sdk_python import durable_execution
    from aws_durable_execution_sdk_python_testing.runner import DurableFunctionTestRunner

    @durable_execution  # type: ignore[misc]
    def handler(event: Any, context: Any) -> Any:
        out = []
        for i in range(event["n"]):
            out.append(context.step(lambda _, i=i: _value(i), name=f"step {i}"))
        return len(out)

    with DurableFunctionTestRunner(handler=handler) as runner, timer() as elapsed:
        result = runner.run(input=json.dumps({"n": n}), execution_name="hand")
        wall, cpu = elapsed()
    assert result.status.name == "SUCCEEDED", result.error
    return Measurement(n, wall, cpu)


def _haze(n: int) -> Measurement:
    import haze_lambda
    from aws_durable_execution_sdk_python_testing.runner import DurableFunctionTestRunner

    _define_once()
    root = Path(tempfile.mkdtemp(prefix="haze-bench-lambda-"))
    (root / "config").mkdir()
    (root / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        'config = define_queue_config(default="m", connections={"m": {"driver": "memory"}})\n'
    )
    os.environ["HAZE_APP_ROOT"] = str(root)
    event = {"workflow": "bench_lambda_steps", "input": {"n": n}}
    try:
        runner = DurableFunctionTestRunner(handler=haze_lambda.workflow_handler)
        with runner, timer() as elapsed:
            result = runner.run(input=json.dumps(event), execution_name="haze")
            wall, cpu = elapsed()
    finally:
        haze_lambda.reset()
    assert result.status.name == "SUCCEEDED", result.error
    return Measurement(n, wall, cpu)


@entry("lambda-durable-hand", group="workflows", skip_reason=_skip)
def lambda_durable_hand(n: int) -> Measurement:
    """A hand-written durable function of n steps on AWS's local engine."""
    return _hand(min(n, 200))


@entry("lambda-durable-haze", baseline="lambda-durable-hand", group="workflows", skip_reason=_skip)
def lambda_durable_haze(n: int) -> Measurement:
    """The same n steps as a haze @workflow through haze_lambda.workflow_handler."""
    return _haze(min(n, 200))


if __name__ == "__main__":
    _haze(20), _hand(20)  # warm: the app's boot and imports are not per step
    hand, haze = _hand(200), _haze(200)
    print(
        f"per step: hand {hand.us_per_job:.0f} us, haze {haze.us_per_job:.0f} us, "
        f"ratio {haze.us_per_job / hand.us_per_job:.2f}"
    )
