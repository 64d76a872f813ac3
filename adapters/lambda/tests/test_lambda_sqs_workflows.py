"""The docs' three workflow recipes behind the Lambda SQS handler: haze's own engine,
every delivery a real ``haze_lambda.sqs_handler`` invocation with records received from
SQS (boto3 against ``moto`` in server mode, tests/drivers/sqs_spec.py), the runs' state
in a SQLite file. ``app/job/recipes.py`` is ``tests/workflows/recipes.py`` copied
unchanged: the same definition file the Worker and the in-process tests run.

The sign-up's two-day sleep runs on a moved clock: its resume waits in 15-minute hops
(SQS's cap), the first hop stays queued, and a resume dispatched after the clock moved
finds the sleep over. One payment's webhook comes through ``haze_lambda.http_handler``
(the signed dispatch endpoint), the other through ``Workflow.send_event``."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3")

from haze._base.sqlfiles import queue_schema

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))  # services, as tests/conftest.py puts it there
_SPEC = runpy.run_path(str(ROOT / "tests/drivers/sqs_spec.py"))

QUEUE_PY = """
from haze import define_queue_config, env

config = define_queue_config(default="sqs", store="state", connections={
    "sqs": {"driver": "sqs", "queue_url": env("WF_SQS_BASE") + "/" + env("WF_NAME") + "-{queue}",
            "endpoint_url": env("WF_SQS_ENDPOINT"), "region": "us-east-1",
            "credentials": {"access_key_id": "testing", "secret_access_key": "testing"},
            "failed_store": "main", "retry_after": "30s"},
})
"""

DATABASE_PY = """
from haze import define_database_config, env

config = define_database_config(default="main", connections={"main": {"url": env("WF_DB_URL")}})
"""

CACHE_PY = """
from haze import define_cache_config

config = define_cache_config(default="state", stores={
    "state": {"driver": "database", "connection": "main"}})
"""

# The child: starts the runs, then plays Lambda: receive, invoke sqs_handler, repeat.
SCRIPT = """
import json, os, sys, time
import boto3
import haze_lambda
from haze import Workflow
from haze._workflows.engine import set_clock
from haze.integrations.http_dispatch import signed_headers

shift = [0.0]
set_clock(lambda: time.time() + shift[0])
client = boto3.client("sqs", endpoint_url=os.environ["WF_SQS_ENDPOINT"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
url = os.environ["WF_URL"]
arn = "arn:aws:sqs:us-east-1:123456789012:" + url.rsplit("/", 1)[-1]


class Context:
    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def invoke_once() -> int:
    r = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30,
                               WaitTimeSeconds=1, MessageSystemAttributeNames=["All"])
    messages = r.get("Messages") or []
    if messages:
        records = [{"messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"],
                    "body": m["Body"], "attributes": m["Attributes"], "messageAttributes": {},
                    "md5OfBody": m["MD5OfBody"], "eventSource": "aws:sqs",
                    "eventSourceARN": arn, "awsRegion": "us-east-1"} for m in messages]
        out = haze_lambda.sqs_handler({"Records": records}, Context())
        assert out == {"batchItemFailures": []}, out
    return len(messages)


def status(rid):
    return haze_lambda.run(lambda app: Workflow.status(rid))


def until(rid, states, limit=60):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        st = status(rid)
        if st is not None and st.state in states:
            return st
        invoke_once()
    raise AssertionError(f"{rid} never reached {states}: {status(rid)}")


haze_lambda.boot()  # imports app/job/recipes.py, as a cold start does
recipes = next(m for n, m in sys.modules.items() if n.endswith("recipes") and hasattr(m, "CALLS"))
recipes.reset()


async def start(app):
    return [
        await Workflow.start(recipes.signup, email="ada@example.com", id="l-signup"),
        await Workflow.start(recipes.payment, order_id="A-1", cents=1200, id="l-pay-1"),
        await Workflow.start(recipes.payment, order_id="A-2", cents=900, id="l-pay-2"),
        await Workflow.start(recipes.import_file, source="c.csv", chunks=4, id="l-import"),
    ]


signup, pay1, pay2, imported = haze_lambda.run(start)
out = {}
sleeping = until(signup, {"sleeping"})
out["resume_in"] = sleeping.resume_at - time.time()
shift[0] = 2 * 86400 + 1
haze_lambda.run(lambda app: recipes.signup.pending({"run": signup}).dispatch())

until(pay1, {"waiting"})
body = json.dumps({"event": "paid", "run": pay1, "payload": {"amount": 1200}})
event = {"requestContext": {"http": {"method": "POST"}}, "body": body,
         "headers": signed_headers(body.encode(), os.environ["HAZE_HTTP_SECRET"])}
http = haze_lambda.http_handler(event, Context())
out["http"] = {"status": http["statusCode"], "body": json.loads(http["body"])}
until(pay2, {"waiting"})
out["send_event"] = haze_lambda.run(lambda app: Workflow.send_event(pay2, "paid", {"amount": 900}))

runs = {"signup": signup, "payment": pay1, "payment2": pay2, "import": imported}
out["runs"] = {}
for key, rid in runs.items():
    st = until(rid, {"done", "failed", "cancelled"})
    out["runs"][key] = {"state": st.state, "result": st.result, "error": st.error,
                        "steps": [s.name for s in st.steps]}
end = time.monotonic() + 20
while recipes.CALLS["receipt"] < 2 and time.monotonic() < end:
    invoke_once()
for _ in range(2):  # redeliveries (there should be none) show up here
    invoke_once()
out["calls"] = dict(recipes.CALLS)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("lambda-wf")
    name = f"wf-{uuid.uuid4().hex[:8]}"
    url = _SPEC["create_queues"]([f"{name}-default"])[f"{name}-default"]
    for folder, files in {
        "config": {"queue.py": QUEUE_PY, "database.py": DATABASE_PY, "cache.py": CACHE_PY},
        "app/job": {},
    }.items():
        (tmp / folder).mkdir(parents=True)
        for file, text in files.items():
            (tmp / folder / file).write_text(text)
    with sqlite3.connect(tmp / "state.db") as c:  # the failed store's table
        for statement in queue_schema("sqlite"):
            c.execute(statement)
    shutil.copy(ROOT / "tests" / "workflows" / "recipes.py", tmp / "app" / "job" / "recipes.py")
    endpoint = _SPEC["endpoint"]()
    env = {
        **os.environ,
        "HAZE_APP_ROOT": str(tmp),
        "HAZE_HTTP_SECRET": "wf-secret",
        "WF_SQS_BASE": f"{endpoint}/{_SPEC['ACCOUNT']}",
        "WF_SQS_ENDPOINT": endpoint,
        "WF_NAME": name,
        "WF_URL": url,
        "WF_DB_URL": f"sqlite:///{tmp / 'state.db'}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_the_signup_sleeps_two_days_in_hops(run: dict[str, Any]) -> None:
    assert 2 * 86400 - 60 < run["resume_in"] <= 2 * 86400
    st = run["runs"]["signup"]
    assert st["state"] == "done", st
    assert st["result"] == {"user": 1471, "nudged": True}
    assert st["steps"] == ["create-account", "welcome-mail", "two-days", "logged-in?", "nudge-mail"]


def test_the_payments_resume_on_their_webhooks(run: dict[str, Any]) -> None:
    assert run["http"] == {
        "status": 202,
        "body": {"run": "l-pay-1", "event": "paid", "kept": True},
    }
    assert run["send_event"] is True
    one, two = run["runs"]["payment"], run["runs"]["payment2"]
    assert one["result"] == {"order": "A-1", "state": "shipped", "paid": {"amount": 1200}}
    assert two["result"] == {"order": "A-2", "state": "shipped", "paid": {"amount": 900}}


def test_the_import_fans_out_and_joins(run: dict[str, Any]) -> None:
    st = run["runs"]["import"]
    assert st["state"] == "done" and st["result"] == {"source": "c.csv", "rows": 406, "chunks": 4}


def test_every_side_effect_ran_once(run: dict[str, Any]) -> None:
    assert run["calls"] == {
        "create_account": 1,
        "mail:welcome": 1,
        "has_logged_in": 1,
        "mail:nudge": 1,
        "create_payment_intent": 2,
        "ship_order": 2,
        "receipt": 2,
        "list_chunks": 1,
        **{f"import:c.csv#{i}": 1 for i in range(4)},
    }, run["calls"]
