"""The ``DispatchRecorder`` protocol: where an App's dispatches go instead of a driver.

``Queue.fake()`` sets one on the App (``app.recorder``); while it is set, the engine
records every dispatch, skipped unique dispatch, chain and batch on it and queues
nothing, and keeps unique locks and middleware state in the recorder's own ``store``
(so a test never touches the App's real lock store). ``haze.testing.FakeQueue`` is the
implementation; the engine and orchestration only know this protocol.

The job, message, chain and batch types live in higher layers, so they are ``Any`` here.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from haze.contracts.store import Store

__all__ = ["DispatchRecorder"]


@runtime_checkable
class DispatchRecorder(Protocol):
    """Records what an App would have queued."""

    @property
    def store(self) -> Store:
        """Holds unique locks, debounce and middleware state while recording."""

    def record(self, job: Any, message: Any, delay: float) -> None:
        """A job (``JobDefinition``) was dispatched as ``message`` (``Message``),
        to run after ``delay`` seconds."""

    def record_skipped(self, job: Any, message: Any) -> None:
        """A dispatch of a unique job met its lock and was skipped."""

    def record_chain(self, chain: Any, links: list[dict[str, Any]], chain_id: str) -> None:
        """A chain (``PendingChain``) was dispatched; ``links`` are its JSON links."""

    def record_batch(self, pending: Any, spec: dict[str, Any]) -> Any:
        """A batch (``PendingBatch``) was dispatched with its stored ``spec``; returns
        the ``Batch`` the dispatch hands back to the caller."""
