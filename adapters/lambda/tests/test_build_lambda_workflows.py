"""``haze build --preset aws-lambda`` for an app with native workflows: ``handler.workflows``
in the zip, the AWS durable execution SDK bundled, and the bundled handler run by AWS's
local durable-execution engine from the unpacked zip (in a process of its own, with the
zip's ``haze``/``haze_lambda``/SDK first on ``sys.path``, as ``/var/task`` on Lambda); a
workflow using a haze rule Lambda cannot honour is refused with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

QUEUE_PY = """\
from haze import define_queue_config

config = define_queue_config(default="lambda", store="db", connections={
    "lambda": {"driver": "sqs", "queue_url": "http://127.0.0.1:1/1/jobs", "workflows": "native"}})
"""
CACHE_PY = """\
from haze import define_cache_config

config = define_cache_config(stores={"db": {"driver": "database", "connection": "main"}})
"""
DATABASE_PY = """\
from haze import define_database_config

config = define_database_config(default="main", connections={"main": {"url": "sqlite:///x.db"}})
"""
FLOWS_PY = """\
from haze import workflow


def hello(name):
    return "hello " + name


@workflow(name="bld_greet"{options})
async def bld_greet(run, name: str):
    text = await run.step("greet", hello, name)
    await run.sleep("nap", "1d")
    return {{"text": text}}
"""
RUN_BUNDLED = """\
import json, sys
sys.path.insert(0, sys.argv[1])
import handler
from aws_durable_execution_sdk_python_testing.runner import DurableFunctionTestRunner

with DurableFunctionTestRunner(handler=handler.workflows) as runner:
    event = {"workflow": "bld_greet", "input": {"name": "ada"}}
    result = runner.run(input=json.dumps(event), execution_name="bld-1")
import haze, haze_lambda, aws_durable_execution_sdk_python as sdk
print(json.dumps({"status": result.status.name, "result": result.result,
                  "from": [haze.__file__, haze_lambda.__file__, sdk.__file__]}))
"""


def write_app(root: Path, options: str = "") -> Path:
    for rel, text in {
        "config/queue.py": QUEUE_PY,
        "config/cache.py": CACHE_PY,
        "config/database.py": DATABASE_PY,
        "app/job/bld_flows.py": FLOWS_PY.format(options=options),
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def build(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "haze.cli", "--root", str(root)),
            *("build", "--preset", "aws-lambda", "--out", str(out)),
        ],
        env={**{k: v for k, v in os.environ.items() if k != "HAZE_APP_ROOT"}, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_zip_runs_the_app_workflows_on_the_durable_engine(tmp_path: Path) -> None:
    root = write_app(tmp_path / "src")
    proc = build(root, tmp_path / "dist")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "handler.workflows" in proc.stdout
    task = tmp_path / "var-task"
    with zipfile.ZipFile(tmp_path / "dist" / "aws-lambda.zip") as z:
        names = set(z.namelist())
        z.extractall(task)
    assert "aws_durable_execution_sdk_python/execution.py" in names
    handler = (task / "handler.py").read_text()
    assert "from haze_lambda import workflow_handler as workflows" in handler
    env = {k: v for k, v in os.environ.items() if k != "HAZE_APP_ROOT"}
    env["LAMBDA_TASK_ROOT"] = str(task)
    ran = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN_BUNDLED), str(task)],
        env=env,
        cwd=task,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["status"] == "SUCCEEDED"
    assert json.loads(out["result"]) == {"text": "hello ada"}
    assert all(path.startswith(str(task)) for path in out["from"]), out["from"]


def test_a_rule_lambda_cannot_honour_is_refused_with_one_line(tmp_path: Path) -> None:
    root = write_app(tmp_path / "src", options=", tries=3")
    proc = build(root, tmp_path / "dist")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert 'workflow "bld_greet"' in lines[0] and "tries=3" in lines[0]
    assert "Lambda durable functions" in lines[0]
    assert not (tmp_path / "dist" / "aws-lambda.zip").exists()
