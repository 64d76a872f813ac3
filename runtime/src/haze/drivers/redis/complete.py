"""How the redis driver finishes a job (complete, release, fail), keeps the locks of
running jobs, and puts back stalled jobs and jobs fetched ahead."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from bullmq.scripts import raw2NextJobData  # type: ignore[import-untyped]
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from haze.contracts.driver import FailedJob, Reserved
from haze.drivers.redis.base import _RedisBase
from haze.drivers.redis.failed import _reason
from haze.drivers.redis.link import _Link
from haze.drivers.redis.scripts import _LOCK_ERRORS, _MAX_STALLED, _ActiveJob, _now_ms

log = logging.getLogger("haze.drivers.redis")

#: How long a job that finished while Redis was unreachable stays marked done: its claim
#: comes back through the stalled check after retry_after, and waits in the queue.
_DONE_KEEP = 86400


class _Finishing(_RedisBase):
    """Finishing claimed jobs; a finish fetches the next job of its queue (``fetchNext``)."""

    async def _claimed(
        self, link: _Link, queue: str, data: dict[str, str], job_id: str, token: str
    ) -> Reserved | None:
        """A job this worker now holds the lock of; counters that are not integers are
        reset first, since BullMQ's scripts ``HINCRBY`` them (failing the job, the stalled
        check) and a script that errors halfway leaves the job in no set at all.

        None: the job had already finished, during an outage that lost its ack (a
        ``_record_lost`` marker names it), and is now completed without running again.
        Only a job on a later attempt can be one: the others cost no extra call."""
        job = self._reserved(queue, data, job_id, token)
        link.open.add(job.token)
        bad: dict[Any, Any] = {
            f: "0"
            for f in ("atm", "stc", "attemptsMade")
            if data.get(f) not in (None, "") and not (data[f].isascii() and data[f].isdigit())
        }
        if bad:
            await link.client.hset(link.scripts(queue).toKey(str(job_id)), mapping=bad)
        if job.attempt > 1 and await self._finished_before(link, job):
            return None
        return job

    async def _finished_before(self, link: _Link, job: Reserved) -> bool:
        """True when ``job`` (just claimed) already finished once while Redis was
        unreachable: it is completed now, unrun."""
        if job.message is None:
            return False
        if not await link.client.exists(self._done_key(link, job.queue, job.message.id)):
            return False
        link.open.discard(job.token)
        keys, args = link.scripts(job.queue).complete_args(
            _ActiveJob(job.token[0], self._queue_opts), self.keep_completed, job.token[1], False
        )
        await link.script("moveToFinished", keys, args)
        log.info(
            "haze redis: job %s on %s/%s already finished while Redis was unreachable: "
            "completed without running it again",
            job.message.id,
            self.name,
            job.queue,
        )
        return True

    async def _return_prefetched(self, link: _Link) -> None:
        """Put jobs fetched ahead back at the head of their queue, unchanged."""
        while link.prefetched:
            job = link.prefetched.popleft()
            job_id, token = job.token
            link.open.discard(job.token)
            s = link.scripts(job.queue)
            keys = [
                s.keys[k]
                for k in (
                    "active",
                    "wait",
                    "stalled",
                    "paused",
                    "meta",
                    "limiter",
                    "prioritized",
                    "marker",
                    "events",
                )
            ]
            try:
                await link.move_back(keys=keys, args=[job_id, token, s.toKey(job_id)])
            except Exception as e:
                log.warning(
                    "haze redis: could not hand back job %s on %s: %s (it returns "
                    "when its lock expires)",
                    job_id,
                    job.queue,
                    e,
                )

    async def _settled(
        self, link: _Link, job: Reserved, result: Any, what: str, asked: bool = False
    ) -> bool:
        """Check a finishing script's reply; keep the job it fetched, if any. False when
        the job's lock was no longer this worker's (the manager warns, naming the job).

        ``asked``: moveToFinished was asked for the next job of the first queue; an
        answer without one is BullMQ's ``drained`` (that queue is empty), kept for the
        next reserve when its wait claims (``_Link.drained``)."""
        if isinstance(result, int):
            if result < 0:
                log.debug(
                    "haze redis: %s of job %s on %s/%s skipped: %s (a stalled check gave it "
                    "to another worker)",
                    what,
                    job.token[0],
                    self.name,
                    job.queue,
                    _LOCK_ERRORS.get(result, f"BullMQ error {result}"),
                    extra={
                        "job_id": job.message.id if job.message else None,
                        "attempt": job.attempt,
                    },
                )
                return False
            if asked and link.fetch_next and link.claim_lite is not None:
                link.drained = (job.queue, 0)
            return True
        if not result:
            return True
        data, job_id, _, due = raw2NextJobData(result)
        if data:
            fetched = await self._claimed(link, job.queue, data, job_id, job.token[1])
            if fetched is not None:
                link.prefetched.append(fetched)
            if not link.fetch_next:  # the worker stopped meanwhile
                await self._return_prefetched(link)
        elif asked and link.fetch_next and link.claim_lite is not None:
            link.drained = (job.queue, int(due or 0))
        return True

    def _fetch(self, link: _Link, job: Reserved) -> bool:
        return link.fetch_next and job.queue == link.first

    async def ack(self, job: Reserved) -> bool:
        link = self._link()
        link.open.discard(job.token)
        job_id, token = job.token
        s = link.scripts(job.queue)
        fetch = self._fetch(link, job)
        keys, args = s.complete_args(
            _ActiveJob(job_id, self._queue_opts), self.keep_completed, token, fetch
        )
        try:
            result = await link.script("moveToFinished", keys, args)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            if job.message is not None:
                self._lost[job.token] = job
            raise
        return await self._settled(link, job, result, "completing", fetch)

    def _done_key(self, link: _Link, queue: str, message_id: str) -> str:
        return f"{link.scripts(queue).keys['']}haze-done:{message_id}"

    async def _record_lost(self, link: _Link) -> None:
        """Record the jobs whose ack was lost to an outage, now that Redis answers: a
        marker per job (its haze id, kept :data:`_DONE_KEEP`) that a later claim of it
        honours (``_claimed``), then the ack again, which completes it where Redis still
        holds it under this worker's lock. Stops at the first outage error (still out);
        a job that fails otherwise is left to run again, as it did without the marker."""
        for token, job in list(self._lost.items()):
            assert job.message is not None
            try:
                await link.client.set(
                    self._done_key(link, job.queue, job.message.id), 1, ex=_DONE_KEEP
                )
                keys, args = link.scripts(job.queue).complete_args(
                    _ActiveJob(token[0], self._queue_opts), self.keep_completed, token[1], False
                )
                await link.script("moveToFinished", keys, args)  # < 0: the lock is gone
            except (RedisConnectionError, RedisTimeoutError, OSError):
                raise
            except Exception as e:  # never a reason to stop claiming
                log.warning(
                    "haze redis: could not record job %s on %s/%s as done (%s: %s); it runs "
                    "again once its lock expires",
                    job.message.id,
                    self.name,
                    job.queue,
                    type(e).__name__,
                    e,
                )
            del self._lost[token]

    async def release(self, job: Reserved, delay: float, *, consume_attempt: bool) -> bool:
        link = self._link()
        link.open.discard(job.token)
        job_id, token = job.token
        s = link.scripts(job.queue)
        fetch = self._fetch(link, job)
        opts = {
            "skipAttempt": not consume_attempt,
            "fetchNext": fetch,
            "workerOpts": self._worker_opts,
        }
        delay_ms = max(0, round(delay * 1000))
        keys, args = s.moveToDelayedArgs(job_id, _now_ms(), token, delay_ms, opts)
        result = await link.commands["moveToDelayed"](keys=keys, args=args, client=link.fast)
        return await self._settled(link, job, result, "releasing")

    async def fail(self, job: Reserved, failed: FailedJob) -> bool:
        link = self._link()
        link.open.discard(job.token)
        job_id, token = job.token
        s = link.scripts(job.queue)
        fields = {"stacktrace": json.dumps([failed.exception])}
        if failed.body and failed.body != job.body:
            fields["data"] = failed.body  # e.g. without the unique lock, or encrypted
        keep: int | bool = self.keep_failed if self.keep_failed is not None else False
        fetch = self._fetch(link, job)
        keys, args = s.moveToFailedArgs(
            _ActiveJob(job_id, self._queue_opts),
            _reason(failed.exception),
            keep,
            token,
            fetch,
            fields,
        )
        result = await link.commands["moveToFinished"](keys=keys, args=args, client=link.fast)
        settled = await self._settled(link, job, result, "failing", fetch)
        if settled:
            try:
                await self.failed.indexed(link, failed.id, job.queue, job_id)
            except Exception as e:  # the failure is recorded: an older copy merely stays
                log.warning(
                    "haze redis: could not replace the older failed record of job %s on "
                    "%s/%s (%s: %s); queue:failed still shows one",
                    failed.id,
                    self.name,
                    job.queue,
                    type(e).__name__,
                    e,
                )
        return settled

    async def heartbeat(self, jobs: Sequence[Reserved]) -> None:
        """Renew the BullMQ locks of running jobs (one script call per queue)."""
        link = self._link()
        by_queue: dict[str, tuple[list[str], list[str]]] = {}
        for job in jobs:
            if isinstance(job.token, tuple):
                ids, tokens = by_queue.setdefault(job.queue, ([], []))
                ids.append(job.token[0])
                tokens.append(job.token[1])
        results = await asyncio.gather(
            *(
                link.scripts(q).extendJobLocks(ids, tokens, self.lock_ms)
                for q, (ids, tokens) in by_queue.items()
            )
        )
        for q, lost in zip(by_queue, results, strict=True):
            tokens_by_id = dict(zip(*by_queue[q], strict=True))
            for job_id in lost or ():
                if (job_id, tokens_by_id.get(job_id)) not in link.open:
                    continue  # it finished while the renewal was on its way
                log.warning(
                    "haze redis: job %s on %s/%s lost its lock; another worker may run it again",
                    job_id,
                    self.name,
                    q,
                )

    async def check_stalled(self, queues: Iterable[str] | None = None) -> list[str]:
        """Run BullMQ's stalled check now; returns the ids of the jobs put back.

        A check marks the active jobs; a later one (after ``stalled_interval``) moves
        those whose lock expired back to ``wait`` and counts the restart (``stc``).
        """
        link = self._link()
        moved: list[str] = []
        for q in list(queues) if queues is not None else list(link.consumed or self.queues):
            ids = await link.scripts(q).moveStalledJobsToWait(_MAX_STALLED, self.lock_ms)
            for job_id in ids or ():
                log.warning(
                    "haze redis: job %s on %s/%s stalled (its worker stopped renewing "
                    "the lock); it is back on the queue",
                    job_id,
                    self.name,
                    q,
                )
                moved.append(str(job_id))
        return moved

    async def _stalled_loop(self, link: _Link) -> None:
        # Ends on ``link.closing`` rather than only on cancellation: redis-py can swallow
        # a cancellation that lands mid-command (redis/redis-py#2028).
        # the first check waits a little: it only marks active jobs, and a worker that
        # is starting has better things to do with its first round trips
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(link.closing.wait(), min(1.0, self.stalled_interval))
        failing = False
        while not link.closing.is_set():
            try:
                await self.check_stalled()
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # once per outage: the worker's own warning says when Redis is back (and
                # an unreachable Redis is the worker's warning to give, not this loop's)
                log.log(
                    logging.DEBUG
                    if failing or isinstance(e, (*self.outage_errors, OSError))
                    else logging.WARNING,
                    "haze redis: stalled-job check on %s failed: %s",
                    self.name,
                    e,
                )
                failing = True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(link.closing.wait(), self.stalled_interval)
