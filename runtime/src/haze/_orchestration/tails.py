"""A long chain's tail, stored once in the batches store instead of in every message.

A message carries at most about ``INLINE_MAX`` bytes of the links still to run. When
the rest is longer, it is cut into chunks of about ``CHUNK_BYTES``; the first chunk
stays inline and the others go to ``haze:chain:<tail>:<n>`` (kept ``batches.ttl``),
ending in a reference ``{"tail": <tail>, "chunk": n, "of": chunks, "links": count}``.
A link whose next link is that reference reads the one chunk it names and dispatches
its first link carrying the rest of the chunk and a reference to the chunk after it,
so each link reads and carries a bounded amount, whatever the chain's length.

The reference past the last chunk (``chunk == of``) ends the tail: the ``ended`` marker
is written, then the chunks are deleted. A redelivered link that finds its chunk gone
and the marker there does nothing (the chain went on, and ended, without it); a chunk
gone without the marker (its TTL ran out) raises ``ChainTailLostError``. A chain that
fails keeps its chunks until they expire: retrying the failed link from the failed
jobs continues the chain.
"""

from __future__ import annotations

import json
from typing import Any

from haze._base.errors import ChainTailLostError
from haze._base.json_text import check_encodable, check_links
from haze._base.message import new_id
from haze._engine.manager import QueueManager

__all__ = ["chain_length", "expand", "spill"]

#: Bytes of encoded links a message carries before the rest is stored.
INLINE_MAX = 16 * 1024
#: Bytes of encoded links in one stored chunk (below INLINE_MAX: one chunk and a
#: reference carried inline are never stored again).
CHUNK_BYTES = 8 * 1024


def _key(tail: str, part: str) -> str:
    return f"haze:chain:{tail}:{part}"


def is_ref(link: dict[str, Any]) -> bool:
    return "tail" in link


def chain_length(links: list[dict[str, Any]] | None) -> int:
    """How many links are still to run, the stored ones included."""
    return sum(int(link.get("links", 0)) if is_ref(link) else 1 for link in links or [])


def _size(link: dict[str, Any]) -> int:
    # "surrogatepass": only a measure; a lone surrogate is refused, naming its path,
    # where the link is encoded
    try:
        text = json.dumps(link, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        check_links(link, "chain link")  # names the link's job and the path
        raise
    return len(text.encode("utf-8", "surrogatepass")) + 1


def _chunks(links: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    chunks: list[list[dict[str, Any]]] = [[]]
    used = 0
    for link in links:
        size = _size(link)
        if chunks[-1] and used + size > CHUNK_BYTES:
            chunks.append([])
            used = 0
        chunks[-1].append(link)
        used += size
    return chunks


async def spill(
    manager: QueueManager, links: list[dict[str, Any]], connection: str
) -> list[dict[str, Any]]:
    """``links`` as a message carries them: as they are when short, else the first
    chunk and a reference to the others, which are stored (before anything is queued:
    a crash in between leaves only chunks that expire)."""
    if sum(_size(link) for link in links) <= INLINE_MAX:
        return links
    chunks = _chunks(links)
    if not any(not is_ref(link) for chunk in chunks[1:] for link in chunk):
        return links  # one chunk and references: already as short as it gets
    store = manager.stores.batches()
    manager.stores.check(store, manager.app.driver(connection), "long chains")
    ttl = manager.app.queue_config.batches_ttl
    tail = new_id()
    for n, chunk in enumerate(chunks[1:], start=1):
        await store.put(_key(tail, str(n)), chunk, ttl)
    stored = sum(chain_length(chunk) for chunk in chunks[1:])
    return [*chunks[0], {"tail": tail, "chunk": 1, "of": len(chunks), "links": stored}]


async def prepared(
    manager: QueueManager, head: dict[str, Any], rest: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The link to dispatch with its payload read back from the object store, and the
    links after it as its message carries them: a large payload offloaded (never held
    inline in the messages or in the stored tail), a long tail stored. Third, what this
    wrote (``discard`` deletes it when the link is not sent after all)."""
    connection = head["batch"]["connection"] if "batch" in head else head.get("connection")
    connection = manager.app.connection_name(connection)
    offload = manager.offload
    written: list[dict[str, Any]] = []
    try:
        out = []
        for link in rest:
            out.append(await offload.offload_link(link, _conn(manager, link, connection)))
            if out[-1] is not link:  # a link offloaded before is the message's, not ours
                written.append(out[-1])
        spilled = await spill(manager, out, connection)
        if spilled is not out and spilled and is_ref(spilled[-1]):
            written.append(spilled[-1])
        return await offload.restore_link(head), spilled, written
    except BaseException:
        await discard(manager, written)
        raise


async def discard(manager: QueueManager, written: list[dict[str, Any]]) -> None:
    """Delete what ``prepared`` wrote for a link that was not sent: nothing will read
    it (a crash before this leaves the objects to ``queue:prune-offload`` and the
    stored links to ``batches.ttl``)."""
    store = manager.stores.batches()
    for link in written:
        if is_ref(link):
            for n in range(1, int(link["of"])):
                await store.delete(_key(link["tail"], str(n)))
        else:
            await manager.offload.discard_link(link)


def _conn(manager: QueueManager, link: dict[str, Any], default: str) -> str:
    return manager.app.connection_name(link.get("connection") or default)


async def offloaded_callbacks(
    manager: QueueManager, spec: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """A batch's callbacks as its record keeps them: a large payload in the object store
    of the batch's connection (read back each time the callback is dispatched). A
    payload JSON cannot carry is refused now, not when the batch ends in a worker."""
    check_encodable(spec.get("callbacks"), "batch callbacks")
    connection = spec["connection"]
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, refs in (spec.get("callbacks") or {}).items():
        out[kind] = [
            await manager.offload.offload_link(r, _conn(manager, r, connection)) for r in refs
        ]
    return out


async def discard_callbacks(
    manager: QueueManager, callbacks: dict[str, list[dict[str, Any]]]
) -> None:
    """Delete the objects of a batch's offloaded callbacks (``offloaded_callbacks``):
    its dispatch failed before any job of it was queued."""
    for refs in callbacks.values():
        for link in refs:
            await manager.offload.discard_link(link)


async def expand(
    manager: QueueManager, links: list[dict[str, Any]], chain_id: str | None
) -> list[dict[str, Any]]:
    """``links`` with the stored links that come first read back, up to the first link
    to dispatch; ``[]`` when the chain has ended (here or, before, elsewhere)."""
    store = manager.stores.batches()
    while links and is_ref(links[0]):
        ref, after = links[0], links[1:]
        tail, n, of = ref["tail"], int(ref["chunk"]), int(ref["of"])
        if n >= of:
            await _end(manager, ref)
            links = after
            continue
        chunk = await store.get(_key(tail, str(n)))
        if chunk is None:
            if await store.get(_key(tail, "ended")) is not None:
                return []  # a redelivery: the chain went on, and ended, without it
            raise ChainTailLostError(
                f"chain {chain_id}: its stored links {_key(tail, str(n))} are gone (kept "
                "batches.ttl); raise batches.ttl for chains that run longer"
            )
        left = int(ref["links"]) - chain_length(chunk)
        links = [*chunk, {"tail": tail, "chunk": n + 1, "of": of, "links": left}, *after]
    return links


async def _end(manager: QueueManager, ref: dict[str, Any]) -> None:
    """Delete the stored chunks of a tail whose links have all been dispatched. The
    ``ended`` marker comes first: a crash before the deletes leaves chunks that expire
    (or that the redelivered last link deletes), and a redelivery that finds a chunk
    gone then knows why."""
    store = manager.stores.batches()
    tail = ref["tail"]
    await store.put(_key(tail, "ended"), 1, manager.app.queue_config.batches_ttl)
    for n in range(1, int(ref["of"])):
        await store.delete(_key(tail, str(n)))
