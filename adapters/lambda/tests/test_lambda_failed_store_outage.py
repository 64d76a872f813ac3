"""The Lambda SQS handler when the failed-job store is down at a job's final failure:
``failed()`` runs once, and the record that is written once the store is back holds
the job's own error. And when the container dies inside ``failed()``: it runs again on
a later delivery, and the failure is recorded once.

Real: haze_lambda's ``sqs_handler`` (called in a child process, as a local run calls
it), boto3 against ``moto`` in server mode (tests/drivers/sqs_spec.py), and a SQLite
file as the failed store. The outage is real too: the child holds the SQLite file's
write lock (``BEGIN EXCLUSIVE``) past the connection's ``busy_timeout``.
"""

from __future__ import annotations

import json
import os
import runpy
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3")

from haze._base.sqlfiles import queue_schema

_SPEC = runpy.run_path(str(Path(__file__).resolve().parents[3] / "tests/drivers/sqs_spec.py"))

QUEUE_PY = """
from haze import define_queue_config, env

config = define_queue_config(default="sqs", connections={
    "sqs": {"driver": "sqs", "queue_url": env("LO_SQS_BASE") + "/" + env("LO_NAME") + "-{queue}",
            "endpoint_url": env("LO_SQS_ENDPOINT"), "region": "us-east-1",
            "credentials": {"access_key_id": "testing", "secret_access_key": "testing"},
            "failed_store": "main", "retry_after": "30s"},
})
"""

DATABASE_PY = """
from haze import define_database_config, env

config = define_database_config(default="main", connections={
    "main": {"url": env("LO_DB_URL"), "busy_timeout": 200}})
"""

JOBS_PY = """
import os
from haze import define_job


def _failed(payload: dict, error: BaseException) -> None:
    with open(os.environ["LO_FAILED"], "a") as f:
        f.write(f"{type(error).__name__}: {error}\\n")


@define_job(tries=1, failed=_failed)
def lo_declined(payload: dict) -> None:
    raise ValueError(f"card {payload['n']} declined")
"""

# The child: one invocation while the failed store is locked, one after.
SCRIPT = """
import json, os, sqlite3, sys, time
import boto3
from haze._base.message import Message, encode, new_id
import haze_lambda

client = boto3.client("sqs", endpoint_url=os.environ["LO_SQS_ENDPOINT"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
url = os.environ["LO_URL"]
arn = "arn:aws:sqs:us-east-1:123456789012:" + url.rsplit("/", 1)[-1]


class Context:
    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def receive(within: float) -> list:
    got, end = [], time.monotonic() + within
    while not got and time.monotonic() < end:
        r = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1,
                                   WaitTimeSeconds=1, MessageSystemAttributeNames=["All"])
        got = r.get("Messages") or []
    return got


def invoke(messages: list) -> dict:
    records = [{"messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"], "attributes": m["Attributes"], "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"], "eventSource": "aws:sqs",
                "eventSourceARN": arn, "awsRegion": "us-east-1"} for m in messages]
    return haze_lambda.sqs_handler({"Records": records}, Context())


message = Message(id=new_id(), job="lo_declined", payload={"n": 42}, queue="default",
                  connection="sqs", ts=time.time())
client.send_message(QueueUrl=url, MessageBody=encode(message))
responses = []
lock = sqlite3.connect(os.environ["LO_DB"], isolation_level=None)
lock.execute("BEGIN EXCLUSIVE")  # the failed store is down
responses.append(invoke(receive(10)))
lock.execute("COMMIT")  # and back

def recorded() -> bool:
    with sqlite3.connect(os.environ["LO_DB"]) as c:
        return bool(c.execute("SELECT COUNT(*) FROM failed_jobs").fetchone()[0])


for _ in range(3):  # whatever comes back (within the first hand-back's delay)
    again = receive(25)
    if not again:
        break
    responses.append(invoke(again))
    if recorded():
        break
print(json.dumps({"id": message.id, "responses": responses}))
"""


def test_a_failed_store_outage_runs_failed_once_and_keeps_the_real_error(
    tmp_path: Path,
) -> None:
    name = f"lo-{uuid.uuid4().hex[:8]}"
    url = _SPEC["create_queues"]([f"{name}-default"])[f"{name}-default"]
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(QUEUE_PY)
    (tmp_path / "config" / "database.py").write_text(DATABASE_PY)
    (tmp_path / "app" / "job").mkdir(parents=True)
    (tmp_path / "app" / "job" / "lo_jobs.py").write_text(JOBS_PY)
    db = tmp_path / "lo.db"
    with sqlite3.connect(db) as c:
        for statement in queue_schema("sqlite"):
            c.execute(statement)
    endpoint = _SPEC["endpoint"]()
    env = {
        **os.environ,
        "HAZE_APP_ROOT": str(tmp_path),
        "LO_SQS_BASE": f"{endpoint}/{_SPEC['ACCOUNT']}",
        "LO_SQS_ENDPOINT": endpoint,
        "LO_NAME": name,
        "LO_URL": url,
        "LO_DB": str(db),
        "LO_DB_URL": f"sqlite:///{db}",
        "LO_FAILED": str(tmp_path / "failed.txt"),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (tmp_path / "failed.txt").read_text().splitlines() == ["ValueError: card 42 declined"]
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT uuid, exception FROM failed_jobs").fetchall()
    assert [uuid for uuid, _ in rows] == [result["id"]]
    assert "ValueError: card 42 declined" in rows[0][1]
    assert "MaxAttemptsExceededError" not in rows[0][1]
    assert all(r == {"batchItemFailures": []} for r in result["responses"]), result
    client = _SPEC["client"]()
    left = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert left["ApproximateNumberOfMessages"] == "0"
    assert left["ApproximateNumberOfMessagesNotVisible"] == "0"


# A state store of its own (a second SQLite file): up while the failed store is down.
STATE_DATABASE_PY = """
from haze import define_database_config, env

config = define_database_config(default="main", connections={
    "main": {"url": env("LO_DB_URL"), "busy_timeout": 200},
    "state": {"url": env("LO_STATE_URL")}})
"""

CACHE_PY = """
from haze import define_cache_config

config = define_cache_config(default="state", stores={
    "state": {"driver": "database", "connection": "state"}})
"""

# The first child dies (os._exit, nothing runs after it) once the failed store, being
# down, made the driver send the message back carrying the failure, before it deletes
# the original; the second, a fresh container, takes whatever SQS delivers next.
CRASH_SCRIPT = (
    SCRIPT.split("message = Message(")[0]
    + """
if os.environ["LO_PHASE"] == "crash":
    from haze.drivers.sqs import SqsDriver

    async def _dies(self, receipt):
        os._exit(0)

    SqsDriver._delete = _dies
    message = Message(id=new_id(), job="lo_declined", payload={"n": 42}, queue="default",
                      connection="sqs", ts=time.time())
    client.send_message(QueueUrl=url, MessageBody=encode(message))
    print(json.dumps({"id": message.id}), flush=True)
    lock = sqlite3.connect(os.environ["LO_DB"], isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # the failed store is down
    invoke(receive(10))
    raise SystemExit("the invocation did not reach the delete")
responses = []
for _ in range(4):
    again = receive(25)
    if not again:
        break
    responses.append(invoke(again))
print(json.dumps({"responses": responses}))
"""
)


def test_a_crash_between_sending_back_and_deleting_runs_failed_once(tmp_path: Path) -> None:
    """The original message comes back after the crash, beside its copy: the job's
    ``failed()`` has run once, and the failure is recorded once."""
    name = f"lc-{uuid.uuid4().hex[:8]}"
    url = _SPEC["create_queues"]([f"{name}-default"])[f"{name}-default"]
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(QUEUE_PY)
    (tmp_path / "config" / "database.py").write_text(STATE_DATABASE_PY)
    (tmp_path / "config" / "cache.py").write_text(CACHE_PY)
    (tmp_path / "app" / "job").mkdir(parents=True)
    (tmp_path / "app" / "job" / "lo_jobs.py").write_text(JOBS_PY)
    db = tmp_path / "lc.db"
    with sqlite3.connect(db) as c:
        for statement in queue_schema("sqlite"):
            c.execute(statement)
    endpoint = _SPEC["endpoint"]()
    env = {
        **os.environ,
        "HAZE_APP_ROOT": str(tmp_path),
        "LO_SQS_BASE": f"{endpoint}/{_SPEC['ACCOUNT']}",
        "LO_SQS_ENDPOINT": endpoint,
        "LO_NAME": name,
        "LO_URL": url,
        "LO_DB": str(db),
        "LO_DB_URL": f"sqlite:///{db}",
        "LO_STATE_URL": f"sqlite:///{tmp_path}/state.db",
        "LO_FAILED": str(tmp_path / "failed.txt"),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    outputs = []
    for phase in ("crash", "after"):
        proc = subprocess.run(
            [sys.executable, "-c", CRASH_SCRIPT],
            cwd=tmp_path,
            env={**env, "LO_PHASE": phase},
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        outputs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    job_id = outputs[0]["id"]
    assert (tmp_path / "failed.txt").read_text().splitlines() == ["ValueError: card 42 declined"]
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT uuid FROM failed_jobs").fetchall()
    assert rows == [(job_id,)]
    client = _SPEC["client"]()
    left = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert left["ApproximateNumberOfMessages"] == "0"
    assert left["ApproximateNumberOfMessagesNotVisible"] == "0"


# failed() dies (os._exit: nothing after it runs) the first time it runs, after it
# started; every run says so in LO_FAILED first.
DYING_JOBS_PY = """
import os
from haze import define_job


def _failed(payload: dict, error: BaseException) -> None:
    with open(os.environ["LO_FAILED"], "a") as f:
        f.write("started\\n")
    marker = os.environ["LO_FAILED"] + ".died"
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(0)
    with open(os.environ["LO_FAILED"], "a") as f:
        f.write("finished\\n")


@define_job(tries=1, failed=_failed)
def lo_declined(payload: dict) -> None:
    raise ValueError(f"card {payload['n']} declined")
"""

# The first child's invocation dies inside failed(); the second, a fresh container, takes
# whatever SQS delivers next until the failure is recorded. The failed() lease is 2 s here
# (a minute by default), so that the test does not wait a minute for it to lapse.
DYING_SCRIPT = (
    SCRIPT.split("message = Message(")[0]
    + """
import haze._engine.failures

haze._engine.failures.FAILED_LEASE = 2.0
if os.environ["LO_PHASE"] == "crash":
    message = Message(id=new_id(), job="lo_declined", payload={"n": 42}, queue="default",
                      connection="sqs", ts=time.time())
    client.send_message(QueueUrl=url, MessageBody=encode(message))
    print(json.dumps({"id": message.id}), flush=True)
    invoke(receive(10))
    raise SystemExit("the invocation did not die in failed()")


def recorded() -> bool:
    with sqlite3.connect(os.environ["LO_DB"]) as c:
        return bool(c.execute("SELECT COUNT(*) FROM failed_jobs").fetchone()[0])


responses = []
for _ in range(6):
    again = receive(25)
    if not again:
        break
    responses.append(invoke(again))
    if recorded():
        break
print(json.dumps({"responses": responses}))
"""
)


def test_a_crash_inside_failed_runs_it_again_and_records_once(tmp_path: Path) -> None:
    """The container dies inside the job's ``failed()``: a later delivery of the message
    runs ``failed()`` again, once the dead one's lease has lapsed, and records the
    failure once."""
    name = f"ld-{uuid.uuid4().hex[:8]}"
    url = _SPEC["create_queues"]([f"{name}-default"])[f"{name}-default"]
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(QUEUE_PY)
    (tmp_path / "config" / "database.py").write_text(STATE_DATABASE_PY)
    (tmp_path / "config" / "cache.py").write_text(CACHE_PY)
    (tmp_path / "app" / "job").mkdir(parents=True)
    (tmp_path / "app" / "job" / "lo_jobs.py").write_text(DYING_JOBS_PY)
    db = tmp_path / "ld.db"
    with sqlite3.connect(db) as c:
        for statement in queue_schema("sqlite"):
            c.execute(statement)
    endpoint = _SPEC["endpoint"]()
    env = {
        **os.environ,
        "HAZE_APP_ROOT": str(tmp_path),
        "LO_SQS_BASE": f"{endpoint}/{_SPEC['ACCOUNT']}",
        "LO_SQS_ENDPOINT": endpoint,
        "LO_NAME": name,
        "LO_URL": url,
        "LO_DB": str(db),
        "LO_DB_URL": f"sqlite:///{db}",
        "LO_STATE_URL": f"sqlite:///{tmp_path}/state.db",
        "LO_FAILED": str(tmp_path / "failed.txt"),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    outputs = []
    for phase in ("crash", "after"):
        proc = subprocess.run(
            [sys.executable, "-c", DYING_SCRIPT],
            cwd=tmp_path,
            env={**env, "LO_PHASE": phase},
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        outputs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    job_id = outputs[0]["id"]
    assert (tmp_path / "failed.txt").read_text().splitlines() == [
        "started",
        "started",
        "finished",
    ]
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT uuid FROM failed_jobs").fetchall()
    assert rows == [(job_id,)]
    client = _SPEC["client"]()
    left = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert left["ApproximateNumberOfMessages"] == "0"
    assert left["ApproximateNumberOfMessagesNotVisible"] == "0"
