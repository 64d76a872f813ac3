"""Plain jobs (a payload-only async handler, no options that need a hook): the memory
driver runs them through a short path, dispatch straight to its queue and claim to ack
in one call. These pin that every deviation from a quiet success behaves as the full
path does, on every driver: a job that raises, is retried, fails for good, suspends,
is redefined, or meets listeners and log lines added after its first run."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest
from haze import JobContext, Queue, current_tenant, define_job, tenant
from haze._jobs.definition import JobDefinition

SEEN: list[Any] = []
FAILED: list[Any] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()
    FAILED.clear()


@define_job(name="pl_ok")
async def pl_ok(payload: dict[str, Any]) -> None:
    SEEN.append(("ok", payload, current_tenant()))
    payload["touched"] = True


@define_job(name="pl_flaky", tries=3)
async def pl_flaky(payload: dict[str, Any]) -> None:
    SEEN.append(("flaky", dict(payload)))
    payload["mutated"] = True
    if sum(1 for s in SEEN if s[0] == "flaky") < payload["ok_at"]:
        raise RuntimeError("flaky")


def _failed_handler(payload: Any, error: BaseException, job: JobContext) -> None:
    FAILED.append((payload, str(error), job.attempt))


@define_job(name="pl_doomed", tries=2, failed=_failed_handler)
async def pl_doomed(payload: dict[str, Any]) -> None:
    SEEN.append(("doomed", dict(payload)))
    payload["mutated"] = True
    raise ValueError(f"doomed {payload['n']}")


@define_job(name="pl_slow", tries=2)
async def pl_slow(payload: dict[str, Any]) -> None:
    await asyncio.sleep(0.01)
    SEEN.append(("slow", payload))
    if payload.get("fail_once") and sum(1 for s in SEEN if s[0] == "slow") == 1:
        raise RuntimeError("slow failure")


@define_job(name="pl_none")
async def pl_none() -> None:
    SEEN.append(("none",))


@define_job(name="pl_parent")
async def pl_parent(payload: dict[str, Any]) -> None:
    SEEN.append(("parent", current_tenant()))
    await pl_ok.dispatch({"child": payload["n"]})


@define_job(name="pl_mangle", tries=2)
async def pl_mangle(payload: Any) -> None:
    # mutates every level it can reach, then fails once: the retry must not see it
    SEEN.append(("mangle", copy.deepcopy(payload)))
    if isinstance(payload, dict):
        payload["top"] = "changed"
        for v in payload.values():
            if isinstance(v, list):
                v.append("changed")
            elif isinstance(v, dict):
                v["changed"] = True
    elif isinstance(payload, list):
        payload.append("changed")
    if sum(1 for s in SEEN if s[0] == "mangle") == 1:
        raise RuntimeError("mangled")


@define_job(name="pl_ctx")
async def pl_ctx(payload: dict[str, Any], job: JobContext) -> None:
    SEEN.append(("ctx", job.id, job.attempt, job.tries, payload))


async def test_a_plain_job_gets_a_copy_and_dispatch_returns_its_id(app, done) -> None:
    payload: dict[str, Any] = {"n": 1, "items": [1, (2, 3)]}
    job_id = await pl_ok.dispatch(payload)
    payload["n"] = 2
    assert isinstance(job_id, str) and job_id
    await done()
    assert SEEN == [("ok", {"n": 1, "items": [1, [2, 3]], "touched": True}, None)]
    assert "touched" not in payload


async def test_a_plain_payload_json_cannot_carry_is_refused_at_dispatch(app, done) -> None:
    with pytest.raises(TypeError):
        await pl_ok.dispatch({"when": object()})
    await done()
    assert SEEN == []


async def test_a_plain_job_without_parameters(app, done) -> None:
    await pl_none.dispatch()
    await done()
    assert SEEN == [("none",)]


@pytest.mark.requires("retries")
async def test_a_plain_job_that_raises_is_retried_with_its_original_payload(app, done) -> None:
    await pl_flaky.dispatch({"ok_at": 3})
    await done()
    assert SEEN == [("flaky", {"ok_at": 3})] * 3
    assert await Queue.failed() == []


@pytest.mark.requires("retries")
@pytest.mark.parametrize(
    "sent",
    [
        {"n": 1, "s": "x"},
        {"n": 1, "tags": ["a"], "inner": {"k": [1, 2]}},
        [1, "a", None],
        [1, [2], {"k": "v"}],
        "text",
        7,
    ],
)
async def test_a_plain_job_that_mutates_its_payload_then_fails_is_retried_with_the_original(
    app, done, sent
) -> None:
    sent_copy = copy.deepcopy(sent)
    await pl_mangle.dispatch(sent)
    await done()
    assert [("mangle", sent_copy)] * 2 == SEEN
    assert sent == sent_copy  # the caller's object: never touched by the job
    assert await Queue.failed() == []


@pytest.mark.requires("retries")
async def test_a_plain_job_that_fails_for_good_is_recorded_once(app, driver, done) -> None:
    job_id = await pl_doomed.dispatch({"n": 7})
    await done()
    assert SEEN == [("doomed", {"n": 7})] * 2
    assert len(FAILED) == 1
    payload, error, attempt = FAILED[0]
    assert (payload["n"], error, attempt) == (7, "doomed 7", 2)
    if driver.stores_failed:
        failed = await Queue.failed()
        assert [f.id for f in failed] == [job_id]
        assert failed[0].payload == {"n": 7}  # as dispatched, not as the job left it
        assert "doomed 7" in failed[0].exception


@pytest.mark.requires("retries")
async def test_a_plain_job_that_suspends_then_fails_is_retried(app, done) -> None:
    await pl_slow.dispatch({"fail_once": True})
    await done()
    assert [s[0] for s in SEEN] == ["slow", "slow"]
    assert await Queue.failed() == []


async def test_idle_waits_for_a_plain_job_that_suspends(app, done) -> None:
    for i in range(3):
        await pl_slow.dispatch({"i": i})
    await done()
    assert sorted(s[1]["i"] for s in SEEN) == [0, 1, 2]


async def test_a_plain_job_runs_as_its_app_and_tenant(app, done) -> None:
    with tenant("acme"):
        await pl_parent.dispatch({"n": 5})
    await done()
    assert ("parent", "acme") in SEEN
    assert ("ok", {"child": 5, "touched": True}, "acme") in SEEN


async def test_listeners_added_after_the_first_run_are_called(app, done) -> None:
    await pl_ok.dispatch({"n": 0})
    await done()
    seen: list[tuple[str, str]] = []

    def before(job: JobContext) -> None:
        seen.append(("before", job.id))

    def after(job: JobContext) -> None:
        seen.append(("after", job.id))

    Queue.on("before", before)
    Queue.on("after", after)
    try:
        job_id = await pl_ok.dispatch({"n": 1})
        await done()
    finally:
        import haze._engine.manager

        haze._engine.manager.events.off("before", before)
        haze._engine.manager.events.off("after", after)
    assert seen == [("before", job_id), ("after", job_id)]


async def test_job_lines_are_logged_for_a_plain_job(app, done, caplog) -> None:
    await pl_ok.dispatch({"n": 0})
    await done()
    with caplog.at_level(logging.DEBUG, logger="haze.job"):
        await pl_ok.dispatch({"n": 1})
        await done()
    states = [getattr(r, "state", None) for r in caplog.records if r.name == "haze.job"]
    assert states == ["running", "done"]
    assert all(r.attempt == 1 for r in caplog.records if r.name == "haze.job")


async def test_a_redefined_job_runs_its_new_handler(app, done) -> None:
    ran: list[Any] = []

    async def first(payload: dict[str, Any]) -> None:
        ran.append(("first", payload))

    async def second(payload: dict[str, Any], job: JobContext) -> None:
        ran.append(("second", payload, job.attempt))

    one = JobDefinition(first, name="pl_redefined", origin="test_plain_jobs:redefined")
    await one.dispatch({"n": 1})
    await done()
    JobDefinition(second, name="pl_redefined", origin="test_plain_jobs:redefined")
    await one.dispatch({"n": 2})  # the message names the job: the new handler runs it
    await done()
    assert ran == [("first", {"n": 1}), ("second", {"n": 2}, 1)]


async def test_a_job_that_takes_its_context_sees_its_id_and_attempt(app, done) -> None:
    job_id = await pl_ctx.dispatch({"n": 1})
    await done()
    assert [("ctx", job_id, 1, 1, {"n": 1})] == SEEN


async def test_size_counts_plain_jobs_until_they_run(app, driver, done) -> None:
    if driver.inline or driver.remote:
        pytest.skip("consumed inside dispatch() or by another worker meanwhile")
    for i in range(4):
        await pl_ok.dispatch({"n": i})
    assert await Queue.size() == 4
    await done()
    assert await Queue.size() == 0
    assert len(SEEN) == 4
