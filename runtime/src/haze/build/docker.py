"""``haze build --preset docker``: a container image whose process is ``haze queue:work``.

``dist/docker/`` is a complete build context::

    Dockerfile            python:3.11-slim; installs requirements.txt; runs the worker
    .dockerignore
    requirements.txt      haze-jobs[cli,<extras of the config>] (+ the app's requirements.txt)
    wheels/haze-*.whl     the haze that ran the build (haze is not on PyPI yet)
    docker-entrypoint.sh  `haze queue:work "$@"`, or the command given (`haze db:migrate`)
    healthcheck.py        the HEALTHCHECK: haze.queue_check() on the worker's connection
    config/ app/ database/ haze.config.py    the app

The worker drains on ``SIGTERM`` (``STOPSIGNAL SIGTERM``): it stops claiming and waits for
its running jobs. The stop timeout (``docker stop -t``, compose ``stop_grace_period``,
ECS ``stopTimeout``) must outlast the longest job, or the job is killed and runs again
after ``retry_after``; the build computes it (the longest job ``timeout`` + 5 s) and says so.

Why an entrypoint script rather than ``ENTRYPOINT ["haze", "queue:work"]``: options
given to ``docker run IMAGE --queue high`` still go to the worker, and a command that
names a program (``docker run IMAGE haze db:migrate``, or haze-infra's ECS task, whose
``command`` is ``["haze", "queue:work", …]``) runs as given instead of being appended
to ``haze queue:work``. The script ``exec``s, so the worker is PID 1 and gets the signal.
"""

from __future__ import annotations

import json
import shlex

from haze._base.errors import ConfigError
from haze._base.hints import DISTRIBUTION
from haze.build import BuildContext, BuildResult
from haze.build._python import (
    app_jobs,
    app_requirements,
    driver_of,
    extras_for,
    is_remote,
    is_sqlite,
    jobs_elsewhere,
    longest_timeout,
    pack_wheel,
    stop_timeout,
    worker_queues,
)

__all__ = ["build"]

BASE_IMAGE = "python:3.11-slim"

#: When no job has a timeout, the stop timeout printed for the user to adjust.
UNKNOWN_STOP_TIMEOUT = 60

ENTRYPOINT_SH = """\
#!/bin/sh
# Made by `haze build --preset docker`.
# No command, or options only (`docker run IMAGE --queue high`): the worker.
# A command (`docker run IMAGE haze db:migrate`, an ECS task's command): run as given.
# `exec` makes it PID 1, so `docker stop` (SIGTERM) reaches it and it drains.
set -e
case "${1:-}" in
  "" | -*) exec haze queue:work "$@" ;;
  *) exec "$@" ;;
esac
"""

HEALTHCHECK_PY = '''\
"""The image's HEALTHCHECK (made by `haze build --preset docker`).

Exit 0 when the queue connection answers (haze.queue_check), 1 when it does not, so an
orchestrator stops sending work to a container whose backend is unreachable. Usage:
python healthcheck.py [CONNECTION]; prints the report as JSON.
"""

import asyncio
import json
import sys
from pathlib import Path

from haze import App, queue_check
from haze._app.app import run_in_app

TIMEOUT = 10.0


async def main(connection: str | None) -> int:
    app = App(root=Path(__file__).resolve().parent)
    try:
        report = await asyncio.wait_for(
            run_in_app(app, lambda: queue_check(connection)), TIMEOUT
        )
    except Exception as e:  # the probe's answer is the exit code, whatever went wrong
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
        return 1
    finally:
        try:
            await asyncio.wait_for(app.stop(), TIMEOUT)
        except Exception:
            pass
    print(json.dumps(report.to_dict()))
    return 0 if report.reachable else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None)))
'''

DOCKERIGNORE = """\
**/__pycache__
**/*.pyc
**/*.db
**/*.db-*
**/.env
**/.venv
.git
"""


def _dockerfile(
    *, extras: list[str], cmd: list[str], connection: str, stop: int, stop_known: bool
) -> str:
    how_long = (
        f"the longest job timeout + 5 s = {stop}s"
        if stop_known
        else f"no job sets a timeout; {stop}s is a guess: use your longest job + 5 s"
    )
    return f"""\
# syntax=docker/dockerfile:1
# Made by `haze build --preset docker`: rebuild it rather than editing it.
# Build and run (the stop timeout lets running jobs finish):
#   docker build -t my-worker dist/docker
#   docker run --stop-timeout {stop} -e DATABASE_URL=... my-worker
FROM {BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \\
    PYTHONDONTWRITEBYTECODE=1 \\
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# {DISTRIBUTION}[{",".join(extras)}] comes from wheels/ (haze is not on PyPI yet); its
# dependencies come from the package index at `docker build` time.
COPY requirements.txt ./
COPY wheels/ ./wheels/
RUN pip install --no-cache-dir -r requirements.txt

RUN useradd --system --uid 10001 --home-dir /app --no-create-home haze
COPY --chown=10001:10001 . .
USER 10001

# `haze queue:work` drains on SIGTERM: no new jobs, the running ones finish.
# Stop timeout ({how_long}):
# docker stop -t {stop} / docker run --stop-timeout {stop} / compose stop_grace_period:
# {stop}s / ECS stopTimeout: {stop} (Fargate allows 120). Shorter, and a running job is
# killed and runs again after retry_after.
STOPSIGNAL SIGTERM
LABEL dev.haze.stop-timeout="{stop}"

HEALTHCHECK --interval=30s --timeout=15s --start-period=15s --retries=3 \\
    CMD ["python", "healthcheck.py", {json.dumps(connection)}]

ENTRYPOINT ["/bin/sh", "docker-entrypoint.sh"]
CMD {json.dumps(cmd)}
"""


def build(ctx: BuildContext) -> BuildResult:
    app = ctx.app
    connection = app.queue_config.default
    driver = driver_of(app, connection)
    _refuse_local(ctx, connection, driver)
    extras = ["cli", *(e for e in extras_for(app) if e != "cli")]
    queues = worker_queues(app, connection)
    cmd = ["--connection", connection, "--queue", ",".join(queues)]
    longest = longest_timeout(app_jobs(app), connection, app.queue_config.routes)
    stop = stop_timeout(longest)
    stop_known = stop is not None
    stop = stop if stop is not None else UNKNOWN_STOP_TIMEOUT

    dest = ctx.dest
    files = ctx.copy_app(dest)
    wheel = pack_wheel(DISTRIBUTION, dest / "wheels")
    files.append(wheel)
    requirements = [
        "# Made by `haze build --preset docker`.",
        "--find-links ./wheels",
        f"{DISTRIBUTION}[{','.join(extras)}]=={_haze_version()}",
        *app_requirements(ctx.root),
    ]
    files.append(ctx.write("requirements.txt", "\n".join(requirements) + "\n"))
    entry = ctx.write("docker-entrypoint.sh", ENTRYPOINT_SH)
    entry.chmod(0o755)
    files.append(entry)
    files.append(ctx.write("healthcheck.py", HEALTHCHECK_PY))
    files.append(ctx.write(".dockerignore", DOCKERIGNORE))
    files.append(
        ctx.write(
            "Dockerfile",
            _dockerfile(
                extras=extras, cmd=cmd, connection=connection, stop=stop, stop_known=stop_known
            ),
        )
    )
    notes = [
        f"the worker runs `haze queue:work {shlex.join(cmd)}` (override with arguments to "
        "`docker run IMAGE ...`)",
        f"requirements: {DISTRIBUTION}[{','.join(extras)}] from the config as read now; set "
        "HAZE_BUILD_EXTRAS=postgres,... if production's environment picks other backends",
        _stop_note(stop, longest if stop_known else None),
    ]
    notes.extend(_elsewhere_notes(ctx, connection))
    if driver == "database" and is_sqlite(app, connection):
        notes.append(
            f'connection "{connection}" is SQLite here: inside a container that file is not '
            "shared with your web process; set DATABASE_URL to a server database (or mount "
            "the file) when you run the image"
        )
    return BuildResult(preset=ctx.preset, path=dest, files=files, notes=notes)


def _elsewhere_notes(ctx: BuildContext, connection: str) -> list[str]:
    """One note per other connection that jobs are pinned to: this image's worker does
    not take them, so they would wait there unseen."""
    app, notes = ctx.app, []
    for other, names in sorted(jobs_elsewhere(app, connection).items()):
        cmd = ["--connection", other, "--queue", ",".join(worker_queues(app, other))]
        notes.append(
            f'jobs {", ".join(names)} go to connection "{other}" (their route or '
            f"definition), which this worker does not take: run another container with "
            f"`docker run IMAGE {shlex.join(cmd)}` (`haze queue:work {shlex.join(cmd)}`)"
        )
    return notes


def _refuse_local(ctx: BuildContext, connection: str, driver: str) -> None:
    """A container worker needs a queue other processes reach: not sync, not in-process."""
    app = ctx.app
    if driver == "sync":
        raise ConfigError(
            f'the default connection "{connection}" is sync: it runs jobs inside dispatch() '
            "and a worker has nothing to consume; make the default (QUEUE_CONNECTION) a "
            "redis, database, sqs or cloudflare connection",
            source=app.queue_config.source,
            key="default",
        )
    if not is_remote(app, connection):
        raise ConfigError(
            f'the default connection "{connection}" ({driver}) lives inside one process: a '
            "container worker cannot see what your web process dispatches to it; make the "
            "default (QUEUE_CONNECTION) a redis, database, sqs or cloudflare connection",
            source=app.queue_config.source,
            key="default",
        )


def _stop_note(stop: int, longest: float | None) -> str:
    """How long ``docker stop`` must wait (``longest``: the longest job timeout, if known)."""
    if longest is not None:
        return (
            f"stop timeout: give `docker stop -t {stop}` (or --stop-timeout, compose "
            f"stop_grace_period, ECS stopTimeout) at least {stop}s: the longest job may run "
            f"{longest:g}s and the worker waits for it on SIGTERM"
        )
    return (
        "stop timeout: no job sets a timeout, so no drain time can be computed; "
        f"the Dockerfile assumes {stop}s: set `docker stop -t` above your longest job"
    )


def _haze_version() -> str:
    from importlib.metadata import version

    return version(DISTRIBUTION)
