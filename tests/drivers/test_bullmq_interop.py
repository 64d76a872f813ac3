"""haze's redis queues are BullMQ queues: the official Node ``bullmq`` (pinned in
``tests/drivers/node/package.json``) reads what haze queued and failed, and queues a job
with haze's envelope that a haze worker then runs."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from haze import JobContext, Queue, define_job
from haze._base.message import new_id
from haze._workers.worker import Worker
from redis_spec import REDIS_URL, needs_redis

NODE_DIR = Path(__file__).parent / "node"

pytestmark = [
    needs_redis,
    pytest.mark.skipif(
        not os.environ.get("CI") and (shutil.which("node") is None or shutil.which("npm") is None),
        reason="needs Node.js and npm",
    ),
]

SEEN: list[dict[str, Any]] = []


@define_job(name="rd_interop")
async def rd_interop(payload: Any, job: JobContext) -> None:
    SEEN.append({"payload": payload, "id": job.id, "attempt": job.attempt})


@define_job(name="rd_interop_fails")
async def rd_interop_fails(payload: Any) -> None:
    raise RuntimeError("no such invoice")


@pytest.fixture(scope="module")
def node_bullmq() -> Path:
    """``npm ci`` from the lockfile when node_modules is missing."""
    if not (NODE_DIR / "node_modules" / "bullmq").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            check=True,
            timeout=600,
            capture_output=True,
        )
    return NODE_DIR / "interop.mjs"


async def _node(script: Path, *args: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(script),
        *args,
        cwd=script.parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def test_node_bullmq_reads_haze_queues_and_feeds_a_job(node_bullmq, redis_app, redis_prefix):
    SEEN.clear()
    async with redis_app() as app:
        # one failed job, then two queued ones (one delayed)
        failed_id = await rd_interop_fails.dispatch({"invoice": 7})
        w = Worker(app, "r", None, 1, sleep=0.05, stop_when_empty=True)
        await w.run()
        [failed] = await Queue.failed()
        assert failed.id == failed_id
        now_id = await rd_interop.dispatch({"invoice": 1})
        later_id = await rd_interop.dispatch({"invoice": 2}, delay=60)

        node_id = new_id()
        envelope = {
            "v": 1,
            "id": node_id,
            "job": "rd_interop",
            "payload": {"from": "node"},
            "queue": "default",
            "ts": time.time(),
        }
        seen = await _node(node_bullmq, REDIS_URL, redis_prefix, "default", json.dumps(envelope))

        assert seen["counts"] == {"wait": 1, "delayed": 1, "active": 0, "completed": 0, "failed": 1}
        by_state = {j["state"]: j for j in seen["jobs"]}
        assert by_state["waiting"]["name"] == "rd_interop"
        assert by_state["waiting"]["data"]["id"] == now_id
        assert by_state["waiting"]["data"]["payload"] == {"invoice": 1}
        assert by_state["delayed"]["data"]["id"] == later_id
        assert by_state["delayed"]["delay"] == 60000
        [node_failed] = seen["failed"]
        assert node_failed["name"] == "rd_interop_fails"
        assert node_failed["data"]["id"] == failed_id
        assert node_failed["failedReason"] == "RuntimeError: no such invoice"
        assert "Traceback" in node_failed["stacktrace"][-1]

        # haze runs the job Node queued (and the one haze queued before it)
        w = Worker(app, "r", None, 1, sleep=0.05, stop_when_empty=True)
        await w.run()
        assert [s["id"] for s in SEEN] == [now_id, node_id]
        assert SEEN[1]["payload"] == {"from": "node"}
        assert SEEN[1]["attempt"] == 1
        assert await Queue.size() == 1  # the delayed one


@define_job(name="rd_interop_group", group=lambda payload: payload["tenant"])
async def rd_interop_group(payload: Any) -> None:
    pass


async def test_a_node_bullmq_worker_takes_haze_groups_in_turn(node_bullmq, redis_app, redis_prefix):
    """Grouped jobs are BullMQ prioritized jobs (the group's turn is the priority): a
    Node worker counts them as prioritized and runs the groups round-robin too."""
    async with redis_app():
        await Queue.bulk([rd_interop_group.with_({"tenant": "A", "k": i}) for i in range(4)])
        await Queue.bulk([rd_interop_group.with_({"tenant": "B", "k": i}) for i in range(2)])
        seen = await _node(
            node_bullmq.parent / "groups_worker.mjs", REDIS_URL, redis_prefix, "default"
        )
    assert seen["counts"] == {"wait": 0, "prioritized": 6, "delayed": 0}
    assert seen["order"] == [["A", 0], ["B", 0], ["A", 1], ["B", 1], ["A", 2], ["A", 3]]
