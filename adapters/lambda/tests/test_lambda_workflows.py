"""Workflows on Lambda durable functions, run by AWS's own local engine.

What is real: ``haze_lambda.workflow_handler`` runs under the AWS durable execution SDK
(``@durable_execution``) and ``aws-durable-execution-sdk-python-testing``'s
``DurableFunctionTestRunner``: AWS's local engine, which keeps the checkpoints, replays
the function after each wait, retry and callback, fires wait timers on its own test
clock (a two-day sleep takes no real time) and completes callbacks. haze's own engine
runs the same definitions (``tests/workflows/recipes.py``) with its state in a SQLite
file. Nothing is a model of either engine.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "workflows"))

import haze_lambda
import recipes
from aws_durable_execution_sdk_python_testing.runner import (
    DurableFunctionTestResult,
    DurableFunctionTestRunner,
)
from haze import (
    App,
    Workflow,
    define_cache_config,
    define_database_config,
    define_queue_config,
    workflow,
)
from haze._workflows.definition import find_workflow
from haze._workflows.engine import set_clock, workflow_state
from haze_lambda import workflow_handler

pytestmark = pytest.mark.timeout(180)

LAMBDA_QUEUE_PY = """\
from haze import define_queue_config

# run.dispatch's jobs run inline (sync): the receipt's side effect is counted here
config = define_queue_config(default="jobs", connections={
    "jobs": {"driver": "sync"},
    "lambda": {"driver": "sqs", "queue_url": "http://127.0.0.1:1/1/jobs", "workflows": "native"},
})
"""


@pytest.fixture(autouse=True)
def lambda_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "lambda_app"
    (root / "config").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(LAMBDA_QUEUE_PY)
    monkeypatch.setenv("HAZE_APP_ROOT", str(root))
    recipes.reset()
    yield root
    haze_lambda.reset()
    recipes.reset()


# ----------------------------------------------------------------------- the two engines


def on_lambda(
    name: str, given: dict[str, Any], run_id: str, events: dict[str, Any] | None = None
) -> DurableFunctionTestResult:
    """Run workflow ``name`` on AWS's local engine; send ``events`` once it waits."""
    with DurableFunctionTestRunner(handler=workflow_handler) as runner:
        event = {"workflow": name, "input": given, "id": run_id}
        arn = runner.run_async(input=json.dumps(event), execution_name=run_id)
        for event_name, payload in (events or {}).items():
            callback = runner.wait_for_callback(arn, name=event_name, timeout=60)
            runner.send_callback_success(callback, json.dumps(payload).encode())
        return runner.wait_for_result(arn, timeout=120)


def lambda_steps(result: DurableFunctionTestResult) -> dict[str, Any]:
    """Each step, sleep and event by name -> its kept value."""
    out: dict[str, Any] = {}
    for op in result.get_all_operations():
        kind = type(op).__name__
        if (op.name or "").startswith("haze:"):
            continue  # haze's own operation (a wait's look for an early event)
        if kind in ("StepOperation", "CallbackOperation") and op.name:
            raw = op.result  # type: ignore[attr-defined]
            out[op.name] = None if raw is None else json.loads(raw)
        elif kind == "WaitOperation" and op.name:
            out[op.name] = None
    return out


async def on_store(
    tmp: Path, name: str, given: dict[str, Any], run_id: str, events: dict[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    """Run workflow ``name`` on haze's own engine, its state in a SQLite file; sleeps and
    timeouts pass on the workflows' clock. The run's status and its kept values."""
    app = App(
        queue=define_queue_config(default="m", store="db", connections={"m": {"driver": "memory"}}),
        cache=define_cache_config(
            default="db", stores={"db": {"driver": "database", "connection": "main"}}
        ),
        database=define_database_config(
            default="main", connections={"main": {"url": f"sqlite:///{tmp / 'store.db'}"}}
        ),
    )
    clock = [time.time()]
    set_clock(lambda: clock[0])
    try:
        async with app:
            wf = find_workflow(name)
            assert wf is not None
            await Workflow.start(wf, id=run_id, **given)  # type: ignore[arg-type]
            st = await settle(run_id)
            while st.state in ("sleeping", "waiting"):
                if st.state == "waiting" and st.waiting_for in (events or {}):
                    await Workflow.send_event(
                        run_id, st.waiting_for, (events or {})[st.waiting_for]
                    )
                else:  # the sleep's (or the wait's timeout's) time passes
                    clock[0] = max(clock[0], st.resume_at or clock[0]) + 1
                    await wf.pending({"run": run_id}).dispatch()
                st = await settle(run_id, st)
            # every kept result, in the one read a replay makes (a first try's result is
            # kept with its step's position, a retried one under its name)
            run = await workflow_state(app.manager.state_store()).kept(run_id)
            kept = {s.name: json.loads(run.results.get(s.name) or "null") for s in st.steps}
            return st, kept
    finally:
        set_clock(None)


async def settle(run_id: str, before: Any = None) -> Any:
    for _ in range(500):
        st = await Workflow.status(run_id)
        if st is not None and st.state != "running" and (before is None or st != before):
            return st
        await asyncio.sleep(0.01)
    raise AssertionError(f"run {run_id} did not settle: {st}")


CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("signup", {"email": "ada@example.com"}, {}),
    ("payment", {"order_id": "A-1", "cents": 1200}, {"paid": {"amount": 1200}}),
    ("import", {"source": "c.csv", "chunks": 4}, {}),
]


@pytest.mark.parametrize(("name", "given", "events"), CASES, ids=lambda v: str(v)[:20])
def test_the_recipes_reach_the_same_steps_results_and_output_on_both_engines(
    tmp_path: Path, name: str, given: dict[str, Any], events: dict[str, Any]
) -> None:
    run_id = f"parity-{name}-{len(events)}"
    store_status, store_kept = asyncio.run(on_store(tmp_path, name, given, run_id, events))
    store_calls = Counter(recipes.CALLS)
    recipes.reset()
    result = on_lambda(name, given, run_id, events)
    assert result.status.name == "SUCCEEDED", result.error
    assert store_status.state == "done", store_status.error
    # the same output, the same steps with the same kept values, the same side effects
    assert json.loads(result.result or "null") == store_status.result
    native_kept = lambda_steps(result)
    for kept in (native_kept, store_kept):  # a dispatch keeps its job's id: a new one each
        for step in [k for k in kept if k.startswith("dispatch:")]:
            assert isinstance(kept[step], str) and len(kept[step]) == 32
            kept[step] = "<job id>"
    assert native_kept == store_kept
    assert store_calls == recipes.CALLS
    # each side effect ran once on each engine, though Lambda replayed the function
    # after every sleep, callback and fan-out
    assert set(store_calls.values()) == {1}


@workflow(name="lam_timeout")
async def lam_timeout(run: Any) -> Any:
    paid = await run.wait_for_event("paid", timeout=2)
    return {"paid": paid, "after": await run.step("after", _count, "after")}


def test_a_wait_whose_event_never_comes_returns_none_at_its_timeout(tmp_path: Path) -> None:
    # The local engine times a callback out on the real clock (its test clock skips
    # waits and retries only): a 2-second timeout, where the payment recipe waits 3 days.
    EFFECTS.clear()
    store_status, _ = asyncio.run(on_store(tmp_path, "lam_timeout", {}, "timeout-1"))
    EFFECTS.clear()
    result = on_lambda("lam_timeout", {}, "timeout-1")
    assert result.status.name == "SUCCEEDED", result.error
    assert (
        json.loads(result.result or "null")
        == store_status.result
        == {
            "paid": None,
            "after": "after",
        }
    )
    assert EFFECTS == {"after": 1}


# ------------------------------------------------------------------------------ replays

EFFECTS: Counter[str] = Counter()


def _count(what: str) -> str:
    EFFECTS[what] += 1
    return what


def _flaky() -> str:
    EFFECTS["flaky"] += 1
    if EFFECTS["flaky"] == 1:
        raise ConnectionError("the service blinked")
    return "ok"


@workflow(name="lam_retry")
async def lam_retry(run: Any) -> list[str]:
    a = await run.step("before", _count, "before")
    await run.sleep("pause", "1h")
    b = await run.step("flaky", _flaky, tries=3, backoff="30s")
    c = await run.step("after", _count, "after")
    return [a, b, c]


def test_a_step_that_raises_once_is_retried_by_the_platform() -> None:
    EFFECTS.clear()
    result = on_lambda("lam_retry", {}, "retry-1")
    assert result.status.name == "SUCCEEDED", result.error
    assert json.loads(result.result or "null") == ["before", "ok", "after"]
    flaky = result.get_step("flaky")
    assert flaky.attempt >= 1  # the platform's own retry: a second invocation ran it
    # the steps before it kept their results across the retry's replay
    assert EFFECTS == {"before": 1, "flaky": 2, "after": 1}


@workflow(name="lam_fails")
async def lam_fails(run: Any) -> str:
    await run.step("before", _count, "before")
    return str(await run.step("broken", _broken, tries=2))


def _broken() -> str:
    EFFECTS["broken"] += 1
    raise ValueError("no such account")


def test_a_step_that_fails_for_good_fails_the_run_with_its_error() -> None:
    EFFECTS.clear()
    result = on_lambda("lam_fails", {}, "fails-1")
    assert result.status.name == "FAILED"
    assert result.error is not None and result.error.message == "no such account"
    assert result.error.type.endswith("ValueError")
    assert EFFECTS == {"before": 1, "broken": 2}


FLIP: Counter[str] = Counter()


@workflow(name="lam_nondet")
async def lam_nondet(run: Any) -> str:
    FLIP["replays"] += 1
    first = "first" if FLIP["replays"] == 1 else "changed"  # not a step result: forbidden
    await run.step(first, _count, first)
    await run.sleep("pause", 60)
    return "unreachable"


def test_nondeterminism_fails_the_run_with_the_store_engines_text(tmp_path: Path) -> None:
    FLIP.clear()
    store_status, _ = asyncio.run(on_store(tmp_path, "lam_nondet", {}, "nondet-1"))
    FLIP.clear()
    result = on_lambda("lam_nondet", {}, "nondet-1")
    assert store_status.state == "failed"
    assert result.status.name == "FAILED"
    assert result.error is not None and result.error.type.endswith("WorkflowNondeterminismError")
    assert store_status.error == f"WorkflowNondeterminismError: {result.error.message}"
    assert 'step 1 of this run is "first", but this replay reached "changed"' in (
        result.error.message or ""
    )


def test_an_unknown_workflow_fails_the_execution_with_one_line() -> None:
    result = on_lambda("no_such_flow", {}, "unknown-1")
    assert result.status.name == "FAILED"
    message = result.error.message if result.error else ""
    assert "no workflow named 'no_such_flow'" in (message or "")
    assert "\n" not in (message or "")
