"""What the Python presets (``docker``, ``server``, ``vercel``) share: which ``haze-jobs[extras]``
an app needs, the requirements derived from them, a wheel of the installed haze, and the
app's jobs, queues and longest timeout.

haze is not on PyPI yet, so a bundle cannot ``pip install haze``: the ``docker`` and
``server`` presets carry a wheel of the haze that ran the build (``wheels/``, found by
``--find-links``), packed from the installed files, so the deployed runtime is the one
the build loaded and the bundle installs haze without reaching an index.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib
import importlib.metadata as metadata
import io
import json
import math
import os
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from haze._base.errors import ConfigError
from haze._base.hints import DISTRIBUTION, DISTRIBUTIONS
from haze._base.routes import JobRoutes
from haze._failed.resolve import failed_target
from haze._orchestration.scheduling import app_schedules
from haze.build.cloudflare_plan import app_jobs as jobs_under_root
from haze.connectors import dialect_of

if TYPE_CHECKING:
    from haze._app.app import App
    from haze._jobs.definition import JobDefinition

__all__ = [
    "DRAIN_SLACK",
    "REMOTE_DRIVERS",
    "app_jobs",
    "app_requirements",
    "extra_requirements",
    "extras_for",
    "jobs_elsewhere",
    "longest_timeout",
    "pack_wheel",
    "stop_timeout",
    "worker_queues",
]

#: Drivers whose queue lives outside the process, so another process can consume it.
REMOTE_DRIVERS = frozenset({"redis", "database", "sqs", "cloudflare", "vercel"})

#: Seconds added to the longest job for a stop timeout (as haze-infra's ECS rule).
DRAIN_SLACK = 5

_DRIVER_EXTRA = {"redis": "redis", "sqs": "sqs", "cloudflare": "cloudflare", "vercel": "vercel"}
_DIALECT_EXTRA = {"postgres": "postgres", "mysql": "mysql", "libsql": "libsql", "d1": "cloudflare"}


# --------------------------------------------------------------------------- the app


def app_jobs(app: App) -> list[JobDefinition[Any]]:
    """The job definitions in files under the app root, by name (the registry is
    process-wide)."""
    return sorted(jobs_under_root(app), key=lambda j: j.name)


def longest_timeout(
    jobs: Iterable[JobDefinition[Any]], connection: str, routes: JobRoutes | None = None
) -> float | None:
    """The longest ``timeout`` of the jobs that can run on ``connection`` (None: none set;
    a job counts where its definition, else its route in ``routes``, pins it)."""
    routes = routes if routes is not None else JobRoutes()
    timeouts = [
        float(j.timeout)
        for j in jobs
        if j.timeout and routes.connection_for(j.name, j.connection) in (None, connection)
    ]
    return max(timeouts) if timeouts else None


def stop_timeout(longest: float | None) -> int | None:
    """Seconds a stop must wait so a running job can finish (None: no job has a timeout)."""
    return None if longest is None else math.ceil(longest) + DRAIN_SLACK


def worker_queues(app: App, connection: str) -> list[str]:
    """The queues a worker on ``connection`` should take: the configured ones in their
    priority order, then ``default`` and every queue a job names or is routed to."""
    options = app.queue_config.connections[connection]
    queues: list[str] = list(options.get("queues") or [])
    routes, default = app.queue_config.routes, app.queue_config.default
    named = sorted(
        {
            q
            for j in app_jobs(app)
            if (q := routes.queue_for(j.name, j.queue))
            # no pinned connection means the default one, not any
            and (routes.connection_for(j.name, j.connection) or default) == connection
        }
    )
    for q in ["default", *named]:
        if q not in queues:
            queues.append(q)
    return queues


def jobs_elsewhere(app: App, connection: str) -> dict[str, list[str]]:
    """The jobs a worker on ``connection`` never sees, by the connection their definition
    or route pins them to (a sync or memory one runs them in the dispatching process)."""
    routes = app.queue_config.routes
    out: dict[str, list[str]] = {}
    for j in app_jobs(app):
        other = routes.connection_for(j.name, j.connection)
        if other in (None, connection) or other not in app.queue_config.connections:
            continue
        if driver_of(app, other) not in ("sync", "memory"):
            out.setdefault(other, []).append(j.name)
    return out


def driver_of(app: App, connection: str) -> str:
    return str(app.queue_config.connections[connection]["driver"])


def is_sqlite(app: App, connection: str) -> bool:
    """Whether a ``database`` connection's queue is a SQLite file (as configured now)."""
    name = app.queue_config.connections[connection].get("connection")
    options = app.database_config.connections.get(name or app.database_config.default)
    return options is not None and dialect_of(str(options["url"])) == "sqlite"


def is_remote(app: App, connection: str) -> bool:
    """Whether another process can consume what is dispatched to ``connection``."""
    options = app.queue_config.connections[connection]
    if options["driver"] == "failover":
        return all(is_remote(app, m) for m in options.get("connections") or [])
    return options["driver"] in REMOTE_DRIVERS


# --------------------------------------------------------------------------- extras


def _database_extra(app: App, name: str | None) -> str | None:
    dc = app.database_config
    options = dc.connections.get(name or dc.default)
    if not options:
        return None
    return _DIALECT_EXTRA.get(dialect_of(str(options["url"])))


def extras_for(app: App) -> list[str]:
    """The ``haze-jobs[...]`` extras the app's config needs, as read at build time.

    Every queue connection, store and database connection counts (a job may dispatch
    anywhere), plus ``encryption`` for encrypted jobs, ``pydantic`` when a payload is a
    pydantic model and ``schedule`` when ``config/schedule.py`` declares schedules.
    ``HAZE_BUILD_EXTRAS`` (comma-separated) adds more: the config is read
    with the build's environment, which may not be production's (``DATABASE_URL``…).
    """
    extras: set[str] = set()
    for options in app.queue_config.connections.values():
        driver = options["driver"]
        if driver in _DRIVER_EXTRA:
            extras.add(_DRIVER_EXTRA[driver])
        if driver == "database":
            extras.add(_database_extra(app, options.get("connection")) or "")
        failed = options.get("failed_store")
        stores, databases = app.cache_config.stores, app.database_config.connections
        target = failed_target(failed, stores, databases) if isinstance(failed, str) else None
        if target is not None and target[0] == "database":
            extras.add(_database_extra(app, target[1]) or "")
    for options in app.cache_config.stores.values():
        if options["driver"] == "redis":
            extras.add("redis")
        elif options["driver"] == "database":
            extras.add(_database_extra(app, options.get("connection")) or "")
    for name in app.database_config.connections:
        extras.add(_database_extra(app, name) or "")
    for job in app_jobs(app):
        if job.encrypted:
            extras.add("encryption")
        payload_type = getattr(job, "payload_type", None)
        if isinstance(payload_type, type) and any(
            c.__module__.startswith("pydantic") for c in payload_type.__mro__[1:]
        ):
            extras.add("pydantic")
    if app_schedules(app.root):  # cronsim for cron, tzdata for zones
        extras.add("schedule")
    for extra in os.environ.get("HAZE_BUILD_EXTRAS", "").split(","):
        extras.add(extra.strip())
    extras.discard("")
    known = set(metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or [])
    unknown = sorted(extras - known)
    if unknown:
        raise ConfigError(
            f"haze has no extra named {', '.join(map(repr, unknown))}; "
            f"known extras: {', '.join(sorted(known))}",
            key="HAZE_BUILD_EXTRAS",
        )
    return sorted(extras)


_EXTRA_MARKER = re.compile(r"""^\s*extra\s*==\s*["']([^"']+)["']\s*$""")


def extra_requirements(extras: Iterable[str]) -> list[str]:
    """The third-party requirements of ``haze-jobs[extras]`` (for a bundle that vendors haze)."""
    wanted = set(extras)
    lines: list[str] = []
    for req in metadata.requires(DISTRIBUTION) or []:
        spec, _, marker = req.partition(";")
        match = _EXTRA_MARKER.match(marker)
        if match is None:
            if not marker.strip():
                lines.append(spec.strip())
            continue
        if match.group(1) in wanted and spec.strip() not in lines:
            lines.append(spec.strip())
    return lines


def app_requirements(root: Path) -> list[str]:
    """The app's own ``requirements.txt`` lines (comments and blanks dropped)."""
    path = root / "requirements.txt"
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split(" #", 1)[0].strip()
        if text and not text.startswith("#"):
            lines.append(text)
    return lines


# --------------------------------------------------------------------------- wheels


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _editable_packages(dist: metadata.Distribution) -> list[Path]:
    """The import packages of an editable install, from the installed distribution map."""
    name = _normalize(dist.metadata["Name"])
    tops = [
        top
        for top, dists in metadata.packages_distributions().items()
        if any(_normalize(d) == name for d in dists)
    ]
    # An editable install's RECORD names only its .pth file, so nothing maps to it: the
    # import name is then the one haze's distributions use (haze-jobs: haze), or the
    # distribution's own (haze_cloudflare).
    imported = {_normalize(d): package for package, (d, _) in DISTRIBUTIONS.items()}
    dirs: list[Path] = []
    for top in sorted(set(tops) - {"_editable_impl_" + name}) or [imported.get(name, name)]:
        module = importlib.import_module(top)
        if module.__file__ is None:
            continue
        dirs.append(Path(module.__file__).parent)
    return dirs


def pack_wheel(distribution: str, dest: Path) -> Path:
    """Write a wheel of the installed ``distribution`` into ``dest``; returns its path.

    The wheel holds the installed files (an editable install: its packages' sources)
    and the installed metadata, so installing it gives back this distribution with its
    ``Requires-Dist``, extras and console scripts. Scripts and data outside the package
    tree are left out; an installer regenerates the scripts from ``entry_points.txt``.
    """
    dist = metadata.distribution(distribution)
    name, version = dist.metadata["Name"], dist.version
    info = f"{_normalize(name)}-{version}.dist-info"
    direct = dist.read_text("direct_url.json")
    editable = bool(direct and json.loads(direct).get("dir_info", {}).get("editable"))
    entries: dict[str, bytes] = {}
    if editable:
        for package in _editable_packages(dist):
            for path in sorted(package.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    entries[path.relative_to(package.parent).as_posix()] = path.read_bytes()
    else:
        for file in dist.files or []:
            rel = file.as_posix()
            if rel.startswith("..") or "__pycache__" in rel or ".dist-info/" in rel:
                continue
            located = Path(str(file.locate()))
            if located.is_file():
                entries[rel] = located.read_bytes()
    wheel_text = dist.read_text("WHEEL") or ""
    tags = re.findall(r"^Tag:\s*(\S+)\s*$", wheel_text, re.M)
    tag = tags[0] if tags and not editable else "py3-none-any"
    if editable or not wheel_text:
        wheel_text = (
            "Wheel-Version: 1.0\nGenerator: haze-build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
    entries[f"{info}/METADATA"] = (dist.read_text("METADATA") or "").encode()
    entries[f"{info}/WHEEL"] = wheel_text.encode()
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        entries[f"{info}/entry_points.txt"] = entry_points.encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for rel, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([rel, f"sha256={digest}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    entries[f"{info}/RECORD"] = record.getvalue().encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{_normalize(name)}-{version}-{tag}.whl"
    # A fixed timestamp keeps the wheel (and a docker layer built from it) reproducible.
    stamp = (2020, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in entries.items():
            zf.writestr(zipfile.ZipInfo(rel, stamp), data, zipfile.ZIP_DEFLATED)
    return path
