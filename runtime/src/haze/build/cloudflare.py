"""``haze build --preset cloudflare``: the app as a Cloudflare Python Worker.

Writes, under the output directory (``dist/``)::

    wrangler.json                  the Worker's config: deploy with
                                   `npx wrangler deploy -c dist/wrangler.json`
    cloudflare/src/entry.py        class Default(QueueWorker) over the bundled app
    cloudflare/src/config/ app/    the app (and database/, haze.config.py when present)
    cloudflare/src/haze/ …         the vendored runtime and haze_cloudflare

Everything is under ``src/``, the directory of ``main``, which wrangler uploads as the
Worker's own modules and the runtime puts on ``sys.path``. Not ``python_modules/``
(where ``pywrangler sync`` puts PyPI packages): wrangler looks for that beside the
config file that deploys, and the Worker is deployed both from ``dist/wrangler.json``
and from a project's own ``wrangler.toml`` (this repository's, for the example app).
Third-party packages the app imports still belong in ``python_modules/`` beside
whichever config deploys it.

``wrangler.json`` is derived from the app, then the ``cloudflare.wrangler`` section of
``haze.config.py`` is merged over it (the app's values win):

- ``name``: the app directory's name; ``main``: the entry (always the generated one);
  ``compatibility_flags`` include ``python_workers``;
- ``queues``: one producer per ``cloudflare`` connection's ``binding``, and a consumer of
  its queue with ``max_retries`` = the most ``tries`` - 1 and a dead-letter queue
  (see :mod:`haze.build._cloudflare_config`, shared with ``haze_infra``);
- ``d1_databases`` for ``d1://`` connections, ``kv_namespaces`` for ``kv`` stores.

Lists of bindings are merged by ``binding`` (a Worker's binding names are unique) and
consumers by ``queue`` (a queue has one consumer); other lists are the app's when given,
except ``compatibility_flags``, which are combined.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from . import BuildContext, BuildResult
from ._cloudflare_config import (
    app_jobs,
    cloudflare_consumer,
    cloudflare_storage,
    connection_max_tries,
    wrangler_section,
)

__all__ = [
    "COMPATIBILITY_DATE",
    "ENTRY",
    "build",
    "entry_source",
    "merge_wrangler",
    "wrangler_config",
]

#: The Workers runtime version the Worker is written against (``haze.config.py`` can set
#: another under ``cloudflare.wrangler.compatibility_date``).
COMPATIBILITY_DATE = "2025-11-01"
#: ``main`` of ``wrangler.json``, relative to it.
ENTRY = "cloudflare/src/entry.py"
#: Packages vendored into ``src/``.
PACKAGES = ("haze", "haze_cloudflare")

#: List key paths merged item by item, and the key that identifies an item.
_KEYED: dict[tuple[str, ...], str] = {
    ("queues", "producers"): "binding",
    ("queues", "consumers"): "queue",
    ("d1_databases",): "binding",
    ("kv_namespaces",): "binding",
    ("r2_buckets",): "binding",
    ("services",): "binding",
    ("durable_objects", "bindings"): "name",
}
_UNION = {("compatibility_flags",)}

ENTRY_SOURCE = '''\
"""The Cloudflare Worker of this haze app, written by `haze build --preset cloudflare`.

dist/wrangler.json points here. Each queue() batch runs through the app bundled beside
this file (config/, app/job/); fetch() is the authenticated dispatch endpoint (set the
HAZE_HTTP_SECRET secret to enable it). See haze_cloudflare.QueueWorker.
"""

import os

from haze_cloudflare import QueueWorker

#: The bundled app: config/ and app/job/ beside this file.
APP_ROOT = os.path.dirname(os.path.abspath(__file__))


class Default(QueueWorker):
    app_root = APP_ROOT
'''


def entry_source() -> str:
    """The source of ``cloudflare/src/entry.py``."""
    return ENTRY_SOURCE


def _slug(text: str) -> str:
    # Worker and queue names: lowercase letters, digits and dashes, at most 63 characters.
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:63].strip("-")
    return slug or "haze-app"


def merge_wrangler(
    base: Mapping[str, Any], override: Mapping[str, Any], path: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``override`` deep-merged over ``base`` (see the module docstring for lists).

    Example::

        merge_wrangler({"queues": {"consumers": [{"queue": "q", "max_retries": 2}]}},
                       {"queues": {"consumers": [{"queue": "q", "max_batch_size": 5}]}})
        # {"queues": {"consumers": [{"queue": "q", "max_retries": 2, "max_batch_size": 5}]}}
    """
    out: dict[str, Any] = json.loads(json.dumps(base))
    for key, value in override.items():
        here = (*path, key)
        mine = out.get(key)
        if isinstance(mine, dict) and isinstance(value, Mapping):
            out[key] = merge_wrangler(mine, value, here)
        elif isinstance(mine, list) and isinstance(value, list) and here in _KEYED:
            out[key] = _merge_keyed(mine, value, _KEYED[here], here)
        elif isinstance(mine, list) and isinstance(value, list) and here in _UNION:
            out[key] = mine + [v for v in value if v not in mine]
        else:
            out[key] = json.loads(json.dumps(value))
    return out


def _merge_keyed(
    base: list[Any], override: list[Any], key: str, path: tuple[str, ...]
) -> list[Any]:
    merged = list(base)
    for item in override:
        match = next(
            (
                i
                for i, b in enumerate(merged)
                if isinstance(b, dict)
                and isinstance(item, Mapping)
                and key in item
                and b.get(key) == item.get(key)
            ),
            None,
        )
        if match is None:
            merged.append(json.loads(json.dumps(item)))
        else:
            merged[match] = merge_wrangler(merged[match], item, path)
    return merged


def wrangler_config(ctx: BuildContext, notes: list[str]) -> dict[str, Any]:
    """``wrangler.json`` for the app of ``ctx`` (derived, then ``haze.config.py`` merged);
    what the user has to know or do is appended to ``notes``."""
    app = ctx.app
    qc = app.queue_config
    section = wrangler_section(app)
    cloudflare = {n: o for n, o in qc.connections.items() if o["driver"] == "cloudflare"}
    if not cloudflare:
        raise ConfigError(
            "the cloudflare preset builds a Worker that consumes Cloudflare Queues, but no "
            'connection uses the cloudflare driver; add one, e.g. "cloudflare": {"driver": '
            '"cloudflare", "binding": "QUEUE"}',
            source=qc.source,
            key="connections",
        )
    name = str(section.get("name") or _slug(ctx.root.name))
    jobs = app_jobs(app)
    producers: list[dict[str, Any]] = []
    consumers: list[dict[str, Any]] = []
    warnings: list[str] = []
    for conn, options in cloudflare.items():
        plan = cloudflare_consumer(app, conn, options, connection_max_tries(jobs, conn), warnings)
        queue = plan.queue_name
        if queue is None:
            queue = _slug(f"{name}-{conn}")
            notes.append(
                f"connection {conn!r}: queue named {queue!r}; name it yourself with a producer "
                f'{{"binding": "{plan.binding}", "queue": ...}} under cloudflare.wrangler.queues '
                "in haze.config.py"
            )
        if not any(p["binding"] == plan.binding for p in producers):
            producers.append({"binding": plan.binding, "queue": queue})
        if any(c["queue"] == queue for c in consumers):
            continue
        consumer: dict[str, Any] = {
            "queue": queue,
            "max_batch_size": plan.max_batch_size,
            "max_batch_timeout": _number(plan.max_batch_timeout),
            "max_retries": plan.max_retries,
            "dead_letter_queue": plan.dead_letter_queue or f"{queue}-dlq",
        }
        if plan.max_concurrency is not None:
            consumer["max_concurrency"] = plan.max_concurrency
        if plan.retry_delay is not None:
            consumer["retry_delay"] = plan.retry_delay
        consumers.append(consumer)
    notes.extend(f"warning: {w}" for w in warnings)
    config: dict[str, Any] = {
        "name": name,
        "main": ENTRY,
        "compatibility_date": COMPATIBILITY_DATE,
        "compatibility_flags": ["python_workers"],
        "queues": {"producers": producers, "consumers": consumers},
        # wrangler uploads .py and .sql by default; haze also ships Lua scripts (redis).
        "rules": [{"type": "Text", "globs": ["**/*.lua"], "fallthrough": True}],
    }
    d1, kv = cloudflare_storage(app)
    d1_entries = [
        {"binding": d.binding, "database_id": d.database} for d in d1 if d.connection is not None
    ]
    kv_entries = [{"binding": k.binding} for k in kv if k.store is not None]
    if d1_entries:
        config["d1_databases"] = d1_entries
    if kv_entries:
        config["kv_namespaces"] = kv_entries
    merged = merge_wrangler(config, section)
    if merged.get("main") != ENTRY:
        notes.append(
            f"cloudflare.wrangler.main ({merged.get('main')!r}) is ignored: the Worker's entry "
            f"is the generated {ENTRY}"
        )
        merged["main"] = ENTRY
    if "python_workers" not in merged.get("compatibility_flags", []):
        merged["compatibility_flags"] = [*merged.get("compatibility_flags", []), "python_workers"]
    for entry in merged.get("kv_namespaces") or []:
        if isinstance(entry, dict) and not entry.get("id"):
            notes.append(
                f"KV binding {entry.get('binding')!r} has no namespace id: add "
                f'{{"binding": "{entry.get("binding")}", "id": ...}} to '
                "cloudflare.wrangler.kv_namespaces in haze.config.py (or let wrangler "
                "provision one)"
            )
    ours = {c["queue"] for c in consumers}
    queues: list[str] = []
    for c in merged["queues"]["consumers"]:
        if isinstance(c, dict) and c.get("queue") in ours:
            queues += [str(q) for q in (c["queue"], c.get("dead_letter_queue")) if q]
    notes.append(
        "create the queues once before the first deploy: "
        + "; ".join(f"npx wrangler queues create {q}" for q in queues)
    )
    return merged


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def build(ctx: BuildContext) -> BuildResult:
    """Write the Worker (see the module docstring)."""
    notes: list[str] = []
    config = wrangler_config(ctx, notes)
    src = ctx.dest / "src"
    files = [ctx.write("src/entry.py", entry_source())]
    files += ctx.copy_app(src)
    files += ctx.vendor(PACKAGES, src)
    wrangler = ctx.write("wrangler.json", json.dumps(config, indent=2) + "\n", base=ctx.out)
    files.append(wrangler)
    notes.append(
        "third-party packages the app imports are not bundled: list them in a "
        "pyproject.toml and run `pywrangler sync` beside the wrangler config (python_modules/)"
    )
    notes.append(f"deploy: npx wrangler deploy -c {wrangler}")
    return BuildResult(preset=ctx.preset, path=ctx.dest, files=files, notes=notes)
