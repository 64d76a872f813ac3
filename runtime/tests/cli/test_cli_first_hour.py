"""The first hour with the CLI: worker output, short ids, ``queue:failed``/``retry``/
``forget`` with short ids, and the messages for common mistakes.

Each test has its own SQLite app under ``tmp_path`` holding only ``config/``; the jobs
are defined in this module (registered process-wide) and run in-process by CliRunner.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from haze import App, define_job
from haze._base.ids import short_id
from haze.cli import get_cli
from haze.connectors.migrations import ensure_queue_tables

ran: list[Any] = []


@define_job(name="fh_send_invoice")
async def fh_send_invoice(payload: dict[str, Any], job: Any) -> None:
    job.logger.info("sending invoice %s", payload["n"])
    ran.append(payload)


@define_job(name="fh_charge_card", tries=2, backoff=7)
async def fh_charge_card(payload: dict[str, Any]) -> None:
    raise ValueError(f"card {payload['n']} declined\nby the bank " + "x" * payload.get("pad", 0))


@define_job(name="fh_always_fails")
async def fh_always_fails(payload: dict[str, Any]) -> None:
    raise ValueError(f"nope {payload['n']}" + " x" * payload.get("pad", 0))


QUEUE = """\
from haze import define_queue_config
config = define_queue_config(
    default="database",
    connections={
        "database": {"driver": "database", "sleep": 0.05},
        "redis": {"driver": "memory"},
    },
)
"""
DATABASE = """\
from haze import define_database_config
config = define_database_config(default="main", connections={"main": {"url": "sqlite:///q.db"}})
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text(QUEUE)
    (tmp_path / "config" / "database.py").write_text(DATABASE)

    async def migrate() -> None:
        async with App(root=tmp_path) as app:
            await ensure_queue_tables(app)

    asyncio.run(migrate())
    ran.clear()
    return tmp_path


def haze(root: Path, *args: str, **kwargs: Any) -> Result:
    return CliRunner().invoke(get_cli(), ["--root", str(root), *args], **kwargs)


def dispatch(root: Path, *jobs: tuple[Any, dict[str, Any]]) -> list[str]:
    async def go() -> list[str]:
        async with App(root=root):
            return [await job.dispatch(payload) for job, payload in jobs]

    return asyncio.run(go())


def work(root: Path, *extra: str) -> Result:
    result = haze(root, "queue:work", "--stop-when-empty", *extra)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def failed_ids(root: Path) -> list[str]:
    with sqlite3.connect(root / "q.db") as c:
        return [r[0] for r in c.execute("SELECT uuid FROM failed_jobs ORDER BY id")]


def fail(root: Path, n: int, **payload: Any) -> list[str]:
    ids = dispatch(root, *[(fh_always_fails, {"n": i, **payload}) for i in range(n)])
    work(root, "--quiet")
    assert failed_ids(root) == ids
    return ids


# --------------------------------------------------------------------------- worker output

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (\S+) \.+ (\S+) (.*)$")


def job_lines(output: str) -> list[tuple[str, str, str]]:
    return [m.groups() for m in map(LINE.match, output.splitlines()) if m]  # type: ignore[misc]


def test_worker_prints_one_line_per_job_state(root: Path) -> None:
    ok, bad = dispatch(root, (fh_send_invoice, {"n": 1}), (fh_charge_card, {"n": 2}))
    out = work(root).output
    lines = job_lines(out)
    assert lines[0] == ("fh_send_invoice", short_id(ok), "RUNNING")
    assert lines[1][:2] == ("fh_send_invoice", short_id(ok))
    assert re.fullmatch(r"DONE \d+ms", lines[1][2]), lines
    assert lines[2] == ("fh_charge_card", short_id(bad), "RUNNING")
    assert lines[3] == (
        "fh_charge_card",
        short_id(bad),
        "RETRY in 7s  ValueError: card 2 declined by the bank",
    )
    assert len(lines) == 4, out
    assert ok not in out, "people see short ids"
    assert "sending invoice" not in out, "INFO job logs only with -v"
    assert "haze.job" not in out and "Traceback" not in out, "one format, no traceback"


def test_a_final_failure_is_printed_once_with_its_traceback_only_with_v(root: Path) -> None:
    (job_id,) = dispatch(root, (fh_always_fails, {"n": 5}))
    out = work(root).output
    failed = [ln for ln in job_lines(out) if ln[2].startswith("FAILED")]
    assert failed == [("fh_always_fails", short_id(job_id), "FAILED  ValueError: nope 5")]
    assert out.count("nope 5") == 1, out
    assert "Traceback" not in out

    (job_id,) = dispatch(root, (fh_always_fails, {"n": 6}))
    out = work(root, "-v").output
    assert out.count("FAILED  ValueError: nope 6") == 1, out
    assert "Traceback (most recent call last)" in out
    assert 'raise ValueError(f"nope' in out


def test_verbose_shows_the_jobs_info_logs_in_the_same_format(root: Path) -> None:
    (job_id,) = dispatch(root, (fh_send_invoice, {"n": 3}))
    lines = job_lines(work(root, "-v").output)
    assert ("fh_send_invoice", short_id(job_id), "INFO sending invoice 3") in lines


def test_quiet_prints_no_job_lines(root: Path) -> None:
    dispatch(root, (fh_send_invoice, {"n": 1}), (fh_always_fails, {"n": 2}))
    out = work(root, "--quiet").output
    assert job_lines(out) == []
    assert "Worker stopped after 2 job(s)." in out
    assert ran == [{"n": 1}]


def test_json_prints_one_object_per_line(root: Path) -> None:
    ok, bad = dispatch(root, (fh_send_invoice, {"n": 1}), (fh_always_fails, {"n": 2}))
    out = work(root, "--json").output
    records = [json.loads(line) for line in out.splitlines()]
    states = [(r.get("job_id"), r.get("state")) for r in records if "state" in r]
    assert states == [(ok, "running"), (ok, "done"), (bad, "running"), (bad, "failed")]
    failed = next(r for r in records if r.get("state") == "failed")
    assert failed["exception"] == "ValueError: nope 2"
    assert "Traceback" in failed["traceback"]
    assert failed["short_id"] == short_id(bad)
    assert records[0]["message"].startswith("Working connection")
    assert records[-1]["message"] == "Worker stopped after 2 job(s)."


def test_quiet_and_json_exclude_each_other(root: Path) -> None:
    result = haze(root, "queue:work", "--quiet", "--json")
    assert result.exit_code == 2
    assert "--quiet and --json" in result.output


# --------------------------------------------------------------------------- failed jobs


def test_failed_fits_80_columns_with_short_ids_and_cut_exceptions(root: Path) -> None:
    ids = fail(root, 3, pad=300)
    result = haze(root, "queue:failed", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, result.output
    for job_id in ids:
        assert short_id(job_id) in result.output
        assert job_id not in result.output
    assert "…" in result.output, "the long exception is cut with an ellipsis"
    assert "queue:failed ID" in result.output, "says how to see one in full"


def test_failed_with_an_id_shows_the_whole_row(root: Path) -> None:
    (job_id,) = fail(root, 1, pad=300)
    for given in (short_id(job_id), job_id):
        result = haze(root, "queue:failed", given, env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        assert job_id in result.output
        assert "fh_always_fails" in result.output
        assert '"pad": 300' in result.output
        assert "Traceback (most recent call last)" in result.output
        # one try (the default): it failed on its first attempt
        assert re.search(r"Attempts\s+failed on attempt 1\b", result.output), result.output
        assert "x" * 300 in "".join(result.output.split()), "nothing cut"


def test_retry_without_argument_asks_for_all_or_ids(root: Path) -> None:
    ids = fail(root, 2)
    result = haze(root, "queue:retry")
    assert result.exit_code == 2
    assert "all" in result.output and "ID" in result.output
    assert failed_ids(root) == ids, "nothing was retried"
    result = haze(root, "queue:retry", "all")
    assert result.exit_code == 0, result.output
    assert "Retried 2 failed job(s)" in result.output
    assert failed_ids(root) == []


def test_retry_and_forget_take_short_ids(root: Path) -> None:
    first, second, third = fail(root, 3)
    result = haze(root, "queue:retry", short_id(first))
    assert result.exit_code == 0, result.output
    assert "Retried 1 failed job(s)" in result.output
    assert failed_ids(root) == [second, third]
    result = haze(root, "queue:forget", short_id(second))
    assert result.exit_code == 0, result.output
    assert f'Deleted failed job "{second}"' in result.output
    assert failed_ids(root) == [third]


def test_an_ambiguous_short_id_lists_the_matches(root: Path) -> None:
    body = json.dumps({"v": 1, "id": "x", "job": "fh_always_fails", "payload": {"n": 0}})
    twins = ["abcd" + "1" * 24 + "0001", "abcd" + "2" * 24 + "0001"]
    with sqlite3.connect(root / "q.db") as c:
        for uuid in twins:
            c.execute(
                "INSERT INTO failed_jobs (uuid, connection, queue, payload, exception, failed_at) "
                "VALUES (?, 'database', 'default', ?, 'ValueError: x', ?)",
                (uuid, body, time.time()),
            )
    assert short_id(twins[0]) == short_id(twins[1]) == "abcd0001"
    for command in ("queue:retry", "queue:forget", "queue:failed"):
        result = haze(root, command, "abcd0001")
        assert result.exit_code == 1, result.output
        assert "matches 2 jobs" in result.output
        assert twins[0] in result.output and twins[1] in result.output
        assert "Traceback" not in result.output
    assert failed_ids(root) == twins


def test_an_unknown_id_is_named_with_both_quotes(root: Path) -> None:
    result = haze(root, "queue:retry", "deadbeef")
    assert result.exit_code == 1
    assert 'no failed job with id "deadbeef" on connection "database"' in result.output
    result = haze(root, "queue:forget", "deadbeef")
    assert result.exit_code == 1
    assert 'no failed job with id "deadbeef" on connection "database"' in result.output


# --------------------------------------------------------------------------- messages


def test_a_mistyped_connection_lists_the_connections_and_their_file(root: Path) -> None:
    for args in (
        ["queue:work", "--connection", "redsi"],
        ["queue:failed", "--connection", "redsi"],
    ):
        result = haze(root, *args)
        assert result.exit_code == 1
        out = " ".join(result.output.split())
        assert "unknown queue connection 'redsi' (did you mean 'redis'?)" in out
        assert f"defined in {root / 'config' / 'queue.py'}" in out
        assert "database, redis" in out
        assert "Traceback" not in result.output


def test_retry_of_a_job_nobody_defines_says_did_you_mean(root: Path) -> None:
    body = json.dumps(
        {"v": 1, "id": "f" * 32, "job": "fh_send_invoce", "payload": {"n": 1}},
        separators=(",", ":"),
    )
    with sqlite3.connect(root / "q.db") as c:
        c.execute(
            "INSERT INTO failed_jobs (uuid, connection, queue, payload, exception, failed_at) "
            "VALUES (?, 'database', 'default', ?, 'UnknownJobError', ?)",
            ("f" * 32, body, time.time()),
        )
    result = haze(root, "queue:retry", "f" * 32)
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "no job named 'fh_send_invoce' (did you mean 'fh_send_invoice'?)" in out
    assert failed_ids(root) == ["f" * 32], "kept: retrying it would only fail again"


def test_completion_is_documented_in_the_help() -> None:
    result = CliRunner().invoke(get_cli(), ["--help"])
    assert "_HAZE_COMPLETE=bash_source haze" in result.output


def test_bash_completion_script_is_generated(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        get_cli(), [], prog_name="haze", env={"_HAZE_COMPLETE": "bash_source"}
    )
    assert result.exit_code == 0
    assert "_haze_completion" in result.output
    assert textwrap.dedent(result.output).count("complete ") >= 1


def test_retry_batch_takes_a_short_batch_id(root: Path) -> None:
    from haze import Queue

    async def go() -> str:
        async with App(root=root):
            batch = (
                await Queue.batch(
                    [fh_always_fails.with_({"n": 1}), fh_send_invoice.with_({"n": 2})]
                )
                .allow_failures()
                .dispatch()
            )
            return batch.id

    batch_id = asyncio.run(go())
    work(root, "--quiet")
    assert len(failed_ids(root)) == 1
    result = haze(root, "queue:retry-batch", short_id(batch_id))
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert f'Retried 1 failed job(s) of batch "{batch_id}"' in out
    assert failed_ids(root) == []


def test_an_apps_own_log_handlers_get_what_they_got_before(root: Path) -> None:
    import logging

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    mine = Keep()
    logging.getLogger().addHandler(mine)
    try:
        dispatch(root, (fh_send_invoice, {"n": 1}), (fh_always_fails, {"n": 2}))
        work(root)
    finally:
        logging.getLogger().removeHandler(mine)
    job_records = [r for r in seen if r.name == "haze.job"]
    assert [r.levelno for r in job_records] == [logging.ERROR], "no DEBUG lifecycle records"
    assert job_records[0].getMessage().startswith('Job "fh_always_fails" failed after 1')
