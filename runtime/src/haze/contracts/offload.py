"""Where a payload too large for its queue goes: the ``ObjectStore`` contract.

A connection with ``"offload": {"to": "s3://bucket/prefix", "over": "192KiB"}`` writes
a payload over ``over`` (or one whose message would not fit the driver) to an object
store first, and the message carries a reference to it. The store is found by the
URL's scheme (``file``, ``s3``; a package adds one, such as ``r2``, through the
``haze.offload`` entry points or ``register_plugin("haze.offload", ...)``). A store
class is built as ``cls(url)`` and must do no I/O there.

Keys are names under the URL's prefix (the store adds the prefix). ``get`` of a
missing key returns None; ``delete`` of a missing key is no error (deletes are
repeated after a crash). ``objects()`` lists what is under the prefix with the time
each was last written, for ``haze queue:prune-offload``.

>>> class Shelf:
...     url = "shelf://main"
...     async def put(self, key: str, data: bytes) -> None: ...
...     async def get(self, key: str) -> bytes | None: ...
...     async def delete(self, key: str) -> None: ...
...     def objects(self): ...
>>> isinstance(Shelf(), ObjectStore)
True
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["ObjectStore", "StoredObject"]


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object of a store's listing: its key (under the prefix) and when it was
    last written (unix seconds)."""

    key: str
    modified: float


@runtime_checkable
class ObjectStore(Protocol):
    """An object store offloaded payloads are written to (``cls(url)``)."""

    #: the URL it was built from (for messages: ``s3://bucket/prefix``)
    url: str

    async def put(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key`` (replacing what was there)."""

    async def get(self, key: str) -> bytes | None:
        """The bytes at ``key``; None when there is no such object (its job fails).
        Raise when the store itself cannot be read (down, refusing, its folder or bucket
        not there): the worker puts the job back until it can."""

    async def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is no error."""

    def objects(self) -> AsyncIterator[StoredObject]:
        """Every object under the prefix (any order), with its last write time."""
