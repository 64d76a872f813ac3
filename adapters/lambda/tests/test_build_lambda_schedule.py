"""``haze build --preset aws-lambda`` for an app with schedules: cronsim and tzdata in
the zip, the EventBridge rules in the notes, and a schedule no rule can express refused
with one line naming it (before anything is written)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

QUEUE_PY = """\
from haze import define_queue_config

config = define_queue_config(default="database", connections={
    "database": {"driver": "database", "connection": "main"}})
"""
DATABASE_PY = """\
from haze import define_database_config

config = define_database_config(default="main", connections={"main": {"url": "sqlite:///x.db"}})
"""
JOBS_PY = """\
from haze import define_job


@define_job
async def bld_lam_report(payload: dict) -> None:
    pass
"""


def write_app(root: Path, schedules: str) -> Path:
    (root / "config").mkdir(parents=True)
    (root / "app" / "job").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(QUEUE_PY)
    (root / "config" / "database.py").write_text(DATABASE_PY)
    (root / "config" / "schedule.py").write_text(
        "from haze import schedule\nfrom app.job.bld_lam_jobs import bld_lam_report\n" + schedules
    )
    (root / "app" / "job" / "bld_lam_jobs.py").write_text(JOBS_PY)
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


def test_zip_and_rules(tmp_path: Path) -> None:
    root = write_app(
        tmp_path / "app",
        "schedule(bld_lam_report, cron='0 9 * * 1-5', tz='Europe/Paris', name='paris')\n"
        "schedule(bld_lam_report, every='15m', name='quarter')\n",
    )
    proc = build(root, tmp_path / "dist")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "cron(0 * * * ? *) -> paris" in out
    assert "cron(0/15 * * * ? *) -> quarter" in out
    with zipfile.ZipFile(tmp_path / "dist" / "aws-lambda.zip") as z:
        names = set(z.namelist())
    for path in ("cronsim/__init__.py", "tzdata/zoneinfo/Europe/Paris", "config/schedule.py"):
        assert path in names, path


def test_a_schedule_no_rule_can_express_is_one_line(tmp_path: Path) -> None:
    root = write_app(tmp_path / "app", "schedule(bld_lam_report, cron='0 9 1 * 1', name='odd')\n")
    proc = build(root, tmp_path / "dist")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith('Error: schedule "odd" (')
    assert "both a day of the month and a day of the week" in lines[0]
    assert not (tmp_path / "dist" / "aws-lambda.zip").exists()
