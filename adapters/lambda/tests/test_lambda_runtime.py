"""The Lambda handlers under the real AWS Lambda runtime client.

Real:
- ``awslambdaric`` (AWS's runtime interface client, the one in AWS's Python base
  images), started as ``python -m awslambdaric haze_lambda.<handler>`` in a subprocess:
  it imports the handler, long-polls the Runtime API for invocations, builds the
  ``LambdaContext`` (deadline included) and posts the marshalled responses and errors.
  One subprocess per handler serves every invocation of a module, as a warm Lambda
  container does.
- haze, haze_lambda, boto3 and a SQLite file (the failed store and the database queue).
- The events' shapes: built as AWS documents them for SQS triggers, EventBridge
  scheduled events and API Gateway HTTP API payload format 2.0, and validated with
  ``aws-lambda-powertools``' parser models (``SqsModel``, ``EventBridgeModel``,
  ``APIGatewayProxyEventV2Model``) before they are sent. SQS records carry receipt
  handles and attributes from a real ``ReceiveMessage`` on the queue.

Stand-ins:
- The Lambda service's Runtime API: ``RuntimeAPI`` below, a small HTTP server with the
  documented routes (``GET /2018-06-01/runtime/invocation/next``,
  ``POST .../invocation/{id}/response`` and ``.../error``, ``POST .../init/error``).
- Amazon SQS: ``moto`` in server mode (see ``tests/drivers/sqs_spec.py``); the Lambda
  poller is this test, which receives messages and builds the event from them.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import queue
import re
import runpy
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("awslambdaric", reason="awslambdaric is needed for the Lambda runtime tests")
models = pytest.importorskip("aws_lambda_powertools.utilities.parser.models")
pytest.importorskip("boto3")

from haze._base.message import Message, encode, new_id  # noqa: E402
from haze._base.sqlfiles import queue_schema  # noqa: E402

_SPEC = runpy.run_path(str(Path(__file__).resolve().parents[3] / "tests/drivers/sqs_spec.py"))
ACCOUNT: str = _SPEC["ACCOUNT"]
REGION: str = _SPEC["REGION"]
SECRET = "lam-test-secret"
FUNCTION_ARN = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:haze-test"


def _trace_id() -> str:
    return f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]}"


pytestmark = pytest.mark.timeout(180)


# --------------------------------------------------------------------------- Runtime API


class RuntimeAPI:
    """The Lambda Runtime API (2018-06-01) as far as a runtime client uses it."""

    PREFIX = "/2018-06-01/runtime"

    def __init__(self) -> None:
        self.pending: queue.Queue[tuple[str, bytes, int]] = queue.Queue()
        self.results: dict[str, tuple[str, Any]] = {}
        self.done: dict[str, threading.Event] = {}
        self.init_errors: list[Any] = []
        self.stopping = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _send(
                self, status: int, body: bytes, headers: dict[str, str] | None = None
            ) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path != f"{api.PREFIX}/invocation/next":
                    self._send(404, b'{"errorMessage":"not found"}')
                    return
                while not api.stopping.is_set():
                    try:
                        rid, event, deadline = api.pending.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    self._send(
                        200,
                        event,
                        {
                            "Lambda-Runtime-Aws-Request-Id": rid,
                            "Lambda-Runtime-Deadline-Ms": str(deadline),
                            "Lambda-Runtime-Invoked-Function-Arn": FUNCTION_ARN,
                            "Lambda-Runtime-Trace-Id": _trace_id(),
                        },
                    )
                    return
                self.close_connection = True

            def do_POST(self) -> None:
                body = self._body()
                m = re.fullmatch(rf"{api.PREFIX}/invocation/([^/]+)/(response|error)", self.path)
                if m:
                    rid, kind = m.groups()
                    api.results[rid] = (kind, json.loads(body or b"null"))
                    api.done.setdefault(rid, threading.Event()).set()
                    self._send(202, b'{"status":"OK"}')
                    return
                if self.path == f"{api.PREFIX}/init/error":
                    api.init_errors.append(json.loads(body or b"null"))
                    self._send(202, b'{"status":"OK"}')
                    return
                self._send(404, b'{"errorMessage":"not found"}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def invoke(
        self, event: dict[str, Any], *, timeout_ms: int = 60_000, wait: float = 90.0
    ) -> tuple[str, Any]:
        """Queue one invocation; returns ("response" | "error", the posted JSON)."""
        rid = str(uuid.uuid4())
        self.done[rid] = threading.Event()
        deadline = int(time.time() * 1000) + timeout_ms
        self.pending.put((rid, json.dumps(event).encode(), deadline))
        end = time.monotonic() + wait
        while not self.done[rid].wait(0.1):
            if self.init_errors:
                raise RuntimeError(f"the function failed to start: {self.init_errors}")
            if time.monotonic() > end:
                raise TimeoutError(f"no response to invocation {rid}")
        return self.results[rid]

    def close(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- the app

QUEUE_PY = """
from haze import define_queue_config, env

creds = {"access_key_id": "testing", "secret_access_key": "testing"}
# The documented naming: a standard and a FIFO connection share one scheme, so a record
# of "lam-x.fifo" fits the standard template too and must go to the FIFO connection.
config = define_queue_config(default="sqs", connections={
    "sqs": {"driver": "sqs", "queue_url": env("LAM_SQS_BASE") + "/lam-{queue}",
            "endpoint_url": env("LAM_SQS_ENDPOINT"), "region": "us-east-1",
            "credentials": creds, "failed_store": "main", "retry_after": "30s",
            "concurrency": 4},
    "fifo": {"driver": "sqs", "queue_url": env("LAM_SQS_BASE") + "/lam-{queue}.fifo",
             "endpoint_url": env("LAM_SQS_ENDPOINT"), "region": "us-east-1",
             "credentials": creds, "failed_store": "main"},
    "database": {"driver": "database", "connection": "main", "retry_after": "30s"},
    # in-process consumers start with the app: none may be left running between
    # invocations or at exit
    "memory": {"driver": "memory", "concurrency": 2},
})
"""

DATABASE_PY = """
from haze import define_database_config, env

config = define_database_config(default="main", connections={"main": {"url": env("LAM_DB_URL")}})
"""

JOBS_PY = """
import asyncio
import functools
import json
import os

from haze import JobContext, define_job


def note(name: str, payload: object, job: JobContext) -> None:
    with open(os.environ["LAM_OUT"], "a") as f:
        f.write(json.dumps({"job": name, "payload": payload, "attempt": job.attempt,
                            "id": job.id, "pid": os.getpid()}) + "\\n")


@define_job(tries=1)
async def lam_ok(payload: dict, job: JobContext) -> None:
    note("lam_ok", payload, job)


@define_job(tries=3, backoff=8)
async def lam_flaky(payload: dict, job: JobContext) -> None:
    note("lam_flaky", payload, job)
    if job.attempt < 2:
        raise RuntimeError("lam_flaky: the first attempt fails")


@define_job(tries=3, backoff=2)
async def lam_flaky_fast(payload: dict, job: JobContext) -> None:
    note("lam_flaky_fast", payload, job)
    if job.attempt < 2:
        raise RuntimeError("lam_flaky_fast: the first attempt fails")


@define_job(tries=1)
async def lam_fail(payload: dict, job: JobContext) -> None:
    note("lam_fail", payload, job)
    raise ValueError("lam_fail always fails")


@define_job(tries=2)
async def lam_release(payload: dict, job: JobContext) -> None:
    note("lam_release", payload, job)
    job.release(0)


@define_job(tries=1)
async def lam_slow(payload: dict, job: JobContext) -> None:
    await asyncio.sleep(payload["seconds"])
    note("lam_slow", payload, job)


def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)

    return wrapper


@define_job(tries=1)
@logged
async def lam_decorated(payload: dict, job: JobContext) -> None:
    await asyncio.sleep(0)
    note("lam_decorated", payload, job)


class LamCallable:
    async def __call__(self, payload: dict, job: JobContext) -> None:
        await asyncio.sleep(0)
        note("lam_callable", payload, job)


define_job(name="lam_callable", tries=1)(LamCallable())
"""


@pytest.fixture(scope="module")
def lam_app(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lam_app")
    (root / "config").mkdir()
    (root / "config" / "queue.py").write_text(QUEUE_PY)
    (root / "config" / "database.py").write_text(DATABASE_PY)
    (root / "app" / "job").mkdir(parents=True)
    (root / "app" / "job" / "lam_jobs.py").write_text(JOBS_PY)
    db = root / "lam.db"
    with contextlib.closing(sqlite3.connect(db)) as c:
        for stmt in queue_schema("sqlite"):
            c.execute(stmt)
        c.commit()
    endpoint = _SPEC["endpoint"]()
    return {
        "root": root,
        "db": db,
        "out": root / "out.jsonl",
        "endpoint": endpoint,
        "env": {
            "HAZE_APP_ROOT": str(root),
            "LAM_SQS_BASE": f"{endpoint}/{ACCOUNT}",
            "LAM_SQS_ENDPOINT": endpoint,
            "LAM_DB_URL": f"sqlite:///{db}",
            "LAM_OUT": str(root / "out.jsonl"),
            "HAZE_HTTP_SECRET": SECRET,
            "HAZE_HTTP_MAX_BODY": "10MB",
            "HAZE_SCHEDULE_CONNECTION": "database",
            "HAZE_SCHEDULE_MARGIN": "1s",
            "HAZE_SQS_MARGIN": "1s",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_LAMBDA_FUNCTION_NAME": "haze-test",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_LOG_GROUP_NAME": "/aws/lambda/haze-test",
            "AWS_LAMBDA_LOG_STREAM_NAME": "test",
        },
    }


@contextlib.contextmanager
def runtime(
    lam_app: dict[str, Any], handler: str, extra_env: dict[str, str] | None = None
) -> Iterator[RuntimeAPI]:
    """The real awslambdaric running ``handler`` against our Runtime API."""
    api = RuntimeAPI()
    log_path = lam_app["root"] / f"{handler.replace('.', '_')}.log"
    env = {
        **os.environ,
        **lam_app["env"],
        **(extra_env or {}),
        "AWS_LAMBDA_RUNTIME_API": api.address,
        "_HANDLER": handler,
    }
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "awslambdaric", handler],
            cwd=lam_app["root"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    api.proc = proc  # a test may SIGKILL it: a crashed execution environment
    try:
        yield api
    except BaseException:
        print(log_path.read_text(errors="replace")[-6000:])
        raise
    finally:
        api.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def outputs(lam_app: dict[str, Any]) -> list[dict[str, Any]]:
    path: Path = lam_app["out"]
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def failed_rows(lam_app: dict[str, Any]) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(lam_app["db"])) as c:
        return c.execute("SELECT uuid, connection, queue, exception FROM failed_jobs").fetchall()


# --------------------------------------------------------------------------- events


def body_of(
    job: str, payload: Any, queue: str, connection: str = "sqs", **extra: Any
) -> tuple[str, str]:
    """A haze envelope (as dispatch writes it); returns (haze id, JSON body)."""
    message = Message(
        id=new_id(),
        job=job,
        payload=payload,
        queue=queue,
        connection=connection,
        ts=time.time(),
        **extra,
    )
    return message.id, encode(message)


def receive_all(
    client: Any, url: str, n: int, visibility: int = 30, within: float = 15.0
) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + within
    while len(got) < n and time.monotonic() < deadline:
        r = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=visibility,
            WaitTimeSeconds=1,
            MessageSystemAttributeNames=["All"],
        )
        got.extend(r.get("Messages") or [])
    return got


def sqs_event(messages: list[dict[str, Any]], queue_name: str) -> dict[str, Any]:
    """An SQS trigger event as AWS documents it, validated with powertools' SqsModel."""
    records = []
    for m in messages:
        a = m["Attributes"]
        attributes = {
            "ApproximateReceiveCount": a["ApproximateReceiveCount"],
            "SentTimestamp": a["SentTimestamp"],
            "SenderId": a.get("SenderId") or "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": a["ApproximateFirstReceiveTimestamp"],
        }
        for key in ("MessageGroupId", "MessageDeduplicationId", "SequenceNumber"):
            if key in a:
                attributes[key] = a[key]
        records.append(
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": attributes,
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue_name}",
                "awsRegion": REGION,
            }
        )
    event = {"Records": records}
    models.SqsModel.model_validate(event)
    return event


def scheduled_event(detail: dict[str, Any] | None = None) -> dict[str, Any]:
    """An EventBridge "Scheduled Event", validated with powertools' EventBridgeModel."""
    event = {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/haze-drain"],
        "detail": detail or {},
    }
    models.EventBridgeModel.model_validate(event)
    return event


def http_event(
    body: str | bytes, headers: dict[str, str], *, method: str = "POST", base64_body: bool = False
) -> dict[str, Any]:
    """An API Gateway HTTP API (payload 2.0) event, validated with powertools' model."""
    raw = body.encode() if isinstance(body, str) else body
    now = time.time()
    event = {
        "version": "2.0",
        "routeKey": f"{method} /jobs",
        "rawPath": "/jobs",
        "rawQueryString": "",
        "headers": {
            "content-type": "application/json",
            "host": "api.example.test",
            "user-agent": "haze-test",
            **{k.lower(): v for k, v in headers.items()},
        },
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": "hazeapi",
            "domainName": "hazeapi.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "hazeapi",
            "http": {
                "method": method,
                "path": "/jobs",
                "protocol": "HTTP/1.1",
                "sourceIp": "192.0.2.1",
                "userAgent": "haze-test",
            },
            "requestId": uuid.uuid4().hex[:16],
            "routeKey": f"{method} /jobs",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "body": base64.b64encode(raw).decode() if base64_body else raw.decode(),
        "isBase64Encoded": base64_body,
    }
    models.APIGatewayProxyEventV2Model.model_validate(event)
    return event


def queue_counts(client: Any, url: str) -> tuple[int, int, int]:
    a = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return (
        int(a["ApproximateNumberOfMessages"]),
        int(a["ApproximateNumberOfMessagesNotVisible"]),
        int(a["ApproximateNumberOfMessagesDelayed"]),
    )


# --------------------------------------------------------------------------- sqs_handler


def queued_batch(name: str, jobs: Sequence[str], tag: str) -> dict[str, Any]:
    """One message per job on a new queue ``name``, received back as a trigger gets them:
    ``client``, ``url``, ``ids`` (job -> envelope id), ``messages``, ``by_job``."""
    client = _SPEC["client"]()
    url = _SPEC["create_queues"]([name])[name]
    ids = {}
    for job in jobs:
        ids[job], body = body_of(job, {"n": job}, tag)
        client.send_message(QueueUrl=url, MessageBody=body)
    messages = receive_all(client, url, len(jobs))
    assert len(messages) == len(jobs)
    by_job = {json.loads(m["Body"])["job"]: m for m in messages}
    return {"client": client, "url": url, "ids": ids, "messages": messages, "by_job": by_job}


def test_sqs_handler_partial_batch_response(lam_app: dict[str, Any]) -> None:
    name = "lam-t1"
    q = queued_batch(name, ("lam_ok", "lam_flaky", "lam_fail", "lam_release"), "t1")
    client, url, ids, messages, by_job = (
        q["client"],
        q["url"],
        q["ids"],
        q["messages"],
        q["by_job"],
    )
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        kind, response = api.invoke(sqs_event(messages, name))
        assert kind == "response", response
        # Only the retried job is reported: Lambda keeps it, with haze's backoff as its
        # visibility. Success and final failure were deleted; the release was re-sent.
        assert response == {
            "batchItemFailures": [{"itemIdentifier": by_job["lam_flaky"]["MessageId"]}]
        }
        mine = set(ids.values())
        runs = {o["job"]: o for o in outputs(lam_app) if o["id"] in mine}
        assert {j: runs[j]["attempt"] for j in ids} == dict.fromkeys(ids, 1)
        rows = failed_rows(lam_app)
        assert [(r[0], r[1], r[2]) for r in rows] == [(ids["lam_fail"], "sqs", "t1")]
        assert "lam_fail always fails" in rows[0][3]
        visible, invisible, _ = queue_counts(client, url)
        assert (visible, invisible) == (1, 1)  # the re-sent release; the flaky one in backoff
        [again] = receive_all(client, url, 1)
        envelope = json.loads(again["Body"])
        assert envelope["job"] == "lam_release"
        assert envelope["id"] == ids["lam_release"]
        assert again["MessageId"] != by_job["lam_release"]["MessageId"]  # a new message
        assert "attempts" not in envelope  # release used no try: still attempt 1 next time
        assert again["Attributes"]["ApproximateReceiveCount"] == "1"
        client.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])

        # The backoff (8 s) ends; the second receive of the flaky job runs as attempt 2.
        [flaky] = receive_all(client, url, 1)
        assert json.loads(flaky["Body"])["job"] == "lam_flaky"
        assert flaky["Attributes"]["ApproximateReceiveCount"] == "2"
        kind, response = api.invoke(sqs_event([flaky], name))
        assert (kind, response) == ("response", {"batchItemFailures": []})
        flaky_runs = [o for o in outputs(lam_app) if o["id"] == ids["lam_flaky"]]
        assert [o["attempt"] for o in flaky_runs] == [1, 2]
        # one warm process (one app, one event loop) served both invocations
        assert len({o["pid"] for o in outputs(lam_app) if o["id"] in mine}) == 1
        assert queue_counts(client, url) == (0, 0, 0)


def test_sqs_handler_runs_async_handlers_that_are_not_a_bare_async_def(
    lam_app: dict[str, Any],
) -> None:
    """An async def under a plain-def decorator and an object whose __call__ is async
    def run their bodies through the Lambda entry path, as on a worker."""
    name = "lam-t-kinds"
    q = queued_batch(name, ("lam_decorated", "lam_callable"), "t-kinds")
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        kind, response = api.invoke(sqs_event(q["messages"], name))
    assert (kind, response) == ("response", {"batchItemFailures": []})
    mine = set(q["ids"].values())
    runs = {o["job"]: o["id"] for o in outputs(lam_app) if o["id"] in mine}
    assert runs == q["ids"]
    assert queue_counts(q["client"], q["url"]) == (0, 0, 0)


def test_sqs_handler_forwards_a_message_that_is_not_due(lam_app: dict[str, Any]) -> None:
    client = _SPEC["client"]()
    name = "lam-t2"
    url = _SPEC["create_queues"]([name])[name]
    haze_id, body = body_of("lam_ok", {"n": "later"}, "t2", meta={"due": time.time() + 120})
    client.send_message(QueueUrl=url, MessageBody=body)
    messages = receive_all(client, url, 1)
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        kind, response = api.invoke(sqs_event(messages, name))
    assert (kind, response) == ("response", {"batchItemFailures": []})
    assert not [o for o in outputs(lam_app) if o["id"] == haze_id]  # not run
    # re-sent with the time left as DelaySeconds (within 15 min: no "due" any more)
    assert queue_counts(client, url) == (0, 0, 1)


def test_sqs_handler_fifo_stops_at_the_first_retry(lam_app: dict[str, Any]) -> None:
    client = _SPEC["client"]()
    name = "lam-t3.fifo"
    url = _SPEC["create_queues"]([name], fifo=True)[name]
    sent = []
    for job in ("lam_flaky", "lam_ok"):
        haze_id, body = body_of(job, {"n": job}, "t3", connection="fifo")
        client.send_message(
            QueueUrl=url, MessageBody=body, MessageGroupId="g1", MessageDeduplicationId=haze_id
        )
        sent.append(haze_id)
    messages = receive_all(client, url, 2)
    assert [json.loads(m["Body"])["id"] for m in messages] == sent
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        kind, response = api.invoke(sqs_event(messages, name))
    assert kind == "response", response
    # AWS's rule for FIFO triggers: after the first failure, report the rest unprocessed
    assert response == {"batchItemFailures": [{"itemIdentifier": m["MessageId"]} for m in messages]}
    assert not [o for o in outputs(lam_app) if o["id"] == sent[1]]


def fifo_batch(name: str, jobs: Sequence[tuple[str, Any]], tag: str) -> dict[str, Any]:
    """One message per (job, payload) in group "g1" of a new FIFO queue ``name``,
    received back in order: ``client``, ``url``, ``ids`` (haze ids), ``messages``."""
    client = _SPEC["client"]()
    url = _SPEC["create_queues"]([name], fifo=True)[name]
    ids = []
    for job, payload in jobs:
        haze_id, body = body_of(job, payload, tag, connection="fifo")
        client.send_message(
            QueueUrl=url, MessageBody=body, MessageGroupId="g1", MessageDeduplicationId=haze_id
        )
        ids.append(haze_id)
    messages = receive_all(client, url, len(jobs))
    assert [json.loads(m["Body"])["id"] for m in messages] == ids
    return {"client": client, "url": url, "ids": ids, "messages": messages}


def warm_up(api: RuntimeAPI) -> None:
    """An empty invocation: the app boots outside the timed one that follows."""
    assert api.invoke({"Records": []}) == ("response", {"batchItemFailures": []})


def runs_of(lam_app: dict[str, Any], haze_id: str) -> list[int]:
    return [o["attempt"] for o in outputs(lam_app) if o["id"] == haze_id]


def test_sqs_handler_fifo_unprocessed_records_keep_their_tries(lam_app: dict[str, Any]) -> None:
    """[A fails once, B, C] on a FIFO queue beside a standard connection of the same
    naming scheme: B and C are reported unprocessed without using a try (tries=1 jobs
    still run), and their visibility is handed back at once, so the group resumes when
    A's own backoff (2 s) ends, not after the queue's 30 s visibility."""
    name = "lam-t4.fifo"
    q = fifo_batch(
        name, [("lam_flaky_fast", {}), ("lam_ok", {"n": "B"}), ("lam_ok", {"n": "C"})], "t4"
    )
    client, url, (a, b, c), messages = q["client"], q["url"], q["ids"], q["messages"]
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        kind, response = api.invoke(sqs_event(messages, name))
        assert kind == "response", response
        assert response == {
            "batchItemFailures": [{"itemIdentifier": m["MessageId"]} for m in messages]
        }
        assert (runs_of(lam_app, a), runs_of(lam_app, b), runs_of(lam_app, c)) == ([1], [], [])
        started = time.monotonic()
        again = receive_all(client, url, 3, within=12)
        assert time.monotonic() - started < 12
        assert [m["MessageId"] for m in again] == [m["MessageId"] for m in messages]
        assert [m["Attributes"]["ApproximateReceiveCount"] for m in again] == ["2", "2", "2"]
        kind, response = api.invoke(sqs_event(again, name))
        assert (kind, response) == ("response", {"batchItemFailures": []})
    assert (runs_of(lam_app, a), runs_of(lam_app, b), runs_of(lam_app, c)) == ([1, 2], [1], [1])
    assert not [r for r in failed_rows(lam_app) if r[0] in (a, b, c)]
    assert queue_counts(client, url) == (0, 0, 0)
    log = (lam_app["root"] / "haze_lambda_sqs_handler.log").read_text(errors="replace")
    # haze's own tasks (the heartbeat, the cancel watch) end with the invocation
    assert "cancelled" not in log, log[-3000:]


def test_sqs_handler_fifo_records_behind_a_held_one_keep_their_tries(
    lam_app: dict[str, Any],
) -> None:
    """[H due in 6 s, B tries=1]: H is held until due (reported), B is reported unprocessed;
    when H is due both run, as attempt 1."""
    name = "lam-t9.fifo"
    jobs = [("lam_ok", {"n": "H"}), ("lam_ok", {"n": "B"})]
    client = _SPEC["client"]()
    url = _SPEC["create_queues"]([name], fifo=True)[name]
    ids = []
    for (job, payload), due in zip(jobs, (time.time() + 6, None), strict=True):
        meta = {"due": due} if due else None
        haze_id, body = body_of(job, payload, "t9", connection="fifo", meta=meta)
        client.send_message(
            QueueUrl=url, MessageBody=body, MessageGroupId="g1", MessageDeduplicationId=haze_id
        )
        ids.append(haze_id)
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        warm_up(api)
        messages = receive_all(client, url, 2)
        kind, response = api.invoke(sqs_event(messages, name))
        assert kind == "response", response
        assert response == {
            "batchItemFailures": [{"itemIdentifier": m["MessageId"]} for m in messages]
        }
        assert (runs_of(lam_app, ids[0]), runs_of(lam_app, ids[1])) == ([], [])
        again = receive_all(client, url, 2, within=15)
        assert [m["MessageId"] for m in again] == [m["MessageId"] for m in messages]
        kind, response = api.invoke(sqs_event(again, name))
        assert (kind, response) == ("response", {"batchItemFailures": []})
    assert (runs_of(lam_app, ids[0]), runs_of(lam_app, ids[1])) == ([1], [1])
    assert not [r for r in failed_rows(lam_app) if r[0] in ids]


@pytest.mark.parametrize("kind", ["standard", "fifo"])
def test_sqs_handler_records_a_crashed_invocation_never_started_keep_their_tries(
    lam_app: dict[str, Any], kind: str
) -> None:
    """The execution environment dies (SIGKILL: out of memory, a crash) while the first
    records run: the ones it never started come back with a receive count of 2 and must
    still run, as attempt 1 (tries=1), while the ones it started used their try."""
    fifo = kind == "fifo"
    name = "lam-t10.fifo" if fifo else "lam-t10"
    client = _SPEC["client"]()
    url = _SPEC["create_queues"]([name], fifo=fifo)[name]
    # standard: 4 slow records fill the connection's 4 slots; FIFO: one runs at a time
    jobs = [("lam_slow", {"seconds": 60})] * (1 if fifo else 4) + [("lam_ok", {"n": "B"})] * 2
    ids = []
    for job, payload in jobs:
        haze_id, body = body_of(job, payload, "t10", connection="fifo" if fifo else "sqs")
        group = {"MessageGroupId": "g1", "MessageDeduplicationId": haze_id} if fifo else {}
        client.send_message(QueueUrl=url, MessageBody=body, **group)
        ids.append(haze_id)
    messages = receive_all(client, url, len(jobs))
    assert len(messages) == len(jobs)
    started, never = ids[: len(jobs) - 2], ids[len(jobs) - 2 :]
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        warm_up(api)
        api.pending.put(
            (
                str(uuid.uuid4()),
                json.dumps(sqs_event(messages, name)).encode(),
                int(time.time() * 1000) + 120_000,
            )
        )
        time.sleep(4)  # the slow records are running; the last two wait for a slot
        assert api.proc is not None
        api.proc.kill()
        api.proc.wait(10)
    for m in messages:  # their visibility timeout passes
        client.change_message_visibility(
            QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    again = receive_all(client, url, len(jobs))
    assert {m["Attributes"]["ApproximateReceiveCount"] for m in again} == {"2"}
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        kind_, response = api.invoke(sqs_event(again, name))
        assert (kind_, response) == ("response", {"batchItemFailures": []})
    assert [runs_of(lam_app, i) for i in never] == [[1], [1]]
    failed = {r[0]: r[3] for r in failed_rows(lam_app) if r[0] in ids}
    assert set(failed) == set(started)  # these ran once: the crash used their one try
    assert all("MaxAttemptsExceededError" in e for e in failed.values())


def test_sqs_handler_fifo_deadline_hands_back_by_reporting(lam_app: dict[str, Any]) -> None:
    """Records of a FIFO batch not started before the deadline are reported (the same
    messages come back, in order), never re-sent behind later ones."""
    name = "lam-t5.fifo"
    jobs = [("lam_slow", {"seconds": 2.0}), ("lam_ok", {"n": 2}), ("lam_ok", {"n": 3})]
    q = fifo_batch(name, jobs, "t5")
    client, url, (m1, m2, m3), messages = q["client"], q["url"], q["ids"], q["messages"]
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        warm_up(api)
        # 3 s to the deadline, 1 s margin: M1 starts, M2 and M3 are past it when it ends
        kind, response = api.invoke(sqs_event(messages, name), timeout_ms=3000)
        assert kind == "response", response
        assert response == {
            "batchItemFailures": [{"itemIdentifier": m["MessageId"]} for m in messages[1:]]
        }
        assert (runs_of(lam_app, m1), runs_of(lam_app, m2), runs_of(lam_app, m3)) == ([1], [], [])
        again = receive_all(client, url, 2, within=8)
        # the same two messages, in their order: nothing was re-sent
        assert [m["MessageId"] for m in again] == [m["MessageId"] for m in messages[1:]]
        kind, response = api.invoke(sqs_event(again, name))
        assert (kind, response) == ("response", {"batchItemFailures": []})
    assert (runs_of(lam_app, m2), runs_of(lam_app, m3)) == ([1], [1])
    assert queue_counts(client, url) == (0, 0, 0)


def test_sqs_handler_reports_an_unsettled_record_past_the_deadline(
    lam_app: dict[str, Any],
) -> None:
    """A non-JSON record reached after the deadline is reported (Lambda would delete an
    unreported one): it stays in the queue to be recorded as failed by a later run."""
    client = _SPEC["client"]()
    name = "lam-t6"
    url = _SPEC["create_queues"]([name])[name]
    for i in range(4):  # concurrency 4: the fifth record waits for a slot past the deadline
        _, body = body_of("lam_slow", {"seconds": 2.0, "i": i}, "t6")
        client.send_message(QueueUrl=url, MessageBody=body)
    messages = receive_all(client, url, 4)
    client.send_message(QueueUrl=url, MessageBody="not json at all")
    [bad] = receive_all(client, url, 1)
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        warm_up(api)
        kind, response = api.invoke(sqs_event([*messages, bad], name), timeout_ms=3000)
    assert (kind, response) == (
        "response",
        {"batchItemFailures": [{"itemIdentifier": bad["MessageId"]}]},
    )


def test_sqs_handler_warns_when_the_visibility_is_shorter_than_the_heartbeat(
    lam_app: dict[str, Any],
) -> None:
    """Lambda receives with the queue's VisibilityTimeout: under the heartbeat's interval
    (retry_after 30 s / 3) a long record would be delivered again before its first beat."""
    client = _SPEC["client"]()
    name = "lam-t8"
    url = _SPEC["create_queues"]([name], attributes={"VisibilityTimeout": "5"})[name]
    _, body = body_of("lam_ok", {"n": "t8"}, "t8")
    client.send_message(QueueUrl=url, MessageBody=body)
    messages = receive_all(client, url, 1)
    with runtime(lam_app, "haze_lambda.sqs_handler") as api:
        kind, response = api.invoke(sqs_event(messages, name))
        assert (kind, response) == ("response", {"batchItemFailures": []})
    log = (lam_app["root"] / "haze_lambda_sqs_handler.log").read_text(errors="replace")
    [line] = [x for x in log.splitlines() if "VisibilityTimeout" in x]
    assert "lam-t8" in line and "5s" in line and "10s" in line, line


def test_sqs_handler_refuses_a_timeout_at_or_below_the_margin(lam_app: dict[str, Any]) -> None:
    """Under HAZE_SQS_MARGIN every record would be handed back for ever: one line."""
    q = queued_batch("lam-t7", ("lam_ok",), "t7")
    with runtime(lam_app, "haze_lambda.sqs_handler", {"HAZE_SQS_MARGIN": "5s"}) as api:
        kind, error = api.invoke(sqs_event(q["messages"], "lam-t7"), timeout_ms=3000)
    assert kind == "error", error
    assert error["errorType"] == "ConfigError"
    assert "HAZE_SQS_MARGIN" in error["errorMessage"]
    assert "5s" in error["errorMessage"] and "timeout" in error["errorMessage"]
    assert "\n" not in error["errorMessage"]
    assert not runs_of(lam_app, q["ids"]["lam_ok"])


# --------------------------------------------------------------------------- schedule_handler


def _insert_jobs(lam_app: dict[str, Any], jobs: list[tuple[str, Any]]) -> None:
    now = time.time()
    with contextlib.closing(sqlite3.connect(lam_app["db"])) as c:
        for job, payload in jobs:
            _, body = body_of(job, payload, "default", connection="database")
            c.execute(
                "INSERT INTO jobs (queue, payload, attempts, available_at, created_at) "
                "VALUES (?, ?, 0, ?, ?)",
                ("default", body, now, now),
            )
        c.commit()


def _jobs_left(lam_app: dict[str, Any]) -> int:
    with contextlib.closing(sqlite3.connect(lam_app["db"])) as c:
        return int(c.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])


def test_schedule_handler_drains_a_database_queue_within_the_deadline(
    lam_app: dict[str, Any],
) -> None:
    _insert_jobs(lam_app, [("lam_ok", {"k": i}) for i in range(3)])
    with runtime(lam_app, "haze_lambda.schedule_handler") as api:
        kind, response = api.invoke(scheduled_event())
        assert kind == "response", response
        assert response["connection"] == "database"
        assert response["processed"] == 3
        assert response["outcomes"] == {"done": 3}
        assert response["stopped"] == "empty"
        assert _jobs_left(lam_app) == 0

        # 6 jobs of 0.4 s, and 2.5 s left before the deadline (1 s margin): the worker
        # stops claiming at max_time and leaves the rest for the next schedule.
        _insert_jobs(lam_app, [("lam_slow", {"seconds": 0.4, "k": i}) for i in range(6)])
        kind, response = api.invoke(scheduled_event(), timeout_ms=2500)
        assert kind == "response", response
        assert 0 < response["max_time"] <= 1.5
        assert 0 < response["processed"] < 6
        assert response["stopped"] == "time"
        assert _jobs_left(lam_app) == 6 - response["processed"]

        # An SQS connection is not drained by a schedule: a clear error, via the runtime.
        kind, error = api.invoke(scheduled_event({"connection": "sqs"}))
        assert kind == "error"
        assert error["errorType"] == "ValueError"
        assert "drains database and redis connections" in error["errorMessage"]


# --------------------------------------------------------------------------- http_handler


def _sign(raw: bytes, timestamp: int | None = None) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    mac = hmac.new(SECRET.encode(), f"{ts}.".encode() + raw, hashlib.sha256).hexdigest()
    return {"x-haze-timestamp": ts, "x-haze-signature": f"sha256={mac}"}


def test_http_handler_dispatches_and_rejects(lam_app: dict[str, Any]) -> None:
    client = _SPEC["client"]()
    url = _SPEC["create_queues"](["lam-default"])["lam-default"]
    bearer = {"authorization": f"Bearer {SECRET}"}
    ok = json.dumps({"job": "lam_ok", "payload": {"via": "bearer"}})
    with runtime(lam_app, "haze_lambda.http_handler") as api:

        def call(body: str | bytes, headers: dict[str, str], **kw: Any) -> tuple[int, Any]:
            kind, response = api.invoke(http_event(body, headers, **kw))
            assert kind == "response", response
            return response["statusCode"], json.loads(response["body"])

        status, data = call(ok, bearer)
        assert status == 202
        assert data["job"] == "lam_ok"
        assert not data["skipped"]
        [m] = receive_all(client, url, 1)
        envelope = json.loads(m["Body"])
        assert (envelope["id"], envelope["job"], envelope["payload"]) == (
            data["id"],
            "lam_ok",
            {"via": "bearer"},
        )

        signed = json.dumps({"job": "lam_ok", "payload": {"via": "hmac"}, "delay": "1s"})
        status, data = call(signed, _sign(signed.encode()), base64_body=True)
        assert status == 202, data
        # a captured signed request is refused once it is over 5 minutes old
        stale = _sign(signed.encode(), int(time.time()) - 301)
        status, data = call(signed, stale, base64_body=True)
        assert status == 401
        assert "X-Haze-Timestamp" in data["error"]
        no_time = {"x-haze-signature": _sign(signed.encode())["x-haze-signature"]}
        status, data = call(signed, no_time, base64_body=True)
        assert status == 401
        assert "X-Haze-Timestamp" in data["error"]

        status, data = call(ok, {})
        assert status == 401
        assert "authentication required" in data["error"]
        status, data = call(ok, {"authorization": "Bearer wrong"})
        assert status == 403
        assert "not valid" in data["error"]
        status, data = call(ok, _sign(b"another body"))
        assert status == 403
        assert "signature" in data["error"]
        status, data = call("{not json", bearer)
        assert status == 400
        assert "not valid JSON" in data["error"]
        status, data = call('["job"]', bearer)
        assert status == 400
        assert "JSON object" in data["error"]
        status, data = call('{"job": "lam_ok", "color": "red"}', bearer)
        assert status == 400
        assert "color" in data["error"]
        status, data = call('{"job": "lam_nope"}', bearer)
        assert status == 404
        assert "lam_nope" in data["error"]
        status, data = call('{"job": "lam_ok", "delay": "soon"}', bearer)
        assert status == 400
        assert "delay" in data["error"]
        big = json.dumps({"job": "lam_ok", "payload": {"blob": "x" * (1024 * 1024 + 10)}})
        status, data = call(big, bearer)
        assert status == 413
        assert "1048528-byte limit" in data["error"]  # SQS's 1 MiB less 48 bytes of room
        status, data = call(ok, bearer, method="GET")
        assert status == 405
        deep = '{"job": "lam_ok", "payload": ' + "[" * 200_000 + "]" * 200_000 + "}"
        status, data = call(deep, bearer)
        assert status == 400
        assert "nested too deeply" in data["error"]
    # only the two accepted dispatches reached the queue
    [second] = receive_all(client, url, 5, within=4)  # the first is still invisible (30 s)
    assert json.loads(second["Body"])["payload"] == {"via": "hmac"}


def test_http_handler_answers_odd_requests_with_a_clear_4xx(lam_app: dict[str, Any]) -> None:
    """A direct invoke with a dict body, a queue that does not exist, a base64 body that
    is not UTF-8: each a 4xx whose error names the problem and no queue URL or account."""
    _SPEC["create_queues"](["lam-default"])
    bearer = {"authorization": f"Bearer {SECRET}"}
    with runtime(lam_app, "haze_lambda.http_handler") as api:

        def call(event: dict[str, Any]) -> tuple[int, str]:
            kind, response = api.invoke(event)
            assert kind == "response", response
            return response["statusCode"], json.loads(response["body"])["error"]

        direct = http_event("{}", bearer)
        direct["body"] = {"job": "lam_ok", "payload": {"via": "direct"}}
        status, error = call(direct)
        assert (status, "body" in error) == (400, True), error
        status, error = call(http_event('{"job": "lam_ok", "queue": "nowhere"}', bearer))
        assert status == 404, error
        assert "nowhere" in error
        assert ACCOUNT not in error and "http" not in error, error
        status, error = call(http_event(b"\xff\xfe{\x00}\x00", bearer, base64_body=True))
        assert status == 400, error
        assert "UTF-8" in error and "utf-16" not in error, error


def test_a_bad_size_or_duration_setting_fails_the_boot_with_one_line(
    lam_app: dict[str, Any],
) -> None:
    bearer = {"authorization": f"Bearer {SECRET}"}
    ok = json.dumps({"job": "lam_ok", "payload": {"via": "bearer"}})
    for name, value in (("HAZE_HTTP_MAX_BODY", "10XB"), ("HAZE_SQS_MARGIN", "soon")):
        with runtime(lam_app, "haze_lambda.http_handler", {name: value}) as api:
            kind, error = api.invoke(http_event(ok, bearer))
        assert kind == "error", error
        assert error["errorType"] == "ConfigError"
        assert f"{name}={value!r}" in error["errorMessage"]
        assert "\n" not in error["errorMessage"]


# --------------------------------------------------------------------------- clean exit

LOCAL_CALLS = """
import asyncio, json, sys, time
import haze_lambda
from haze_lambda import _boot

events = json.loads(sys.argv[1])
left = []
for name, event in events:
    handler = getattr(haze_lambda, name)
    answer = handler(event, None)
    loop = _boot._state.get("loop")
    pending = [] if loop is None else [t for t in asyncio.all_tasks(loop) if not t.done()]
    left.append({"handler": name, "pending": [repr(t) for t in pending],
                 "status": answer.get("statusCode") if isinstance(answer, dict) else None})
print(json.dumps(left))
"""


def test_handlers_called_locally_leave_no_task_or_loop_behind(lam_app: dict[str, Any]) -> None:
    """A script that calls the handlers and exits, as a local run or a test does: after
    each invocation no task is pending on the process's loop, and the exit prints
    neither "Task was destroyed but it is pending!" nor "Event loop is closed"."""
    _SPEC["create_queues"](["lam-default"])
    bearer = {"authorization": f"Bearer {SECRET}"}
    ok = json.dumps({"job": "lam_ok", "payload": {"via": "local"}})
    slow = json.dumps({"job": "lam_slow", "payload": {"seconds": 0.01}})
    events = [
        ["http_handler", http_event(ok, bearer)],
        ["http_handler", http_event(slow, bearer)],
        ["schedule_handler", scheduled_event()],
    ]
    proc = subprocess.run(
        [sys.executable, "-X", "dev", "-c", LOCAL_CALLS, json.dumps(events)],
        cwd=lam_app["root"],
        env={**os.environ, **lam_app["env"]},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    calls = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["status"] for c in calls[:2]] == [202, 202]
    assert all(c["pending"] == [] for c in calls), calls
    assert "Task was destroyed but it is pending" not in proc.stderr, proc.stderr[-4000:]
    assert "Event loop is closed" not in proc.stderr, proc.stderr[-4000:]
    assert "ResourceWarning" not in proc.stderr, proc.stderr[-4000:]
