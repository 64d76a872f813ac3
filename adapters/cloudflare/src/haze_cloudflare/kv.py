"""A cache store on Workers KV (``config/cache.py``: ``{"driver": "kv", "binding": "KV"}``).

KV is eventually consistent and has no compare-and-set: ``add``, ``increment``, the
owner check of ``delete`` and ``touch`` (a lease renewal) are read-then-write here, so
two isolates can both take a "unique" lock or lose an increment. The store says so with
``atomic = False``, and logs a warning the first time it is used for locks or counters
(unique jobs, middleware, batches, a ``failed_store``'s index). Use ``redis`` or the
``database`` store (D1 through the binding) for those; KV is fine for state that
tolerates races.

Values are stored as JSON ``{"v": value, "e": expires_at}``. KV's own expiry
(``expirationTtl``) has a 60-second minimum, so it is set to at least 60 s and the exact
TTL is checked on read. Keys get ``prefix`` (default: none) in front.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from haze.contracts.store import BatchSettled
from haze.driver_api import HazeError

from haze_cloudflare._js import binding, is_nullish, to_js, to_py

__all__ = ["KVStore"]

log = logging.getLogger("haze.stores.kv")

#: KV rejects an expirationTtl under 60 seconds.
MIN_KV_TTL = 60


async def _settle(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class KVStore:
    """Workers KV through the binding ``binding`` (default ``KV``); not atomic."""

    #: the config options it takes besides ``driver`` (``DeclaresOptions``)
    options: ClassVar[Mapping[str, str]] = {"binding": "str", "prefix": "str"}

    atomic = False
    shared = True

    def __init__(self, name: str, options: dict[str, Any] | None = None, app: Any = None):
        options = options or {}
        self.name = name
        self.binding_name: str = options.get("binding") or "KV"
        self.prefix: str = options.get("prefix") or ""
        self._warned = False

    def __repr__(self) -> str:
        return f"<KVStore {self.name!r} binding={self.binding_name!r}>"

    def _kv(self) -> Any:
        kv = binding(self.binding_name)
        if kv is None:
            raise HazeError(
                f'the "{self.name}" store (kv) needs the KV binding {self.binding_name!r} of a '
                "Cloudflare Worker; none is bound here (haze_cloudflare.bind_env(env))"
            )
        return kv

    def _warn(self, what: str) -> None:
        if self._warned:
            return
        self._warned = True
        log.warning(
            'The "%s" store is Cloudflare KV, which is not atomic (eventually consistent, no '
            "compare-and-set): %s on it may race between isolates, so unique locks can be "
            "taken twice, batch or rate-limit counters can lose updates, and a failed_store "
            "index can miss a failure recorded at the same instant (still found by its id). "
            "Use redis, or the database store on D1, for locks, batches and failed jobs.",
            self.name,
            what,
        )

    # -- raw access ---------------------------------------------------------------

    async def _read(self, key: str) -> tuple[Any, float | None] | None:
        raw = await _settle(self._kv().get(self.prefix + key))
        if is_nullish(raw):
            return None
        try:
            data = json.loads(str(to_py(raw)))
        except ValueError:
            return None
        if not isinstance(data, dict) or "v" not in data:
            return None
        expires = data.get("e")
        if expires is not None and float(expires) <= time.time():
            return None
        return data["v"], (float(expires) if expires is not None else None)

    async def _write(self, key: str, value: Any, expires: float | None) -> None:
        text = json.dumps({"v": value, "e": expires}, separators=(",", ":"))
        kv = self._kv()
        if expires is None:
            await _settle(kv.put(self.prefix + key, text))
            return
        ttl = max(MIN_KV_TTL, math.ceil(expires - time.time()))
        await _settle(kv.put(self.prefix + key, text, to_js({"expirationTtl": ttl})))

    # -- Store protocol -----------------------------------------------------------

    async def get(self, key: str) -> Any | None:
        got = await self._read(key)
        return None if got is None else got[0]

    async def get_many(self, keys: Sequence[str]) -> list[Any | None]:
        return [await self.get(k) for k in keys]

    async def put(self, key: str, value: Any, ttl: float | None = None) -> None:
        await self._write(key, value, time.time() + ttl if ttl else None)

    async def add(self, key: str, value: Any, ttl: float | None = None) -> bool:
        self._warn("add-if-absent (locks)")
        if await self._read(key) is not None:
            return False
        await self._write(key, value, time.time() + ttl if ttl else None)
        return True

    async def increment(self, key: str, by: int = 1, ttl: float | None = None) -> int:
        self._warn("increment (counters)")
        got = await self._read(key)
        if got is None:
            value, expires = by, (time.time() + ttl if ttl else None)
        else:
            value, expires = int(got[0]) + by, got[1]
        await self._write(key, value, expires)
        return int(value)

    async def delete(self, key: str, owner: Any | None = None) -> bool:
        got = await self._read(key)
        if got is None:
            return False
        if owner is not None and got[0] != owner:
            return False
        await _settle(self._kv().delete(self.prefix + key))
        return True

    async def ttl(self, key: str) -> float | None:
        got = await self._read(key)
        if got is None or got[1] is None:
            return None
        return max(0.0, got[1] - time.time())

    async def touch(self, key: str, owner: Any, ttl: float) -> bool:
        """Read, compare, write: another isolate's write in between is overwritten."""
        self._warn("lease renewal (concurrency limits)")
        got = await self._read(key)
        if got is None or got[0] != owner:
            return False
        await self._write(key, got[0], time.time() + ttl)
        return True

    async def settle_batch_job(
        self,
        batch: str,
        job: str,
        outcome: str,
        *,
        count: int = 1,
        cancel: bool = False,
        now: float = 0.0,
        ttl: float | None = None,
        keep: int = 0,
    ) -> BatchSettled:
        """The same steps as the atomic stores, one KV read or write at a time: a crash
        or a second isolate in between can lose or double a count (hence the warning)."""
        self._warn("batch counters")
        marker = f"{batch}:done:{job}"
        got = await self._read(marker)
        if got is None:
            await self._write(marker, outcome, time.time() + ttl if ttl else None)
            if outcome == "failed":
                n = await self.increment(f"{batch}:failed", count, ttl)
                await self.put(f"{batch}:failed:{n}", job, ttl)
                if cancel:
                    await self.add(f"{batch}:cancelled", now, ttl)
            else:
                await self.increment(f"{batch}:processed", count, ttl)
            if keep > 0 and (n := await self.increment(f"{batch}:jobs", 1, ttl)) <= keep:
                await self.put(f"{batch}:jobs:{n}", job, ttl)
            pending = await self.increment(f"{batch}:pending", -count, ttl)
            return BatchSettled(True, pending, outcome)
        first = str(got[0])
        if (
            outcome == "done"
            and first == "failed"
            and await self.add(f"{batch}:recovered:{job}", 1, ttl)
        ):
            await self.increment(f"{batch}:recovered", 1, ttl)
            await self.increment(f"{batch}:processed", 1, ttl)
        return BatchSettled(False, int(await self.get(f"{batch}:pending") or 0), first)

    async def close(self) -> None:
        return None
