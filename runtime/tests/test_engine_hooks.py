"""Outcome hooks: what plugs into the engine sees each outcome in stage order, before and
after the driver records it; a run guard can skip an attempt."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from haze import App, JobContext, Queue, define_job, define_queue_config
from haze._engine.hooks import Outcome, PlainQuiet, Run, Skip, Stage
from haze_plain_conditions import plain_conditions

seen: list[tuple[str, str, str]] = []


@define_job(name="hooks_ok")
async def hooks_ok(payload: dict[str, Any]) -> str:
    return "fine"


@define_job(name="hooks_boom", tries=2, backoff=0)
async def hooks_boom(payload: dict[str, Any]) -> None:
    raise RuntimeError("boom")


released: list[str] = []


@define_job(name="hooks_release")
async def hooks_release(payload: dict[str, Any], job: JobContext) -> None:
    if not released:  # a release uses no attempt: the second run is attempt 1 again
        released.append(job.id)
        job.release(0)


class Recorder:
    def __init__(self, name: str) -> None:
        self.name = name

    async def settling(self, run: Run) -> None:
        seen.append((self.name, "settling", run.outcome))

    async def settled(self, run: Run) -> None:
        seen.append((self.name, "settled", run.outcome))


class SkipFlagged:
    async def admit(self, run: Run) -> Skip | None:
        return Skip("flagged") if run.message.payload.get("skip") else None


def memory_app() -> App:
    return App(queue=define_queue_config(connections={"memory": {"driver": "memory"}}))


async def test_hooks_see_each_outcome_in_stage_order_around_the_record() -> None:
    seen.clear()
    async with memory_app() as app:
        # Added out of order: the stage decides, then the order of adding.
        app.manager.hooks.add(Recorder("late"), Stage.NOTIFY)
        app.manager.hooks.add(Recorder("early"), Stage.CONTINUE)
        await hooks_ok.dispatch({})
        await Queue.idle()
    assert seen == [
        ("early", "settling", Outcome.SUCCESS),
        ("late", "settling", Outcome.SUCCESS),
        ("early", "settled", Outcome.SUCCESS),
        ("late", "settled", Outcome.SUCCESS),
    ]


async def test_hooks_see_retries_releases_and_the_final_failure() -> None:
    seen.clear()
    released.clear()
    async with memory_app() as app:
        app.manager.hooks.add(Recorder("h"), Stage.COUNT)
        await hooks_boom.dispatch({})
        await hooks_release.dispatch({})
        await Queue.idle()
    outcomes = [outcome for _, step, outcome in seen if step == "settled"]
    assert sorted(outcomes) == sorted(
        [Outcome.RETRY, Outcome.FAILED, Outcome.RELEASED, Outcome.SUCCESS]
    )


async def test_a_run_guard_skips_the_attempt() -> None:
    seen.clear()
    async with memory_app() as app:
        app.manager.hooks.add(Recorder("h"), Stage.COUNT)
        app.manager.hooks.guard(SkipFlagged())
        await hooks_ok.dispatch({"skip": True})
        await Queue.idle()
        assert await Queue.failed() == []
    assert seen == [("h", "settling", Outcome.SKIPPED), ("h", "settled", Outcome.SKIPPED)]


class Captured:
    """A loud hook (not ``Selective``): it sees every run, so it can keep one."""

    def __init__(self) -> None:
        self.runs: list[Run] = []

    async def settling(self, run: Run) -> None:
        self.runs.append(run)

    async def settled(self, run: Run) -> None:
        return None


class QuietCounter:
    """Declares itself ``PlainQuiet``: a plain success must not even ask ``wants``."""

    plain_quiet = True

    def __init__(self) -> None:
        self.asked: list[str] = []

    def wants(self, run: Run) -> bool:
        self.asked.append(run.outcome)
        return False

    async def settling(self, run: Run) -> None:
        return None

    async def settled(self, run: Run) -> None:
        return None


async def test_a_plain_success_asks_no_plain_quiet_hook_and_every_declaration_holds() -> None:
    captured, quiet = Captured(), QuietCounter()
    async with memory_app() as app:
        hooks = app.manager.hooks
        hooks.add(captured, Stage.NOTIFY)
        hooks.add(quiet, Stage.NOTIFY)
        await hooks_ok.dispatch({})
        await hooks_boom.dispatch({})
        await Queue.idle()
        # Every built-in hook and guard that says it is quiet for a plain success says
        # False when asked about one (so skipping the question changes nothing).
        plain = next(r for r in captured.runs if r.outcome == Outcome.SUCCESS)
        declared = [
            h for h in [*(e[0] for e in hooks._ordered), *hooks.guards] if isinstance(h, PlainQuiet)
        ]
        assert len(declared) >= 9
        for h in declared:
            if h is not quiet:
                assert h.wants(plain) is False, h
    # Asked only about the failing job's runs, never about the plain success.
    assert sorted(quiet.asked) == [Outcome.FAILED, Outcome.RETRY]


callers: list[str] = []


@define_job(name="hooks_caller")
async def hooks_caller(payload: dict[str, Any]) -> None:
    # the module that started this handler: the short path (haze._engine.plain) calls
    # its first step itself; the full way awaits it from the execution
    callers.append(sys._getframe(1).f_globals["__name__"])


async def test_queue_off_removes_a_listener_and_plain_jobs_take_the_short_path_again() -> None:
    """A ``before`` listener sends every plain claim the full way; once ``Queue.off``
    removed it, plain jobs run on the short path again."""
    ran: list[str] = []

    def before(job: JobContext) -> None:
        ran.append(job.name)

    async def callers_of_three() -> set[str]:
        callers.clear()
        for _ in range(3):  # queued together: the worker claims all but the first
            await hooks_caller.dispatch({})
        await Queue.idle()
        return set(callers)

    short = "haze._engine.plain"
    async with memory_app() as app:
        with plain_conditions(app):  # none left by earlier tests in this process
            assert short in await callers_of_three()
            Queue.on("before", before)
            try:
                assert short not in await callers_of_three()
            finally:
                Queue.off("before", before)
            assert ran == ["hooks_caller"] * 3
            assert short in await callers_of_three()
            Queue.off("before", before)  # not listening: nothing to remove
    assert ran == ["hooks_caller"] * 3


def test_queue_off_names_an_unknown_event() -> None:
    for call in (Queue.on, Queue.off):
        with pytest.raises(ValueError, match=r"^Queue\.o(n|ff): unknown queue event 'befor'"):
            call("befor", print)
