"""The redis driver under real faults: real worker processes, a real (private) redis-server.

Each test runs its own ``redis-server`` on a free port (``redis_fault_harness.py``), so
it can kill and restart it. Workers are ``haze queue:work`` processes on the
``redis_fault_app`` app; their jobs append a line per start and end to a runs file, so a
test counts the runs of every job across processes, kills and restarts.

- a worker SIGKILLed mid-job: BullMQ's stalled check puts the job back once its lock
  expires, and the next attempt counts the restart;
- 5,000 jobs through 3 workers x concurrency 8 while a random worker is SIGKILLed and
  restarted every few seconds: nothing is lost; the at-least-once duplicates are counted
  and reported (printed, a junit property, ``kill_report.json`` under the test's tmp dir);
  with no kills every job runs exactly once;
- Redis restarted mid-run: the worker logs the outage once, reconnects (scripts reloaded,
  blocking connection recreated) and runs the jobs dispatched after the restart. Without
  persistence the queued jobs are gone with the server's memory; with ``appendonly yes``
  and ``appendfsync always`` (docs/redis.md) every job queued before the restart runs;
- Redis restarted from a snapshot while jobs ran: those that ended during the outage
  (their acks lost) are recorded when it is back and do not complete a second time;
- SIGTERM drains: running jobs finish, exit code 0, nothing left active;
- a message with bad JSON, with a data that is not a haze envelope, or naming an unknown
  job fails with a clear reason and is kept in the failed set (``haze queue:failed``).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from haze import Queue
from haze._base.ids import short_id
from redis_fault_harness import harness, needs_redis_server, rfx_record, rfx_slow_first, until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), needs_redis_server]


# =========================================================================== SIGKILL mid-job


async def test_job_of_a_sigkilled_worker_comes_back_through_the_stalled_check(
    tmp_path: Path,
) -> None:
    async with harness(tmp_path, retry_after="2s") as h:
        job_id = await rfx_slow_first.dispatch({"k": "a", "sleep": 60})
        first = h.start_worker("--concurrency", "2")
        await h.wait_ready(first)
        await until("the job started", lambda: h.counts("start")["a"] == 1, 30)
        first.send_signal(signal.SIGKILL)
        assert await h.wait_exit(first) == -signal.SIGKILL
        state = await h.state()
        assert state["active"] == 1, (
            f"the dead worker's claim stays until its lock expires: {state}"
        )

        second = h.start_worker("--concurrency", "2")
        await h.wait_ready(second)
        await h.wait_ended({"a"}, within=60, procs=[second])
        runs = [(e, a) for e, k, a, _, _ in h.events() if k == "a"]
        assert runs == [("start", 1), ("start", 2), ("end", 2)], "attempt counts the restart"
        assert "stalled" in h.err(second), h.log(second)
        second.send_signal(signal.SIGTERM)
        assert await h.wait_exit(second) == 0, h.log(second)
        state = await h.state()
        assert state == {"wait": 0, "active": 0, "delayed": 0, "failed": 0, "completed": 1}
        client = aioredis.Redis.from_url(h.server.url, decode_responses=True)
        try:
            [bull_id] = await client.zrange("rfx:default:completed", 0, -1)
            job = await client.hgetall(f"rfx:default:{bull_id}")
        finally:
            await client.aclose()
        assert json.loads(job["data"])["id"] == job_id
        assert job["stc"] == "1", "BullMQ's stalled counter recorded the restart"


# =========================================================================== kill storm


def _report(tmp_path: Path, record_property: Any, capsys: Any, data: dict[str, Any]) -> None:
    for k, v in data.items():
        record_property(k, v)
    (tmp_path / "kill_report.json").write_text(json.dumps(data, indent=2))
    with capsys.disabled():
        print(f"\n[redis kill report] {json.dumps(data)}")


#: (worker kills, a Redis restart mid-run): the restart runs Redis with AOF (appendfsync
#: always), the configuration docs/redis.md asks for, so it must lose nothing either.
STORM = [(True, False), (False, False), (True, True)]


@pytest.mark.parametrize(
    ("kills", "redis_restart"), STORM, ids=["kills", "nokills", "kills-and-redis-restart"]
)
async def test_five_thousand_jobs_three_workers_random_sigkills(
    kills: bool, redis_restart: bool, tmp_path: Path, record_property: Any, capsys: Any
) -> None:
    total, workers, concurrency = 5000, 3, 8
    rng = random.Random(20260105)
    async with harness(tmp_path, retry_after="2s", aof=redis_restart) as h:
        keys = {str(i) for i in range(total)}
        # 30 ms a job: >= 6 s even on a fast machine (24 slots), long enough for 2 kills
        await Queue.bulk([rfx_record.with_({"k": i, "sleep": 0.03}) for i in range(total)])
        live = [h.start_worker("--concurrency", str(concurrency)) for _ in range(workers)]
        for p in live:
            await h.wait_ready(p)
        started = time.monotonic()
        killed = 0
        restarted = False
        deadline = started + 120
        next_kill = started + rng.uniform(1.0, 2.0)
        while True:
            ended = [(k, pid) for e, k, _, pid, _ in h.events() if e == "end"]
            done_keys = {k for k, _ in ended}
            if keys <= done_keys:
                break
            assert time.monotonic() < deadline, (
                f"{len(keys - done_keys)} of {total} jobs unfinished after 120 s"
            )
            for p in live:
                assert p.poll() is None, f"worker {p.pid} died on its own:\n{h.log(p)}"
            if redis_restart and not restarted and len(done_keys) >= total * 0.4:
                h.server.kill()
                await asyncio.sleep(1.0)
                h.server.start()
                restarted = True
            working_pids = {pid for _, pid in ended}
            ready = [p for p in live if p.pid in working_pids]
            # kill a worker that is running jobs, never the last one working
            if kills and time.monotonic() >= next_kill and len(ready) >= 2:
                victim = ready[rng.randrange(len(ready))]
                live.remove(victim)
                victim.send_signal(signal.SIGKILL)
                await h.wait_exit(victim)
                killed += 1
                live.append(h.start_worker("--concurrency", str(concurrency)))
                next_kill = time.monotonic() + rng.uniform(1.0, 2.5)
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - started
        for p in live:
            await h.wait_ready(p)  # a SIGTERM before its handlers are in would just kill it
            p.send_signal(signal.SIGTERM)
        codes = [await h.wait_exit(p) for p in live]
        logs = "\n".join(h.log(p) for p in live)

        starts, ends = h.counts("start"), h.counts("end")
        assert set(starts) == keys and set(ends) == keys, "no job is lost"
        state = await h.state()
        assert state["wait"] == state["active"] == state["delayed"] == 0, state
        assert state["failed"] == 0, "no job failed"
        assert codes == [0] * workers, f"SIGTERM: clean exits\n{logs}"
        data = {
            "driver": "redis",
            "jobs": total,
            "workers": workers,
            "concurrency": concurrency,
            "kills": killed,
            "redis_restarts": int(restarted),
            "seconds": round(elapsed, 1),
            "duplicate_runs": sum(starts.values()) - total,  # extra starts (reruns)
            "jobs_run_more_than_once": sum(1 for n in starts.values() if n > 1),
            "jobs_completed_more_than_once": sum(1 for n in ends.values() if n > 1),
        }
        _report(tmp_path, record_property, capsys, data)
        if redis_restart:
            assert restarted
            assert any("reachable again" in h.err(p) for p in h.procs), logs
        if not kills:
            assert data["duplicate_runs"] == 0 and max(ends.values()) == 1, (
                "with no kills every job runs exactly once"
            )
        else:
            assert killed >= 2, "the storm killed too few workers to mean anything"


# =========================================================================== Redis restart


@pytest.mark.parametrize("aof", [False, True], ids=["no-persistence", "aof-always"])
async def test_redis_restart_mid_run_worker_reconnects_and_carries_on(
    aof: bool, tmp_path: Path, record_property: Any, capsys: Any
) -> None:
    """Without persistence the restarted Redis has forgotten every job: what must hold is
    that the worker survives with one warning, reconnects and runs what is dispatched
    after the restart, and that the jobs done or running at the kill completed (running
    handlers finish although their acks cannot reach Redis). With ``appendonly yes`` and
    ``appendfsync always`` nothing queued before the restart is lost either."""
    async with harness(tmp_path, retry_after="3s", aof=aof) as h:
        before = {f"a{i}" for i in range(40)}
        await Queue.bulk([rfx_record.with_({"k": k, "sleep": 0.25}) for k in sorted(before)])
        worker = h.start_worker("--concurrency", "4")
        await h.wait_ready(worker)
        await until("some jobs ran", lambda: len(h.counts("end")) >= 8, 60)
        h.server.kill()
        done_before = set(h.counts("end"))
        running_at_kill = set(h.counts("start")) - done_before
        # down for a while: the worker's claims, acks and heartbeats fail meanwhile
        await asyncio.sleep(2.0)
        assert worker.poll() is None, f"the worker gave up:\n{h.log(worker)}"
        h.server.start()
        after = {f"b{i}" for i in range(10)}
        # the dispatching app reconnects on its own too
        await until(
            "dispatch works again",
            lambda: _try_bulk([rfx_record.with_({"k": k}) for k in sorted(after)]),
            30,
        )
        expected = after | (before if aof else set())
        await h.wait_ended(expected, within=90, procs=[worker])
        await until("the queue is drained", _drained(h), 60)
        worker.send_signal(signal.SIGTERM)
        assert await h.wait_exit(worker) == 0, h.log(worker)

        err = h.err(worker)
        assert err.count("is unavailable") == 1, f"one warning per outage:\n{err}"
        assert "reachable again" in err, err
        assert "Traceback" not in err, f"an outage is not a crash:\n{err}"
        ended = set(h.counts("end"))
        assert done_before <= ended
        # their handlers ran to the end although their acks could not reach Redis
        assert running_at_kill <= ended, running_at_kill - ended
        state = await h.state()
        assert state["failed"] == 0, state
        lost = sorted(before - ended)
        data = {
            "aof": aof,
            "ended_before_kill": len(done_before),
            "running_at_kill": len(running_at_kill),
            "queued_before_kill_lost": len(lost),
            "reruns": sum(h.counts("start").values()) - len(set(h.counts("start"))),
        }
        _report(tmp_path, record_property, capsys, data)
        if aof:
            assert lost == [], "appendfsync always: nothing queued before the restart is lost"


async def test_jobs_finished_while_redis_restarts_from_a_snapshot_do_not_complete_twice(
    tmp_path: Path, record_property: Any, capsys: Any
) -> None:
    """Redis without AOF, restarted from its last RDB snapshot (taken while four jobs
    ran, none ended): the four end while Redis is down, so their acks fail. The
    restored Redis still has them running under locks that expire, and its stalled
    check would put them back to run a second time. The worker records them as done
    when Redis is back (a retried ack, and a marker per job that a later claim honours):
    each runs to its end once. (Acks that reached Redis after the snapshot are another
    matter: that Redis cannot tell, see docs/redis.md.)"""
    async with harness(tmp_path, retry_after="2s") as h:
        keys = [f"s{i}" for i in range(8)]
        await Queue.bulk([rfx_record.with_({"k": k, "sleep": 1.5}) for k in keys])
        worker = h.start_worker("--concurrency", "4")
        await h.wait_ready(worker)
        await until("four jobs running", lambda: len(h.counts("start")) == 4, 30, poll=0.02)
        client = aioredis.Redis.from_url(h.server.url, decode_responses=True)
        try:
            await client.save()  # what the snapshot knows: 4 active, 4 waiting
        finally:
            await client.aclose()
        h.server.kill()
        assert not h.counts("end"), "a job ended before the snapshot: its ack is not lost"
        running = set(h.counts("start"))
        await until("the four ended during the outage", lambda: len(h.counts("end")) == 4, 30)
        await asyncio.sleep(1.0)
        h.server.start()  # from dump.rdb: the snapshot
        await h.wait_ended(set(keys), within=90, procs=[worker])
        await until("the queue is drained", _drained(h), 60)
        await asyncio.sleep(4.0)  # past retry_after and a stalled check: no late rerun
        worker.send_signal(signal.SIGTERM)
        assert await h.wait_exit(worker) == 0, h.log(worker)
        twice = sorted(k for k, n in h.counts("end").items() if n > 1)
        _report(
            tmp_path,
            record_property,
            capsys,
            {"running_at_restart": len(running), "completed_twice": len(twice)},
        )
        assert twice == [], f"completed twice: {twice}\n{h.log(worker)}"
        assert set(h.counts("end")) == set(keys)


async def _try_bulk(pending: list[Any]) -> bool:
    try:
        await Queue.bulk(pending)
    except (ConnectionError, OSError, aioredis.ConnectionError):
        return False
    return True


def _drained(h: Any) -> Any:
    async def check() -> bool:
        s = await h.state()
        return bool(s["wait"] == s["active"] == s["delayed"] == 0)

    return check


# =========================================================================== SIGTERM drain


async def test_sigterm_drains_running_jobs_and_exits_zero(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        await Queue.bulk([rfx_record.with_({"k": f"slow{i}", "sleep": 2.0}) for i in range(3)])
        await Queue.bulk([rfx_record.with_({"k": f"queued{i}"}) for i in range(4)])
        worker = h.start_worker("--concurrency", "3")
        await h.wait_ready(worker)
        await until("three jobs running", lambda: len(h.counts("start")) == 3, 30, poll=0.02)
        worker.send_signal(signal.SIGTERM)
        assert await h.wait_exit(worker) == 0, h.log(worker)
        assert set(h.counts("end")) == {f"slow{i}" for i in range(3)}, "running jobs finished"
        assert set(h.counts("start")) == {f"slow{i}" for i in range(3)}, "nothing claimed after"
        assert "waiting for 3 running job(s)" in h.out(worker)
        state = await h.state()
        # a job fetched ahead (fetchNext) went back to the head of the queue
        assert state == {"wait": 4, "active": 0, "delayed": 0, "failed": 0, "completed": 3}
        # nothing lost: another worker runs the rest
        again = h.start_worker("--concurrency", "2", "--stop-when-empty")
        assert await h.wait_exit(again) == 0, h.log(again)
        assert set(h.counts("end")) == (
            {f"slow{i}" for i in range(3)} | {f"queued{i}" for i in range(4)}
        )


# =========================================================================== bad messages


async def test_bad_json_and_unknown_job_fail_with_a_clear_reason_and_are_kept(
    tmp_path: Path,
) -> None:
    from bullmq import Queue as BullQueue  # type: ignore[import-untyped]

    async with harness(tmp_path) as h:
        client = aioredis.Redis.from_url(h.server.url, decode_responses=True)
        bull = BullQueue("default", {"connection": h.server.url, "prefix": h.prefix})
        try:
            # a Node/Python BullMQ producer that does not speak haze's envelope
            bad = await bull.add("rfx_record", {"k": "bad"})
            await client.hset(f"rfx:default:{bad.id}", "data", "{not json")
            foreign = await bull.add("send_email", {"to": "someone@example.com"})
            unknown_id = "f" * 32
            unknown = await bull.add(
                "rfx_nobody",
                {"v": 1, "id": unknown_id, "job": "rfx_nobody_defines_this", "payload": {"n": 1}},
            )
            ok = await rfx_record.dispatch({"k": "fine"})
            worker = h.start_worker("--concurrency", "2", "--stop-when-empty")
            assert await h.wait_exit(worker) == 0, h.log(worker)
        finally:
            await bull.close()

        assert set(h.counts("end")) == {"fine"}, "the good job still ran"
        err = h.err(worker)
        assert "not valid JSON" in err, err
        assert "rfx_nobody_defines_this" in err, err
        failed = {f.id: f for f in await Queue.failed()}
        assert set(failed) == {
            f"bullmq:default:{bad.id}",
            f"bullmq:default:{foreign.id}",
            unknown_id,
        }, failed
        assert ok not in failed
        bad_f = failed[f"bullmq:default:{bad.id}"]
        assert "not valid JSON" in bad_f.exception
        assert bad_f.body == "{not json", "the message is kept as it was"
        foreign_f = failed[f"bullmq:default:{foreign.id}"]
        assert "not a haze message" in foreign_f.exception, foreign_f.exception
        assert json.loads(foreign_f.body) == {"to": "someone@example.com"}
        unknown_f = failed[unknown_id]
        assert "no job named 'rfx_nobody_defines_this'" in unknown_f.exception
        assert unknown_f.payload == {"n": 1}
        try:
            for job_id in (bad.id, foreign.id, unknown.id):
                assert await client.zscore("rfx:default:failed", job_id) is not None
                assert await client.hget(f"rfx:default:{job_id}", "failedReason")
        finally:
            await client.aclose()

        listed = h.cli("queue:failed")
        assert listed.returncode == 0, listed.stderr
        assert short_id(f"bullmq:default:{bad.id}") in listed.stdout, listed.stdout
        assert short_id(unknown_id) in listed.stdout, listed.stdout
        assert "not valid JSON" in listed.stdout, listed.stdout
        assert len(await Queue.failed()) == 3, "listing does not remove anything"


# =========================================================================== scripts reloaded


async def test_every_driver_path_reloads_the_scripts_a_restarted_redis_forgot(
    tmp_path: Path,
) -> None:
    """A restarted Redis has no scripts (``NOSCRIPT``); ``SCRIPT FLUSH`` does the same to a
    live one. Each driver call then loads what it needs and carries on."""
    from haze.drivers.redis import RedisDriver

    async with harness(tmp_path, retry_after="5s") as h:
        assert h.app is not None
        driver = h.app.driver("r")
        assert isinstance(driver, RedisDriver)
        client = aioredis.Redis.from_url(h.server.url, decode_responses=True)

        async def forget() -> None:
            assert await client.script_flush() is True

        try:
            await forget()
            await rfx_record.dispatch({"k": "one"})
            await forget()
            await rfx_record.dispatch({"k": "two"})  # the queue's lite add (the 1st checks)
            assert "default" in driver._link().lite_adds
            await forget()
            await Queue.bulk([rfx_record.with_({"k": f"bulk{i}"}) for i in range(3)])
            await forget()
            assert await Queue.size() == 5
            await forget()
            job = await driver.reserve(["default"], 1.0)
            assert job is not None
            await forget()
            await driver.heartbeat([job])
            await forget()
            await driver.release(job, 0.0, consume_attempt=False)
            await forget()
            job = await driver.reserve(["default"], 1.0)
            assert job is not None
            await forget()
            await driver.ack(job)
            await forget()
            assert await driver.check_stalled(["default"]) == []
            job = await driver.reserve(["default"], 1.0)
            assert job is not None and job.message is not None
            from haze.drivers import FailedJob

            await forget()
            await driver.fail(
                job,
                FailedJob(
                    id=job.message.id,
                    name=job.message.job,
                    connection="r",
                    queue="default",
                    payload=job.message.payload,
                    exception="ValueError: boom",
                    failed_at=time.time(),
                    body=job.body,
                ),
            )
            await forget()
            [failed] = await Queue.failed()
            assert failed.id == job.message.id
            await forget()
            assert await driver.failed.find(job.message.id) is not None
            await forget()
            assert await Queue.retry(job.message.id) == [job.message.id]
            await forget()
            assert await Queue.size() == 4  # counts the job the ack fetched ahead, too
            await forget()
            assert await Queue.clear() >= 2  # waiting jobs; not the one fetched ahead
        finally:
            await client.aclose()
