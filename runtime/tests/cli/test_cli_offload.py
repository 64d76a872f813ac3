"""``haze queue:prune-offload --older-than AGE``: the orphans of offloaded payloads go,
what a failed job still refers to and what is recent stay; a bad age, a bad store URL
and a connection without ``offload`` are one line each.

The app is a SQLite ``database`` connection (its failed jobs outlive the command) that
offloads to a ``file://`` folder under ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from haze import App, Queue, define_job
from haze.cli import get_cli
from haze.connectors.migrations import ensure_queue_tables
from haze.driver_api import Worker


@define_job(name="cli_ol_boom", tries=1)
async def cli_ol_boom(payload: Any) -> None:
    raise ValueError("boom")


def haze(root: Path, *args: str) -> Result:
    return CliRunner().invoke(get_cli(), ["--root", str(root), *args])


def write_app(root: Path, offload: str) -> Path:
    files = {
        "database.py": f"""\
            from haze import define_database_config
            config = define_database_config(
                default="main", connections={{"main": {{"url": "sqlite:///{root}/q.db"}}}})
            """,
        "queue.py": f"""\
            from haze import define_queue_config
            config = define_queue_config(default="db", connections={{
                "db": {{"driver": "database"{offload}}},
                "plain": {{"driver": "memory"}}}})
            """,
    }
    for name, text in files.items():
        path = root / "config" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "objects"


@pytest.fixture
def root(tmp_path: Path, folder: Path) -> Path:
    root = write_app(tmp_path / "app", f', "offload": {{"to": "file://{folder}", "over": 100}}')

    async def setup() -> None:
        async with App(root=root) as app:
            await ensure_queue_tables(app)

    asyncio.run(setup())
    return root


def test_prune_deletes_old_orphans_and_keeps_recent_and_failed_ones(
    root: Path, folder: Path
) -> None:
    async def fail_one() -> str:
        async with App(root=root) as app:
            await cli_ol_boom.dispatch({"blob": "x" * 500})
            await Worker(app, "db", stop_when_empty=True, sleep=0.05).run()
            [record] = await Queue.failed()
            return str(json.loads(record.body)["meta"]["offload"]["offloaded"])

    kept = asyncio.run(fail_one())
    (folder / "orphan-old").write_bytes(b"old")
    (folder / "orphan-new").write_bytes(b"new")
    day_ago = time.time() - 86400
    for name in (kept, "orphan-old"):
        os.utime(folder / name, (day_ago, day_ago))

    result = haze(root, "queue:prune-offload", "--older-than", "1h")
    assert result.exit_code == 0, result.output
    assert "Pruned 1 offloaded payload(s)" in result.output
    assert sorted(os.listdir(folder)) == sorted([kept, "orphan-new"])


def test_a_bad_age_is_one_line(root: Path) -> None:
    result = haze(root, "queue:prune-offload", "--older-than", "soon")
    assert result.exit_code == 2
    assert "Invalid value for '--older-than'" in result.output
    assert "Traceback" not in result.output


def test_a_connection_without_offload_is_one_line(root: Path) -> None:
    result = haze(root, "queue:prune-offload", "--older-than", "1d", "--connection", "plain")
    assert result.exit_code == 1
    assert 'connection "plain" has no "offload" setting' in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("offload", "says"),
    [
        ('{"to": "ftp://host/x"}', "no object store handles ftp://"),
        ('{"to": "file://relative/dir"}', "a file:// URL names an absolute folder"),
        ('{"to": "s3://"}', "is not a URL such as s3://bucket/prefix"),
        ('{"to": "s3://b/p", "over": "lots"}', "is not a size"),
        ('{"to": "s3://b/p", "under": 1}', "unknown option"),
    ],
)
def test_a_bad_offload_setting_is_one_line(tmp_path: Path, offload: str, says: str) -> None:
    root = write_app(tmp_path / "bad", f', "offload": {offload}')
    result = haze(root, "queue:prune-offload", "--older-than", "1d")
    assert result.exit_code != 0
    assert says in result.output, result.output
    assert "connections.db.offload" in result.output
    assert "Traceback" not in result.output
