"""``haze build --preset aws-lambda``, tested by running the zip it writes.

Real: the build (``python -m haze.cli build``, in a process of its own), the zip,
unpacked into a fresh directory that stands for ``/var/task``, and AWS's runtime client
``awslambdaric`` importing ``handler.sqs`` / ``handler.schedule`` / ``handler.http`` from
it, with the vendored ``haze`` and ``haze_lambda`` of the bundle (the job records which
copy ran). ``HAZE_APP_ROOT`` is unset: the handlers find the bundled app through
``LAMBDA_TASK_ROOT``, as on AWS.

Stand-ins, shared with test_lambda_runtime.py (imported from it, not copied): the Lambda
Runtime API server, and moto in server mode for Amazon SQS. boto3 comes from this
environment, as it comes from the Lambda Python runtime on AWS.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from haze._base.sqlfiles import queue_schema
from test_lambda_runtime import (
    _SPEC,
    DATABASE_PY,
    JOBS_PY,
    QUEUE_PY,
    SECRET,
    _insert_jobs,
    _jobs_left,
    failed_rows,
    http_event,
    outputs,
    queued_batch,
    receive_all,
    runtime,
    scheduled_event,
    sqs_event,
)

pytestmark = pytest.mark.timeout(240)

WHERE_PY = """\
import json
import os
import sys

from haze import JobContext, define_job


@define_job(tries=1)
async def bld_lam_where(payload: dict, job: JobContext) -> None:
    with open(os.environ["LAM_OUT"], "a") as f:
        f.write(json.dumps({"job": "bld_lam_where", "id": job.id, "attempt": job.attempt,
                            "haze": sys.modules["haze"].__file__,
                            "haze_lambda": sys.modules["haze_lambda"].__file__,
                            "cwd": os.getcwd(),
                            "app_root": os.environ.get("HAZE_APP_ROOT")}) + "\\n")
"""


def _build(root: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A process of its own: the app's job package is ``app``, and its jobs' names would
    # clash with test_lambda_runtime.py's if registered in this one.
    return subprocess.run(
        [
            *(sys.executable, "-m", "haze.cli", "--root", str(root)),
            *("build", "--preset", "aws-lambda", "--out", str(out)),
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("bld_lam")
    root = base / "app-src"
    (root / "config").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(QUEUE_PY)
    (root / "config" / "database.py").write_text(DATABASE_PY)
    (root / "app" / "job").mkdir(parents=True)
    (root / "app" / "job" / "lam_jobs.py").write_text(JOBS_PY)
    (root / "app" / "job" / "bld_lam_where.py").write_text(WHERE_PY)
    db = base / "lam.db"
    with contextlib.closing(sqlite3.connect(db)) as c:
        for stmt in queue_schema("sqlite"):
            c.execute(stmt)
        c.commit()
    endpoint = _SPEC["endpoint"]()
    task = base / "var-task"
    env = {
        "LAM_SQS_BASE": f"{endpoint}/{_SPEC['ACCOUNT']}",
        "LAM_SQS_ENDPOINT": endpoint,
        "LAM_DB_URL": f"sqlite:///{db}",
        "LAM_OUT": str(base / "out.jsonl"),
        "LAMBDA_TASK_ROOT": str(task),
        "HAZE_HTTP_SECRET": SECRET,
        "HAZE_SCHEDULE_CONNECTION": "database",
        "HAZE_SCHEDULE_MARGIN": "1s",
        "HAZE_SQS_MARGIN": "1s",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": _SPEC["REGION"],
        "AWS_REGION": _SPEC["REGION"],
        "AWS_LAMBDA_FUNCTION_NAME": "haze-build-test",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_LOG_GROUP_NAME": "/aws/lambda/haze-build-test",
        "AWS_LAMBDA_LOG_STREAM_NAME": "test",
    }
    dist = base / "dist"
    proc = _build(root, dist, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    archive = dist / "aws-lambda.zip"
    with zipfile.ZipFile(archive) as z:
        z.extractall(task)
    return {
        "root": task,
        "src": root,
        "dist": dist,
        "db": db,
        "out": base / "out.jsonl",
        "env": env,
        "build_output": proc.stdout,
    }


@pytest.fixture(autouse=True)
def _no_app_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # runtime() passes this process's environment on: the bundle must be found without it
    monkeypatch.delenv("HAZE_APP_ROOT", raising=False)


def test_zip_holds_the_handler_the_app_and_the_vendored_packages(bundle: dict[str, Any]) -> None:
    dist: Path = bundle["dist"]
    with zipfile.ZipFile(dist / "aws-lambda.zip") as z:
        names = z.namelist()
        infos = z.infolist()
    assert names == sorted(names)
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    for name in (
        "handler.py",
        "config/queue.py",
        "config/database.py",
        "app/job/lam_jobs.py",
        "haze/__init__.py",
        "haze/drivers/sql/sqlite.sql",
        "haze_lambda/__init__.py",
    ):
        assert name in names, name
    # bytecode of every module, compiled at build time: /var/task is read-only on AWS,
    # so a bundle without it compiles every module again on each cold start
    tag = sys.implementation.cache_tag
    sources = [n for n in names if n.endswith(".py")]
    for source in sources:
        folder, _, stem = source.rpartition("/")
        cached = f"{folder}/__pycache__/{stem[:-3]}.{tag}.pyc".lstrip("/")
        assert cached in names, cached
    assert len([n for n in names if n.endswith(".pyc")]) == len(sources)
    # the zip is dist/aws-lambda/, file for file
    on_disk = sorted(
        p.relative_to(dist / "aws-lambda").as_posix()
        for p in (dist / "aws-lambda").rglob("*")
        if p.is_file()
    )
    assert names == on_disk
    handler = (dist / "aws-lambda" / "handler.py").read_text()
    assert "from haze_lambda import sqs_handler as sqs" in handler
    assert "from haze_lambda import schedule_handler as schedule" in handler
    assert "from haze_lambda import http_handler as http" in handler
    # the notes: boto3 from the runtime
    assert "boto3" in bundle["build_output"]
    assert "comes with the Lambda Python runtime" in bundle["build_output"]
    # and the SQLite file this test's queue uses, which Lambda instances would not share
    output = " ".join(bundle["build_output"].split())  # the CLI wraps long notes
    assert "warning: database 'main' is a SQLite file as read now" in output, output
    assert "not shared between instances" in output


def test_the_bundle_imports_from_its_bytecode_without_compiling(bundle: dict[str, Any]) -> None:
    """A cold start on the bundle reads every haze module's bytecode and compiles none.

    The bytecode is hash-based and unchecked, so it holds whatever time stamps the zip's
    entries unpack with; ``python -v`` says where each code object came from.
    """
    task: Path = bundle["root"]
    # as on AWS: no PYTHONPATH and no bytecode cache elsewhere (PYTHONPYCACHEPREFIX)
    left_out = ("PYTHONPATH", "HAZE_APP_ROOT", "PYTHONPYCACHEPREFIX")
    env = {k: v for k, v in os.environ.items() if k not in left_out}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-v", "-c", "import handler, haze.driver_api"],
        cwd=task,
        env={**env, **bundle["env"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = re.findall(r"^# code object from '?([^'\n]+)'?$", proc.stderr, re.M)
    bundled = [p for p in loaded if p.startswith(str(task))]
    for package in ("/haze_lambda/", "/haze/_base/"):
        assert any(package in p for p in bundled), (package, proc.stderr[-2000:])
    compiled = [p for p in bundled if not p.endswith(".pyc")]
    assert not compiled, compiled


def test_the_zip_is_deterministic(bundle: dict[str, Any], tmp_path: Path) -> None:
    proc = _build(bundle["src"], tmp_path / "again", bundle["env"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = (bundle["dist"] / "aws-lambda.zip").read_bytes()
    assert (tmp_path / "again" / "aws-lambda.zip").read_bytes() == first


def test_bundled_sqs_handler_reports_batch_item_failures(bundle: dict[str, Any]) -> None:
    name = "lam-bld"
    q = queued_batch(name, ("lam_ok", "lam_flaky", "lam_fail", "bld_lam_where"), "bld")
    ids, messages, by_job = q["ids"], q["messages"], q["by_job"]
    with runtime(bundle, "handler.sqs") as api:
        kind, response = api.invoke(sqs_event(messages, name))
        assert kind == "response", response
        # only the job that will be retried is reported back to Lambda
        assert response == {
            "batchItemFailures": [{"itemIdentifier": by_job["lam_flaky"]["MessageId"]}]
        }
    runs = {o["job"]: o for o in outputs(bundle) if o["id"] in set(ids.values())}
    assert {j: runs[j]["attempt"] for j in ids} == dict.fromkeys(ids, 1)
    rows = [r for r in failed_rows(bundle) if r[0] == ids["lam_fail"]]
    assert [(r[1], r[2]) for r in rows] == [("sqs", "bld")]
    assert "lam_fail always fails" in rows[0][3]
    # the bundle's own haze ran, found through LAMBDA_TASK_ROOT
    where = runs["bld_lam_where"]
    task = str(bundle["root"])
    assert where["haze"] == os.path.join(task, "haze", "__init__.py")
    assert where["haze_lambda"] == os.path.join(task, "haze_lambda", "__init__.py")
    assert where["app_root"] is None


def test_bundled_http_handler_dispatches(bundle: dict[str, Any]) -> None:
    client = _SPEC["client"]()
    url = _SPEC["create_queues"](["lam-bldh"])["lam-bldh"]
    body = json.dumps({"job": "lam_ok", "payload": {"via": "bundle"}, "queue": "bldh"})
    with runtime(bundle, "handler.http") as api:
        kind, response = api.invoke(http_event(body, {"authorization": f"Bearer {SECRET}"}))
        assert kind == "response", response
        assert response["statusCode"] == 202, response
        data = json.loads(response["body"])
        kind, response = api.invoke(http_event(body, {"authorization": "Bearer wrong"}))
        assert kind == "response", response
        assert response["statusCode"] == 403
    assert data["job"] == "lam_ok"
    [m] = receive_all(client, url, 1)
    envelope = json.loads(m["Body"])
    assert (envelope["id"], envelope["payload"]) == (data["id"], {"via": "bundle"})


def test_bundled_schedule_handler_drains_the_database_queue(bundle: dict[str, Any]) -> None:
    _insert_jobs(bundle, [("lam_ok", {"k": i}) for i in range(2)])
    with runtime(bundle, "handler.schedule") as api:
        kind, response = api.invoke(scheduled_event())
        assert kind == "response", response
    assert response["connection"] == "database"
    assert response["processed"] == 2
    assert response["stopped"] == "empty"
    assert _jobs_left(bundle) == 0
