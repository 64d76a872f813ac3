"""What a Cloudflare deploy needs to know about an app, shared by ``haze build --preset
cloudflare`` (``dist/wrangler.json``) and ``haze_infra`` (the Pulumi components), so
the two cannot derive different consumer settings from the same app.

The rules:

- The queue of a ``cloudflare`` connection is the one the ``cloudflare.wrangler``
  producers of ``haze.config.py`` bind to the connection's ``binding`` (None when no
  producer names it: the caller picks a name).
- Consumer ``max_retries`` = tries - 1 of the job with the most tries on the connection:
  Cloudflare counts *retries* (the first delivery is not one), haze counts *tries*. Past
  ``max_retries`` Cloudflare moves the message to the dead-letter queue itself; with
  exactly ``tries - 1`` haze's own final failure (``failed()`` callbacks, the failed
  store) happens first. A smaller value from ``haze.config.py`` is kept, with a warning.
- The dead-letter queue defaults to ``<queue>-dlq``; batch size and timeout default to
  Cloudflare's own defaults (10 messages, 5 s).
- D1 bindings come from ``d1://`` connections of ``config/database.py`` (their
  ``options.binding``, default ``DB``), KV bindings from ``kv`` stores of
  ``config/cache.py``, plus any the wrangler section lists.

Example::

    from haze import App
    from haze.build.cloudflare_plan import (
        app_jobs, cloudflare_consumer, connection_max_tries,
    )

    app = App(root=".")
    options = app.queue_config.connections["cloudflare"]
    tries = connection_max_tries(app_jobs(app), "cloudflare")
    plan = cloudflare_consumer(app, "cloudflare", options, tries, warnings=[])
    plan.max_retries
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from haze._base.errors import ConfigError
from haze._jobs.definition import registered_jobs
from haze.connectors.d1 import d1_target

if TYPE_CHECKING:
    from haze._app.app import App
    from haze._base.routes import JobRoutes
    from haze._jobs.definition import JobDefinition

__all__ = [
    "CF_DEFAULT_BATCH_SIZE",
    "CF_DEFAULT_BATCH_TIMEOUT",
    "CF_MAX_BATCH_SIZE",
    "CF_MAX_BATCH_TIMEOUT",
    "CF_MAX_RETRIES",
    "CloudflarePlan",
    "D1Plan",
    "KvPlan",
    "app_jobs",
    "cloudflare_consumer",
    "cloudflare_max_retries",
    "cloudflare_storage",
    "connection_jobs",
    "connection_max_tries",
    "r2_buckets",
    "wrangler_queues",
    "wrangler_section",
]

#: Cloudflare Queues: the largest consumer ``max_retries``, batch and batch timeout (s).
CF_MAX_RETRIES = 100
CF_MAX_BATCH_SIZE = 100
CF_MAX_BATCH_TIMEOUT = 60
#: Cloudflare's consumer defaults (``max_batch_size`` 10, ``max_batch_timeout`` 5 s).
CF_DEFAULT_BATCH_SIZE = 10
CF_DEFAULT_BATCH_TIMEOUT = 5


@dataclass(frozen=True)
class CloudflarePlan:
    """A ``cloudflare`` connection as a Cloudflare Queue, its DLQ and its consumer."""

    binding: str
    queue_name: str | None
    """From the ``cloudflare.wrangler`` producers of ``haze.config.py``, else None."""
    dead_letter_queue: str | None
    max_retries: int
    min_max_retries: int
    max_batch_size: int
    max_batch_timeout: float
    max_concurrency: int | None
    retry_delay: int | None


@dataclass(frozen=True)
class D1Plan:
    """A D1 database the Worker binds (a ``d1://`` connection or a wrangler entry)."""

    binding: str
    connection: str | None
    database: str | None


@dataclass(frozen=True)
class KvPlan:
    """A KV namespace the Worker binds (a ``kv`` cache store or a wrangler entry)."""

    binding: str
    store: str | None


def cloudflare_max_retries(max_tries: int | None) -> int:
    """Cloudflare counts retries, not tries: ``tries - 1`` (100, the maximum, when
    unbounded)."""
    if max_tries is None:
        return CF_MAX_RETRIES
    return min(CF_MAX_RETRIES, max_tries - 1)


def wrangler_section(app: App) -> dict[str, Any]:
    """A copy of the ``cloudflare.wrangler`` section of the app's ``haze.config.py``."""
    wrangler = (app.haze_config.cloudflare or {}).get("wrangler") or {}
    return copy.deepcopy(dict(wrangler)) if isinstance(wrangler, Mapping) else {}


def wrangler_queues(app: App) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The producers and consumers listed in the wrangler section (mappings only)."""
    queues = wrangler_section(app).get("queues") or {}
    if not isinstance(queues, Mapping):
        return [], []
    producers = [p for p in queues.get("producers") or [] if isinstance(p, Mapping)]
    consumers = [c for c in queues.get("consumers") or [] if isinstance(c, Mapping)]
    return [dict(p) for p in producers], [dict(c) for c in consumers]


def app_jobs(app: App) -> list[JobDefinition[Any]]:
    """The job definitions of the app: those defined in files under its root (every
    registered job when the app has no root)."""
    jobs = list(registered_jobs().values())
    if app.root is None:
        return jobs
    root = Path(app.root).resolve()
    mine = []
    for job in jobs:
        file = str(job.origin).rsplit(":", 1)[0]
        try:
            if Path(file).resolve().is_relative_to(root):
                mine.append(job)
        except (OSError, ValueError):
            continue
    return mine


def connection_jobs(
    jobs: Iterable[JobDefinition[Any]], name: str, routes: JobRoutes | None = None
) -> list[JobDefinition[Any]]:
    """The jobs that can land on connection ``name``: those pinned to it (by their
    definition, else by a route of ``routes``), and every job pinned nowhere (the default
    connection is often chosen by an environment variable, and ``.on_connection()`` can
    send it anywhere). Sorted by name."""
    return sorted((j for j in jobs if _pin(j, routes) in (None, name)), key=lambda j: j.name)


def _pin(job: JobDefinition[Any], routes: JobRoutes | None) -> str | None:
    return job.connection if routes is None else routes.connection_for(job.name, job.connection)


def connection_max_tries(
    jobs: Iterable[JobDefinition[Any]], name: str, routes: JobRoutes | None = None
) -> int | None:
    """The most ``tries`` of a job on connection ``name`` (1 with no job); None when a
    job there has ``retry_until`` (no try limit)."""
    on = connection_jobs(jobs, name, routes)
    if any(j.retry_until is not None for j in on):
        return None
    return max((int(j.tries) for j in on), default=1)


def cloudflare_consumer(
    app: App,
    name: str,
    options: Mapping[str, Any],
    max_tries: int | None,
    warnings: list[str],
) -> CloudflarePlan:
    """The queue, dead-letter queue and consumer settings of ``cloudflare`` connection
    ``name`` (see the module docstring); problems are appended to ``warnings``."""
    binding = str(options.get("binding") or "QUEUE")
    producers, consumers = wrangler_queues(app)
    queue_name = next(
        (str(p["queue"]) for p in producers if p.get("binding") == binding and p.get("queue")), None
    )
    consumer = next((c for c in consumers if queue_name and c.get("queue") == queue_name), {})
    need = cloudflare_max_retries(max_tries)
    max_retries = int(consumer.get("max_retries", need))
    if max_retries < need:
        warnings.append(
            f"connection {name!r}: haze.config.py sets max_retries={max_retries} for queue "
            f"{queue_name!r}, but a job there has {max_tries} tries (needs >= {need}); "
            "Cloudflare would dead-letter messages haze still means to retry"
        )
    if max_tries is not None and max_tries - 1 > CF_MAX_RETRIES:
        warnings.append(
            f"connection {name!r}: {max_tries} tries is more than Cloudflare "
            f"Queues can retry ({CF_MAX_RETRIES})"
        )
    dlq = consumer.get("dead_letter_queue")
    if dlq is None and queue_name is not None:
        dlq = f"{queue_name}-dlq"
    concurrency = consumer.get("max_concurrency")
    delay = consumer.get("retry_delay")
    return CloudflarePlan(
        binding=binding,
        queue_name=queue_name,
        dead_letter_queue=str(dlq) if dlq is not None else None,
        max_retries=max_retries,
        min_max_retries=need,
        max_batch_size=int(consumer.get("max_batch_size", CF_DEFAULT_BATCH_SIZE)),
        max_batch_timeout=float(consumer.get("max_batch_timeout", CF_DEFAULT_BATCH_TIMEOUT)),
        max_concurrency=int(concurrency) if concurrency is not None else None,
        retry_delay=int(delay) if delay is not None else None,
    )


def cloudflare_storage(app: App) -> tuple[tuple[D1Plan, ...], tuple[KvPlan, ...]]:
    """The D1 databases and KV namespaces the Worker binds (see the module docstring)."""
    d1: dict[str, D1Plan] = {}
    for name, c in app.database_config.connections.items():
        url = str(c.get("url") or "")
        if url.lower().startswith("d1://"):
            _, database, binding = d1_target(url, c.get("options") or {}, f"connections.{name}.url")
            d1.setdefault(binding, D1Plan(binding=binding, connection=name, database=database))
    kv: dict[str, KvPlan] = {}
    for name, s in app.cache_config.stores.items():
        if s.get("driver") == "kv":
            binding = str(s.get("binding") or "KV")
            kv.setdefault(binding, KvPlan(binding=binding, store=name))
    wrangler = wrangler_section(app)
    for entry in wrangler.get("d1_databases") or []:
        if isinstance(entry, Mapping) and entry.get("binding"):
            b = str(entry["binding"])
            d1.setdefault(
                b, D1Plan(binding=b, connection=None, database=entry.get("database_name"))
            )
    for entry in wrangler.get("kv_namespaces") or []:
        if isinstance(entry, Mapping) and entry.get("binding"):
            b = str(entry["binding"])
            kv.setdefault(b, KvPlan(binding=b, store=None))
    return tuple(d1.values()), tuple(kv.values())


#: A Worker binding's name: what wrangler accepts (and a Python attribute of ``env``).
_BINDING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def r2_buckets(app: App) -> list[dict[str, str]]:
    """``r2_buckets`` entries for the connections that offload to ``r2://BINDING/prefix``:
    the bucket is the URL's ``?bucket=``, else the binding's name in lower case with ``_``
    as ``-`` (the same default haze_cloudflare's store uses outside a Worker)."""
    qc = app.queue_config
    found: dict[str, dict[str, str]] = {}
    for conn, options in qc.connections.items():
        offload = options.get("offload")
        url = offload.get("to") if isinstance(offload, dict) else None
        if not isinstance(url, str) or not url.lower().startswith("r2://"):
            continue
        parts = urlsplit(url)
        if not _BINDING_NAME.match(parts.netloc):
            raise ConfigError(
                f"{url!r}: {parts.netloc!r} is not an R2 binding name; use r2://BINDING/prefix "
                "with letters, digits and _ (not starting with a digit), such as "
                "r2://PAYLOADS/haze",
                source=qc.source,
                key=f"connections.{conn}.offload.to",
            )
        bucket = parse_qs(parts.query).get("bucket", [""])[-1]
        bucket = bucket or parts.netloc.lower().replace("_", "-")
        found.setdefault(parts.netloc, {"binding": parts.netloc, "bucket_name": bucket})
    return list(found.values())
