"""Large payloads: written to a connection's object store, read back where they run.

A connection with ``"offload": {"to": url, "over": size}`` sends a payload over
``over`` bytes (without ``over``: a message over the driver's cap) through its object
store: the dispatcher writes the payload (already encrypted, for an encrypted job) as
one object, then queues an envelope whose ``payload`` is null and whose
``meta.offload`` is ``{"offloaded": key, "size": n, "sha256": hex}``. Execution reads
the object back before the job's payload is decoded, and fails the job when it is
missing or its bytes do not match ("checksum mismatch").

The object lives as long as the message: deleted after the job's final ack (done,
cancelled, skipped), kept while the job is released, retried or in failed jobs (a
retry from there queues the same reference), and deleted when its failed record is
forgotten or flushed.

The key is ``<message id>.<12 random hex>``, chosen here, at dispatch: the id names
the job an orphan belonged to, and the random part keeps two messages that share an
id (a chain link sent again after a crash) from sharing, and deleting, one object.

Crash windows, each leaving an orphan that ``haze queue:prune-offload`` sweeps:
written and never queued (the enqueue failed or the process died); acked and not
deleted; a failed record forgotten and its object not deleted. None loses a job.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from haze._base.describe import error_line
from haze._base.errors import HazeError, OffloadError, OffloadStoreError
from haze._base.message import OFFLOADED, decode_payload, encode_payload, envelope_of, new_id
from haze._engine.hooks import Outcome
from haze.offload import object_store

if TYPE_CHECKING:
    from haze._base.message import Message
    from haze._engine.hooks import Run
    from haze._engine.view import EngineApp
    from haze.contracts.driver import Driver, FailedJob
    from haze.contracts.offload import ObjectStore

__all__ = ["Offload", "OffloadCleanup", "Plan", "reference", "referenced"]

log = logging.getLogger("haze")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
#: Bytes of a chain link's or a callback's payload kept inline (at most: less when the
#: connection's ``over`` is lower); links travel in the messages before them.
LINK_OVER = 16 * 1024
#: Outcomes after which the message is gone from its queue and its failed jobs.
_FINAL = (Outcome.SUCCESS, Outcome.CANCELLED, Outcome.SKIPPED)


class Plan(NamedTuple):
    """A connection's offload: its store and its threshold (None: the driver's cap)."""

    store: ObjectStore
    over: int | None
    connection: str = ""


def _cause(error: BaseException) -> str:
    """A store client's error on one line, however it words it (and at most 300 chars)."""
    return " ".join(error_line(error).split())[:300]


def reference(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """The offload reference an envelope's ``meta`` carries, or None."""
    ref = meta.get(OFFLOADED) if meta is not None else None
    return ref if isinstance(ref, dict) else None


def _size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _ref(key: str, data: bytes, *, encrypted: bool) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "offloaded": key,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if encrypted:
        ref["enc"] = True
    return ref


class Offload:
    """The offload of one app's connections."""

    def __init__(self, app: EngineApp) -> None:
        self.app = app
        self._plans: dict[str, Plan | None] = {}

    def plan(self, connection: str) -> Plan | None:
        """The offload ``connection`` is configured with (None: none)."""
        if connection in self._plans:
            return self._plans[connection]
        config = self.app.queue_config.connections.get(connection) or {}
        offload = config.get("offload")
        plan = None
        if isinstance(offload, dict):
            key = f"connections.{connection}.offload.to"
            plan = Plan(object_store(offload["to"], key=key), offload.get("over"), connection)
        self._plans[connection] = plan
        return plan

    @staticmethod
    def wanted(plan: Plan, content: str, body: str, driver: Driver) -> bool:
        """Whether a payload (``content``: its JSON, or its ciphertext) goes to the store."""
        if plan.over is not None:
            return _size(content) > plan.over
        limit = driver.max_message_size
        return limit is not None and _size(body) > limit

    @staticmethod
    async def write(plan: Plan, message: Message, content: str, *, encrypted: bool) -> Message:
        """Write ``content`` to the store; the message that carries its reference (a copy:
        ``message`` keeps its payload for the caller)."""
        ref = await Offload.put(plan, message.id, content, encrypted=encrypted)
        out = copy.copy(message)
        out.payload, out.enc = None, None
        out.meta = {**(message.meta or {}), OFFLOADED: ref}
        return out

    async def offload_link(self, link: dict[str, Any], connection: str) -> dict[str, Any]:
        """``link`` (a chain link or a callback, kept in every message before it and in
        the batches store) with its payload in ``connection``'s store when it is over
        the threshold, or over ``LINK_OVER``: links ride along in other messages."""
        plan = self.plan(connection) if "job" in link else None
        field = "enc" if "enc" in link else "payload"
        if plan is None or field not in link:
            return link
        content = link[field] if field == "enc" else encode_payload(link[field], link["job"])
        over = LINK_OVER if plan.over is None else min(plan.over, LINK_OVER)
        if _size(content) <= over:
            return link
        ref = await self.put(plan, f"link-{new_id()}", content, encrypted=field == "enc")
        out = {k: v for k, v in link.items() if k != field}
        out[OFFLOADED] = {**ref, "connection": connection}
        return out

    @staticmethod
    async def put(plan: Plan, key: str, content: str, *, encrypted: bool) -> dict[str, Any]:
        """Write ``content`` under ``key`` made safe, cut to 100 characters and given a
        random suffix (two messages of one id never share an object); its reference."""
        data = content.encode("utf-8")
        key = f"{_UNSAFE.sub('_', key)[:100]}.{os.urandom(6).hex()}"
        try:
            await plan.store.put(key, data)
        except HazeError:
            raise
        except Exception as e:  # OSError, botocore's: the store is down or refuses
            raise OffloadStoreError(
                f'connection "{plan.connection}": its offload store {plan.store.url} could '
                f"not be written ({_cause(e)}); check that it is reachable and writable"
            ) from None
        return _ref(key, data, encrypted=encrypted)

    async def restore_link(self, link: dict[str, Any]) -> dict[str, Any]:
        """``link`` with its offloaded payload read back and checked (``OffloadError``
        when it is missing or does not match)."""
        ref = reference(link)
        if ref is None:
            return link
        who = f'a chain link or callback of job "{link.get("job")}"'
        text = await self.fetch(ref, str(ref.get("connection")), who)
        out = {k: v for k, v in link.items() if k != OFFLOADED}
        if ref.get("enc"):
            out["enc"] = text
        else:
            out["payload"] = decode_payload(text)
        return out

    async def fetch(self, ref: dict[str, Any], connection: str, who: str) -> str:
        """The text an offload reference names, read back and checked (``OffloadError``
        when it is missing or does not match, ``OffloadStoreError`` when the store cannot
        be read)."""
        key, size, digest = ref.get("offloaded"), ref.get("size"), ref.get("sha256")
        if not isinstance(key, str) or not isinstance(digest, str) or size.__class__ is not int:
            raise OffloadError(f"{who}: its offload reference is unreadable: {ref!r}")
        plan = self.plan(connection)
        if plan is None:
            raise OffloadError(
                f'{who}: its payload was offloaded ({key!r}), but connection "{connection}" '
                'has no "offload" store to read it from; add the same "offload" setting '
                "as the connection that sent it"
            )
        try:
            data = await plan.store.get(key)
        except HazeError:
            raise
        except Exception as e:  # OSError, botocore's: the store is down or refuses
            raise OffloadStoreError(
                f"{who}: its offloaded payload {key!r} could not be read from the offload "
                f"store {plan.store.url} ({_cause(e)}); check that it is reachable and "
                "readable"
            ) from None
        if data is None:
            raise OffloadError(
                f"{who}: its offloaded payload {key!r} is missing from {plan.store.url}"
            )
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise OffloadError(
                f"{who}: checksum mismatch: the offloaded payload {key!r} in "
                f"{plan.store.url} is {len(data)} bytes with sha256 "
                f"{hashlib.sha256(data).hexdigest()}, its reference says {size} and {digest}"
            )
        return data.decode("utf-8")

    async def restore(self, message: Message, connection: str) -> None:
        """Put the offloaded payload back into ``message`` (``OffloadError`` when the
        object is missing or does not match its reference)."""
        ref = reference(message.meta)
        assert ref is not None
        who = f'job "{message.job}" ({message.id})'
        if self.plan(connection) is None and message.connection:
            connection = message.connection
        text = await self.fetch(ref, connection, who)
        if ref.get("enc"):
            message.enc = text
        else:
            message.payload = decode_payload(text)

    async def discard_link(self, link: dict[str, Any]) -> None:
        """Delete a chain link's object once its own message (with an object of its
        own) is queued."""
        ref = reference(link)
        if ref is not None:
            await self.discard(link, str(ref.get("connection")))

    async def discard(self, meta: dict[str, Any] | None, connection: str) -> None:
        """Delete the object ``meta`` refers to; a store that fails leaves an orphan
        (``haze queue:prune-offload``), never fails the job."""
        ref = reference(meta)
        key = ref.get("offloaded") if ref is not None else None
        plan = self.plan(connection)
        if not isinstance(key, str) or plan is None:
            return
        try:
            await plan.store.delete(key)
        except Exception as e:
            log.warning(
                "haze: could not delete the offloaded payload %r from %s (%s); "
                "haze queue:prune-offload removes it later",
                key,
                plan.store.url,
                e,
            )

    async def forgotten(self, records: Iterable[FailedJob], connection: str) -> None:
        """Delete the objects of failed records that were just forgotten (and of the
        chain links they carried: nothing will dispatch them now)."""
        for record in records:
            data = envelope_of(record.body) if record.body else None
            meta = data.get("meta") if data is not None else None
            if isinstance(meta, dict):
                await self.discard(meta, connection)
            chain = data.get("chain") if data is not None else None
            for link in chain if isinstance(chain, list) else []:
                if isinstance(link, dict):
                    await self.discard_link(link)

    async def prune(
        self,
        connection: str,
        older_than: float,
        keep: set[str],
        spare: Callable[[str], Awaitable[bool]] | None = None,
    ) -> int:
        """Delete the objects of ``connection``'s store written more than ``older_than``
        seconds ago, except those in ``keep`` (referenced by failed records) and those
        ``spare`` says are still in use (a workflow run's results)."""
        plan = self.plan(connection)
        if plan is None:
            raise OffloadError(
                f'connection "{connection}" has no "offload" setting: there is nothing to '
                'prune; name a connection with {"offload": {"to": ...}}'
            )
        cutoff = time.time() - older_than
        old = [o.key async for o in plan.store.objects() if o.modified < cutoff]
        n = 0
        for key in old:
            if key not in keep and not (spare is not None and await spare(key)):
                await plan.store.delete(key)
                n += 1
        return n


def referenced(records: Iterable[FailedJob]) -> set[str]:
    """The object keys the failed ``records`` refer to (their own payload's, and those
    of the chain links they carry: a retry continues the chain)."""
    keys: set[str] = set()
    for record in records:
        data = envelope_of(record.body) if record.body else None
        if data is None:
            continue
        meta, chain = data.get("meta"), data.get("chain")
        holders = [meta, *chain] if isinstance(chain, list) else [meta]
        for holder in holders:
            ref = reference(holder) if isinstance(holder, dict) else None
            if ref is not None and isinstance(ref.get("offloaded"), str):
                keys.add(ref["offloaded"])
    return keys


class OffloadCleanup:
    """Outcome hook: an offloaded payload is deleted once its job has left the queue
    for good (after the ack is recorded: by the worker, when it keeps the ack to send
    it later), and kept while it may run again or sits in failed jobs."""

    plain_quiet = True  # wants() is False for a plain success (PlainQuiet)

    def __init__(self, offload: Offload) -> None:
        self.offload = offload

    def wants(self, run: Run) -> bool:
        meta = run.message.meta
        return meta is not None and OFFLOADED in meta and run.outcome in _FINAL

    async def settling(self, run: Run) -> None:
        # Set before the ack: a worker that keeps the ack may record it (and call this)
        # before the ``settled`` step runs.
        meta, connection = run.message.meta, run.driver.name
        run.reserved.after_ack = lambda: self.offload.discard(meta, connection)

    async def settled(self, run: Run) -> None:
        reserved = run.reserved
        after, reserved.after_ack = reserved.after_ack, None
        if reserved.ack_pending:
            reserved.after_ack = after  # the worker calls it once it recorded the ack
        elif after is not None and not reserved.lease_lost:
            # (a lost lease: another worker runs the job, and its ack deletes it)
            await after()
