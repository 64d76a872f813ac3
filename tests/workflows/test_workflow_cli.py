"""``haze workflow:list|show|cancel|retry`` on runs kept in a SQLite database store, the
runs made by a real in-process ``queue:work``; bad ids are one line, never a traceback.

The app has only ``config/``; the workflows are defined in this module (the CliRunner
commands and the test's starts run in this process)."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result
from haze import App, Workflow, workflow
from haze.cli import get_cli
from haze.connectors.migrations import ensure_queue_tables

T = TypeVar("T")
flaky = {"fail": True}


def charge(order: str) -> str:
    if flaky["fail"]:
        raise ValueError(f"card for {order} declined")
    return f"charged {order}"


@workflow(name="cli.pay")
async def pay(run: Any, order: str) -> Any:
    intent = await run.step("intent", lambda: {"order": order})
    charged = await run.step("charge", charge, intent["order"])
    return {"charged": charged}


@workflow(name="cli.approve")
async def approve(run: Any, doc: str) -> Any:
    await run.step("draft", lambda: doc)
    return await run.wait_for_event("approved", timeout="7d")


@workflow(name="cli.secret", encrypted=True)
async def secret(run: Any, card: str) -> Any:
    await run.step("check", lambda: card)
    await run.step("charge", charge, card)
    return {"card": card}


def write_app(root: Path, db: Path) -> Path:
    files = {
        "database.py": f"""\
            from haze import define_database_config
            config = define_database_config(
                default="main", connections={{"main": {{"url": "sqlite:///{db}"}}}}
            )
            """,
        "cache.py": """\
            from haze import define_cache_config
            config = define_cache_config(default="database", stores={"database": {"driver": "database"}})
            """,
        "queue.py": """\
            from haze import define_queue_config
            config = define_queue_config(
                default="database",
                connections={"database": {"driver": "database", "sleep": 0.05}},
                store="database",
            )
            """,
    }
    for name, text in files.items():
        path = root / "config" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def in_app(root: Path, fn: Callable[[App], Awaitable[T]]) -> T:
    async def go() -> T:
        async with App(root=root) as app:
            return await fn(app)

    return asyncio.run(go())


def haze(root: Path, *args: str) -> Result:
    return CliRunner().invoke(get_cli(), ["--root", str(root), *args])


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def refused(result: Result) -> str:
    """A one-line error: exit code 1 or 2, no traceback."""
    assert result.exit_code in (1, 2), (result.output, result.exception)
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    return result.output


def work(root: Path) -> None:
    ok(haze(root, "queue:work", "--stop-when-empty"))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = write_app(tmp_path / "app", tmp_path / "queue.db")
    in_app(r, ensure_queue_tables)
    flaky["fail"] = True
    return r


def test_list_show_cancel_and_retry(root: Path) -> None:
    async def start(app: App) -> tuple[str, str]:
        return (
            await Workflow.start(pay, order="A-1", id="pay-1"),
            await Workflow.start(approve, doc="q3.pdf", id="approve-1"),
        )

    pay_id, approve_id = in_app(root, start)
    work(root)

    listed = ok(haze(root, "workflow:list"))
    assert "pay-1" in listed and "cli.pay" in listed and "failed" in listed
    assert "approve-1" in listed and "waiting" in listed and 'event "approved"' in listed
    waiting = ok(haze(root, "workflow:list", "--state", "waiting"))
    assert "approve-1" in waiting and "pay-1" not in waiting
    assert "No done workflow runs." in ok(haze(root, "workflow:list", "--state", "done"))

    shown = ok(haze(root, "workflow:show", pay_id))
    assert "cli.pay run pay-1: failed" in shown
    assert "card for A-1 declined" in shown
    lines = {ln.split()[1]: ln for ln in shown.splitlines() if ln.strip()[:1].isdigit()}
    assert "done" in lines["intent"] and "B" in lines["intent"]  # its result size
    assert "failed" in lines["charge"]

    # retry: the kept "intent" result is reused, "charge" runs again and succeeds
    assert "only a failed run" in refused(haze(root, "workflow:retry", approve_id))
    flaky["fail"] = False
    assert "Retrying run pay-1" in ok(haze(root, "workflow:retry", pay_id))
    work(root)
    st = in_app(root, lambda app: Workflow.status(pay_id))
    assert st is not None and st.state == "done", st
    assert st.result == {"charged": "charged A-1"}
    assert [s.attempts for s in st.steps] == [1, 2]

    assert f"Cancelled run {approve_id}" in ok(haze(root, "workflow:cancel", approve_id))
    assert "is cancelled: nothing to cancel" in refused(haze(root, "workflow:cancel", approve_id))
    st = in_app(root, lambda app: Workflow.status(approve_id))
    assert st is not None and st.state == "cancelled"


@pytest.mark.parametrize("command", ["workflow:show", "workflow:cancel", "workflow:retry"])
def test_an_unknown_run_is_one_line(root: Path, command: str) -> None:
    out = refused(haze(root, command, "no-such-run"))
    assert "no workflow run" in out and "no-such-run" in out
    assert len(out.strip().splitlines()) == 1


def test_bad_arguments_are_one_line(root: Path) -> None:
    out = refused(haze(root, "workflow:list", "--state", "asleep"))
    assert "'asleep' is not one of" in out
    out = refused(haze(root, "workflow:list", "--limit", "0"))
    assert "--limit" in out
    out = refused(haze(root, "workflow:show", " "))
    assert "a run id is 1-255 characters" in out


def test_show_opens_an_encrypted_run_with_the_key_and_says_encrypted_without(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze._base.crypto import generate_key

    monkeypatch.setenv("APP_KEY", generate_key())
    rid = in_app(root, lambda app: Workflow.start(secret, card="SECRET-CARD-9", id="sec-1"))
    work(root)
    shown = ok(haze(root, "workflow:show", rid))
    assert "cli.secret run sec-1: failed" in shown
    assert '"SECRET-CARD-9"' in shown and "card for SECRET-CARD-9 declined" in shown
    monkeypatch.delenv("APP_KEY")
    hidden = ok(haze(root, "workflow:show", rid))
    assert "cli.secret run sec-1: failed" in hidden and "SECRET-CARD-9" not in hidden
    assert "input:   (encrypted with the app key; set APP_KEY to show it)" in hidden
    assert "error:   encrypted with the app key" in hidden
