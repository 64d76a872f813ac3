"""The Cloudflare components under Pulumi's mocks: the graph, the bindings, and consumer
settings that match the app config (tries, haze.config.py's wrangler section)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from infra_apps import EXPECTED_TRIES, require_pulumi

require_pulumi()

import pulumi  # noqa: E402
from haze_infra.cloudflare import (  # noqa: E402
    ConsumerSettings,
    HazeCloudflareApp,
    HazeCloudflareQueue,
    HazeCloudflareWorker,
    QueueBinding,
)
from haze_infra.config import InfraConfigError, StackConfig  # noqa: E402
from infra_mocks import RecordingMocks, deploy  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated:DeprecationWarning")

QUEUE = "cloudflare:index/queue:Queue"
CONSUMER = "cloudflare:index/queueConsumer:QueueConsumer"
SCRIPT = "cloudflare:index/workersScript:WorkersScript"
D1 = "cloudflare:index/d1Database:D1Database"
KV = "cloudflare:index/workersKvNamespace:WorkersKvNamespace"


@pytest.fixture(scope="module")
def deployed(inf_stack: StackConfig) -> RecordingMocks:
    return deploy(lambda: HazeCloudflareApp("inf-cf", stack=inf_stack, account_id="acc"))


def cf_violations(mocks: RecordingMocks) -> list[str]:
    """The consumer of the app's cloudflare connection against the app's jobs (6 tries)
    and haze.config.py (batch 25, 2 s, DLQ inf-jobs-dead)."""
    problems = []
    queues = {q.inputs["queueName"]: q for q in mocks.of(QUEUE)}
    for c in mocks.of(CONSUMER):
        s = c.inputs["settings"]
        if s["maxRetries"] < EXPECTED_TRIES["edge"] - 1:
            problems.append(f"max_retries {s['maxRetries']:g} < tries {EXPECTED_TRIES['edge']} - 1")
        if s["batchSize"] != 25 or s["maxWaitTimeMs"] != 2000:
            problems.append(f"batch settings {s} differ from haze.config.py")
        if c.inputs.get("deadLetterQueue") not in queues:
            problems.append(f"dead letter queue {c.inputs.get('deadLetterQueue')} not created")
        if c.inputs["queueId"] != queues["inf-jobs"].outputs["queueId"]:
            problems.append("the consumer does not consume inf-jobs")
    if not mocks.of(CONSUMER):
        problems.append("no consumer")
    return problems


def test_the_graph_is_what_the_docs_promise(deployed: RecordingMocks) -> None:
    types = deployed.types()
    assert types["haze:cloudflare:HazeCloudflareApp"] == 1
    assert types["haze:cloudflare:HazeCloudflareQueue"] == 1
    assert types["haze:cloudflare:HazeCloudflareWorker"] == 1
    assert types[QUEUE] == 2  # the queue and its DLQ
    assert types[SCRIPT] == 1
    assert types[CONSUMER] == 1
    assert types[D1] == 1
    assert types[KV] == 1
    assert {q.inputs["queueName"] for q in deployed.of(QUEUE)} == {"inf-jobs", "inf-jobs-dead"}
    for q in deployed.of(QUEUE):
        assert q.parent == "haze:cloudflare:HazeCloudflareQueue"
    for typ in (SCRIPT, CONSUMER, D1, KV):
        assert deployed.one(typ).parent == "haze:cloudflare:HazeCloudflareWorker"
    assert not any("sqs" in r.name or "database" in r.name for r in deployed.resources)


def test_consumer_settings_match_the_app_config(deployed: RecordingMocks) -> None:
    assert cf_violations(deployed) == []
    consumer = deployed.one(CONSUMER)
    assert consumer.inputs["type"] == "worker"
    assert consumer.inputs["scriptName"] == "inf-cf"
    settings = consumer.inputs["settings"]
    assert settings["maxRetries"] == 6 - 1  # Cloudflare counts retries, haze tries
    assert settings["batchSize"] == 25
    assert settings["maxWaitTimeMs"] == 2000
    assert consumer.inputs["deadLetterQueue"] == "inf-jobs-dead"


def test_the_worker_script_and_its_bindings(deployed: RecordingMocks, inf_root: Path) -> None:
    script = deployed.one(SCRIPT)
    i = script.inputs
    assert i["scriptName"] == "inf-cf"
    assert i["mainModule"] == "entry.py"
    assert i["contentType"] == "text/x-python"
    assert Path(i["contentFile"]) == inf_root / "dist" / "cloudflare" / "src" / "entry.py"
    assert len(i["contentSha256"]) == 64
    assert "python_workers" in i["compatibilityFlags"]
    wrangler = json.loads((inf_root / "dist" / "wrangler.json").read_text())
    assert i["compatibilityDate"] == wrangler["compatibility_date"]  # from the build
    # the build's bundle: the app, the vendored runtime, and haze's Lua scripts as text
    assert i["files"]["app/job/inf_jobs.py"]["contentType"] == "text/x-python"
    assert i["files"]["haze_cloudflare/worker.py"]["contentType"] == "text/x-python"
    lua = [name for name in i["files"] if name.endswith(".lua")]
    assert lua
    assert all(i["files"][name]["contentType"] == "text/plain" for name in lua)
    bindings = {b["name"]: b for b in i["bindings"]}
    assert bindings["JOBS"] == {"name": "JOBS", "type": "queue", "queueName": "inf-jobs"}
    d1 = deployed.one(D1)
    assert bindings["DB"] == {"name": "DB", "type": "d1", "id": d1.outputs["uuid"]}
    kv = deployed.one(KV)
    assert bindings["CACHE"]["type"] == "kv_namespace"
    assert bindings["CACHE"]["namespaceId"] == "kv-inf-cf-cache"
    assert kv.inputs["title"] == "inf-cf-cache"
    assert set(bindings) == {"JOBS", "DB", "CACHE"}


def test_extra_bindings_vars_and_secrets(inf_stack: StackConfig) -> None:
    mocks = deploy(
        lambda: HazeCloudflareApp(
            "inf-cf",
            stack=inf_stack,
            account_id="acc",
            script_name="inf-worker",
            d1_databases={"ANALYTICS": "inf-analytics"},
            kv_namespaces={"FLAGS": None},
            vars={"APP_ENV": "production"},
            secrets={"HAZE_HTTP_SECRET": "s3cret"},
        )
    )
    bindings = {b["name"]: b for b in mocks.one(SCRIPT).inputs["bindings"]}
    assert set(bindings) == {
        "JOBS",
        "DB",
        "CACHE",
        "ANALYTICS",
        "FLAGS",
        "APP_ENV",
        "HAZE_HTTP_SECRET",
    }
    assert bindings["APP_ENV"] == {"name": "APP_ENV", "type": "plain_text", "text": "production"}
    assert bindings["HAZE_HTTP_SECRET"]["type"] == "secret_text"
    assert {d.inputs["name"] for d in mocks.of(D1)} == {"inf-worker-db", "inf-analytics"}


# --------------------------------------------------------------------------- wrong configs


def test_max_retries_below_tries_is_refused(inf_stack: StackConfig) -> None:
    """haze.config.py (here: the derived plan) asking for fewer retries than tries - 1."""
    plan = inf_stack.connections["edge"]
    assert plan.cloudflare is not None
    wrong = replace(
        inf_stack,
        connections={"edge": replace(plan, cloudflare=replace(plan.cloudflare, max_retries=2))},
    )
    with pytest.raises(InfraConfigError, match="max_retries 2 is below tries - 1 = 5"):
        deploy(lambda: HazeCloudflareApp("inf-cf", stack=wrong, account_id="acc"))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (ConsumerSettings(max_tries=3, max_retries=1), "below tries - 1 = 2"),
        (ConsumerSettings(max_tries=150), "over Cloudflare's 100"),
        (ConsumerSettings(max_batch_size=101), "max_batch_size 101 is outside 1-100"),
        (ConsumerSettings(max_batch_timeout=61), "max_batch_timeout 61s is outside 0-60s"),
    ],
)
def test_consumer_limits(inf_root: Path, settings: ConsumerSettings, message: str) -> None:
    def program() -> None:
        q = HazeCloudflareQueue("inf-q", account_id="acc", queue_name="inf-q")
        HazeCloudflareWorker(
            "inf-w",
            account_id="acc",
            script_name="inf-w",
            queues=[QueueBinding("Q", q, settings)],
            dist_dir=inf_root / "dist" / "cloudflare",
        )

    with pytest.raises(InfraConfigError, match=message):
        deploy(program)


def test_bad_names_and_a_missing_bundle(inf_stack: StackConfig, tmp_path: Path) -> None:
    with pytest.raises(InfraConfigError, match="not a valid queue name"):
        deploy(lambda: HazeCloudflareQueue("inf-q", account_id="acc", queue_name="Inf_Q"))
    with pytest.raises(InfraConfigError, match="haze build --preset cloudflare"):
        deploy(
            lambda: HazeCloudflareApp(
                "inf-cf", stack=inf_stack, account_id="acc", dist_dir=tmp_path
            )
        )


def test_the_checks_catch_tampered_consumers(inf_stack: StackConfig) -> None:
    """A consumer altered after the component's checks (max_retries 0, batch 100) fails
    the same checks the good deployment passes."""

    def tamper(
        args: pulumi.ResourceTransformationArgs,
    ) -> pulumi.ResourceTransformationResult | None:
        if args.type_ != CONSUMER:
            return None
        props: dict[str, Any] = dict(args.props)
        props["settings"] = {**props["settings"], "max_retries": 0, "batch_size": 100}
        return pulumi.ResourceTransformationResult(props, args.opts)

    mocks = deploy(
        lambda: HazeCloudflareApp(
            "inf-cf",
            stack=inf_stack,
            account_id="acc",
            opts=pulumi.ResourceOptions(transformations=[tamper]),
        )
    )
    problems = cf_violations(mocks)
    assert any("max_retries 0 < tries 6 - 1" in p for p in problems), problems
    assert any("batch settings" in p for p in problems), problems
