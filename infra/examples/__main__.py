"""Deploy the haze example app (``examples/``) to AWS and to Cloudflare.

Everything queue-related comes from the app itself (``stack_config``, what ``haze
infra:config`` prints): the SQS queues and their redrive, the Lambda's timeout and
batching, the Cloudflare consumer's retries and batches. Build the app first::

    cd examples && haze build --preset aws-lambda && haze build --preset cloudflare
    cd ../infra/examples && pulumi stack init dev
    pulumi config set aws:region eu-west-1
    pulumi config set cloudflare:apiToken --secret ...
    pulumi config set cloudflareAccountId ...
    pulumi up

The example app needs an ``sqs`` and a ``cloudflare`` connection in
``config/queue.py`` to deploy there (see docs/infra.md).
"""

from __future__ import annotations

from pathlib import Path

import pulumi
from haze_infra import HazeAwsApp, HazeCloudflareApp, InfraConfigError, stack_config

HERE = Path(__file__).resolve().parent
config = pulumi.Config()
platforms = {
    p.strip() for p in (config.get("platforms") or "aws,cloudflare").split(",") if p.strip()
}
app_root = (HERE / (config.get("appRoot") or "../../examples")).resolve()
dist_dir = Path(config.get("distDir") or app_root / "dist")
if not dist_dir.is_absolute():
    dist_dir = (HERE / dist_dir).resolve()

stack = stack_config(app_root)
for warning in stack.warnings:
    pulumi.log.warn(f"haze: {warning}")

NEEDS = {
    "aws": (
        '"sqs": {"driver": "sqs", "queue_url": env("SQS_URL", '
        '"https://sqs.eu-west-1.amazonaws.com/000000000000/haze-example-{queue}"), '
        '"queues": ["high", "default"]}'
    ),
    "cloudflare": '"cloudflare": {"driver": "cloudflare", "binding": "QUEUE"}',
}
for platform, driver in (("aws", "sqs"), ("cloudflare", "cloudflare")):
    if platform in platforms and not stack.by_driver(driver):
        raise InfraConfigError(
            f"the app has no {driver} connection to deploy on {platform}; add to the "
            f"connections of config/queue.py: {NEEDS[platform]}",
            source=stack.source,
            key="connections",
        )

if "aws" in platforms:
    aws_app = HazeAwsApp(
        "haze-example",
        stack=stack,
        dist_dir=dist_dir,
        connections=[c.name for c in stack.by_driver("sqs")],
    )
    pulumi.export(
        "sqs_queue_urls",
        {conn: {q: v.url for q, v in queues.items()} for conn, queues in aws_app.queues.items()},
    )
    pulumi.export(
        "sqs_dead_letter_queues",
        {
            conn: {q: v.dlq.url for q, v in queues.items()}
            for conn, queues in aws_app.queues.items()
        },
    )
    pulumi.export(
        "lambda_functions", {conn: c.function.name for conn, c in aws_app.consumers.items()}
    )

if "cloudflare" in platforms:
    cf_app = HazeCloudflareApp(
        "haze-example",
        stack=stack,
        account_id=config.require("cloudflareAccountId"),
        dist_dir=dist_dir / "cloudflare",
        # The example binds a D1 database and a KV namespace even when its config does
        # not use them yet (a d1:// connection / a kv cache store add theirs).
        d1_databases={} if stack.d1 else {"DB": None},
        kv_namespaces={} if stack.kv else {"KV": None},
    )
    pulumi.export("cloudflare_worker", cf_app.worker.script_name)
    pulumi.export("cloudflare_queues", {conn: q.queue_name for conn, q in cf_app.queues.items()})
    pulumi.export("cloudflare_d1", {b: db.uuid for b, db in cf_app.worker.d1.items()})
    pulumi.export("cloudflare_kv", {b: ns.id for b, ns in cf_app.worker.kv.items()})
