"""The example stack (infra/examples) under Pulumi's mocks, on a copy of examples/.

The example app's config/queue.py gets the ``sqs`` and ``cloudflare`` connections the
stack deploys (unless it has them already), exactly the lines docs/infra.md shows. The
program runs in its own process: the example app's job package is ``app``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from infra_apps import require_pulumi, write_dist

require_pulumi()

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROGRAM = REPO / "infra" / "examples" / "__main__.py"
CONNECTIONS = """\
        # Deployed by infra/examples: the stack sets SQS_URL for the Lambda consumer.
        "sqs": {"driver": "sqs", "queue_url": env("SQS_URL", "https://sqs.eu-west-1.amazonaws.com/000000000000/haze-example-{queue}"),
                "queues": ["high", "default"]},
        "cloudflare": {"driver": "cloudflare", "binding": "QUEUE"},
"""

RUNNER = """
import json, runpy, sys
sys.path.insert(0, {tests!r})
import pulumi
from infra_mocks import deploy

for key, value in {config!r}.items():
    pulumi.runtime.set_config("haze-example:" + key, value)
mocks = deploy(lambda: runpy.run_path({program!r}, run_name="__main__"), "haze-example")
print(json.dumps([{{"typ": r.typ, "name": r.name, "inputs": r.inputs,
                   "outputs": r.outputs, "parent": r.parent}} for r in mocks.resources],
                 default=lambda o: getattr(o, "path", None) or str(o)))
"""


def example_copy(tmp: Path) -> Path:
    root = tmp / "examples"
    shutil.copytree(
        REPO / "examples",
        root,
        ignore=shutil.ignore_patterns("dist", "storage", "__pycache__", "*.db"),
    )
    queue_py = root / "config" / "queue.py"
    text = queue_py.read_text()
    if '"driver": "sqs"' not in text or '"driver": "cloudflare"' not in text:
        assert "    connections={\n" in text
        text = text.replace("    connections={\n", "    connections={\n" + CONNECTIONS, 1)
        queue_py.write_text(text)
    write_dist(root)  # the real build output, as a user deploys it
    return root


def run_example(root: Path, **config: str) -> list[dict[str, Any]]:
    code = RUNNER.format(
        tests=str(HERE), program=str(PROGRAM), config={"appRoot": str(root), **config}
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    if out.returncode != 0:
        raise AssertionError(out.stderr[-4000:])
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def resources(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = example_copy(tmp_path_factory.mktemp("inf_example"))
    return run_example(root, cloudflareAccountId="acc")


def of(resources: list[dict[str, Any]], typ: str) -> list[dict[str, Any]]:
    return [r for r in resources if r["typ"] == typ]


def test_the_example_deploys_sqs_and_lambda(resources: list[dict[str, Any]]) -> None:
    queues = {q["inputs"]["name"]: q for q in of(resources, "aws:sqs/queue:Queue")}
    # names from the app's queue_url template; high and default, each with a DLQ
    assert set(queues) == {
        "haze-example-high",
        "haze-example-default",
        "haze-example-high-dlq",
        "haze-example-default-dlq",
    }
    # the example's jobs: publish_post has 3 tries -> maxReceiveCount 5
    for name in ("haze-example-high", "haze-example-default"):
        redrive = json.loads(queues[name]["inputs"]["redrivePolicy"])
        assert redrive["maxReceiveCount"] == 5
        assert redrive["deadLetterTargetArn"] == queues[f"{name}-dlq"]["outputs"]["arn"]
    (fn,) = of(resources, "aws:lambda/function:Function")
    assert fn["inputs"]["handler"] == "handler.sqs"
    # no example job has a timeout: the default 60 s, and visibility 6 x 60
    assert fn["inputs"]["timeout"] == 60
    assert queues["haze-example-high"]["inputs"]["visibilityTimeoutSeconds"] == 360
    env = fn["inputs"]["environment"]["variables"]
    assert env["SQS_URL"] == (
        "https://sqs.eu-west-1.amazonaws.com/123456789012/haze-example-{queue}"
    )
    # the code is the zip `haze build --preset aws-lambda` wrote
    assert Path(fn["inputs"]["code"]).name == "aws-lambda.zip"
    assert Path(fn["inputs"]["code"]).is_file()
    mappings = of(resources, "aws:lambda/eventSourceMapping:EventSourceMapping")
    assert len(mappings) == 2
    assert all(
        m["inputs"]["functionResponseTypes"] == ["ReportBatchItemFailures"] for m in mappings
    )


def test_the_example_deploys_queue_worker_d1_and_kv(resources: list[dict[str, Any]]) -> None:
    names = {q["inputs"]["queueName"] for q in of(resources, "cloudflare:index/queue:Queue")}
    assert names == {"haze-example-cloudflare", "haze-example-cloudflare-dlq"}
    (consumer,) = of(resources, "cloudflare:index/queueConsumer:QueueConsumer")
    assert consumer["inputs"]["settings"]["maxRetries"] == 3 - 1
    assert consumer["inputs"]["deadLetterQueue"] == "haze-example-cloudflare-dlq"
    (script,) = of(resources, "cloudflare:index/workersScript:WorkersScript")
    bindings = {b["name"]: b["type"] for b in script["inputs"]["bindings"]}
    assert bindings == {"QUEUE": "queue", "DB": "d1", "KV": "kv_namespace"}
    # the Worker uploads the built entry, the vendored runtime and the bundled app
    assert Path(script["inputs"]["contentFile"]).parts[-3:] == ("cloudflare", "src", "entry.py")
    files = script["inputs"]["files"]
    for module in ("haze/__init__.py", "haze_cloudflare/worker.py", "app/job/media.py"):
        assert module in files, sorted(files)[:20]
    assert len(of(resources, "cloudflare:index/d1Database:D1Database")) == 1
    assert len(of(resources, "cloudflare:index/workersKvNamespace:WorkersKvNamespace")) == 1


def test_one_platform_at_a_time(tmp_path: Path) -> None:
    root = example_copy(tmp_path)
    resources = run_example(root, platforms="aws")
    assert of(resources, "aws:lambda/function:Function")
    assert not [r for r in resources if r["typ"].startswith("cloudflare:")]


def test_an_app_without_the_connections_is_told_what_to_add(tmp_path: Path) -> None:
    root = example_copy(tmp_path)
    (root / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(default='memory', connections={'memory': "
        "{'driver': 'memory'}})\n"
    )
    with pytest.raises(AssertionError, match="has no sqs connection to deploy on aws"):
        run_example(root, platforms="aws")
