"""Which store the engine keeps its state in, and the warning when that store cannot work.

Unique locks, debounce keys, middleware state, status records and cancel markers live
in the app's queue store; batch state in its batch store. While a test recorder is set
on the app (``Queue.fake()``), all of it lives in the recorder's own store instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from haze._engine.view import EngineApp
    from haze.contracts.driver import Driver
    from haze.contracts.store import Store

__all__ = ["EngineStores"]

log = logging.getLogger("haze")


class EngineStores:
    """The state and batch stores of one app."""

    def __init__(self, app: EngineApp) -> None:
        self.app = app
        self._warned: set[str] = set()  # what ("unique jobs", "batches") was warned

    def state(self) -> Store:
        """Locks, middleware state, status records and cancel markers."""
        recorder = self.app.recorder
        return recorder.store if recorder is not None else self.app.queue_store

    def batches(self) -> Store:
        """Batch records, counters and once-markers."""
        recorder = self.app.recorder
        return recorder.store if recorder is not None else self.app.batch_store

    def worker_warnings(self, driver: Driver) -> list[str]:
        """The lines a starting worker of ``driver`` prints when the state or batch store
        is one this process alone sees: the dispatchers' locks would never be released
        here, and the batches they dispatch never settle here (their callbacks never run).
        Said at start: the dispatch warning comes only with a unique job or a batch."""
        if not driver.remote:
            return []
        lost: dict[str, list[str]] = {}
        for store, what in ((self.state(), "unique jobs"), (self.batches(), "batches")):
            if not store.shared:
                lost.setdefault(store.name, []).append(what)
                self._warned.update((what, "long chains") if what == "batches" else (what,))
        effects = {
            "unique jobs": "locks taken by other processes are never released here",
            "batches": "batch then/catch/finally callbacks never run",
        }
        return [
            f'The "{name}" store holds {" and ".join(whats)} in this process only, but '
            f'connection "{driver.name}" is shared with other processes: '
            f"{'; '.join(effects[w] for w in whats)}. Set store='redis' (or 'database') in "
            "config/queue.py."
            for name, whats in lost.items()
        ]

    def check(self, store: Store, driver: Driver, what: str) -> None:
        """Warn once per ``what`` when ``store`` cannot hold it for ``driver``: a store
        this process alone sees beside a connection other processes consume, or a store
        that is not atomic."""
        if what in self._warned:
            return
        if driver.remote and not store.shared:
            self._warned.add(what)
            lost = (
                "which cannot release locks taken here; later dispatches will be skipped until "
                "the lock expires"
                if what == "unique jobs"
                else "which cannot see them: a long chain stops after its first links"
                if what == "long chains"
                else "which cannot see them: a batch's then/catch/finally callbacks never run"
            )
            log.warning(
                'The "%s" store holds %s, but connection "%s" is consumed by other processes, '
                "%s. Set store='redis' (or 'database') in config/queue.py.",
                store.name,
                what,
                driver.name,
                lost,
            )
        elif not store.atomic:
            self._warned.add(what)
            log.warning(
                'The "%s" store is not atomic: %s may be held twice. Use redis or database.',
                store.name,
                what,
            )
