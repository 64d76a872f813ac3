"""Jobs of a batch whose send lost its reply and could not be looked up: they may be
queued or not, and the batch must neither call them failed while they may still run
nor wait for them forever.

Such a job stays pending. Each has a fate key that exactly one side claims:

- the job itself, when a worker takes it (``claim_run``): it runs and settles like any
  other job of the batch;
- the batch, once nothing but such jobs is pending (``due``: checked by each job that
  settles and by the dispatch itself when it is done): each one not started is first
  looked up on the connections it may be queued on (``KnowsQueued``). Found: it stays
  pending, and runs and settles later. Not found (or a connection that cannot look a
  job up): voided, counted as failed, and skipped should it come later.

"Not found" is final: a job claims its key when it starts, before its run ends and
its row goes, so a job that ran has its key taken and is not voided. A lookup that
gives no answer leaves the job pending; the caller asks again (``batch_settle``).

So the batch ends either way, and never with a job of its own still to run. Keys: the
count ``unknown``, the sets ``unknown-set:{k}`` (``k`` up to ``unknown-sets``: the ids
of one send and the connections it may have queued them on), the count
``unknown-started`` and ``fate:{id}`` (``run`` or ``void``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from haze._orchestration.batch_records import _key
from haze.contracts.store import Store

__all__ = ["Held", "claim_run", "due", "ids", "parts", "record", "sets", "void"]


#: (job id, the connections it may be queued on) -> whether one of them holds it;
#: raises when it gets no answer
Held = Callable[[str, Sequence[str]], Awaitable[bool]]


async def record(
    store: Store,
    batch_id: str,
    job_ids: Sequence[str],
    connections: Sequence[str],
    ttl: float | None,
) -> None:
    """Note ``job_ids`` as jobs of the batch that may be queued, on one of ``connections``."""
    k = await store.increment(_key(batch_id, "unknown-sets"), 1, ttl)
    noted = {"ids": list(job_ids), "connections": list(connections)}
    await store.put(_key(batch_id, f"unknown-set:{k}"), noted, ttl)
    # the count last: a job that reads it finds its id in the lists
    await store.increment(_key(batch_id, "unknown"), len(job_ids), ttl)


async def sets(store: Store, batch_id: str) -> list[tuple[list[str], list[str]]]:
    """Each send's jobs that may be queued, with the connections they may be queued on."""
    n = int(await store.get(_key(batch_id, "unknown-sets")) or 0)
    noted = await store.get_many([_key(batch_id, f"unknown-set:{k}") for k in range(1, n + 1)])
    return [_read(s) for s in noted if s]


def _read(noted: Any) -> tuple[list[str], list[str]]:
    if isinstance(noted, list):  # noted before connections were: none to ask
        return [str(i) for i in noted], []
    return [str(i) for i in noted["ids"]], [str(c) for c in noted["connections"]]


async def ids(store: Store, batch_id: str) -> list[str]:
    """Every job of the batch noted as may be queued."""
    return [i for job_ids, _ in await sets(store, batch_id) for i in job_ids]


async def claim_run(store: Store, batch_id: str, job_id: str, ttl: float | None) -> bool:
    """Whether job ``job_id`` of a batch with jobs that may be queued may run: False when
    it is one of them and the batch voided it (counted it failed) before it came."""
    if job_id not in await ids(store, batch_id):
        return True
    fate = _key(batch_id, f"fate:{job_id}")
    if await store.add(fate, "run", ttl):
        await store.increment(_key(batch_id, "unknown-started"), 1, ttl)
        return True
    return await store.get(fate) != "void"  # "run": a redelivery of the one that runs


async def due(store: Store, batch_id: str) -> bool:
    """Whether nothing but jobs that may be queued and have not started is pending."""
    keys = [_key(batch_id, p) for p in ("unknown", "unknown-started", "pending")]
    unknown, started, pending = await store.get_many(keys)
    if not unknown:
        return False
    return int(pending or 0) <= int(unknown) - int(started or 0)


async def void(
    store: Store, batch_id: str, ttl: float | None, held: Held
) -> tuple[list[str], Exception | None]:
    """Claim the fate of each job that may be queued, has not started and that ``held``
    does not find: the ids the batch now counts as failed (any of them that comes later
    is skipped), and the first lookup that got no answer (its job stays pending)."""
    voided: list[str] = []
    error: Exception | None = None
    for job_ids, connections in await sets(store, batch_id):
        fates = await store.get_many([_key(batch_id, f"fate:{i}") for i in job_ids])
        for job_id, fate in zip(job_ids, fates, strict=True):
            if fate is not None:
                continue  # started (it settles itself), or voided already
            try:
                if await held(job_id, connections):
                    continue  # queued or running: it claims its key and settles
            except Exception as e:
                error = error or e
                continue
            if await store.add(_key(batch_id, f"fate:{job_id}"), "void", ttl):
                voided.append(job_id)
    return voided, error


async def parts(store: Store, batch_id: str) -> list[str]:
    """The key parts of a batch's jobs that may be queued (for ``prune``)."""
    n = int(await store.get(_key(batch_id, "unknown-sets")) or 0)
    out = ["unknown", "unknown-sets", "unknown-started"]
    out += [f"unknown-set:{k}" for k in range(1, n + 1)]
    return out + [f"fate:{i}" for i in await ids(store, batch_id)]
