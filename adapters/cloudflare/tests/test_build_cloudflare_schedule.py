"""``haze build --preset cloudflare`` for an app with schedules: ``triggers.crons`` in
``dist/wrangler.json`` (one per distinct UTC cron, beside the ones haze.config.py lists),
cronsim and tzdata vendored beside haze, wrangler accepting the triggers, and a schedule
no Cron Trigger can express refused with one line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_build_cloudflare import _dry_run

# wrangler's dry run (Node.js): in the one Node lane under xdist (tests/conftest.py)
pytestmark = pytest.mark.workerd

QUEUE_PY = """\
from haze import define_queue_config

config = define_queue_config(
    default="cloudflare",
    connections={"cloudflare": {"driver": "cloudflare", "binding": "QUEUE", "failed_store": "kv"}},
    store="kv",
)
"""
CACHE_PY = """\
from haze import define_cache_config

config = define_cache_config(default="kv", stores={"kv": {"driver": "kv", "binding": "KV"}})
"""
JOBS_PY = """\
from haze import define_job


@define_job
async def bld_sched_report(payload: dict) -> None:
    pass
"""
SCHEDULE_PY = """\
from haze import schedule

from app.job.bld_sched_jobs import bld_sched_report

schedule(bld_sched_report.with_({"k": "paris"}), cron="30 9 * * 1-5", tz="Europe/Paris",
         name="paris")
schedule(bld_sched_report.with_({"k": "utc"}), cron="0 6 * * *", name="six")
schedule(bld_sched_report, every="15m")
"""
HAZE_CONFIG_PY = """\
from haze import define_haze_config

config = define_haze_config(cloudflare={"wrangler": {
    "name": "bld-sched",
    "triggers": {"crons": ["0 0 1 * *"]},
    "kv_namespaces": [{"binding": "KV", "id": "0123456789abcdef0123456789abcdef"}],
}})
"""


def write_app(root: Path, schedules: str = SCHEDULE_PY) -> Path:
    (root / "config").mkdir(parents=True)
    (root / "app" / "job").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(QUEUE_PY)
    (root / "config" / "cache.py").write_text(CACHE_PY)
    (root / "config" / "schedule.py").write_text(schedules)
    (root / "app" / "job" / "bld_sched_jobs.py").write_text(JOBS_PY)
    (root / "haze.config.py").write_text(HAZE_CONFIG_PY)
    return root


def build(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "haze.cli", "--root", str(root)),
            *("build", "--preset", "cloudflare", "--out", str(out)),
        ],
        env={**os.environ, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_triggers_and_vendored_packages(tmp_path: Path) -> None:
    root = write_app(tmp_path / "app")
    dist = tmp_path / "dist"
    proc = build(root, dist)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    w = json.loads((dist / "wrangler.json").read_text())
    assert w["triggers"] == {"crons": ["0 0 1 * *", "30 * * * *", "0 6 * * *", "*/15 * * * *"]}
    assert "30 * * * * -> paris" in proc.stdout
    src = dist / "cloudflare" / "src"
    for path in ("cronsim/__init__.py", "tzdata/zoneinfo/Europe/Paris", "config/schedule.py"):
        assert (src / path).is_file(), path
    project = json.loads((dist / "cloudflare" / "wrangler.jsonc").read_text())
    assert project["triggers"] == w["triggers"]
    # wrangler reads the config with its triggers (it prints no schedules on a dry run)
    out = _dry_run(dist / "wrangler.json", tmp_path / "out", dist)
    assert "cronsim/__init__.py" in out


def test_a_schedule_no_trigger_can_express_is_one_line(tmp_path: Path) -> None:
    root = write_app(
        tmp_path / "app",
        "from haze import schedule\nfrom app.job.bld_sched_jobs import bld_sched_report\n"
        "schedule(bld_sched_report, every='10s', name='fast')\n",
    )
    proc = build(root, tmp_path / "dist")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith('Error: schedule "fast" (')
    assert "every=10s has no Cloudflare cron trigger" in lines[0]
    assert "Traceback" not in proc.stderr
