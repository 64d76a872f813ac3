"""``haze build --preset docker``, run rather than read.

There is no Docker engine here, so this test plays the engine's part for the image the
Dockerfile describes, one instruction at a time:

Real:
- the built context (``dist/docker/``) and its Dockerfile, parsed instruction by
  instruction (``FROM``, ``ENV``, ``WORKDIR``, ``COPY``, ``RUN``, ``STOPSIGNAL``,
  ``HEALTHCHECK``, ``ENTRYPOINT``, ``CMD``);
- a fresh virtualenv (``python -m venv``: the image's ``site-packages``), into which the
  Dockerfile's own ``RUN pip install -r requirements.txt`` runs, from the context, with
  the Dockerfile's ``ENV``; haze comes from the context's ``wheels/`` (the wheel the
  build packed), so the test process's editable haze is not what runs;
- the exact ``ENTRYPOINT`` + ``CMD`` (``/bin/sh docker-entrypoint.sh --connection …``),
  the ``HEALTHCHECK`` command and a ``haze db:migrate`` one-off, with the context
  directory as the working directory and the Dockerfile's ``ENV``;
- the worker consuming a real SQLite queue that the test dispatches into, and the
  ``STOPSIGNAL`` sent to the worker's PID: the running job finishes, the next one stays
  queued, the exit code is 0.

Stand-ins for the container:
- the image's filesystem is the context directory (``WORKDIR /app`` maps to it; every
  ``COPY`` in this Dockerfile copies the context to the workdir, so it is checked that
  its sources exist rather than copied);
- the package index: ``PIP_NO_INDEX`` + ``PIP_FIND_LINKS`` point pip at a wheelhouse of
  the third-party packages packed from this virtualenv (the test has no network), where
  ``docker build`` would download them;
- ``RUN useradd`` and ``USER`` are not performed (they need root and would change this
  machine); the worker runs as the test's user;
- the interpreter is this machine's CPython 3.11, not the ``python:3.11-slim`` image's.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
from haze._base.errors import ConfigError
from haze.build import build
from haze.build._python import pack_wheel
from packaging.requirements import Requirement
from preset_support import Proc, clean_env, lines_of, make_queue_tables, wait_until, write_app

posix = pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell and signals")

CONFIG = {
    "config/database.py": """\
        from haze import define_database_config, env
        config = define_database_config(
            default="main",
            connections={"main": {"url": env("DATABASE_URL", "sqlite:///storage/app.db")}},
        )
        """,
    "config/queue.py": """\
        from haze import define_queue_config, env
        config = define_queue_config(
            default=env("QUEUE_CONNECTION", "database"),
            connections={
                "database": {
                    "driver": "database",
                    "queues": ["high", "default"],
                    "concurrency": 1,
                    "sleep": 0.05,
                    "max_sleep": 0.2,
                },
                "memory": {"driver": "memory"},
                "sync": {"driver": "sync"},
            },
        )
        """,
}

DISPATCH = """\
import asyncio, json, sys
from haze import App, Queue

async def main() -> None:
    async with App(root="."):
        for payload in json.loads(sys.argv[1]):
            await Queue.dispatch("docker_write", payload)

asyncio.run(main())
"""


@dataclass
class Dockerfile:
    """The instructions of a Dockerfile, in order, continuation lines joined."""

    instructions: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Dockerfile:
        parsed = cls()
        pending = ""
        for line in text.splitlines():
            stripped = line.strip()
            if not pending and (not stripped or stripped.startswith("#")):
                continue
            if stripped.endswith("\\"):
                pending += stripped[:-1] + " "
                continue
            full = (pending + stripped).strip()
            pending = ""
            keyword, _, rest = full.partition(" ")
            parsed.instructions.append((keyword.upper(), rest.strip()))
        return parsed

    def all(self, keyword: str) -> list[str]:
        return [rest for k, rest in self.instructions if k == keyword]

    def one(self, keyword: str) -> str:
        [rest] = self.all(keyword)
        return rest

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for rest in self.all("ENV"):
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
        return env

    def healthcheck(self) -> list[str]:
        _, _, cmd = self.one("HEALTHCHECK").partition(" CMD ")
        argv: list[str] = json.loads(cmd)
        return argv


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions ``requirements`` pull in (haze excluded)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = req.name.lower()
        extras = set(req.extras)
        dist = metadata.distribution(req.name)
        if key != "haze":
            if key in seen:
                continue
            seen.add(key)
        for raw in dist.requires or []:
            sub = Requirement(raw)
            if sub.marker is None or any(
                sub.marker.evaluate({"extra": e}) for e in (extras or {""})
            ):
                todo.append(sub)
    return seen


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The built context, its parsed Dockerfile and the venv its RUN steps installed."""
    tmp = tmp_path_factory.mktemp("docker")
    root = write_app(tmp / "site", CONFIG, name="docker_write", timeout="20s")
    make_queue_tables(root)
    result = build(root, "docker", tmp / "dist")
    ctx = result.path
    dockerfile = Dockerfile.parse((ctx / "Dockerfile").read_text())
    venv = tmp / "image-venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=180)
    requirement_lines = [
        ln
        for ln in (ctx / "requirements.txt").read_text().splitlines()
        if ln and not ln.startswith(("#", "-"))
    ]
    wheelhouse = tmp / "wheelhouse"
    for name in sorted(_closure(requirement_lines)):
        pack_wheel(name, wheelhouse)
    run_env = clean_env(
        **dockerfile.env(),
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheelhouse),
    )
    assert dockerfile.one("WORKDIR") == "/app"
    for rest in dockerfile.all("COPY"):
        sources = [s for s in shlex.split(rest) if not s.startswith("--")][:-1]
        for source in sources:
            assert (ctx / source).exists(), f"COPY {source}: not in the context"
    for rest in dockerfile.all("RUN"):
        if rest.startswith("useradd "):
            continue  # stand-in: see the module docstring
        assert rest.startswith("pip install "), f"unexpected RUN step: {rest}"
        done = subprocess.run(
            ["/bin/sh", "-c", rest],
            cwd=ctx,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    return {
        "root": root,
        "ctx": ctx,
        "tmp": tmp,
        "dockerfile": dockerfile,
        "venv": venv,
        "result": result,
        "env": {k: v for k, v in run_env.items() if not k.startswith("PIP_")},
    }


def test_the_dockerfile_runs_the_worker_and_states_its_stop_timeout(
    image: dict[str, object],
) -> None:
    dockerfile = image["dockerfile"]
    assert isinstance(dockerfile, Dockerfile)
    assert dockerfile.one("FROM") == "python:3.11-slim"
    assert dockerfile.one("STOPSIGNAL") == "SIGTERM"
    assert json.loads(dockerfile.one("ENTRYPOINT")) == ["/bin/sh", "docker-entrypoint.sh"]
    assert json.loads(dockerfile.one("CMD")) == [
        "--connection",
        "database",
        "--queue",
        "high,default",
    ]
    # the job's timeout is 20 s: the drain needs 25 s
    assert 'dev.haze.stop-timeout="25"' in dockerfile.one("LABEL")
    notes = " ".join(image["result"].notes)  # type: ignore[attr-defined]
    assert "docker stop -t 25" in notes
    ctx = image["ctx"]
    assert isinstance(ctx, Path)
    assert (ctx / "app" / "job" / "docker_write.py").is_file()
    assert (ctx / ".dockerignore").is_file()
    [wheel] = (ctx / "wheels").glob("haze_jobs-*.whl")
    assert "haze-jobs[cli]" in (ctx / "requirements.txt").read_text()
    assert wheel.name.endswith("-py3-none-any.whl")


@posix
def test_the_image_installs_haze_from_its_context(image: dict[str, object]) -> None:
    venv, tmp = image["venv"], image["tmp"]
    assert isinstance(venv, Path) and isinstance(tmp, Path)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import haze; print(haze.__file__)"],
        cwd=tmp,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(venv), done.stdout
    assert (venv / "bin" / "haze").is_file()


@posix
def test_the_entrypoint_works_the_queue_and_drains_on_the_stop_signal(
    image: dict[str, object],
) -> None:
    ctx, tmp, dockerfile = image["ctx"], image["tmp"], image["dockerfile"]
    assert isinstance(ctx, Path) and isinstance(tmp, Path) and isinstance(dockerfile, Dockerfile)
    base_env = image["env"]
    assert isinstance(base_env, dict)
    env = {**base_env, "DATABASE_URL": f"sqlite:///{tmp / 'queue.db'}"}  # docker run -e
    entrypoint = json.loads(dockerfile.one("ENTRYPOINT"))
    cmd = json.loads(dockerfile.one("CMD"))

    def one_off(
        *argv: str, extra: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        # `docker run IMAGE <argv>`: the entrypoint gets the command as its arguments
        return subprocess.run(
            [*entrypoint, *argv],
            cwd=ctx,
            env={**env, **(extra or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    migrated = one_off("haze", "db:migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "Applied" in migrated.stdout, migrated.stdout

    health = subprocess.run(
        dockerfile.healthcheck(), cwd=ctx, env=env, capture_output=True, text=True, timeout=60
    )
    assert health.returncode == 0, health.stdout + health.stderr
    assert json.loads(health.stdout.splitlines()[-1])["reachable"] is True
    unreachable = subprocess.run(
        dockerfile.healthcheck(),
        cwd=ctx,
        env={**env, "DATABASE_URL": f"sqlite:///{tmp / 'missing-dir' / 'x.db'}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unreachable.returncode == 1, unreachable.stdout + unreachable.stderr

    out = tmp / "ran.txt"
    dispatched = subprocess.run(
        [
            "python",
            "-c",
            DISPATCH,
            json.dumps(
                [
                    {"file": str(out), "tag": "slow", "seconds": 3},
                    {"file": str(out), "tag": "next", "seconds": 0},
                ]
            ),
        ],
        cwd=ctx,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dispatched.returncode == 0, dispatched.stdout + dispatched.stderr

    worker = Proc([*entrypoint, *cmd], cwd=ctx, env=env)
    try:
        worker.wait_for_output("Working connection", 120)
        assert wait_until(lambda: "start slow" in lines_of(out), 60), worker.output
        worker.proc.send_signal(getattr(signal, dockerfile.one("STOPSIGNAL")))
        code = worker.wait(timeout=90)
    finally:
        worker.kill()
    assert code == 0, worker.output
    assert lines_of(out) == ["start slow", "end slow"], worker.output
    assert "waiting for 1 running job" in worker.output

    # An ECS task's command (haze-infra's HazeContainerWorker) names the program itself.
    rest = one_off("haze", "queue:work", "--connection", "database", "--stop-when-empty")
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert lines_of(out) == ["start slow", "end slow", "start next", "end next"]


def test_a_worker_image_needs_a_queue_another_process_can_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_app(tmp_path / "site", CONFIG, name="docker_refuse")
    for connection, words in (("memory", "lives inside one process"), ("sync", "is sync")):
        monkeypatch.setenv("QUEUE_CONNECTION", connection)
        with pytest.raises(ConfigError, match=words):
            build(root, "docker", tmp_path / "dist")


def test_jobs_routed_to_another_connection_are_named_in_the_build_notes(tmp_path: Path) -> None:
    """The image's worker takes one connection: a job whose route sends it elsewhere has
    no worker there, and the build says which jobs and the worker command that takes
    them, rather than leaving them to wait unseen."""
    config = {
        **CONFIG,
        "config/queue.py": """\
        from haze import define_queue_config
        config = define_queue_config(
            default="database",
            connections={
                "database": {"driver": "database"},
                "side": {"driver": "redis", "queues": ["default"]},
            },
            routes={
                "docker_routed": {"connection": "side", "queue": "bulk"},
                "docker_stays": {"queue": "mail"},
            },
        )
        """,
        "app/job/docker_stays.py": """\
        from haze import define_job

        @define_job(name="docker_stays")
        async def docker_stays(payload: dict) -> None:
            pass
        """,
    }
    root = write_app(tmp_path / "site", config, name="docker_routed")
    notes = build(root, "docker", tmp_path / "dist").notes
    [note] = [n for n in notes if "docker_routed" in n]
    assert 'connection "side"' in note
    # only the queues of the jobs that go there: docker_stays stays on "database"
    assert "haze queue:work --connection side --queue default,bulk`" in note
    assert "--queue default,mail" in " ".join(notes)
