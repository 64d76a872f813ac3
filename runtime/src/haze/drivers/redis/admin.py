"""What the redis driver tells about a queue (sizes, counts, one job, running jobs) and
how it empties one."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from haze.contracts.driver import JobRecord, QueueCounts, RunningJob
from haze.drivers.redis.base import _RedisBase
from haze.drivers.redis.failed import _epoch_ms
from haze.drivers.redis.scripts import (
    _BACKLOG_SCAN,
    _COUNTED,
    _FIND_KEYS,
    _FIND_LIMIT,
    _SIZED,
    _Pipe,
    check_queue,
)


class _Inspecting(_RedisBase):
    """Inspection and purge."""

    def check_queue(self, queue: str) -> None:
        """A ``:`` is refused (``QueueNameRules``): it separates the parts of the keys."""
        check_queue(queue)

    async def size(self, queue: str) -> int:
        """Jobs waiting, delayed or claimed (active), like Laravel's Redis queue size."""
        counts = await self._link().scripts(queue).getCounts(_SIZED)
        return sum(int(c) for c in counts)

    async def counts(self, queue: str) -> QueueCounts:
        """Ready (wait, paused, prioritized), delayed, and running (active) jobs."""
        link = self._link()
        s = link.scripts(queue)
        c = [int(n) for n in await s.getCounts(_SIZED)]
        ready = c[0] + c[1] + c[3]
        oldest = await self._oldest_ready(link, s) if ready else None
        due = None
        if c[2]:
            first = await link.client.zrange(s.keys["delayed"], 0, 0, withscores=True)
            # BullMQ's score: due ms * 0x1000 + a counter
            due = int(first[0][1]) // 0x1000 / 1000 if first else None
        return QueueCounts(ready, c[2], c[4], oldest, due)

    async def _oldest_ready(self, link: Any, s: Any) -> float | None:
        """When the next job of the wait and paused lists (consumed from the tail: LPUSH
        adds at the head) and of the prioritized set became ready, the oldest of them.

        A job's hash keeps its dispatch ``timestamp`` and the delay it was dispatched
        with (``opts.delay``; BullMQ zeroes ``delay`` on promotion), so that sum is when
        it first came due. A retried job came back after its last attempt started
        (``processedOn``); the backoff it then waited is not kept, so its age counts
        from that start.
        """
        async with link.client.pipeline(transaction=False) as pipe:
            pipe.lindex(s.keys["wait"], -1)
            pipe.lindex(s.keys["paused"], -1)
            pipe.zrange(s.keys["prioritized"], 0, 0)
            wait, paused, prioritized = await pipe.execute()
        ids = [str(i) for i in (wait, paused, *prioritized) if i is not None]
        if not ids:
            return None
        async with link.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(s.toKey(job_id), "timestamp", "opts", "processedOn")
            rows = await pipe.execute()
        found: list[float] = []
        for stamp, opts, started in rows:
            if stamp is None:
                continue  # taken by a worker between the two reads
            try:
                delay = json.loads(opts).get("delay") if opts else None
                due = float(stamp) + (float(delay) if isinstance(delay, (int, float)) else 0)
                if started is not None:
                    due = max(due, float(started))
            except (TypeError, ValueError):
                continue  # not a hash haze or BullMQ wrote
            found.append(due / 1000)
        return min(found) if found else None

    async def find_job(self, job_id: str, queues: Sequence[str]) -> JobRecord | None:
        """Look through each queue's active, waiting, prioritized, delayed and completed
        jobs (the first ``_FIND_LIMIT`` of each, completed ones newest first) in one
        script for the job whose envelope carries ``job_id``."""
        link = self._link()
        names = list(dict.fromkeys(queues))
        keys = [link.scripts(q).keys[k] for q in names for k in _FIND_KEYS]
        prefixes = [link.scripts(q).keys[""] for q in names]
        hit = await link.find_job(keys=keys, args=[job_id, _FIND_LIMIT, *prefixes])
        if not hit:
            return None
        queue, bull_id, state = names[int(hit[0]) - 1], str(hit[1]), str(hit[2])
        fields = ("data", "atm", "attemptsMade", "stc", "finishedOn")
        row = await link.client.hmget(link.scripts(queue).toKey(bull_id), *fields)
        if row[0] is None:
            return None  # settled and removed between the two reads
        data = {k: str(v) for k, v in zip(fields[:4], row[:4], strict=True) if v is not None}
        job = self._reserved(queue, data, bull_id, "")
        # Reserved.attempt is the attempt a claim now would start: one more than started,
        # except for the running one.
        started = job.attempt if state == "running" else job.attempt - 1
        at = None
        if state == "delayed" and hit[3]:
            at = int(float(hit[3])) // 0x1000 / 1000  # BullMQ: due ms * 0x1000 + counter
        elif state == "done":
            at = _epoch_ms(row[4])
        name = job.message.job if job.message is not None else "<undecodable>"
        return JobRecord(job_id, name, queue, state, started, str(row[0]), at)

    async def running(self, queue: str, limit: int = 50) -> list[RunningJob] | None:
        """The active list's jobs (a job of a dead worker stays there until the stalled
        check takes it back)."""
        link = self._link()
        s = link.scripts(queue)
        ids = [str(i) for i in await link.client.lrange(s.keys["active"], -limit, -1)]
        if not ids:
            return []
        async with link.client.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(s.toKey(job_id), "data", "processedOn", "atm", "attemptsMade", "stc")
            rows = await pipe.execute()
        jobs = []
        for job_id, (body, started, atm, made, stc) in zip(ids, rows, strict=True):
            if body is None:
                continue  # settled between the two reads
            reserved = self._reserved(
                queue,
                {
                    k: v
                    for k, v in (("data", body), ("atm", atm), ("attemptsMade", made), ("stc", stc))
                    if v is not None
                },
                job_id,
                "",
            )
            message = reserved.message
            jobs.append(
                RunningJob(
                    message.id if message is not None else job_id,
                    message.job if message is not None else "<undecodable>",
                    queue,
                    reserved.attempt,  # the hash is as the claim read it
                    int(started) / 1000 if started and started.isdigit() else None,
                )
            )
        return sorted(jobs, key=lambda j: j.started_at or 0.0)

    async def group_backlog(self, queue: str, limit: int = 20) -> list[tuple[str, int]]:
        """The groups with the most queued jobs (waiting or delayed), largest first.

        Counts the first 10,000 jobs of each set: a bigger backlog is counted in part
        (the order of the groups at its head is what a worker meets next)."""
        link = self._link()
        s = link.scripts(queue)
        keys = s.getKeys(["prioritized", "delayed"])
        flat = await link.group_backlog(keys=keys, args=[s.keys[""], _BACKLOG_SCAN])
        pairs = [(_text(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]
        pairs.sort(key=lambda p: (-p[1], p[0]))
        return pairs[:limit]

    async def purge(self, queue: str) -> int:
        """Delete the waiting and delayed jobs (BullMQ's ``drain``); returns how many."""
        link = self._link()
        s = link.scripts(queue)
        async with link.client.pipeline(transaction=True) as pipe:
            proxy: Any = _Pipe(pipe)
            await link.commands["getCounts"](keys=[s.keys[""]], args=_COUNTED, client=proxy)
            await link.commands["drain"](
                keys=s.getKeys(["wait", "paused", "delayed", "prioritized", "repeat"]),
                args=[s.keys[""], "1"],
                client=proxy,
            )
            results = await pipe.execute(raise_on_error=False)
        if any(isinstance(r, NoScriptError) for r in results):
            counts = await s.getCounts(_COUNTED)
            await s.drain(True)
            return sum(int(c) for c in counts)
        for r in results:
            if isinstance(r, Exception):
                raise r
        return sum(int(c) for c in results[0])


def _text(raw: str | bytes) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw
