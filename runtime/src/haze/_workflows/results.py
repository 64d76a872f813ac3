"""Step results over a connection's offload threshold, kept in its object store.

The run keeps ``{"haze:offloaded": {...}}`` (key, size, sha256) in place of the result;
every replay reads the object back and checks it. An encrypted workflow's result is
sealed before the write. The objects a run wrote or read are deleted when it finishes
(a failed run keeps them for its retry); a crash between the object's write and the
step's record leaves an orphan, which ``haze queue:prune-offload`` sweeps (it spares the
objects of runs that have not ended or that failed).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from haze._base.crypto import seal, unseal
from haze._base.message import OFFLOADED

if TYPE_CHECKING:
    from haze._base.crypto import Keyed
    from haze._engine.offload import Offload, Plan

__all__ = ["KEY_PREFIX", "StoreResults", "run_of_key"]

_MARK = "haze:offloaded"
#: the keys of workflow results start with this, then the run id and a dot
KEY_PREFIX = "wf-"


def run_of_key(key: str) -> str | None:
    """The run id a result object's key names (its safe spelling), or None."""
    if not key.startswith(KEY_PREFIX):
        return None
    return key[len(KEY_PREFIX) :].rsplit(".", 1)[0] or None


class StoreResults:
    """One replay's large step results of run ``run_id`` on ``connection``."""

    def __init__(
        self,
        offload: Offload,
        plan: Plan,
        connection: str,
        run_id: str,
        *,
        limit: int | None,
        sealing: Keyed | None,
    ) -> None:
        self._offload, self._plan, self._connection = offload, plan, connection
        self._run_id = run_id
        self._over = plan.over if plan.over is not None else limit
        self._sealing = sealing
        #: every object this replay wrote or read: the run's, deleted when it finishes
        self.keys: set[str] = set()

    def _context(self) -> str:
        return f"haze:workflow-result:{self._run_id}"

    def wanted(self, text: str) -> bool:
        """Whether a step's result (its JSON) goes to the store."""
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        return self._over is not None and size > self._over

    async def put(self, text: str) -> str:
        """Write a result; the reference the run keeps instead (JSON text)."""
        content = text if self._sealing is None else seal(self._sealing, text, self._context())
        ref = await self._offload.put(
            self._plan, KEY_PREFIX + self._run_id, content, encrypted=self._sealing is not None
        )
        self.keys.add(str(ref["offloaded"]))
        return json.dumps({_MARK: ref}, separators=(",", ":"))

    async def get(self, text: str) -> str:
        """The result a kept text stands for: itself, or the object it refers to."""
        if not text.startswith('{"' + _MARK):
            return text
        ref: Any = json.loads(text).get(_MARK)
        if not isinstance(ref, dict):
            return text
        who = f"a step result of workflow run {self._run_id}"
        content = await self._offload.fetch(ref, self._connection, who)
        self.keys.add(str(ref.get("offloaded")))
        if not ref.get("enc"):
            return content
        assert self._sealing is not None, "an encrypted run's object needs the app key"
        return str(unseal(self._sealing, content, self._context(), who))

    async def delete(self) -> None:
        """Delete the run's objects (it ended); a store that fails leaves orphans."""
        for key in sorted(self.keys):
            await self._offload.discard({OFFLOADED: {"offloaded": key}}, self._connection)
