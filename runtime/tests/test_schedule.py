"""``schedule()``: fire times (cron in a time zone across DST, every=), declaration
errors, the Scheduler's claim, lease and catch-up rules on a memory store, and the
``schedule:*`` commands through CliRunner."""

from __future__ import annotations

import asyncio
import itertools
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from haze import (
    App,
    JobContext,
    ScheduleError,
    define_job,
    define_queue_config,
    schedule,
)
from haze._orchestration import scheduling
from haze._orchestration.scheduling import Scheduler, dispatch_due, registered_schedules
from haze.cli import get_cli

ran: list[tuple[Any, str | None]] = []


@define_job(name="sched_test_report")
async def report(payload: Any, job: JobContext) -> None:
    meta = job.message.meta or {}
    ran.append((payload, meta.get("fire_at")))


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    # Each CLI test's app defines the same job from its own folder: jobs are restored too.
    from haze._jobs import definition as jobs

    saved, saved_jobs = dict(scheduling._registry), dict(jobs._registry)
    scheduling._registry.clear()
    ran.clear()
    yield
    scheduling._registry.clear()
    scheduling._registry.update(saved)
    jobs._registry.clear()
    jobs._registry.update(saved_jobs)


# -- fire times -------------------------------------------------------------------------


def test_cron_in_paris_across_spring_forward() -> None:
    s = schedule(report, cron="30 2 * * *", tz="Europe/Paris", name="night")
    got = list(s.fire_times(utc(2026, 3, 27, 12), utc(2026, 3, 31, 0)))
    # 02:30 does not exist on 29 March: it fires at 03:00 CEST (01:00 UTC), once.
    assert [t.isoformat() for t in got] == [
        "2026-03-28T01:30:00+00:00",
        "2026-03-29T01:00:00+00:00",
        "2026-03-30T00:30:00+00:00",
    ]


def test_cron_in_paris_across_fall_back() -> None:
    s = schedule(report, cron="30 2 * * *", tz="Europe/Paris", name="night")
    got = list(s.fire_times(utc(2026, 10, 24, 12), utc(2026, 10, 27, 12)))
    # 02:30 happens twice on 25 October: it fires once, at the first (CEST, 00:30 UTC).
    assert [t.isoformat() for t in got] == [
        "2026-10-25T00:30:00+00:00",
        "2026-10-26T01:30:00+00:00",
        "2026-10-27T01:30:00+00:00",
    ]


def test_nine_in_paris_moves_in_utc_with_dst() -> None:
    s = schedule(report.with_({"kind": "daily"}), cron="0 9 * * *", tz="Europe/Paris")
    assert s.name == "sched_test_report"
    got = list(s.fire_times(utc(2026, 10, 24, 0), utc(2026, 10, 26, 23)))
    assert [t.hour for t in got] == [7, 8, 8]
    assert s.is_due_at(utc(2026, 10, 26, 8))
    assert not s.is_due_at(utc(2026, 10, 26, 7))
    assert s.latest_at_or_before(utc(2026, 10, 26, 8)) == utc(2026, 10, 26, 8)
    assert s.latest_at_or_before(utc(2026, 10, 26, 7, 59, 59)) == utc(2026, 10, 25, 8)


def test_cron_without_tz_is_utc() -> None:
    s = schedule(report, cron="0 9 * * 1-5")
    got = list(s.fire_times(utc(2026, 12, 4, 12), utc(2026, 12, 8, 12)))  # Fri..Tue
    assert got == [utc(2026, 12, 7, 9), utc(2026, 12, 8, 9)]
    assert s.describe() == "cron 0 9 * * 1-5 (UTC)"


def test_every_is_aligned_to_the_epoch() -> None:
    s = schedule(report, every="15m")
    got = list(s.fire_times(utc(2026, 1, 1, 10, 7, 30), utc(2026, 1, 1, 11, 0)))
    assert [t.minute for t in got] == [15, 30, 45, 0]
    assert s.next_after(utc(2026, 1, 1, 10, 15)) == utc(2026, 1, 1, 10, 30)
    assert s.latest_at_or_before(utc(2026, 1, 1, 10, 14, 59)) == utc(2026, 1, 1, 10, 0)
    assert s.describe() == "every 15m"
    one = schedule(report, every="1s", name="fast")
    assert len(list(one.fire_times(utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 10)))) == 10


# -- declaration errors -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"cron": "61 * * * *"}, "cron '61 * * * *' is not a valid cron expression"),
        ({"cron": "* * *"}, "cron '* * *' has 3 fields"),
        ({"cron": 5}, "cron must be a cron expression"),
        ({"every": "soon"}, "'soon' is not a duration"),
        ({"every": "500ms"}, "under 1s"),
        ({"every": 0}, "greater than 0"),
        ({"cron": "0 9 * * *", "tz": "Mars/Olympus"}, "tz 'Mars/Olympus' is not a known time zone"),
        ({"every": "1d", "tz": "Europe/Paris"}, "tz applies to cron schedules"),
        ({}, "give exactly one of cron="),
        ({"cron": "0 9 * * *", "every": "1h"}, "give exactly one of cron="),
        ({"cron": "0 9 * * *", "catch_up": "yes"}, "catch_up must be True or False"),
    ],
)
def test_bad_declarations_name_the_schedule_and_value(
    kwargs: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ScheduleError) as e:
        schedule(report, name="nightly", **kwargs)
    message = str(e.value)
    assert expected in message
    assert message.startswith('schedule "nightly" (')
    assert "test_schedule.py:" in message
    assert "\n" not in message
    assert registered_schedules() == {}


def test_not_a_job() -> None:
    with pytest.raises(ScheduleError, match="expected a job"):
        schedule(print, every="1m")  # type: ignore[arg-type]


def test_duplicate_names_are_refused_with_both_places() -> None:
    schedule(report, every="1m")
    with pytest.raises(ScheduleError) as e:
        schedule(report, cron="0 9 * * *")
    assert 'two schedules are named "sched_test_report"' in str(e.value)
    assert str(e.value).count("test_schedule.py:") == 2
    schedule(report, cron="0 9 * * *", name="other")
    assert list(registered_schedules()) == ["sched_test_report", "other"]


def test_the_same_declaration_read_again_replaces_itself() -> None:
    for _ in range(2):  # a second App reading config/schedule.py runs the same line
        schedule(report, every="1m", name="again")
    assert list(registered_schedules()) == ["again"]


# -- the scheduler ------------------------------------------------------------------------


def memory_app() -> App:
    return App(
        queue=define_queue_config(default="memory", connections={"memory": {"driver": "memory"}})
    )


async def test_two_schedulers_dispatch_each_tick_once() -> None:
    s = schedule(report.with_({"n": 1}), every="10s", name="ten")
    async with memory_app() as app:
        from haze import Queue

        a, b = Scheduler(app), Scheduler(app)
        t0 = utc(2026, 1, 1, 12, 0, 0, 500000)
        await a.step(t0)
        await b.step(t0)
        assert a.leader and not b.leader
        for i in range(1, 4):
            await a.step(t0 + timedelta(seconds=10 * i))
            await b.step(t0 + timedelta(seconds=10 * i))
        # The lease holder dies: the other takes over once the lease expires, and
        # resumes after the last tick dispatched (nothing lost, nothing twice).
        await app.store().delete("haze:schedule:leader")
        await b.step(t0 + timedelta(seconds=65))
        assert b.leader
        await Queue.idle()
    fired = [at for _, at in ran]
    assert fired == [
        (utc(2026, 1, 1, 12, 0, 0) + timedelta(seconds=10 * i)).isoformat() for i in range(1, 7)
    ]
    assert len(set(fired)) == len(fired)
    assert s.tick_key(utc(2026, 1, 1, 12, 0, 10)).endswith(":1767268810000")


async def test_two_leaders_at_once_still_dispatch_each_tick_once() -> None:
    """A leader stalled past its lease (a VM pause) runs next to the new one: the claim
    on (name, fire time) keeps each tick to one dispatch."""
    schedule(report, every="1s", name="second")
    async with memory_app() as app:
        from haze import Queue

        a, b = Scheduler(app), Scheduler(app)
        t0 = utc(2026, 1, 1, 12)
        await a.step(t0)
        await app.store().delete("haze:schedule:leader")
        await b.step(t0)
        assert a.leader and b.leader
        for i in range(1, 6):
            await a.step(t0 + timedelta(seconds=i))
            await b.step(t0 + timedelta(seconds=i, milliseconds=300))
        await Queue.idle()
    fired = [at for _, at in ran]
    assert sorted(fired) == [(t0 + timedelta(seconds=i)).isoformat() for i in range(1, 6)]
    assert a.dispatched + b.dispatched == 5


GATE: dict[str, asyncio.Event] = {}


@define_job(name="sched_test_slow")
async def slow(payload: Any, job: JobContext) -> None:
    GATE["started"].set()
    await GATE["go"].wait()


async def test_a_tick_whose_job_is_still_queued_or_running_at_the_next_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = schedule(slow, every="1s", name="busy")
    GATE.update(started=asyncio.Event(), go=asyncio.Event())
    async with memory_app() as app:  # one job at a time: tick 2 waits behind tick 1
        from haze import Queue

        sched = Scheduler(app)
        t0 = utc(2026, 1, 1, 12)
        try:
            await sched.step(t0)
            await sched.step(t0 + timedelta(seconds=1))  # tick 1 sent
            await asyncio.wait_for(GATE["started"].wait(), 5)  # and running
            with caplog.at_level("WARNING", logger="haze"):
                await sched.step(t0 + timedelta(seconds=2))
            assert 'schedule "busy": the job of its tick of' in caplog.text
            assert "is still running at the next tick" in caplog.text
            sched._warned.clear()  # it warns once a minute: look again now
            caplog.clear()
            with caplog.at_level("WARNING", logger="haze"):
                await sched.step(t0 + timedelta(seconds=3))  # tick 2 waits behind 1
            assert "is still queued at the next tick" in caplog.text
        finally:
            GATE["go"].set()
        await Queue.idle()
        sched._warned.clear()
        caplog.clear()
        with caplog.at_level("WARNING", logger="haze"):
            await sched.step(t0 + timedelta(seconds=4))
        assert "still" not in caplog.text
        # A tick's once key lives as long as its own window, not as long as batches.
        once = scheduling.tick_once_key(s, t0 + timedelta(seconds=1))
        ttl = await app.manager.stores.batches().ttl(once)
        assert ttl is not None
        assert ttl <= 1 + 2 * scheduling.MISFIRE_GRACE + scheduling.LEASE


async def test_missed_ticks_are_skipped_without_catch_up() -> None:
    schedule(report, cron="0 9 * * *", name="daily")
    async with memory_app() as app:
        from haze import Queue

        store = app.store()
        await store.put("haze:schedule:daily:last", utc(2026, 1, 1, 9).timestamp())
        sched = Scheduler(app)
        await sched.step(utc(2026, 1, 3, 10))  # down through two 09:00 ticks
        await sched.step(utc(2026, 1, 4, 9, 0, 5))  # the next one fires, a bit late
        await Queue.idle()
    assert [at for _, at in ran] == [utc(2026, 1, 4, 9).isoformat()]


async def test_catch_up_replays_only_the_latest_missed_tick() -> None:
    schedule(report, cron="0 9 * * *", name="daily", catch_up=True)
    async with memory_app() as app:
        from haze import Queue

        store = app.store()
        await store.put("haze:schedule:daily:last", utc(2026, 1, 1, 9).timestamp())
        first, second = Scheduler(app), Scheduler(app)
        await first.step(utc(2026, 1, 3, 10))
        await store.delete("haze:schedule:leader")
        await second.step(utc(2026, 1, 3, 10, 5))  # another start: already caught up
        await Queue.idle()
    assert [at for _, at in ran] == [utc(2026, 1, 3, 9).isoformat()]


async def test_catch_up_on_a_schedule_that_never_ran_replays_nothing() -> None:
    schedule(report, cron="0 9 * * *", name="daily", catch_up=True)
    async with memory_app() as app:
        from haze import Queue

        await Scheduler(app).step(utc(2026, 1, 3, 10))
        await Queue.idle()
    assert ran == []


async def test_dispatch_due_fires_what_a_platform_trigger_names() -> None:
    a = schedule(report.with_({"n": "a"}), cron="*/5 * * * *", name="five")
    b = schedule(report.with_({"n": "b"}), cron="0 * * * *", name="hourly")
    async with memory_app() as app:
        from haze import Queue

        assert await dispatch_due(app, utc(2026, 1, 1, 10, 5, 0, 120000)) == ["five"]
        assert await dispatch_due(app, utc(2026, 1, 1, 11, 0)) == ["five", "hourly"]
        # A trigger delivered twice dispatches once.
        assert await dispatch_due(app, utc(2026, 1, 1, 11, 0), [a, b]) == []
        await Queue.idle()
    assert sorted(p["n"] for p, _ in ran) == ["a", "a", "b"]


# -- config/schedule.py and the CLI ---------------------------------------------------------


def write_app(root: Path, schedules: str, default: str = "memory") -> Path:
    (root / "config").mkdir(parents=True)
    (root / "app" / "job").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(
        textwrap.dedent(f"""
        from haze import define_queue_config
        config = define_queue_config(default={default!r}, connections={{
            "memory": {{"driver": "memory"}},
            "sqlite": {{"driver": "database", "connection": "main"}},
        }})
        """)
    )
    (root / "config" / "database.py").write_text(
        "from haze import define_database_config\n"
        'config = define_database_config(default="main", connections={"main": '
        '{"url": "sqlite:///db.sqlite"}})\n'
    )
    (root / "app" / "job" / "sched_cli_jobs.py").write_text(
        textwrap.dedent("""
        from haze import define_job

        @define_job(name="sched_cli_ping")
        async def ping(payload=None):
            pass
        """)
    )
    (root / "config" / "schedule.py").write_text(textwrap.dedent(schedules))
    return root


SCHEDULES = """
from haze import schedule
from app.job.sched_cli_jobs import ping

schedule(ping.with_({"kind": "daily"}), cron="0 9 * * *", tz="Europe/Paris", name="daily")
schedule(ping, every="15m")
"""


@pytest.mark.usefixtures("isolated_imports")
def test_app_loads_config_schedule_and_list_prints_next_three(tmp_path: Path) -> None:
    root = write_app(tmp_path, SCHEDULES)
    App(root=root)
    assert list(registered_schedules()) == ["daily", "sched_cli_ping"]
    result = CliRunner().invoke(get_cli(), ["--root", str(root), "schedule:list"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("daily  sched_cli_ping  cron 0 9 * * * (Europe/Paris)  next: ")
    assert lines[0].count("09:00:00 CE") == 3
    assert lines[1].startswith("sched_cli_ping  sched_cli_ping  every 15m  next: ")
    assert lines[1].count(" UTC") == 3


@pytest.mark.usefixtures("isolated_imports")
def test_schedule_run_dispatches_now(tmp_path: Path) -> None:
    root = write_app(tmp_path, SCHEDULES, default="sqlite")
    runner = CliRunner()
    for setup in ("make:queue-tables", "db:migrate"):
        done = runner.invoke(get_cli(), ["--root", str(root), setup])
        assert done.exit_code == 0, done.output
    result = runner.invoke(get_cli(), ["--root", str(root), "schedule:run", "daily"])
    assert result.exit_code == 0, result.output
    assert result.output == 'Dispatched schedule "daily" (sched_cli_ping).\n'
    size = runner.invoke(get_cli(), ["--root", str(root), "queue:size"])
    assert "1" in size.output, size.output
    bad = runner.invoke(get_cli(), ["--root", str(root), "schedule:run", "dialy"])
    assert bad.exit_code == 1
    assert bad.output.startswith("Error: no schedule named 'dialy'")
    assert "did you mean 'daily'" in bad.output
    assert "Traceback" not in bad.output


@pytest.mark.usefixtures("isolated_imports")
def test_bad_schedule_file_is_one_line(tmp_path: Path) -> None:
    root = write_app(
        tmp_path,
        "from haze import schedule\nfrom app.job.sched_cli_jobs import ping\n"
        "schedule(ping, cron='0 25 * * *')\n",
    )
    result = CliRunner().invoke(get_cli(), ["--root", str(root), "schedule:list"])
    assert result.exit_code == 1
    assert 'schedule "sched_cli_ping"' in result.output
    assert "'0 25 * * *' is not a valid cron expression (Bad hour)" in result.output
    assert "schedule.py:3" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.usefixtures("isolated_imports")
def test_schedule_work_refuses_a_memory_connection_and_no_schedules(tmp_path: Path) -> None:
    root = write_app(tmp_path, SCHEDULES)
    result = CliRunner().invoke(get_cli(), ["--root", str(root), "schedule:work"])
    assert result.exit_code == 1
    assert 'schedule "daily" dispatches to connection "memory"' in result.output
    assert "queue:work --schedule" in result.output
    (root / "config" / "schedule.py").write_text("")
    scheduling._registry.clear()
    result = CliRunner().invoke(get_cli(), ["--root", str(root), "schedule:work"])
    assert result.exit_code == 1
    assert "no schedules are declared" in result.output


# -- platform triggers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "cloudflare", "eventbridge"),
    [
        ({"every": "15m"}, "*/15 * * * *", "cron(0/15 * * * ? *)"),
        ({"every": "1m"}, "* * * * *", "cron(* * * * ? *)"),
        ({"every": "2h"}, "0 */2 * * *", "cron(0 0/2 * * ? *)"),
        ({"every": "1h"}, "0 * * * *", "cron(0 * * * ? *)"),
        ({"every": "1d"}, "0 0 * * *", "cron(0 0 * * ? *)"),
        ({"cron": "0 9 * * *"}, "0 9 * * *", "cron(0 9 * * ? *)"),
        # Cloudflare and EventBridge count weekdays 1-7 from Sunday; cron 0-7 (0, 7: Sunday)
        ({"cron": "0 9 * * 1-5"}, "0 9 * * 2-6", "cron(0 9 ? * 2-6 *)"),
        ({"cron": "30 6 * * 0"}, "30 6 * * 1", "cron(30 6 ? * 1 *)"),
        ({"cron": "30 6 * * 7"}, "30 6 * * 1", "cron(30 6 ? * 1 *)"),
        ({"cron": "0 9 * * 5-7"}, "0 9 * * 6,7,1", "cron(0 9 ? * 6,7,1 *)"),
        ({"cron": "0 9 * * */2"}, "0 9 * * 1,3,5,7", "cron(0 9 ? * 1,3,5,7 *)"),
        ({"cron": "0 9 * * 1,3"}, "0 9 * * 2,4", "cron(0 9 ? * 2,4 *)"),
        ({"cron": "0 6 * * MON#1"}, "0 6 * * MON#1", "cron(0 6 ? * MON#1 *)"),
        ({"cron": "0 9 * * MON-FRI"}, "0 9 * * MON-FRI", "cron(0 9 ? * MON-FRI *)"),
        ({"cron": "0 9 * * 5L"}, "0 9 * * 6L", "cron(0 9 ? * 6L *)"),
        ({"cron": "0 9 * * 1#2"}, "0 9 * * 2#2", "cron(0 9 ? * 2#2 *)"),
        ({"cron": "0 9 L * *"}, "0 9 L * *", "cron(0 9 L * ? *)"),
        ({"cron": "0 0 1 * *"}, "0 0 1 * *", "cron(0 0 1 * ? *)"),
        ({"cron": "0 0 9 * * *"}, "0 9 * * *", "cron(0 9 * * ? *)"),
        ({"cron": "0 9 * * *", "tz": "UTC"}, "0 9 * * *", "cron(0 9 * * ? *)"),
        # In a zone: a trigger every hour at its minutes; the handler checks the zone.
        ({"cron": "30 9 * * 1-5", "tz": "Europe/Paris"}, "30 * * * *", "cron(30 * * * ? *)"),
    ],
)
def test_platform_triggers(kwargs: dict[str, Any], cloudflare: str, eventbridge: str) -> None:
    s = schedule(report, name="t", **kwargs)
    assert scheduling.utc_cron(s) == cloudflare
    assert scheduling.eventbridge_cron(s) == eventbridge


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"every": "1s"}, "every=1s has no Cloudflare cron trigger"),
        ({"every": "7m"}, "every=7m has no Cloudflare cron trigger"),
        ({"every": "5h"}, "every=5h has no Cloudflare cron trigger"),
        ({"cron": "*/10 * * * * *"}, "has a seconds field; Cloudflare cron triggers"),
        ({"cron": "0 9 * * *", "tz": "Asia/Kolkata"}, "not a whole number of hours from UTC"),
    ],
)
def test_platform_triggers_refused(kwargs: dict[str, Any], expected: str) -> None:
    s = schedule(report, name="t", **kwargs)
    with pytest.raises(ScheduleError) as e:
        scheduling.utc_cron(s)
    assert expected in str(e.value)
    assert str(e.value).startswith('schedule "t" (')


def test_triggers_cannot_or_days() -> None:
    """cron fires on day 1 OR on Mondays; neither platform's triggers say OR."""
    s = schedule(report, cron="0 9 1 * 1", name="t")
    for convert in (scheduling.utc_cron, scheduling.eventbridge_cron):
        with pytest.raises(ScheduleError, match="both a day of the month and a day of the week"):
            convert(s)


async def test_dispatch_trigger_checks_the_zone() -> None:
    schedule(report.with_({"n": "paris"}), cron="30 9 * * *", tz="Europe/Paris", name="paris")
    schedule(report.with_({"n": "utc"}), cron="30 * * * *", name="hourly")
    assert scheduling.platform_triggers("cloudflare") == {"30 * * * *": ["paris", "hourly"]}
    async with memory_app() as app:
        from haze import Queue

        # 07:30 UTC in summer is 09:30 in Paris; 08:30 UTC is not.
        at = utc(2026, 7, 1, 7, 30, 0)
        assert await scheduling.dispatch_trigger(app, "cloudflare", "30 * * * *", at) == [
            "paris",
            "hourly",
        ]
        at = utc(2026, 7, 1, 8, 30, 41)  # the trigger's time within its minute
        assert await scheduling.dispatch_trigger(app, "cloudflare", "30 * * * *", at) == ["hourly"]
        assert await scheduling.dispatch_trigger(app, "cloudflare", "0 5 * * *", at) == []
        await Queue.idle()
    assert sorted(p["n"] for p, _ in ran) == ["paris", "utc", "utc"]


@pytest.mark.usefixtures("isolated_imports")
def test_queue_work_schedule_runs_a_memory_queue_in_process(tmp_path: Path) -> None:
    """``queue:work`` refuses a memory connection, except with ``--schedule``: the
    scheduler dispatches into the worker's own process, which runs the jobs."""
    root = write_app(
        tmp_path,
        "from haze import schedule\nfrom app.job.sched_cli_jobs import ping\n"
        "schedule(ping, every='1s', name='second')\n",
    )
    (root / "app" / "job" / "sched_cli_jobs.py").write_text(
        textwrap.dedent(f"""
        from haze import define_job

        @define_job(name="sched_cli_ping")
        async def ping(payload=None, job=None):
            with open({str(tmp_path / "runs.txt")!r}, "a") as f:
                f.write(job.message.meta["fire_at"] + "\\n")
        """)
    )
    runner = CliRunner()
    refused = runner.invoke(get_cli(), ["--root", str(root), "queue:work"])
    assert refused.exit_code == 1
    assert "is a memory queue" in refused.output
    result = runner.invoke(
        get_cli(), ["--root", str(root), "queue:work", "--schedule", "--max-time", "3.5s"]
    )
    assert result.exit_code == 0, result.output
    assert 'Schedule "second" dispatched sched_cli_ping' in result.output
    fired = (tmp_path / "runs.txt").read_text().splitlines()
    assert 2 <= len(fired) <= 4, fired
    assert len(set(fired)) == len(fired)
    stamps = sorted(datetime.fromisoformat(f) for f in fired)
    assert all((b - a) == timedelta(seconds=1) for a, b in itertools.pairwise(stamps))


async def test_a_failed_dispatch_drops_the_claim_and_is_tried_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sched = schedule(report.with_({"n": 1}), every="10s", name="flaky")
    async with memory_app() as app:
        from haze import Queue

        real = app.manager.dispatch
        calls = {"n": 0}

        async def flaky(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise ConnectionError("backend down")
            return await real(*args, **kwargs)

        monkeypatch.setattr(app.manager, "dispatch", flaky)
        s = Scheduler(app)
        t0 = utc(2026, 1, 1, 12, 0, 5)
        await s.step(t0)
        await s.step(t0 + timedelta(seconds=6))  # the 12:00:10 tick fails
        tick = utc(2026, 1, 1, 12, 0, 10)
        assert await app.store().get(sched.tick_key(tick)) is None  # claim dropped
        assert 'schedule "flaky" could not dispatch its tick of 2026-01-01T12:00:10' in caplog.text
        await s.step(t0 + timedelta(seconds=8))  # tried again, within the grace
        await Queue.idle()
    assert [at for _, at in ran] == [tick.isoformat()]


async def test_run_stops_and_releases_the_lease() -> None:
    schedule(report, every="1h", name="hourly")
    async with memory_app() as app:
        import asyncio

        s = Scheduler(app)
        stop = asyncio.Event()
        task = asyncio.create_task(s.run(stop))
        for _ in range(50):
            if s.leader:
                break
            await asyncio.sleep(0.01)
        assert await app.store().get("haze:schedule:leader") == s.id
        stop.set()
        await asyncio.wait_for(task, 5)
        assert await app.store().get("haze:schedule:leader") is None


@pytest.mark.usefixtures("isolated_imports")
def test_python_presets_install_the_schedule_extra(tmp_path: Path) -> None:
    from haze.build._python import extras_for

    root = write_app(tmp_path, SCHEDULES)
    assert "schedule" in extras_for(App(root=root))
    scheduling._registry.clear()
    (root / "config" / "schedule.py").write_text("")
    assert "schedule" not in extras_for(App(root=root))


async def test_the_leader_renews_its_lease_and_notices_losing_it() -> None:
    import asyncio

    schedule(report, every="1h", name="hourly")
    async with memory_app() as app:
        store = app.store()
        a = Scheduler(app, lease=0.3)
        now = utc(2026, 1, 1, 12, 0, 1)
        await a.step(now)
        assert a.leader
        await asyncio.sleep(0.2)
        await a.step(now)  # past a third of the lease: renewed
        ttl = await store.ttl("haze:schedule:leader")
        assert ttl is not None and ttl > 0.2
        await store.put("haze:schedule:leader", "someone-else", 10)
        await asyncio.sleep(0.12)
        await a.step(now)
        assert not a.leader
        assert await store.get("haze:schedule:leader") == "someone-else"


@pytest.mark.usefixtures("isolated_imports")
def test_a_schedule_on_an_unknown_connection_stops_the_scheduler_at_start(
    tmp_path: Path,
) -> None:
    root = write_app(
        tmp_path,
        "from haze import schedule\nfrom app.job.sched_cli_jobs import ping\n"
        "schedule(ping.with_().on_connection('redsi'), every='1m', name='m')\n",
    )
    for args in (["schedule:work"], ["queue:work", "--schedule", "--max-time", "1s"]):
        result = CliRunner().invoke(get_cli(), ["--root", str(root), *args])
        assert result.exit_code == 1, result.output
        assert "unknown queue connection 'redsi'" in result.output
        assert len(result.output.strip().splitlines()) == 1


async def test_a_first_tick_claimed_by_a_leader_that_died_is_sent_by_the_next() -> None:
    """A schedule that never fired: the first leader claims its first tick and dies
    before dispatching. The next leader resumes from where the first one started (not
    from its own start) and sends the tick once the dead one's claim expires."""
    sched = schedule(report.with_({"n": 1}), every="10s", name="first")
    async with memory_app() as app:
        from haze import Queue

        store = app.store()
        t0 = utc(2026, 1, 1, 12, 0, 5)
        a = Scheduler(app, lease=0.3)
        await a.step(t0)
        tick = utc(2026, 1, 1, 12, 0, 10)
        # a's first write of the tick, then a SIGKILL: its leases are left to expire.
        assert await store.add(sched.tick_key(tick), f"lease:{a.id}", 0.6)
        b = Scheduler(app, lease=2.0)
        await b.step(t0 + timedelta(seconds=6))
        assert not b.leader  # a's leader lease still holds
        await asyncio.sleep(0.35)
        await b.step(t0 + timedelta(seconds=7))
        assert b.leader and b.dispatched == 0  # a's claim on the tick has not expired
        await asyncio.sleep(0.35)
        await b.step(t0 + timedelta(seconds=8))
        assert b.dispatched == 1
        assert await store.get(sched.tick_key(tick)) == "done"
        await Queue.idle()
    assert [at for _, at in ran] == [tick.isoformat()]


async def test_a_tick_sent_twice_runs_once_and_a_manual_run_always_runs() -> None:
    """Two messages for one tick (a scheduler died after dispatching, before marking the
    tick done, and the next sent it again): the tick's once key lets the first run and
    acks the other. ``schedule:run`` is not a tick: no once key, each one runs."""
    sched = schedule(report.with_({"n": 1}), every="10s", name="twice")
    async with memory_app() as app:
        from haze import Queue

        store = app.store()
        tick = utc(2026, 1, 1, 12, 0, 10)
        assert await scheduling.fire(app, sched, tick, store=store)
        await store.delete(sched.tick_key(tick))  # as if the lease ran out unmarked
        assert await scheduling.fire(app, sched, tick, store=store)
        assert not await scheduling.fire(app, sched, tick, store=store)  # marked done now
        await scheduling.run_now(app, "twice")
        await scheduling.run_now(app, "twice")
        await Queue.idle()
    assert [at for _, at in ran].count(tick.isoformat()) == 1
    assert len(ran) == 3


async def test_a_tick_held_by_a_live_scheduler_is_not_passed_over() -> None:
    """Another scheduler holds the tick's lease (a stalled leader mid-dispatch): this one
    neither sends it nor moves past it, and leaves it alone once it is marked done."""
    sched = schedule(report.with_({"n": 1}), every="10s", name="held")
    async with memory_app() as app:
        from haze import Queue

        store = app.store()
        t0 = utc(2026, 1, 1, 12, 0, 5)
        s = Scheduler(app)
        await s.step(t0)
        tick = utc(2026, 1, 1, 12, 0, 10)
        await store.add(sched.tick_key(tick), "lease:stalled", 30)
        await s.step(t0 + timedelta(seconds=6))
        await s.step(t0 + timedelta(seconds=7))
        assert s.dispatched == 0 and s._cursors["held"] < tick
        await store.put(sched.tick_key(tick), "done", 130)  # the stalled one finished
        await s.step(t0 + timedelta(seconds=16))
        assert s.dispatched == 1  # the 12:00:20 tick only
        await Queue.idle()
    assert [at for _, at in ran] == [utc(2026, 1, 1, 12, 0, 20).isoformat()]


@pytest.mark.usefixtures("isolated_imports")
def test_a_schedule_file_imports_its_own_jobs_when_another_app_owns_the_app_package(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other"
    (other / "app" / "job").mkdir(parents=True)
    (other / "config").mkdir()
    # Regular packages (not namespace ones): ``app`` then resolves to that root alone.
    (other / "app" / "__init__.py").write_text("")
    (other / "app" / "job" / "__init__.py").write_text("")
    (other / "app" / "job" / "sched_other_jobs.py").write_text(
        "from haze import define_job\n\n"
        '@define_job(name="sched_other_job")\nasync def other(payload=None):\n    pass\n'
    )
    App(root=other)  # this one takes the ``app`` package name
    owner = __import__("sys").modules["app"]
    root = write_app(tmp_path / "mine", SCHEDULES)
    App(root=root)
    assert list(registered_schedules()) == ["daily", "sched_cli_ping"]
    assert __import__("sys").modules["app"] is owner, "the other app keeps its package"


# A real process stands for the Cloudflare invocation: it claims the tick in the app's
# SQLite store, then dies (os._exit, no cleanup) where it would dispatch.
DIES_AFTER_THE_CLAIM = """
import asyncio, os, sys
from datetime import UTC, datetime
from haze import App
from haze._orchestration import scheduling

scheduling.LEASE = 0.5  # its claim on the tick expires soon (10 s by default)


async def main() -> None:
    async with App(root=sys.argv[1]) as app:
        async def killed(*args: object, **kwargs: object) -> None:
            os._exit(137)

        app.manager.dispatch = killed  # type: ignore[method-assign]
        at = datetime(2026, 1, 1, 10, 55, tzinfo=UTC)
        await scheduling.dispatch_trigger(app, "cloudflare", "*/5 * * * *", at)


asyncio.run(main())
"""


def _run(args: list[str], cwd: Path) -> Any:
    import subprocess

    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.usefixtures("isolated_imports")
async def test_a_tick_claimed_by_an_invocation_that_died_is_sent_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A platform trigger's invocation (Cloudflare ``scheduled()``) claims its tick and
    is killed before dispatching it. The next invocation, of any trigger, finds the
    claim unsent with its lease expired and sends the tick; one after that does not."""
    import sys

    root = write_app(
        tmp_path,
        "from haze import schedule\nfrom app.job.sched_cli_jobs import ping\n"
        "schedule(ping, cron='*/5 * * * *', name='five')\n"
        "schedule(ping.with_({'kind': 'hourly'}), cron='0 * * * *', name='hourly')\n",
        default="sqlite",
    )
    for setup in ("make:queue-tables", "db:migrate"):
        done = _run([sys.executable, "-m", "haze.cli", "--root", str(root), setup], root)
        assert done.returncode == 0, done.stdout + done.stderr
    child = _run([sys.executable, "-c", DIES_AFTER_THE_CLAIM, str(root)], root)
    assert child.returncode == 137, child.stderr
    monkeypatch.chdir(root)
    await asyncio.sleep(0.6)  # the dead invocation's claim lease runs out
    async with App(root=root) as app:
        # The hourly trigger's invocation is the next one: it sends 10:55 of "five" too.
        assert await scheduling.dispatch_trigger(
            app, "cloudflare", "0 * * * *", utc(2026, 1, 1, 11)
        ) == ["hourly"]
        assert 'schedule "five" sends its tick of 2026-01-01T10:55:00+00:00' in caplog.text
        for minute in (5, 10):
            await scheduling.dispatch_trigger(
                app, "cloudflare", "*/5 * * * *", utc(2026, 1, 1, 11, minute)
            )
        driver = app.driver("sqlite")
        sent = []
        while (got := await driver.reserve(["default"], 0)) is not None:
            assert got.message is not None
            sent.append(
                ((got.message.meta or {}).get("schedule"), (got.message.meta or {})["fire_at"])
            )
            await driver.ack(got)
    assert sorted(sent) == [
        ("five", "2026-01-01T10:55:00+00:00"),
        ("five", "2026-01-01T11:05:00+00:00"),
        ("five", "2026-01-01T11:10:00+00:00"),
        ("hourly", "2026-01-01T11:00:00+00:00"),
    ]


async def test_an_invocation_leaves_a_claimed_tick_alone_while_its_lease_holds() -> None:
    """A claim still within its lease (a slow invocation) is not sent by the next one;
    a re-sender killed too holds only its own short lease, and the record waits for the
    invocation after it."""
    from haze import Queue

    sched = schedule(report, cron="*/5 * * * *", name="five")
    async with memory_app() as app:
        store = app.store()
        tick = utc(2026, 1, 1, 10, 55)
        key = sched.tick_key(tick)
        assert isinstance(await scheduling._claim(store, key, "slow", 30), tuple)
        trigger = "*/5 * * * *"
        assert await scheduling.dispatch_trigger(
            app, "cloudflare", trigger, utc(2026, 1, 1, 11)
        ) == ["five"]
        await store.put(key, "unsent:1000:dead", 60)  # its lease ended long ago
        assert await store.add(f"{key}:resend", "lease:killed-resender", 0.3)
        await scheduling.dispatch_trigger(app, "cloudflare", trigger, utc(2026, 1, 1, 11, 5))
        await asyncio.sleep(0.35)
        await scheduling.dispatch_trigger(app, "cloudflare", trigger, utc(2026, 1, 1, 11, 10))
        assert await store.get(key) == "done"
        await scheduling.dispatch_trigger(app, "cloudflare", trigger, utc(2026, 1, 1, 11, 15))
        await Queue.idle()
    # 10:55 goes out first in the 11:10 invocation, before that invocation's own tick.
    at = [utc(2026, 1, 1, 11, 0), utc(2026, 1, 1, 11, 5), tick] + [
        utc(2026, 1, 1, 11, minute) for minute in (10, 15)
    ]
    assert [fired for _, fired in ran] == [t.isoformat() for t in at]


async def _crash_before_marking_done(
    app: App, sched: Any, tick: datetime, monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    """The in-process scheduler sends ``tick`` and dies before marking it done; its
    lease ends. The messages are held as in a queue (not run): returns their options."""
    sent: list[dict[str, Any]] = []

    async def held_in_queue(pending: Any, **options: Any) -> None:
        sent.append(options)

    monkeypatch.setattr(app.manager, "dispatch", held_in_queue)
    monkeypatch.setattr(scheduling, "tick_window", lambda *a, **k: 0.2)
    store = app.store()
    real_put = store.put

    async def dies_at_done(key: str, value: Any, ttl: float | None = None) -> None:
        if value == "done":
            raise ConnectionError("the scheduler was killed here")
        await real_put(key, value, ttl)

    monkeypatch.setattr(store, "put", dies_at_done)
    assert await scheduling._fire(app, sched, tick, store, owner="a", lease=0.1) == "sent"
    monkeypatch.setattr(store, "put", real_put)
    await asyncio.sleep(0.15)
    return sent


async def test_a_resent_tick_runs_once_even_when_the_first_message_comes_after_its_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A queue that is not FIFO (or a long backlog) delivers the re-sent message first
    and the dead scheduler's message after the tick's window: the second never runs."""
    sched = schedule(report.with_({"n": 1}), every="10s", name="resent-late")
    async with memory_app() as app:
        tick = utc(2026, 1, 1, 12, 0, 10)
        sent = await _crash_before_marking_done(app, sched, tick, monkeypatch)
        store = app.store()
        assert await scheduling._fire(app, sched, tick, store, owner="b", lease=0.1) == "sent"
        first, again = sent
        once, claim = first["meta"]["once"], app.manager.callbacks.claim_once
        assert await claim(once, again.get("id") or "second-message", again["meta"]["once_ttl"])
        await asyncio.sleep(0.3)  # past the tick's (shortened) window
        assert not await claim(once, "first-message", first["meta"]["once_ttl"])


async def test_a_tick_whose_first_message_already_started_is_not_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sched = schedule(report.with_({"n": 1}), every="10s", name="resent-started")
    async with memory_app() as app:
        tick = utc(2026, 1, 1, 12, 0, 10)
        sent = await _crash_before_marking_done(app, sched, tick, monkeypatch)
        once = sent[0]["meta"]["once"]
        assert await app.manager.callbacks.claim_once(once, "first-message", 5.0)
        store = app.store()
        assert await scheduling._fire(app, sched, tick, store, owner="b", lease=0.1) == "done"
        assert len(sent) == 1
        assert await store.get(sched.tick_key(tick)) == "done"
