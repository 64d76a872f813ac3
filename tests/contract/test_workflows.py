"""Durable workflows on every driver: replay, kept results, sleeps, events, fan-out,
once-per-run dispatch, and each bad input as one clear error or a failed run.

The contract app keeps its store in memory (its worker runs in this process); the run
state on the shared stores (SQL, Redis) has its own suite
(``tests/workflows/test_state_stores.py``) and the real-process storm
(``tests/workflow_storm``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

import pytest
from haze import (
    ConfigError,
    Workflow,
    WorkflowLimitError,
    WorkflowRunError,
    define_job,
    workflow,
)
from haze._workflows.engine import workflow_state

CALLS: collections.Counter[str] = collections.Counter()
FAILED: list[tuple[str, str]] = []
TOGGLE = {"name": "first"}


@pytest.fixture(autouse=True)
def _reset() -> Any:
    CALLS.clear()
    FAILED.clear()
    TOGGLE["name"] = "first"


def count(what: str, value: Any = None) -> Any:
    CALLS[what] += 1
    return value if value is not None else what


@define_job(name="wfc_audit")
async def wfc_audit(payload: dict[str, Any]) -> None:
    CALLS[f"audit:{payload['user']}"] += 1


@workflow(name="wfc_onboard")
async def wfc_onboard(run: Any, user_id: int) -> dict[str, Any]:
    user = await run.step("fetch", count, "fetch", {"id": user_id})
    await run.sleep("cool-off", 0.3)
    answer = await run.wait_for_event("approved", timeout="1h")
    a, b = await run.gather(run.step("mail", count, "mail"), run.step("crm", count, "crm"))
    await run.dispatch(wfc_audit.with_({"user": user["id"]}))
    return {"user": user, "answer": answer, "mail": a, "crm": b}


async def test_a_run_replays_to_the_end_and_each_step_runs_once(
    app: Any, done: Any, driver: Any
) -> None:
    rid = await Workflow.start(wfc_onboard, user_id=7)
    before = await Workflow.status(rid)
    assert before is not None
    if not driver.inline:  # the event comes before its wait: it is kept for it
        assert "approved" not in [s.name for s in before.steps]
    await Workflow.send_event(rid, "approved", {"by": "ops"})
    st = await Workflow.wait(rid, timeout=20)
    await done()
    assert st.state == "done", st.error
    assert st.result == {"user": {"id": 7}, "answer": {"by": "ops"}, "mail": "mail", "crm": "crm"}
    assert [s.name for s in st.steps] == [
        "fetch",
        "cool-off",
        "approved",
        "mail",
        "crm",
        "dispatch:wfc_audit",
    ]
    assert all(s.state == "done" for s in st.steps)
    assert CALLS == {"fetch": 1, "mail": 1, "crm": 1, "audit:7": 1}
    assert [s.attempts for s in st.steps if s.kind == "step"] == [1, 1, 1]


async def test_start_is_idempotent_by_id_and_status_of_unknown_is_none(app: Any, done: Any) -> None:
    a = await Workflow.start(wfc_onboard, user_id=1, id="signup-1")
    b = await Workflow.start(wfc_onboard, user_id=1, id="signup-1")
    assert a == b == "signup-1"
    await Workflow.send_event(a, "approved", True)
    await Workflow.wait(a, timeout=20)
    await done()
    assert CALLS["fetch"] == 1
    assert await Workflow.status("no-such-run") is None
    assert len(await Workflow.list(name="wfc_onboard")) == 1


@workflow(name="wfc_waits")
async def wfc_waits(run: Any) -> Any:
    return await run.wait_for_event("go", timeout="1h")


async def test_wait_times_out_cancel_is_a_bool_and_events_need_a_live_run(
    app: Any, done: Any
) -> None:
    rid = await Workflow.start(wfc_waits)
    with pytest.raises(TimeoutError, match="still"):
        await Workflow.wait(rid, timeout=0.3)
    # the run reaches its wait when a worker gets to it: on a loaded machine that can be
    # after the 0.3 s (it was still "running" with no step in one CI run)
    st = await Workflow.status(rid)
    for _ in range(400):
        if st is not None and st.state != "running":
            break
        await asyncio.sleep(0.05)
        st = await Workflow.status(rid)
    assert st is not None and st.state == "waiting" and st.waiting_for == "go"
    assert await Workflow.cancel(rid) is True
    assert await Workflow.cancel(rid) is False
    assert await Workflow.cancel("no-such-run") is False
    with pytest.raises(WorkflowRunError, match="is cancelled"):
        await Workflow.send_event(rid, "go", 1)
    with pytest.raises(WorkflowRunError, match="no workflow run"):
        await Workflow.send_event("no-such-run", "go", 1)
    with pytest.raises(WorkflowLimitError, match="an event name must be a string of 1-255"):
        await Workflow.send_event(rid, "", 1)
    assert (await Workflow.wait(rid, timeout=5)).state == "cancelled"


@workflow(name="wfc_flaky")
async def wfc_flaky(run: Any) -> Any:
    def flaky() -> str:
        CALLS["flaky"] += 1
        if CALLS["flaky"] == 1:
            raise RuntimeError("first try fails")
        return run.step_key

    return await run.step("flaky", flaky, tries=2)


async def test_a_step_retries_with_its_own_tries_and_step_key_is_stable(
    app: Any, done: Any
) -> None:
    rid = await Workflow.start(wfc_flaky, id="flaky-1")
    st = await Workflow.wait(rid, timeout=20)
    assert st.state == "done" and st.result == "flaky-1:flaky"
    assert st.steps[0].attempts == 2


async def _failed_with(rid: str, quietly: Any, done: Any) -> str:
    st = await Workflow.wait(rid, timeout=20)
    await quietly(done())
    assert st.state == "failed", st
    assert st.error is not None
    return st.error


def _logged_in_one_line(caplog: Any, workflow_name: str, rid: str, reason: str) -> None:
    """A broken rule is the user's error, not a crash: the worker logs it as one line
    naming the workflow, the run and the rule, and no traceback."""
    records = [r for r in caplog.records if r.name.startswith("haze")]
    assert [r.getMessage() for r in records if r.exc_info or "Traceback" in r.getMessage()] == []
    lines = [r.getMessage() for r in records if reason in r.getMessage()]
    assert lines, [r.getMessage() for r in records]
    assert all(f'"{workflow_name}"' in line and rid in line for line in lines), lines
    assert all("\n" not in line for line in lines)


def _on_failed(run_id: str, error: BaseException) -> None:
    FAILED.append((run_id, type(error).__name__))


@workflow(name="wfc_nondet", failed=_on_failed)
async def wfc_nondet(run: Any) -> None:
    await run.step(TOGGLE["name"], count, "x")
    await run.wait_for_event("go")


async def test_nondeterminism_fails_the_run_naming_both_steps(
    app: Any, done: Any, quietly: Any, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG, logger="haze")
    rid = await Workflow.start(wfc_nondet)
    await done()
    TOGGLE["name"] = "second"
    await quietly(Workflow.send_event(rid, "go"))
    error = await _failed_with(rid, quietly, done)
    assert "WorkflowNondeterminismError" in error
    assert '"first"' in error and '"second"' in error
    assert [(rid, "WorkflowNondeterminismError")] == FAILED
    _logged_in_one_line(caplog, "wfc_nondet", rid, "the steps must come in the same order")


@workflow(name="wfc_twice")
async def wfc_twice(run: Any) -> None:
    await run.step("same", count, "a")
    await run.step("same", count, "b")


@workflow(name="wfc_not_json")
async def wfc_not_json(run: Any) -> None:
    await run.step("obj", lambda: object())


@workflow(name="wfc_big")
async def wfc_big(run: Any) -> None:
    await run.step("big", lambda: "x" * 10_000)


@workflow(name="wfc_many", max_steps=2)
async def wfc_many(run: Any) -> None:
    for i in range(3):
        await run.step(f"s{i}", count, "s")


@workflow(name="wfc_long_sleep")
async def wfc_long_sleep(run: Any) -> None:
    await run.sleep("forever", "366d")


@workflow(name="wfc_long_name")
async def wfc_long_name(run: Any) -> None:
    await run.step("n" * 256, count, "n")


@pytest.mark.parametrize(
    ("wf", "reason"),
    [
        (wfc_twice, 'the step name "same" is used twice'),
        (wfc_not_json, "which is not JSON"),
        (wfc_big, "over the connection's max_message_size of 4096 bytes"),
        (wfc_many, "more than 2 steps in one run"),
        (wfc_long_sleep, "over the 365-day limit"),
        (wfc_long_name, "1-255 characters, got 256 characters"),
    ],
    ids=["duplicate-name", "not-json", "too-large", "step-limit", "sleep-366d", "long-name"],
)
async def test_a_broken_rule_fails_the_run_with_its_reason(
    make_app: Any, done: Any, quietly: Any, wf: Any, reason: str, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG, logger="haze")
    async with make_app(options={"max_message_size": 4096}):
        rid = await quietly(Workflow.start(wf))
        if isinstance(rid, Exception):  # sync: the run ran inside start() and raised
            assert reason in str(rid)
            [run] = await Workflow.list(name=wf.name)
            rid = run.id
        error = await _failed_with(rid, quietly, done)
        assert reason in error
        assert "\n" not in error
        _logged_in_one_line(caplog, wf.name, rid, reason)


async def test_input_and_events_must_be_json(app: Any) -> None:
    with pytest.raises(TypeError, match="not JSON"):
        await Workflow.start(wfc_onboard, user_id=object())


async def test_input_that_does_not_fit_the_workflow_is_refused_at_start(app: Any) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'user'") as e:
        await Workflow.start(wfc_waits, user=1)
    assert 'Workflow.start("wfc_waits")' in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(TypeError, match="missing a required argument: 'user_id'"):
        await Workflow.start(wfc_onboard)
    assert await Workflow.list() == []


async def test_a_kv_store_is_refused_in_one_line() -> None:
    # Cloudflare KV's store class, never used: workflow_state refuses it by its
    # declared atomicity before any call reaches a binding.
    kv = pytest.importorskip("haze_cloudflare.kv").KVStore("kv")
    with pytest.raises(ConfigError, match='store "kv" is not atomic') as e:
        workflow_state(kv)
    assert "\n" not in str(e.value)


@workflow(name="wfc_sleeper")
async def wfc_sleeper(run: Any) -> str:
    await run.step("before", count, "before")
    await run.sleep("nap", 0.5)
    return await run.step("after", count, "after")


async def test_a_sleeping_run_holds_no_worker(make_app: Any, done: Any, driver: Any) -> None:
    if driver.inline:
        pytest.skip("sync runs a sleep's resume inline: a sleep there is skipped")
    async with make_app(concurrency=1):
        rids = [await Workflow.start(wfc_sleeper) for _ in range(4)]
        await asyncio.sleep(0.2)
        # four runs asleep on one slot: none holds it, so all four wake and finish
        for rid in rids:
            assert (await Workflow.wait(rid, timeout=20)).result == "after"
        assert CALLS == {"before": 4, "after": 4}


@workflow(name="wfc_fails_once")
async def wfc_fails_once(run: Any) -> str:
    await run.step("kept", count, "kept")

    def flaky() -> str:
        CALLS["flaky"] += 1
        if CALLS["flaky"] == 1:
            raise RuntimeError("down for now")
        return "up"

    return str(await run.step("flaky", flaky))


async def test_a_failed_run_is_retried_from_its_last_kept_step(
    app: Any, done: Any, quietly: Any
) -> None:
    from haze._workflows.api import retry

    rid = await quietly(Workflow.start(wfc_fails_once, id="retry-1"))
    assert "RuntimeError: down for now" in await _failed_with("retry-1", quietly, done)
    assert await retry("retry-1") is True
    st = await Workflow.wait("retry-1", timeout=20)
    assert (st.state, st.result) == ("done", "up"), rid
    assert CALLS == {"kept": 1, "flaky": 2}
    assert await retry("retry-1") is False  # done: nothing to retry


async def test_a_store_other_processes_cannot_see_is_warned_about(
    make_app: Any, remote_sim: Any, driver: Any, caplog: Any, done: Any
) -> None:
    if driver.id != "memory":
        pytest.skip("one run is enough: the remote-sim spec is the same on every driver")
    from haze._workflows import api

    api._warned.clear()
    async with make_app(spec=remote_sim):
        rid = await Workflow.start(wfc_waits)
        await Workflow.cancel(rid)
        await done()
    [line] = [r.getMessage() for r in caplog.records if "keeps workflow runs" in r.message]
    assert 'The "memory" store keeps workflow runs, but connection "main"' in line


@workflow(name="wfc_short_wait")
async def wfc_short_wait(run: Any) -> Any:
    return {"answer": await run.wait_for_event("go", timeout=0.3)}


async def test_a_wait_without_its_event_times_out_on_every_driver(app: Any, done: Any) -> None:
    # sync has no delayed message to end the wait: Workflow.wait ends it once due
    rid = await Workflow.start(wfc_short_wait)
    st = await Workflow.wait(rid, timeout=20)
    assert (st.state, st.result) == ("done", {"answer": None}), st.error
    assert [(s.name, s.state) for s in st.steps] == [("go", "done")]


@workflow(name="wfc_step_gives_up", tries=3, failed=_on_failed)
async def wfc_step_gives_up(run: Any) -> None:
    def down() -> None:
        CALLS["down"] += 1
        raise RuntimeError("the card service is down")

    await run.step("charge", down, tries=2)


async def test_a_step_that_fails_for_good_fails_the_run_without_the_runs_retries(
    app: Any, done: Any, quietly: Any
) -> None:
    # the workflow's own tries are for crashes mid-replay; a step's tries are its own
    await quietly(Workflow.start(wfc_step_gives_up, id="gives-up"))
    error = await _failed_with("gives-up", quietly, done)
    assert "RuntimeError: the card service is down" in error
    assert CALLS["down"] == 2
    assert FAILED == [("gives-up", "RuntimeError")]
    st = await Workflow.status("gives-up")
    assert st is not None and [(s.name, s.state, s.attempts) for s in st.steps] == [
        ("charge", "failed", 2)
    ]


@workflow(name="wfc_slow_step")
async def wfc_slow_step(run: Any) -> str:
    async def slow() -> str:
        CALLS["slow"] += 1
        await asyncio.sleep(0.3)
        return "slow"

    return str(await run.step("slow", slow))


async def test_concurrent_starts_with_one_id_make_one_run_that_runs_its_steps_once(
    make_app: Any, done: Any
) -> None:
    async with make_app(concurrency=3):
        ids = await asyncio.gather(*(Workflow.start(wfc_slow_step, id="once") for _ in range(3)))
        assert ids == ["once"] * 3
        st = await Workflow.wait("once", timeout=20)
        await done()
        assert (st.state, st.result) == ("done", "slow")
        assert CALLS["slow"] == 1
        assert [r.id for r in await Workflow.list(name="wfc_slow_step")] == ["once"]


@workflow(name="wfc_slow_then_wait")
async def wfc_slow_then_wait(run: Any) -> Any:
    async def slow() -> str:
        CALLS["slow"] += 1
        await asyncio.sleep(0.3)
        return "slow"

    await run.step("slow", slow)
    return await run.wait_for_event("go", timeout="1h")


async def test_an_early_event_does_not_replay_the_run_beside_itself(
    make_app: Any, done: Any
) -> None:
    # the event comes while the first step runs: it is kept for the wait, and its
    # resume does not run the step a second time on another slot
    async with make_app(concurrency=3):
        rid = await Workflow.start(wfc_slow_then_wait)
        await asyncio.sleep(0.1)
        assert await Workflow.send_event(rid, "other", {"n": 2}) is True
        assert await Workflow.send_event(rid, "go", {"n": 1}) is True
        st = await Workflow.wait(rid, timeout=20)
        await done()
        assert (st.state, st.result) == ("done", {"n": 1}), st.error
        assert CALLS["slow"] == 1


@workflow(name="wfc_dispatch_crash", tries=2)
async def wfc_dispatch_crash(run: Any) -> str:
    await run.dispatch(wfc_audit.with_({"user": "crash"}))
    return "sent"


async def test_a_dispatch_queued_again_after_a_crash_before_its_record_runs_once(
    app: Any, done: Any, driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process "dies" after queueing the job and before keeping its id: the write
    # fails once (an exception, so that the run's next delivery replays it here, as a
    # fresh worker would after a SIGKILL) and the replay queues the job again.
    if driver.inline:
        pytest.skip("sync runs the job inside the dispatch and has no second delivery")
    from haze.stores.workflow_state import KeyValueWorkflowState

    keep = KeyValueWorkflowState.keep_result
    died: list[str] = []

    async def dies_once(self: Any, run_id: str, name: str, result: str, now: float) -> str:
        if name.startswith("dispatch:") and not died:
            died.append(name)
            raise RuntimeError("the worker died here")
        return await keep(self, run_id, name, result, now)

    monkeypatch.setattr(KeyValueWorkflowState, "keep_result", dies_once)
    rid = await Workflow.start(wfc_dispatch_crash)
    st = await Workflow.wait(rid, timeout=20)
    await done()
    await asyncio.sleep(0.2)
    await done()
    assert (st.state, st.result, died) == ("done", "sent", ["dispatch:wfc_audit"])
    assert CALLS["audit:crash"] == 1


@workflow(name="wfc_bad_sleep", tries=3, failed=_on_failed)
async def wfc_bad_sleep(run: Any) -> None:
    CALLS["replays"] += 1
    await run.sleep("nap", "soon")


@workflow(name="wfc_bad_timeout", tries=3, failed=_on_failed)
async def wfc_bad_timeout(run: Any) -> None:
    CALLS["replays"] += 1
    await run.wait_for_event("go", timeout=-5)


@workflow(name="wfc_bad_backoff", tries=3, failed=_on_failed)
async def wfc_bad_backoff(run: Any) -> None:
    CALLS["replays"] += 1
    await run.step("charge", count, "charge", tries=2, backoff="later")


@pytest.mark.parametrize(
    ("wf", "reason"),
    [
        (wfc_bad_sleep, "run.sleep(\"nap\", ...): 'soon' is not a duration"),
        (wfc_bad_timeout, 'run.wait_for_event("go", timeout=...): duration must be a finite'),
        (wfc_bad_backoff, "run.step(\"charge\", backoff=...): 'later' is not a duration"),
    ],
    ids=["sleep", "wait-timeout", "step-backoff"],
)
async def test_a_bad_duration_fails_the_run_at_once_naming_the_call_and_value(
    app: Any, done: Any, quietly: Any, wf: Any, reason: str, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG, logger="haze")
    # a broken rule, not a crash: the workflow's tries=3 do not replay it
    rid = await quietly(Workflow.start(wf))
    if isinstance(rid, Exception):  # sync: the run ran inside start() and raised
        [run] = await Workflow.list(name=wf.name)
        rid = run.id
    error = await _failed_with(rid, quietly, done)
    assert "WorkflowLimitError" in error and reason in error, error
    assert "'soon'" in error or "-5" in error or "'later'" in error
    assert f'workflow "{wf.name}" (run {rid})' in error
    assert "\n" not in error
    assert CALLS["replays"] == 1
    assert [(rid, "WorkflowLimitError")] == FAILED
    assert "charge" not in CALLS
    _logged_in_one_line(caplog, wf.name, rid, reason)


@workflow(name="wfc_cancelled_mid")
async def wfc_cancelled_mid(run: Any) -> None:
    await run.step("before", count, "before")
    await run.sleep("nap", 0.2)
    await run.wait_for_event("go", timeout="1h")


async def test_a_cancelled_run_shows_the_step_it_stopped_at_as_cancelled(
    app: Any, driver: Any
) -> None:
    rid = await Workflow.start(wfc_cancelled_mid)
    with pytest.raises(TimeoutError, match="still"):
        await Workflow.wait(rid, timeout=0.8)
    assert await Workflow.cancel(rid) is True
    st = await Workflow.wait(rid, timeout=5)
    shown = [(s.name, s.state) for s in st.steps]
    if driver.inline:  # sync skips the sleep
        assert shown == [("before", "done"), ("nap", "done"), ("go", "cancelled")]
    else:
        assert shown[0] == ("before", "done") and shown[-1][1] == "cancelled", shown
    assert all(s.state in ("done", "cancelled") for s in st.steps), shown
    assert st.steps[-1].finished_at is None


@workflow(name="wfc_cancelled_asleep")
async def wfc_cancelled_asleep(run: Any) -> None:
    await run.sleep("nap", "1h")


async def test_a_run_cancelled_in_its_sleep_shows_the_sleep_cancelled(
    app: Any, driver: Any
) -> None:
    if driver.inline:
        pytest.skip("sync skips a sleep: there is no sleeping run to cancel")
    rid = await Workflow.start(wfc_cancelled_asleep)
    with pytest.raises(TimeoutError, match="still sleeping"):
        await Workflow.wait(rid, timeout=0.5)
    assert await Workflow.cancel(rid) is True
    st = await Workflow.status(rid)
    assert st is not None and st.state == "cancelled"
    assert [(s.name, s.state) for s in st.steps] == [("nap", "cancelled")]


@workflow(name="wfc_late_event")
async def wfc_late_event(run: Any) -> Any:
    first = await run.wait_for_event("go", timeout=0.3)
    return {"go": first, "next": await run.wait_for_event("next", timeout="1h")}


async def test_an_event_after_its_wait_timed_out_is_refused_like_one_to_a_finished_run(
    app: Any,
) -> None:
    # event names are unique in a run: no later wait can take an event whose wait
    # ended, so keeping it would keep it for nothing, and True would say it arrives
    rid = await Workflow.start(wfc_late_event)
    for _ in range(100):
        st = await Workflow.status(rid)
        assert st is not None
        if st.waiting_for == "next" or (st.state == "waiting" and st.resume_at is None):
            break
        if st.state == "waiting" and st.waiting_for == "go":  # sync: due once read
            with pytest.raises(TimeoutError):
                await Workflow.wait(rid, timeout=0.4)
        await asyncio.sleep(0.1)
    assert (st.steps[0].name, st.steps[0].state) == ("go", "done"), st
    with pytest.raises(WorkflowRunError, match='wait for the event "go" has ended') as e:
        await Workflow.send_event(rid, "go", {"late": True})
    assert rid in str(e.value) and "\n" not in str(e.value)
    assert await Workflow.send_event(rid, "next", 2) is True
    st = await Workflow.wait(rid, timeout=20)
    assert (st.state, st.result) == ("done", {"go": None, "next": 2}), st.error
    with pytest.raises(WorkflowRunError, match="is done"):
        await Workflow.send_event(rid, "go", 3)


@workflow(name="wfc_one_event")
async def wfc_one_event(run: Any) -> Any:
    got = await run.wait_for_event("go", timeout="1h")
    await run.wait_for_event("hold", timeout="1h")
    return got


async def test_an_event_sent_again_after_its_wait_got_one_is_not_kept(app: Any) -> None:
    rid = await Workflow.start(wfc_one_event)
    assert await Workflow.send_event(rid, "go", 1) is True
    for _ in range(100):
        st = await Workflow.status(rid)
        if st is not None and st.waiting_for == "hold":
            break
        await asyncio.sleep(0.1)
    assert await Workflow.send_event(rid, "go", 2) is False  # the first wins
    assert await Workflow.cancel(rid) is True
