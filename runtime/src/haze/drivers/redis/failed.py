"""The redis driver's failed jobs: BullMQ's failed sets, read and written by haze."""

from __future__ import annotations

import builtins
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from redis.exceptions import WatchError

from haze._base.message import Message, envelope_of
from haze.contracts.driver import FailedJob
from haze.drivers.redis.scripts import (
    _BULK_CHUNK,
    _EvalPipe,
    _NewJob,
    _now_ms,
    group_add_call,
    group_of,
)

if TYPE_CHECKING:
    from haze.drivers.redis.base import _RedisBase
    from haze.drivers.redis.link import _Link

_FAILED_FIELDS = ("name", "data", "failedReason", "stacktrace", "finishedOn")
#: How often a retry's transaction is sent again when its claim changed under WATCH.
_WATCH_TRIES = 5


class RedisFailedJobs:
    """Failed jobs = BullMQ's failed sets of the connection's ``queues``.

    ``FailedJob.id`` is the haze message id (``bullmq:<queue>:<job id>`` for a job
    whose data is not a haze envelope). Lookups by haze id scan the failed sets in
    one server-side script (``find_failed.lua``); ids seen by ``list``/``find``
    are remembered, so ``Queue.retry()`` of every failed job stays linear.
    """

    def __init__(self, driver: _RedisBase) -> None:
        self._d = driver
        self._where: dict[str, tuple[str, str]] = {}

    def _queues(self, queue: str | None) -> list[str]:
        if queue:
            return [queue]
        # Failed sets are per queue: a job's own queue must be looked at even when the
        # connection's ``queues`` option does not list it.
        context = self._d.context
        named = context.job_queues(self._d.name) if context is not None else {}
        return list(dict.fromkeys([*self._d.queues, *named]))

    async def record(self, job: FailedJob) -> None:
        """Store a failure that did not come from this driver's ``fail()``."""
        link = self._d._link()
        s = link.scripts(job.queue)
        finished = round(job.failed_at * 1000)
        async with link.client.pipeline(transaction=True) as pipe:
            pipe.hset(
                s.toKey(job.id),
                mapping={
                    "name": job.name,
                    "data": job.body,
                    "opts": '{"attempts":1}',
                    "timestamp": finished,
                    "delay": 0,
                    "priority": 0,
                    "atm": 1,
                    "failedReason": _reason(job.exception),
                    "finishedOn": finished,
                    "stacktrace": json.dumps([job.exception]),
                },
            )
            pipe.zadd(s.keys["failed"], {job.id: finished})
            await pipe.execute()
        await self.indexed(link, job.id, job.queue, job.id)

    def _index_key(self) -> str:
        # beside BullMQ's queues, under the connection's prefix: a name no queue takes
        return f"{self._d.prefix}:haze-failed-ids"

    async def indexed(self, link: _Link, id: str | None, queue: str, job_id: str) -> None:
        """A failed record was written for message ``id``: the one it had before (another
        BullMQ job) goes, so each id keeps one record (``one_failed.lua``)."""
        if id:
            args = [id, f"{self._d.prefix}:", queue, job_id]
            await link.one_failed(keys=[self._index_key()], args=args)

    async def list(self, queue: str | None = None) -> list[FailedJob]:
        link = self._d._link()
        out: list[FailedJob] = []
        for q in self._queues(queue):
            s = link.scripts(q)
            ids = [str(i) for i in await link.client.zrange(s.keys["failed"], 0, -1)]
            for i in range(0, len(ids), _BULK_CHUNK):
                chunk = ids[i : i + _BULK_CHUNK]
                async with link.client.pipeline(transaction=False) as pipe:
                    for job_id in chunk:
                        pipe.hmget(s.toKey(job_id), *_FAILED_FIELDS)
                    rows = await pipe.execute()
                for job_id, row in zip(chunk, rows, strict=True):
                    if row[1] is not None:
                        out.append(self._record(q, job_id, row))
        out.sort(key=lambda j: j.failed_at)
        # A message id that failed twice (a redelivery, a retried job failing again) has
        # two BullMQ jobs in the failed sets: it is one failed job, its newest record.
        newest = {j.id: j for j in out}
        return [j for j in out if newest[j.id] is j]

    def _record(self, queue: str, job_id: str, row: Sequence[str | None]) -> FailedJob:
        name, data, reason, stack, finished_on = row
        exception = reason or ""
        if stack:
            try:
                frames = json.loads(stack)
                if isinstance(frames, list) and frames:
                    exception = str(frames[-1])
            except (ValueError, RecursionError):
                pass
        job = FailedJob.from_body(
            data or "",
            id=None,
            connection=self._d.name,
            queue=queue,
            exception=exception,
            failed_at=_epoch_ms(finished_on) or 0.0,
            name=name or "<undecodable>",
        )
        if not job.id:  # not a haze envelope: BullMQ's own id
            job.id = f"bullmq:{queue}:{job_id}"
        self._where[job.id] = (queue, job_id)
        return job

    async def _locate(self, id: str) -> tuple[str, str, Sequence[str | None]] | None:
        link = self._d._link()
        candidates: list[tuple[str, str]] = []
        if id.startswith("bullmq:") and id.count(":") >= 2:
            q, job_id = id[len("bullmq:") :].rsplit(":", 1)
            candidates.append((q, job_id))
        elif id in self._where:
            candidates.append(self._where[id])
        for q, job_id in candidates:
            found = await self._failed_row(link, q, job_id)
            if found is not None and (id.startswith("bullmq:") or _envelope_id(found[1]) == id):
                return q, job_id, found
        queues = self._queues(None)
        keys = [link.scripts(q).keys["failed"] for q in queues]
        prefixes = [link.scripts(q).keys[""] for q in queues]
        hit = await link.find_failed(keys=keys, args=[id, *prefixes])
        if not hit:
            self._where.pop(id, None)
            return None
        q, job_id = queues[int(hit[0]) - 1], str(hit[1])
        found = await self._failed_row(link, q, job_id)
        return None if found is None else (q, job_id, found)

    @staticmethod
    async def _failed_row(link: _Link, queue: str, job_id: str) -> Sequence[str | None] | None:
        s = link.scripts(queue)
        async with link.client.pipeline(transaction=False) as pipe:
            pipe.zscore(s.keys["failed"], job_id)
            pipe.hmget(s.toKey(job_id), *_FAILED_FIELDS)
            score, row = await pipe.execute()
        return None if score is None or row[1] is None else row

    async def find(self, id: str) -> FailedJob | None:
        found = await self._locate(id)
        return None if found is None else self._record(*found)

    async def forget(self, id: str) -> bool:
        return await self._remove(id, None) > 0

    async def _remove(self, id: str, up_to: float | None) -> int:
        """Remove every failed BullMQ job of message ``id`` (only those that failed at or
        before ``up_to`` when given, newest first); how many."""
        n = 0
        while (found := await self._locate(id)) is not None:
            q, job_id, row = found
            if up_to is not None and int(row[4] or 0) / 1000 > up_to:
                break  # failed again after the claim: that record stays
            self._where.pop(id, None)
            link = self._d._link()
            if not await link.scripts(q).remove(job_id, False):
                break  # locked (not failed any more): leave it to its worker
            if await link.client.hget(self._index_key(), id) in (
                f"{q}:{job_id}",
                f"{q}:{job_id}".encode(),
            ):
                await link.client.hdel(self._index_key(), id)
            n += 1
        return n

    def _claim_key(self, id: str) -> str:
        # beside BullMQ's queues, under the connection's prefix: a name no queue takes
        return f"{self._d.prefix}:haze-retry-claim:{id}"

    async def claim_retry(self, id: str, token: str, lease: float) -> FailedJob | None:
        found = await self._locate(id)
        if found is None:
            return None
        job = self._record(*found)
        claim = json.dumps({"token": token, "failed_at": job.failed_at})
        link = self._d._link()
        key = self._claim_key(id)
        if not await link.client.set(key, claim, nx=True, px=max(1, round(lease * 1000))):
            return None
        # Another caller may have retried it (and ended its claim) since we found it.
        if await self._failed_row(link, found[0], found[1]) is None:
            await link.client.delete(key)
            return None
        return job

    async def retried(self, id: str, token: str) -> bool:
        # The claim first: every run of a retried job asks, and locating a record that
        # is gone scans the failed sets.
        client = self._d._link().client
        key = self._claim_key(id)
        raw = await client.get(key)
        claim = json.loads(raw) if raw else None
        if not isinstance(claim, dict) or claim.get("token") != token:
            return False
        gone = await self._remove(id, float(claim.get("failed_at") or 0.0)) > 0
        await client.delete(key)
        return gone

    # -- pages (FailedPages): counted with ZCOUNT, read one page of hashes at a time ----

    @staticmethod
    def _scores(since: float | None, until: float | None) -> tuple[str, str]:
        """The failed sets' score range (finishedOn, in ms) for ``since``/``until``."""
        low = "-inf" if since is None else str(math.ceil(since * 1000))
        high = "+inf" if until is None else str(math.floor(until * 1000))
        return low, high

    async def count(
        self, queue: str | None = None, since: float | None = None, until: float | None = None
    ) -> int:
        link = self._d._link()
        low, high = self._scores(since, until)
        async with link.client.pipeline(transaction=False) as pipe:
            for q in self._queues(queue):
                pipe.zcount(link.scripts(q).keys["failed"], low, high)
            return sum(int(n) for n in await pipe.execute())

    async def counts(self) -> dict[str, int]:
        link = self._d._link()
        queues = self._queues(None)
        async with link.client.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zcard(link.scripts(q).keys["failed"])
            sizes = await pipe.execute()
        return {q: int(n) for q, n in zip(queues, sizes, strict=True) if int(n)}

    async def page(
        self,
        queue: str | None = None,
        since: float | None = None,
        until: float | None = None,
        *,
        offset: int = 0,
        limit: int = 50,
        text: int | None = None,
    ) -> builtins.list[FailedJob]:
        link = self._d._link()
        low, high = self._scores(since, until)
        queues = self._queues(queue)
        want = max(0, offset) + max(0, limit)
        # The newest `want` ids of each queue's set (ids and scores only), merged.
        async with link.client.pipeline(transaction=False) as pipe:
            for q in queues:
                key = link.scripts(q).keys["failed"]
                pipe.zrevrangebyscore(key, high, low, start=0, num=want, withscores=True)
            ranked = await pipe.execute()
        merged = [
            (score, q, str(i)) for q, rows in zip(queues, ranked, strict=True) for i, score in rows
        ]
        merged.sort(reverse=True)
        chosen = merged[max(0, offset) : want]
        async with link.client.pipeline(transaction=False) as pipe:
            for _, q, job_id in chosen:
                pipe.hmget(link.scripts(q).toKey(job_id), *_FAILED_FIELDS)
            rows = await pipe.execute()
        out: builtins.list[FailedJob] = []
        for (_, q, job_id), row in zip(chosen, rows, strict=True):
            if row[1] is not None:
                job = self._record(q, job_id, row)
                if text is not None and len(job.exception) > text:
                    job.exception = job.exception[:text]
                out.append(job)
        return out

    async def requeue_claimed(self, id: str, token: str, body: str, message: Message) -> bool:
        """Add the BullMQ job and delete the failed record in one ``MULTI``/``EXEC``,
        under a ``WATCH`` of the claim: when the claim changes before ``EXEC`` (its lease
        ended, another caller took it), nothing of it is written and the claim is read
        again."""
        link = self._d._link()
        key = self._claim_key(id)
        queues = self._queues(None)
        s = link.scripts(message.queue)
        for _ in range(_WATCH_TRIES):
            async with link.client.pipeline(transaction=True) as pipe:
                await pipe.watch(key)
                raw = await pipe.get(key)
                claim = json.loads(raw) if raw else None
                if not isinstance(claim, dict) or claim.get("token") != token:
                    return False
                up_to = round(float(claim.get("failed_at") or 0.0) * 1000)
                pipe.multi()  # type: ignore[no-untyped-call]
                job = _NewJob(message.job, body, 0, _now_ms())
                group = group_of(message)
                if group is None:
                    await s.addJob(job, _EvalPipe(pipe, link.commands.values()))
                else:  # back in its group's turns
                    keys, args = group_add_call(s, job, group)
                    pipe.execute_command("EVAL", link.add_group.script, len(keys), *keys, *args)
                failed = [link.scripts(q).keys["failed"] for q in queues]
                prefixes = [link.scripts(q).keys[""] for q in queues]
                pipe.execute_command(
                    "EVAL", link.forget_failed.script, len(failed), *failed, id, up_to, *prefixes
                )
                pipe.delete(key)
                pipe.hdel(self._index_key(), id)  # a record after the claim: only unindexed
                try:
                    results = await pipe.execute(raise_on_error=False)
                except WatchError:
                    continue
            self._where.pop(id, None)
            for r in results:
                if isinstance(r, Exception):
                    raise r
            return True
        return False

    async def flush(self, older_than: float | None = None) -> int:
        link = self._d._link()
        grace = round((older_than or 0) * 1000)
        n = 0
        for q in self._queues(None):
            n += len(await link.scripts(q).cleanJobsInSet("failed", grace, 0))
        if not grace:  # every record went (entries left by a partial flush are checked)
            await link.client.delete(self._index_key())
        self._where.clear()
        return n


def _envelope_id(data: str | None) -> str | None:
    d = envelope_of(data or "")
    return str(d["id"]) if d is not None and "id" in d else None


def _epoch_ms(raw: str | bytes | None) -> float | None:
    """Seconds from a hash's BullMQ timestamp (``finishedOn``, epoch milliseconds); None
    when it holds no count of milliseconds (absent, or edited by hand)."""
    if isinstance(raw, bytes):
        raw = raw.decode("latin-1")
    if raw and len(raw) <= 15 and raw.isascii() and raw.isdigit():  # up to year 33658
        return int(raw) / 1000
    return None


def _reason(exception: str) -> str:
    """BullMQ's ``failedReason``: the exception line (the last line of a traceback)."""
    lines = [ln for ln in exception.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else exception
