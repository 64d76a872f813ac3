"""The test apps of the infra tests (no Pulumi here), and the Pulumi availability check."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest


def require_pulumi() -> None:
    """Skip the calling test module when Pulumi is missing, except in CI (fail there)."""
    if os.environ.get("CI"):
        import pulumi  # noqa: F401
    else:
        pytest.importorskip("pulumi", reason="pulumi is haze-infra's dependency")


def isolated_stack_config(root: Path) -> Any:
    """``stack_config(root)``, then free the ``app`` package name for other apps (the jobs
    stay registered) and restore ``sys.path``."""
    from haze_infra.config import stack_config

    path, before = list(sys.path), set(sys.modules)
    try:
        return stack_config(root)
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - before:
            if name == "app" or name.startswith(("app.", "_haze_jobs_", "_haze_config_")):
                sys.modules.pop(name, None)


def write_app(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


def write_dist(root: Path) -> Path:
    """A stand-in for ``haze build`` output: dist/aws-lambda.zip, dist/cloudflare/src,
    dist/wrangler.json."""
    dist = root / "dist"
    (dist / "cloudflare" / "src" / "app" / "job").mkdir(parents=True, exist_ok=True)
    (dist / "cloudflare" / "src" / "entry.py").write_text(
        "from haze_cloudflare import QueueWorker\n\n\nclass Default(QueueWorker):\n"
        "    app_root = '.'\n"
    )
    (dist / "cloudflare" / "src" / "app" / "job" / "jobs.py").write_text("# bundled job\n")
    (dist / "cloudflare" / "src" / "config.json").write_text("{}\n")
    (dist / "wrangler.json").write_text(
        json.dumps(
            {
                "name": "inf",
                "main": "cloudflare/src/entry.py",
                "compatibility_date": "2025-10-15",
                "compatibility_flags": ["python_workers"],
            }
        )
    )
    with zipfile.ZipFile(dist / "aws-lambda.zip", "w") as z:
        z.writestr("handler.py", "from haze_lambda import sqs_handler as sqs\n")
    return dist


#: The app every infra test deploys. Expected values, by connection:
#: - sqs: inf_sqs_heavy (4 tries, 40s, queue high) + inf_anywhere (2 tries, 10s):
#:   max tries 4 -> maxReceiveCount 6; concurrency 2 -> batch 2 -> Lambda 50s (>= 45s);
#:   visibility 6 x 50 = 300s; queues high, default; queue_url from INF_SQS_URL (unset).
#: - edge (cloudflare, binding JOBS): inf_edge_job (6 tries, 20s) + inf_anywhere:
#:   max_retries 5; wrangler: queue inf-jobs, batch 25, timeout 2s, DLQ inf-jobs-dead.
#: - database: inf_db_job (9 tries, 5m) + inf_anywhere.
INF_APP = {
    "config/queue.py": """
        from haze import define_queue_config, env

        config = define_queue_config(
            default=env("INF_QUEUE_CONNECTION", "sqs"),
            connections={
                "sqs": {"driver": "sqs", "queue_url": env("INF_SQS_URL"), "region": "eu-west-1",
                        "concurrency": 2, "queues": ["high", "default"]},
                "edge": {"driver": "cloudflare", "binding": "JOBS"},
                "database": {"driver": "database", "connection": "main",
                             "queues": ["default"]},
                "memory": {"driver": "memory"},
            },
        )
    """,
    "config/database.py": """
        from haze import define_database_config

        config = define_database_config(default="main", connections={
            "main": {"url": "sqlite:///storage/app.db"},
            "edge": {"url": "d1://account/database", "options": {"binding": "DB"}},
        })
    """,
    "config/cache.py": """
        from haze import define_cache_config

        config = define_cache_config(default="memory", stores={
            "memory": {"driver": "memory"},
            "kv": {"driver": "kv", "binding": "CACHE"},
        })
    """,
    "haze.config.py": """
        from haze import define_haze_config

        config = define_haze_config(cloudflare={"wrangler": {"queues": {
            "producers": [{"binding": "JOBS", "queue": "inf-jobs"}],
            "consumers": [{"queue": "inf-jobs", "max_batch_size": 25,
                           "max_batch_timeout": 2, "dead_letter_queue": "inf-jobs-dead"}],
        }}})
    """,
    "app/__init__.py": "",
    "app/job/__init__.py": "",
    "app/job/inf_jobs.py": """
        from haze import define_job


        @define_job(tries=4, timeout="40s", queue="high", connection="sqs")
        async def inf_sqs_heavy(payload):
            pass


        @define_job(tries=2, timeout="10s")
        async def inf_anywhere(payload):
            pass


        @define_job(tries=6, timeout="20s", connection="edge")
        async def inf_edge_job(payload):
            pass


        @define_job(tries=9, timeout="5m", connection="database")
        async def inf_db_job(payload):
            pass
    """,
}

#: Expected per connection (kept here, independent of the code under test).
EXPECTED_TRIES = {"sqs": 4, "edge": 6, "database": 9}
EXPECTED_JOB_TIMEOUT = {"sqs": 40.0, "edge": 20.0, "database": 300.0}
