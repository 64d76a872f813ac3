"""The ``redis`` driver: haze queues as BullMQ queues, through the ``bullmq`` package.

BullMQ's data model is kept as is, so BullMQ tools (bull-board, Taskforce, a Node
``Queue``) can look at haze queues:

- each haze queue is one BullMQ queue under the key prefix ``prefix`` (default
  ``haze``): ``haze:<queue>:wait``, ``:active``, ``:delayed``, ``:failed``, ...
- each message is one BullMQ job with an auto-increment id, named after the haze
  job, whose ``data`` is the haze envelope (see ``haze.message``)::

      {"v": 1, "id": "8f0c…", "job": "send_invoice", "payload": {"invoice_id": 42},
       "queue": "emails", "ts": 1764433200.12, "connection": "redis",
       "attempts": 0, "tenant": "acme", "chain": [...], "batch_id": "…", ...}

  ``v``, ``id`` (32 hex characters, the id haze returns and logs), ``job`` and
  ``payload`` are required; the rest is written only when set. A Node producer can
  queue a haze job with ``queue.add("send_invoice", {v: 1, id, job: "send_invoice",
  payload: {...}})``. A job whose data is not such an envelope, or names a job this
  app does not define, is moved to the failed set with the reason.

How haze's rules map onto BullMQ:

- Delays use the delayed set. Jobs are created with ``attempts: 1``: BullMQ never
  retries on its own, haze's manager decides (tries, backoff, ``retry_until``).
- ``Reserved.attempt`` = envelope ``attempts`` + ``attemptsMade`` (``atm``) +
  ``stalledCounter`` (``stc``) + 1. A retry moves the job to the delayed set with the
  backoff timestamp (``moveToDelayed``, which counts ``attemptsMade``); a crash
  restart is counted by BullMQ's stalled check (``stc``).
- ``job.release(delay)`` uses BullMQ's ``DelayedError`` machinery: ``moveToDelayed``
  with ``skipAttempt``, so the job keeps its id and no try is used.
- Stalled jobs: claiming sets a lock for ``retry_after`` (default 30s); the worker's
  heartbeat renews the locks of running jobs every ``retry_after / 3`` (BullMQ's
  default is a half: a third leaves a late round on a busy event loop more slack); every
  ``retry_after`` a stalled check (``moveStalledJobsToWait``, shared by all workers
  through BullMQ's stalled-check key) puts back the jobs whose lock expired.
- ``fail()`` moves the job to the failed set (``failedReason`` = the exception line,
  ``stacktrace`` = the traceback). ``Queue.failed()`` reads the failed sets of the
  ``queues`` option; ``Queue.retry()`` re-adds the envelope as a new job.
- Speed: finishing a job (``ack``/``release``/``fail``) fetches the next job of the
  same queue in the same script call (``fetchNext``) and keeps it for the next
  ``reserve``; when that finds the queue empty, the next ``reserve`` waits for its
  marker without claiming first (BullMQ's ``drained``). An idle worker blocks on the
  queues' marker keys (``BZPOPMIN``) on a connection of its own, with the claim of the
  first queue (BullMQ's ``moveToActive``) written behind it in the same write: Redis
  runs the claim the moment the wait returns, so a job that wakes an idle worker is
  claimed with no round trip after its marker. Every claim (behind a wait or not) is
  ``claim_job.lua``, haze's copy of BullMQ's ``moveToActive`` for the options haze
  sends (the same writes, plain arguments instead of msgpack, less server time), used
  only next to the bullmq script it copies (same SHA);
  tests/drivers/test_redis_lite_claim.py compares the two. A claim behind a wait can run
  long after it was written, so it sends an empty timestamp, which the script takes
  from the server's clock. A stopping worker ends such a wait with
  ``CLIENT UNBLOCK`` and hands back what its claim took. ``enqueue_many`` adds a whole
  group in one ``MULTI`` round trip (``addBulk``). The per-job script calls (add, claim,
  finish) go over a lean connection of their own (``haze.drivers.redis.wire``) with their arguments
  built from per-queue templates, checked against bullmq's own builders on first use.
  A plain job (no delay) after a queue's first is added by ``add_job.lua``,
  haze's copy of BullMQ's ``addStandardJob`` for that shape (the same writes, about
  half the server time), used only next to the bullmq script it copies (same SHA);
  tests/drivers/test_redis_lite_add.py compares the two.
- Priority: ``reserve(["high", "default"])`` always tries ``high`` first; a job is
  only prefetched from the highest-priority queue, so a prefetch never jumps it.
  Claims are taken one at a time per process, so jobs start in queue order.
- ``size()`` counts waiting, delayed and active (claimed) jobs, like Laravel's Redis
  queue; ``purge()`` is BullMQ's ``drain`` (waiting and delayed jobs).
- Outages (docs/redis.md): a pooled connection that died with a restart is retried once
  on a fresh one; scripts a restarted Redis forgot are loaded again on ``NOSCRIPT``. The
  worker takes ``outage_errors`` as "Redis is unreachable" (one warning per outage,
  claims retried with backoff) and calls ``connection_lost()``, which drops the jobs
  fetched ahead (their locks expire and the stalled check returns them) and the
  blocking waits.
"""

from __future__ import annotations

from haze._base.errors import MissingDependencyError

# One check for the whole package: its modules import these at their top.
try:
    import bullmq  # type: ignore[import-untyped]  # noqa: F401
    import msgpack  # type: ignore[import-untyped]  # noqa: F401
    import redis.asyncio  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised without the extra installed
    raise MissingDependencyError("the redis driver", "redis", "bullmq") from e

from haze.drivers.redis.driver import RedisDriver
from haze.drivers.redis.failed import RedisFailedJobs

__all__ = ["RedisDriver", "RedisFailedJobs"]
