"""Failed jobs on a cache store (``redis``, ``database``, ``kv``): one key layout.

Keys, under ``haze:failed:<connection>:``:

- ``rec:<id>`` the record (``FailedJob.to_dict()`` and the envelope ``body``), no expiry;
- ``seq`` a counter and ``slot:<n>`` the id recorded n-th: the index ``list()`` reads
  (an id recorded twice is listed once);
- ``floor`` slots at or below it were flushed;
- ``claim:<id>`` a retry in progress (``{"token", "failed_at"}``), expiring after the
  retry's lease.

Every write is one store call and the index is appended through the store's atomic
``increment``, so several processes can record at once on an atomic store (redis,
database). On KV (``atomic = False``) two failures recorded at the same instant may
take one slot: the one left out of the listing is still found by id, and two retries
of one record at the same instant may both win its claim. ``forget`` deletes
the record and leaves its slot (skipped when listing); a full ``flush`` deletes the
slots too. Listing reads every slot since the last full flush: for a long failed
history, prefer a database connection.

Earlier, the cloudflare driver kept ``<id>`` records (without ``rec:``) listed by a
read-modify-write ``index`` list under the same prefix. Those are still listed, found,
forgotten and flushed here; nothing writes them any more.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Sequence
from typing import Any

from haze._base.message import FailedJob
from haze.contracts.store import Store

__all__ = ["StoreFailedJobs"]

#: Names under the prefix that are not an earlier layout's ``<id>`` record.
_OWN = ("seq", "floor", "index")
_CHUNK = 500


class StoreFailedJobs:
    """Failed jobs of queue connection ``connection`` on ``store``; see the module docstring."""

    def __init__(self, store: Store, connection: str) -> None:
        self.store = store
        self.connection = connection
        self._prefix = f"haze:failed:{connection}:"
        #: ids of the earlier layout's index, read once (None: not read yet)
        self._legacy: builtins.list[str] | None = None

    def _k(self, suffix: str) -> str:
        return self._prefix + suffix

    async def record(self, job: FailedJob) -> None:
        data = job.to_dict()
        data["body"] = job.body
        await self.store.put(self._k(f"rec:{job.id}"), data)
        n = await self.store.increment(self._k("seq"), 1)
        await self.store.put(self._k(f"slot:{n}"), job.id)

    async def claim_retry(self, id: str, token: str, lease: float) -> FailedJob | None:
        job = await self.find(id)  # the earlier layout's records too
        if job is None:
            return None
        # The claim names the record it took (its failed_at): a record written after
        # it (the job failed again) is not the one ``retried`` deletes.
        claim = {"token": token, "failed_at": job.failed_at}
        key = self._k(f"claim:{id}")
        if not await self.store.add(key, claim, ttl=lease):
            return None
        # Another caller may have retried it (and ended its claim) since we read it.
        again = await self.find(id)
        if again is None or again.failed_at != job.failed_at:
            await self.store.delete(key, owner=claim)
            return None
        return job

    async def retried(self, id: str, token: str) -> bool:
        claim_key = self._k(f"claim:{id}")
        claim = await self.store.get(claim_key)
        if not isinstance(claim, dict) or claim.get("token") != token:
            return False
        rec_key = self._k(f"rec:{id}")
        data = await self.store.get(rec_key)
        gone = False
        if isinstance(data, dict) and data.get("failed_at") == claim.get("failed_at"):
            gone = await self.store.delete(rec_key, owner=data)  # unless replaced meanwhile
        elif data is None and (await self._legacy_ids()) and self._is_legacy(id):
            gone = await self.forget(id)
        await self.store.delete(claim_key, owner=claim)
        return gone

    @staticmethod
    def _job(data: Any) -> FailedJob | None:
        if not isinstance(data, dict):
            return None
        if "name" not in data:  # the earlier layout kept the row of a failed_jobs table
            return FailedJob.from_body(
                str(data.get("body") or ""),
                id=str(data.get("id")),
                connection=str(data.get("connection")),
                queue=str(data.get("queue")),
                exception=str(data.get("exception")),
                failed_at=float(data.get("failed_at") or 0.0),
            )
        return FailedJob(
            id=str(data.get("id")),
            name=str(data.get("name")),
            connection=str(data.get("connection")),
            queue=str(data.get("queue")),
            payload=data.get("payload"),
            exception=str(data.get("exception")),
            failed_at=float(data.get("failed_at") or 0.0),
            chain_id=data.get("chain_id"),
            batch_id=data.get("batch_id"),
            body=str(data.get("body") or ""),
        )

    async def _get_many(self, keys: Sequence[str]) -> builtins.list[Any]:
        out: builtins.list[Any] = []
        for i in range(0, len(keys), _CHUNK):
            out.extend(await self.store.get_many(keys[i : i + _CHUNK]))
        return out

    async def _legacy_ids(self) -> builtins.list[str]:
        if self._legacy is None:
            ids = await self.store.get(self._k("index"))
            self._legacy = [str(i) for i in ids] if isinstance(ids, list) else []
        return self._legacy

    def _is_legacy(self, id: str) -> bool:
        return self._legacy is not None and id in self._legacy and id not in _OWN

    async def _ids(self) -> tuple[builtins.list[str], int, int]:
        legacy = await self._legacy_ids()
        seq, floor = await self.store.get_many([self._k("seq"), self._k("floor")])
        seq, floor = int(seq or 0), int(floor or 0)
        values = await self._get_many([self._k(f"slot:{n}") for n in range(floor + 1, seq + 1)])
        ids = list(dict.fromkeys([*legacy, *(str(v) for v in values if v is not None)]))
        return ids, floor, seq

    async def list(self, queue: str | None = None) -> builtins.list[FailedJob]:
        ids, _, _ = await self._ids()
        records = await self._get_many([self._k(f"rec:{i}") for i in ids])
        old = [i for i, r in zip(ids, records, strict=True) if r is None and self._is_legacy(i)]
        records += await self._get_many([self._k(i) for i in old])
        jobs = [j for j in map(self._job, records) if j is not None]
        jobs.sort(key=lambda j: j.failed_at)
        return [j for j in jobs if queue is None or j.queue == queue]

    async def find(self, id: str) -> FailedJob | None:
        found = self._job(await self.store.get(self._k(f"rec:{id}")))
        if found is None and (await self._legacy_ids()) and self._is_legacy(id):
            found = self._job(await self.store.get(self._k(id)))
        return found

    async def forget(self, id: str) -> bool:
        gone = bool(await self.store.delete(self._k(f"rec:{id}")))
        if (await self._legacy_ids()) and self._is_legacy(id):
            gone = bool(await self.store.delete(self._k(id))) or gone
        return gone

    async def flush(self, older_than: float | None = None) -> int:
        if older_than is not None:
            cutoff = time.time() - older_than
            n = 0
            for job in await self.list():
                if job.failed_at < cutoff and await self.forget(job.id):
                    n += 1
            return n
        ids, floor, seq = await self._ids()
        n = 0
        for i in ids:
            if await self.forget(i):
                n += 1
        await self.store.put(self._k("floor"), seq)
        for slot in range(floor + 1, seq + 1):
            await self.store.delete(self._k(f"slot:{slot}"))
        if self._legacy:
            await self.store.delete(self._k("index"))
            self._legacy = []
        return n
