"""haze on Cloudflare: ``QueueWorker`` (a Python Worker entrypoint whose ``queue()`` runs
haze jobs), producers through the Queue binding, D1 through its binding and a KV store.

Pure Python, no threads: it loads under Pyodide (Cloudflare Python Workers). Outside a
Worker the ``cloudflare`` driver of the runtime talks to the REST API instead
(``haze[cloudflare]``).
"""

from __future__ import annotations

from ._js import bind_env, current_env
from .kv import KVStore
from .worker import LocalResponse, MessageDelivery, QueueWorker

__all__ = ["KVStore", "LocalResponse", "MessageDelivery", "QueueWorker", "bind_env", "current_env"]
