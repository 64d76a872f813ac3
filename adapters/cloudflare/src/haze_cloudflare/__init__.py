"""haze on Cloudflare: ``QueueWorker`` (a Python Worker entrypoint whose ``queue()`` runs
haze jobs), producers through the Queue binding, D1 through its binding and a KV store.

Pure Python, no threads: it loads under Pyodide (Cloudflare Python Workers). Outside a
Worker the ``cloudflare`` driver of the runtime talks to the REST API instead
(``haze-jobs[cloudflare]``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from haze_cloudflare._js import bind_env, current_env
    from haze_cloudflare.kv import KVStore
    from haze_cloudflare.worker import LocalResponse, MessageDelivery, QueueWorker

__all__ = ["KVStore", "LocalResponse", "MessageDelivery", "QueueWorker", "bind_env", "current_env"]

# Loaded on first access: a Worker isolate's cold start pays only for what its entry
# uses (the Queue and D1 binding modules load with the first invocation).
_LAZY = {
    "KVStore": "kv",
    "LocalResponse": "worker",
    "MessageDelivery": "worker",
    "QueueWorker": "worker",
    "bind_env": "_js",
    "current_env": "_js",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
