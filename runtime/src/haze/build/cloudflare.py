"""``haze build --preset cloudflare``: the app as a Cloudflare Python Worker.

Writes, under the output directory (``dist/``)::

    wrangler.json                  the Worker's config: deploy with
                                   `npx wrangler deploy -c dist/wrangler.json`
    cloudflare/                    a pywrangler project (Cloudflare's Python Workers
                                   toolchain): `cd dist/cloudflare && uv run pywrangler
                                   sync && uv run pywrangler deploy`
    cloudflare/pyproject.toml      requires-python >= 3.13; haze and haze-cloudflare (the
                                   wheels beside it) and the app's requirements.txt as
                                   dependencies; workers-py, workers-runtime-sdk as dev
    cloudflare/wrangler.jsonc      the same Worker, ``main`` relative to it (pywrangler
                                   reads the config beside pyproject.toml)
    cloudflare/wheels/             haze and haze-cloudflare, packed from this install
    cloudflare/src/entry.py        class Default(QueueWorker) over the bundled app
    cloudflare/src/config/ app/    the app (and database/, haze.config.py when present)
    cloudflare/src/haze/ …         the vendored runtime and haze_cloudflare

The runtime is also vendored under ``src/``, the directory of ``main``, which wrangler
uploads as the Worker's own modules and the runtime puts on ``sys.path``: so the Worker
deploys with plain wrangler from ``dist/wrangler.json``, from a project's own
``wrangler.toml`` (this repository's, for the example app) and through the
``haze_infra`` components, none of which run ``pywrangler sync`` (wrangler looks for
``python_modules/`` beside the config file that deploys). ``pywrangler sync`` in
``dist/cloudflare`` vendors the same wheels, and the app's PyPI requirements, into
``dist/cloudflare/python_modules/``.

The build reads the config as the Worker will: ``env()`` answering with the ``vars`` of
the ``cloudflare.wrangler`` section (as it reads a Worker's vars). It warns
when the default connection, the lock/batch store or a ``cloudflare`` connection's
failed store cannot work inside a Worker: a SQLite file, a TCP database or Redis, or a
memory store beside a queue that other isolates consume.

``wrangler.json`` is derived from the app, then the ``cloudflare.wrangler`` section of
``haze.config.py`` is merged over it (the app's values win):

- ``name``: the app directory's name; ``main``: the entry (always the generated one);
  ``compatibility_flags`` include ``python_workers``;
- ``queues``: one producer per ``cloudflare`` connection's ``binding``, and a consumer of
  its queue with ``max_retries`` = the most ``tries`` - 1 and a dead-letter queue
  (see :mod:`haze.build.cloudflare_plan`, shared with ``haze_infra``);
- ``d1_databases`` for ``d1://`` connections, ``kv_namespaces`` for ``kv`` stores,
  ``r2_buckets`` for connections that offload to ``r2://BINDING/prefix``.

Lists of bindings are merged by ``binding`` (a Worker's binding names are unique) and
consumers by ``queue`` (a queue has one consumer); other lists are the app's when given,
except ``compatibility_flags``, which are combined.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from datetime import date
from pathlib import Path
from typing import Any

from haze._app.app import App, _load_module_file
from haze._app.config import env_source
from haze._base.errors import ConfigError
from haze._base.hints import DISTRIBUTION
from haze._orchestration.scheduling import bundle_packages, platform_triggers
from haze.build import BuildContext, BuildResult
from haze.build._cloudflare_workflows import (
    native_workflows,
    workflow_classes,
    wrangler_workflows,
)
from haze.build._python import app_requirements, pack_wheel
from haze.build.cloudflare_plan import (
    CloudflarePlan,
    app_jobs,
    cloudflare_consumer,
    cloudflare_storage,
    connection_max_tries,
    r2_buckets,
    wrangler_section,
)
from haze.build.cloudflare_warnings import worker_warnings
from haze.connectors.migrations import migration_files, migration_statements

__all__ = [
    "COMPATIBILITY_DATE",
    "ENTRY",
    "PROJECT_ENTRY",
    "TESTED_PYODIDE",
    "build",
    "entry_source",
    "merge_wrangler",
    "pyodide_of",
    "pyproject_source",
    "worker_warnings",
    "wrangler_config",
]

#: The Workers runtime version the Worker is written against (``haze.config.py`` can set
#: another under ``cloudflare.wrangler.compatibility_date``). Dates from 2025-09-29 run
#: Python 3.13 on Pyodide 0.28.2, the version haze's Pyodide tests run the full suite
#: on (tests/pyodide); dates from 2026-09-08 run Python 3.14 on Pyodide 314, which the
#: tests cover too (tests/pyodide-0.28 and tests/pyodide: see docs/cloudflare.md).
COMPATIBILITY_DATE = "2025-11-01"
#: Compatibility date from which Cloudflare runs a Python (its Pyodide), newest first.
_PYTHON_BY_DATE = ((date(2026, 9, 8), "3.14", "314"), (date(2025, 9, 29), "3.13", "0.28.2"))
#: Pyodide versions whose Python the tests run haze on.
TESTED_PYODIDE = ("0.28.2", "314")
#: ``main`` of ``wrangler.json``, relative to it.
ENTRY = "cloudflare/src/entry.py"
#: ``main`` of the pywrangler project's ``cloudflare/wrangler.json``.
PROJECT_ENTRY = "src/entry.py"
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


# Imports and job discovery now, at the top level: a deployed Worker runs this once and
# starts its isolates from a memory snapshot of the result.
Default.preload()
'''


def entry_source() -> str:
    """The source of ``cloudflare/src/entry.py``."""
    return ENTRY_SOURCE


#: What Cloudflare accepts as a Worker's name (a DNS label).
_WORKER_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


def _slug(text: str) -> str:
    # Worker and queue names: lowercase letters, digits and dashes, at most 63 characters.
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:63].strip("-")
    return slug or "haze-app"


def _queue_slug(app: str, connection: str) -> str:
    """``<app>-<connection>``, cut from the app's end: the connection keeps two
    connections' queues apart, and 4 characters stay free for the ``-dlq`` suffix."""
    conn = _slug(connection)[:40].strip("-")
    return f"{_slug(app)[: 63 - len('-dlq') - len(conn) - 1].strip('-')}-{conn}"


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


def pyodide_of(compatibility_date: str) -> tuple[str, str] | None:
    """(Python, Pyodide) that Cloudflare runs a Python Worker on from this date, or None
    for a date before 2025-09-29 (Python 3.12) or one that is not ``YYYY-MM-DD``."""
    try:
        day = date.fromisoformat(str(compatibility_date))
    except ValueError:
        return None
    for since, python, pyodide in _PYTHON_BY_DATE:
        if day >= since:
            return python, pyodide
    return None


def _var(variables: Mapping[str, Any], name: str) -> str | None:
    # A var as env() reads it inside the Worker: a string, or a JSON number or boolean
    # as text; an object var is not an environment variable.
    value = variables.get(name)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, (str, int, float)) else None


def worker_app(ctx: BuildContext, variables: Mapping[str, Any]) -> App:
    """The app's config as the Worker reads it: ``config/*.py`` evaluated with the Worker's
    ``vars`` as environment variables (no jobs imported: the build's app has them)."""
    if not variables:
        return ctx.app
    specs: dict[str, Any] = {}
    with env_source(lambda name: _var(variables, name)):
        for kind in ("queue", "cache", "redis", "database", "haze"):
            path = ctx.root / ("haze.config.py" if kind == "haze" else f"config/{kind}.py")
            if path.is_file():
                module = _load_module_file(path, f"_haze_worker_config_{kind}")
                specs[kind] = getattr(module, "config", None)
        return App(**specs)


def wrangler_config(ctx: BuildContext, notes: list[str]) -> dict[str, Any]:
    """``wrangler.json`` for the app of ``ctx`` (derived, then ``haze.config.py`` merged);
    what the user has to know or do is appended to ``notes``."""
    section = wrangler_section(ctx.app)
    variables = section.get("vars") or {}
    app = worker_app(ctx, variables if isinstance(variables, Mapping) else {})
    name = str(section.get("name") or _slug(ctx.root.name))
    if not _WORKER_NAME.match(name):
        raise ConfigError(
            f"{name!r} is not a Cloudflare worker name: 1 to 63 lowercase letters, digits "
            "and dashes, not starting or ending with a dash",
            source=str(ctx.root / "haze.config.py"),
            key="cloudflare.wrangler.name",
        )
    warnings: list[str] = []
    producers, consumers = _queue_bindings(ctx, app, name, notes, warnings)
    warnings += worker_warnings(app)
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
    _add_storage(app, config)
    merged = merge_wrangler(config, section)
    _add_cron_triggers(ctx, merged, notes)
    _check_merged(merged, notes)
    ours = {c["queue"] for c in consumers}
    queues: list[str] = []
    for c in merged["queues"]["consumers"]:
        if isinstance(c, dict) and c.get("queue") in ours:
            queues += [str(q) for q in (c["queue"], c.get("dead_letter_queue")) if q]
    notes.append(
        "create the queues once before the first deploy: "
        + "; ".join(f"npx wrangler queues create {shlex.quote(q)}" for q in queues)
    )
    return merged


def _queue_bindings(
    ctx: BuildContext, app: App, name: str, notes: list[str], warnings: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The producers and consumers of the app's cloudflare connections (one consumer
    per queue, one producer per binding)."""
    qc = app.queue_config
    cloudflare = {n: o for n, o in qc.connections.items() if o["driver"] == "cloudflare"}
    if not cloudflare:
        raise ConfigError(
            "the cloudflare preset builds a Worker that consumes Cloudflare Queues, but no "
            'connection uses the cloudflare driver; add one, e.g. "cloudflare": {"driver": '
            '"cloudflare", "binding": "QUEUE"}',
            source=qc.source,
            key="connections",
        )
    jobs = app_jobs(ctx.app)
    producers: list[dict[str, Any]] = []
    consumers: list[dict[str, Any]] = []
    for conn, options in cloudflare.items():
        tries = connection_max_tries(jobs, conn, app.queue_config.routes)
        plan = cloudflare_consumer(app, conn, options, tries, warnings)
        queue = plan.queue_name
        if queue is None:
            queue = _queue_slug(name, conn)
            notes.append(
                f"connection {conn!r}: queue named {queue!r}; name it yourself with a producer "
                f'{{"binding": "{plan.binding}", "queue": ...}} under cloudflare.wrangler.queues '
                "in haze.config.py"
            )
        if not any(p["binding"] == plan.binding for p in producers):
            producers.append({"binding": plan.binding, "queue": queue})
        if not any(c["queue"] == queue for c in consumers):
            consumers.append(_consumer(plan, queue))
    return producers, consumers


def _consumer(plan: CloudflarePlan, queue: str) -> dict[str, Any]:
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
    return consumer


def _add_storage(app: App, config: dict[str, Any]) -> None:
    """The D1 databases, KV namespaces and R2 buckets the app's connections and stores
    bind."""
    d1, kv = cloudflare_storage(app)
    d1_entries = [
        {"binding": d.binding, "database_id": d.database} for d in d1 if d.connection is not None
    ]
    kv_entries = [{"binding": k.binding} for k in kv if k.store is not None]
    if d1_entries:
        config["d1_databases"] = d1_entries
    if kv_entries:
        config["kv_namespaces"] = kv_entries
    if r2 := r2_buckets(app):
        config["r2_buckets"] = r2


def _check_merged(merged: dict[str, Any], notes: list[str]) -> None:
    """Put back what haze.config.py must not change (the entry, python_workers), and note
    what it set that haze cannot vouch for."""
    if merged.get("main") != ENTRY:
        notes.append(
            f"cloudflare.wrangler.main ({merged.get('main')!r}) is ignored: the Worker's entry "
            f"is the generated {ENTRY}"
        )
        merged["main"] = ENTRY
    if "python_workers" not in merged.get("compatibility_flags", []):
        merged["compatibility_flags"] = [*merged.get("compatibility_flags", []), "python_workers"]
    runs = pyodide_of(str(merged.get("compatibility_date")))
    if runs is None or runs[1] not in TESTED_PYODIDE:
        notes.append(
            f"warning: compatibility_date {merged.get('compatibility_date')!r} runs a Python "
            f"haze is not tested on; haze is tested on Pyodide {' and '.join(TESTED_PYODIDE)} "
            "(compatibility dates from 2025-09-29)"
        )
    for entry in merged.get("kv_namespaces") or []:
        if isinstance(entry, dict) and not entry.get("id"):
            notes.append(
                f"KV binding {entry.get('binding')!r} has no namespace id: add "
                f'{{"binding": "{entry.get("binding")}", "id": ...}} to '
                "cloudflare.wrangler.kv_namespaces in haze.config.py (or let wrangler "
                "provision one)"
            )


def _add_cron_triggers(ctx: BuildContext, config: dict[str, Any], notes: list[str]) -> None:
    """``triggers.crons``: one Cron Trigger per distinct UTC cron of the app's schedules
    (kept beside any the wrangler section lists); the Worker's ``scheduled()`` handler
    dispatches the schedules of the trigger that fired."""
    triggers = platform_triggers("cloudflare", ctx.root)
    if not triggers:
        return
    section = config.get("triggers") if isinstance(config.get("triggers"), dict) else {}
    listed = [str(c) for c in (section or {}).get("crons") or []]
    config["triggers"] = {**(section or {}), "crons": list(dict.fromkeys([*listed, *triggers]))}
    notes.append(
        "cron triggers (UTC): "
        + "; ".join(f"{cron} -> {', '.join(names)}" for cron, names in triggers.items())
    )


PYPROJECT = """\
# The Worker as a pywrangler project (Cloudflare's toolchain for Python Workers), written
# by `haze build --preset cloudflare`; rebuilding replaces this directory.
#
#   uv run pywrangler sync      # vendors the dependencies below into python_modules/
#   uv run pywrangler dev       # runs the Worker locally (workerd)
#   uv run pywrangler deploy    # syncs, then deploys with wrangler.json beside this file
#
# haze and haze-cloudflare come from the wheels in wheels/ (packed from the haze that
# ran the build); add the app's PyPI packages to dependencies (requirements.txt of the
# app is copied here).
[project]
name = {name}
version = "0.1.0"
requires-python = ">=3.13"
dependencies = [
{dependencies}]

[dependency-groups]
dev = ["workers-py", "workers-runtime-sdk"]

[tool.uv.sources]
{sources}"""


def pyproject_source(name: str, wheels: Mapping[str, str], requirements: list[str]) -> str:
    """``cloudflare/pyproject.toml``: ``wheels`` maps a distribution (``haze``) to its
    wheel's path relative to the project."""
    deps = [*wheels, *(r for r in requirements if r not in wheels)]
    return PYPROJECT.format(
        # TOML strings take characters as they are, never JSON's surrogate-pair escapes
        name=json.dumps(name, ensure_ascii=False),
        dependencies="".join(f"    {json.dumps(d)},\n" for d in deps),
        sources="".join(f"{d} = {{ path = {json.dumps(p)} }}\n" for d, p in wheels.items()),
    )


def _pins(packages: Iterable[str]) -> list[str]:
    """``dist==version`` of the installed distributions that provide these packages."""
    from importlib import metadata

    providers = metadata.packages_distributions()
    pins: list[str] = []
    for package in packages:
        for dist in providers.get(package, []):
            pin = f"{dist}=={metadata.version(dist)}"
            if pin not in pins:
                pins.append(pin)
    return pins


def _with_migrations(config: dict[str, Any], migrations: str) -> dict[str, Any]:
    """``config`` with ``migrations_dir`` (relative to the config file) on each D1 database
    that has none, so ``wrangler d1 migrations apply`` runs the app's migrations."""
    out = dict(config)
    out["d1_databases"] = [
        {**d, "migrations_dir": migrations}
        if isinstance(d, dict) and "migrations_dir" not in d
        else d
        for d in config.get("d1_databases") or []
    ]
    if not out["d1_databases"]:
        del out["d1_databases"]
    return out


def _d1_migrations(ctx: BuildContext, dest: Path) -> list[Path]:
    """Each ``.py`` migration of the app rendered as the ``.sql`` that ``wrangler d1
    migrations apply`` reads (it runs SQL files only), in D1's dialect."""
    written: list[Path] = []
    for path in migration_files(ctx.root):
        if path.suffix == ".py":
            sql = ";\n\n".join(migration_statements(path, "d1")) + ";\n"
            target = dest / f"{path.stem}.sql"
            target.write_text(f"-- {path.name} rendered for D1 by `haze build`.\n{sql}")
            written.append(target)
    return written


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def build(ctx: BuildContext) -> BuildResult:
    """Write the Worker (see the module docstring)."""
    notes: list[str] = []
    flows = native_workflows(ctx)
    config = wrangler_config(ctx, notes)
    if flows:
        config["workflows"] = [*config.get("workflows", []), *wrangler_workflows(flows)]
        notes.append(f"Cloudflare Workflows: {', '.join(flows)} (one class each in src/entry.py)")
    src = ctx.dest / "src"
    files = [ctx.write("src/entry.py", entry_source() + workflow_classes(flows))]
    files += ctx.copy_app(src)
    bundled = bundle_packages(ctx.root)
    files += ctx.vendor((*PACKAGES, *bundled), src)
    wheels: dict[str, str] = {}
    for dist in (DISTRIBUTION, "haze-cloudflare"):
        wheel = pack_wheel(dist, ctx.dest / "wheels")
        wheels[dist] = f"wheels/{wheel.name}"
        files.append(wheel)
    # what is vendored beside haze (cronsim, tzdata for schedules) pinned as installed here
    own = app_requirements(ctx.root)
    requirements = [*_pins(bundled), *own]
    files.append(
        ctx.write("pyproject.toml", pyproject_source(config["name"], wheels, requirements))
    )
    project = {**config, "main": PROJECT_ENTRY}
    if (ctx.root / "database" / "migrations").is_dir() and config.get("d1_databases"):
        files += _d1_migrations(ctx, src / "database" / "migrations")
        config = _with_migrations(config, "cloudflare/src/database/migrations")
        project = _with_migrations(project, "src/database/migrations")
        names = [
            str(d.get("database_name") or d.get("binding"))
            for d in config["d1_databases"]
            if isinstance(d, dict)
        ]
        notes.append(
            "create the D1 tables (the app's database/migrations) once: "
            + "; ".join(
                f"npx wrangler d1 migrations apply {shlex.quote(n)} --remote" for n in names
            )
        )
    files.append(ctx.write("wrangler.jsonc", json.dumps(project, indent=2) + "\n"))
    wrangler = ctx.write("wrangler.json", json.dumps(config, indent=2) + "\n", base=ctx.out)
    files.append(wrangler)
    if own:  # the pins of what is vendored beside haze need no pywrangler: src/ has it
        notes.append(
            f"the app's requirements.txt ({', '.join(own)}) is in "
            "dist/cloudflare/pyproject.toml: deploy with pywrangler (it vendors them into "
            "python_modules/), not with plain wrangler"
        )
    notes.append(f"deploy: npx wrangler deploy -c {shlex.quote(str(wrangler))}")
    notes.append(
        f"or with pywrangler: cd {shlex.quote(str(ctx.dest))} && uv run pywrangler sync && "
        "uv run pywrangler deploy"
    )
    return BuildResult(preset=ctx.preset, path=ctx.dest, files=files, notes=notes)
