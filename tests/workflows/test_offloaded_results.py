"""A workflow step result over the connection's offload threshold goes to the object
store (the run keeps a reference, checked on every replay), on the store engine; the
run's objects are deleted when it ends. On a memory connection with a small
``max_message_size`` and a real folder store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from haze import App, Workflow, WorkflowLimitError, define_queue_config, workflow
from haze._base.crypto import generate_key
from haze.cli.queue_admin import unfinished_run

MARKER = "OFFLOADED-RESULT-4417"
SEEN: list[int] = []


def big(n: int) -> dict[str, Any]:
    return {"blob": MARKER + "x" * n}


@workflow(name="wfo_big")
async def wfo_big(run: Any, n: int) -> int:
    first = await run.step("make", big, n)
    await run.sleep("nap", 0.05)  # a replay: the result is read back from the store
    SEEN.append(len(first["blob"]))
    second = await run.step("again", big, n // 2)
    return len(first["blob"]) + len(second["blob"])


wfo_secret = workflow(name="wfo_secret", encrypted=True)(wfo_big.fn)


def objects(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def app_with(folder: Path | None, **extra: Any) -> App:
    main: dict[str, Any] = {"driver": "memory", "max_message_size": 16_384}
    if folder is not None:
        main["offload"] = {"to": f"file://{folder}"}
    return App(queue=define_queue_config(default="main", connections={"main": main}), **extra)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    SEEN.clear()
    return tmp_path / "objects"


async def test_a_big_step_result_goes_to_the_store_and_comes_back_on_replay(
    folder: Path,
) -> None:
    async with app_with(folder):
        rid = await Workflow.start(wfo_big, n=100_000)
        st = await Workflow.wait(rid, timeout=20)
        assert st.state == "done", st.error
        assert st.result == 100_000 + 50_000 + 2 * len(MARKER)
        assert [100_000 + len(MARKER)] == SEEN
    assert objects(folder) == []  # the run ended: its objects are gone


async def test_a_tampered_result_fails_the_run_with_checksum_mismatch(folder: Path) -> None:
    async with app_with(folder):
        rid = await Workflow.start(wfo_big, n=100_000)
        for _ in range(200):  # until the first result is in the store
            if objects(folder):
                break
            await asyncio.sleep(0.02)
        (obj,) = objects(folder)
        obj.write_bytes(obj.read_bytes().replace(b"xxxx", b"yyyy", 1))
        st = await Workflow.wait(rid, timeout=20)
        assert st.state == "failed"
        assert "checksum mismatch" in (st.error or "")


async def test_an_encrypted_runs_object_holds_no_plaintext(folder: Path) -> None:
    async with app_with(folder, key=generate_key()):
        rid = await Workflow.start(wfo_secret, n=100_000)
        for _ in range(200):
            if objects(folder):
                break
            await asyncio.sleep(0.02)
        assert all(MARKER.encode() not in p.read_bytes() for p in objects(folder))
        st = await Workflow.wait(rid, timeout=20)
        assert st.state == "done", st.error


async def test_without_offload_a_big_result_fails_naming_the_setting(folder: Path) -> None:
    async with app_with(None):
        rid = await Workflow.start(wfo_big, n=100_000)
        st = await Workflow.wait(rid, timeout=20)
        assert st.state == "failed"
        assert "max_message_size" in (st.error or "") and '"offload"' in (st.error or "")
        assert WorkflowLimitError.__name__ in (st.error or "") or "over" in (st.error or "")


@workflow(name="wfo_waits")
async def wfo_waits(run: Any, n: int) -> int:
    first = await run.step("make", big, n)
    await run.wait_for_event("go", timeout="1h")
    return len(first["blob"])


async def test_prune_spares_the_results_of_a_run_that_has_not_ended(folder: Path) -> None:
    async with app_with(folder) as app:
        rid = await Workflow.start(wfo_waits, n=100_000)
        for _ in range(200):
            if objects(folder):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        (kept,) = objects(folder)
        orphan = folder / "wf-deadbeef.0123456789ab"
        orphan.write_bytes(b"left by a crash")
        assert await app.manager.prune_offload(0.0, "main", spare=unfinished_run) == 1
        assert objects(folder) == [kept]  # the waiting run's result stays
        await Workflow.send_event(rid, "go", {})
        st = await Workflow.wait(rid, timeout=20)
        assert (st.state, st.result) == ("done", 100_000 + len(MARKER))
    assert objects(folder) == []


FAIL_STEP = [True]


def fails_once_told() -> int:
    if FAIL_STEP[0]:
        raise RuntimeError("the step fails")
    return 1


@workflow(name="wfo_fails")
async def wfo_fails(run: Any, n: int) -> int:
    first = await run.step("make", big, n)
    await run.step("boom", fails_once_told)
    return len(first["blob"])


async def test_a_failed_run_keeps_its_results_and_a_retry_replays_them(folder: Path) -> None:
    from haze._workflows.api import retry

    FAIL_STEP[0] = True
    async with app_with(folder) as app:
        rid = await Workflow.start(wfo_fails, n=100_000)
        st = await Workflow.wait(rid, timeout=20)
        assert st.state == "failed", st.error
        assert len(objects(folder)) == 1  # a retry replays the steps that finished
        assert await app.manager.prune_offload(0.0, "main", spare=unfinished_run) == 0
        FAIL_STEP[0] = False
        assert await retry(rid)
        st = await Workflow.wait(rid, timeout=20)
        assert (st.state, st.error, st.result) == ("done", None, 100_000 + len(MARKER))
    assert objects(folder) == []
