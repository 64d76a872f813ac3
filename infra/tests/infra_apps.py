"""The test apps of the infra tests (no Pulumi here), and the Pulumi availability check."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
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
    """``haze build --preset aws-lambda`` and ``--preset cloudflare`` for the app at
    ``root`` (in a subprocess: the build loads the app, whose job names are process-wide)."""
    for preset in ("aws-lambda", "cloudflare"):
        built = subprocess.run(
            [sys.executable, "-m", "haze.cli", "--root", str(root), "build", "--preset", preset],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=root,
            # the build validates the config, which needs a queue URL the stack derives
            env={"INF_SQS_URL": "https://sqs.eu-west-1.amazonaws.com/1/inf-{queue}", **os.environ},
        )
        assert built.returncode == 0, built.stdout + built.stderr
    return root / "dist"


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
