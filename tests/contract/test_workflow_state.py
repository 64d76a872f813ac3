"""The workflow run state (``WorkflowStateStore``) on every atomic store: memory, the
database store on SQLite, PostgreSQL, MariaDB and libSQL (a real sqld), and Redis (the
stores of ``test_store_contract.py``, and libSQL). Every decision is insert-if-absent: of many concurrent
writers exactly one wins, and every writer reads the winner back."""

from __future__ import annotations

import asyncio
import itertools
import os
import runpy
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from haze.contracts.workflow import HasWorkflowState, WorkflowStateStore

_STORES = runpy.run_path(str(Path(__file__).parent / "test_store_contract.py"))["STORES"]
_tables = itertools.count()


async def _libsql(tmp_path: Path) -> Any:
    from haze import App, define_database_config
    from haze.stores.database import DatabaseStore

    url = sys.modules["haze_contract_conftest"]._sqld_url()
    app = App(database=define_database_config(default="main", connections={"main": {"url": url}}))
    table = f"haze_wf_state_{os.getpid()}_{next(_tables)}"

    class OwningDatabaseStore(DatabaseStore):
        async def close(self) -> None:  # this test's app owns the connector: close it too
            await super().close()
            await self.db.close()

    options = {"driver": "database", "connection": "main", "table": table}
    return OwningDatabaseStore("contract", options, app)


_STORES = [*_STORES, ("database-libsql", _libsql, ())]


@pytest.fixture(params=[pytest.param(f, id=i, marks=m) for i, f, m in _STORES])
async def state(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    store = await request.param(tmp_path)
    try:
        assert isinstance(store, HasWorkflowState)
        s = store.workflow_state()
        assert isinstance(s, WorkflowStateStore)
        yield s
    finally:
        await store.close()


async def test_a_result_is_kept_once_among_concurrent_writers(state: Any) -> None:
    await state.create_run("r1", "wf", "{}", 1.0)
    kept = await asyncio.gather(*(state.keep_result("r1", "s", f'"{i}"', 2.0) for i in range(20)))
    assert len(set(kept)) == 1
    assert await state.result("r1", "s") == kept[0]
    assert await state.result("r1", "other") is None


async def test_marks_finals_events_and_keys_are_first_writer_wins(state: Any) -> None:
    await state.create_run("r2", "wf", '{"a":1}', 1.0)
    assert await state.mark("r2", 0, "fetch", "step", 1.0) == "fetch"
    assert await state.mark("r2", 0, "other", "step", 1.0) == "fetch"
    assert await state.put_event("r2", "go", '{"by":1}') is True
    assert await state.put_event("r2", "go", '{"by":2}') is False
    assert await state.event("r2", "go") == '{"by":1}'
    assert await state.keep("r2", "wake:1", "m1") == "m1"
    assert await state.keep("r2", "wake:1", "m2") == "m1"
    assert await state.replace("r2", "wake:1", "m1", "m3") is True
    assert await state.keep("r2", "wake:1", "m4") == "m3"
    assert await state.replace("r2", "wake:1", "m1", "m5") is False
    assert await state.final_state("r2") is None
    done = await asyncio.gather(*(state.finish("r2", "done", 3.0, "1", None) for _ in range(5)))
    assert sorted(done) == [False, False, False, False, True]
    assert await state.finish("r2", "cancelled", 4.0, None, "cancelled") is False
    assert await state.final_state("r2") == "done"


async def test_runs_are_read_with_their_steps_and_listed_newest_first(state: Any) -> None:
    assert await state.create_run("a", "wf1", '{"n":1}', 1.0) is True
    assert await state.create_run("a", "wf1", '{"n":9}', 1.0) is False
    await state.create_run("b", "wf2", "{}", 2.0)
    await state.mark("a", 0, "fetch", "step", 1.5)
    assert await state.started("a", "fetch", 1.5) == 1
    assert await state.started("a", "fetch", 1.6) == 2
    await state.keep_result("a", "fetch", '{"id":7}', 1.7)
    await state.mark("a", 1, "nap", "sleep", 1.8)
    await state.set_state("a", "sleeping", 1.8, resume_at=99.0)
    run = await state.get_run("a")
    assert (run.name, run.state, run.input, run.resume_at) == ("wf1", "sleeping", {"n": 1}, 99.0)
    fetch, nap = run.steps
    assert (fetch.name, fetch.state, fetch.attempts, fetch.result_size) == ("fetch", "done", 2, 8)
    assert fetch.started_at == 1.5 and fetch.finished_at == 1.7
    assert (nap.name, nap.state, nap.kind) == ("nap", "sleeping", "sleep")
    assert await state.get_run("nope") is None
    assert [r.id for r in await state.list_runs()] == ["b", "a"]
    assert [r.id for r in await state.list_runs(name="wf1")] == ["a"]
    assert [r.id for r in await state.list_runs(state="sleeping")] == ["a"]
    await state.finish("b", "failed", 3.0, None, "RuntimeError: boom")
    [b] = await state.list_runs(state="failed")
    assert (b.id, b.error) == ("b", "RuntimeError: boom")
    assert [r.id for r in await state.list_runs(limit=1)] == ["b"]


async def test_an_encrypted_runs_data_is_stored_sealed_and_opened_with_the_key(
    state: Any,
) -> None:
    from haze import App
    from haze._base.crypto import generate_key
    from haze._workflows.sealed import sealed_state

    secret, key = "SEALED-SECRET-5150", generate_key()
    sealed = sealed_state(state, App(key=key), encrypt=True)
    await sealed.create_run("enc1", "wf", f'{{"card":"{secret}"}}', 1.0)
    assert await sealed.keep_result("enc1", "s", f'"{secret}:step"', 2.0) == f'"{secret}:step"'
    assert await sealed.put_event("enc1", "ev", f'"{secret}:event"')
    await sealed.step_failed("enc1", "t", f"{secret}:step-error", 3.0)
    await sealed.finish("enc1", "failed", 4.0, None, f"{secret}:error")
    # what the store holds, read without the key: nothing of the secret
    stored = [
        await state.run_input("enc1"),
        await state.result("enc1", "s"),
        await state.event("enc1", "ev"),
        repr(await state.get_run("enc1")),
    ]
    assert all(secret not in str(v) for v in stored), stored
    # the engine's reads and the status open it with the key
    assert await sealed.run_input("enc1") == f'{{"card":"{secret}"}}'
    assert await sealed.result("enc1", "s") == f'"{secret}:step"'
    assert await sealed.event("enc1", "ev") == f'"{secret}:event"'
    st = await sealed.get_run("enc1")
    assert st is not None and st.encrypted and st.input == {"card": secret}
    assert st.error == f"{secret}:error"
    # another key cannot open it, and says so
    other = await sealed_state(state, App(key=generate_key()), encrypt=False).get_run("enc1")
    assert other is not None and other.encrypted and other.input is None
    assert other.error is not None and other.error.startswith("encrypted:")
    assert secret not in repr(other)


async def test_an_encrypted_run_is_cancelled_without_the_key(
    state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze import App
    from haze._base.crypto import generate_key
    from haze._workflows.api import StoreRuns
    from haze._workflows.sealed import sealed_state

    monkeypatch.delenv("APP_KEY", raising=False)
    sealed = sealed_state(state, App(key=generate_key()), encrypt=True)
    await sealed.create_run("enc2", "wf", '{"card":"x"}', 1.0)
    runs = StoreRuns(sealed_state(state, App(), encrypt=False))
    assert await runs.cancel("enc2")
    assert await state.final_state("enc2") == "cancelled"
    assert not await runs.cancel("nope")


async def test_a_first_try_keeps_name_result_and_attempt_in_one_record(state: Any) -> None:
    await state.create_run("k", "wf", '{"n":2}', 1.0)
    writers = [state.keep_step("k", 0, "fetch", f'"{i}"', 1.5, 2.0) for i in range(10)]
    kept = await asyncio.gather(*writers, state.keep_step("k", 0, "other", '"x"', 1.5, 2.0))
    assert len(set(kept)) == 1 and kept[0][0] == "fetch"
    # a position marked first (a failed try) keeps no result in the record: None back
    assert await state.mark("k", 1, "slow", "step", 2.1) == "slow"
    assert await state.keep_step("k", 1, "slow", '"late"', 2.1, 2.2) == ("slow", None)
    await state.keep_result("k", "slow", '"late"', 2.3)
    await state.mark("k", 2, "nap", "sleep", 2.4)
    # a gap (a concurrent step not ended yet) hides nothing after it
    await state.keep_step("k", 4, "after-gap", "7", 2.5, 2.6)
    run = await state.kept("k")
    assert (run.input, run.final, run.state) == ('{"n":2}', None, None)
    assert run.marks == {
        0: ("fetch", "step"),
        1: ("slow", "step"),
        2: ("nap", "sleep"),
        4: ("after-gap", "step"),
    }
    assert run.results == {"fetch": kept[0][1], "slow": '"late"', "after-gap": "7"}
    st = await state.get_run("k")
    shown = [
        (s.position, s.name, s.state, s.attempts, s.started_at, s.finished_at) for s in st.steps
    ]
    assert shown == [
        (0, "fetch", "done", 1, 1.5, 2.0),
        (1, "slow", "done", 0, 2.1, 2.3),
        (2, "nap", "sleeping", 0, 2.4, None),
        (4, "after-gap", "done", 1, 2.5, 2.6),
    ]
    await state.finish("k", "done", 3.0, "1", None)
    assert (await state.kept("k")).final == "done"
    assert (await state.kept("nope")).input is None


async def test_a_replay_reads_runs_past_one_page_of_steps(state: Any) -> None:
    await state.create_run("long", "wf", "{}", 1.0)
    await asyncio.gather(
        *(state.keep_step("long", i, f"s{i}", str(i), 1.0, 2.0) for i in range(230))
    )
    run = await state.kept("long")
    assert len(run.marks) == len(run.results) == 230 and run.results["s229"] == "229"


async def test_a_new_run_is_listed_in_the_same_write_that_adds_it(
    state: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the process "dies" at a separate numbering write: with one atomic write there is
    # none, so the run is either absent or both added and listed, never found by
    # Workflow.status yet missing from Workflow.list / workflow:list / the dashboard
    async def dies(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the process died here")

    monkeypatch.setattr(state.store, "increment", dies)
    monkeypatch.setattr(state.store, "put", dies)
    try:
        created = await state.create_run("listed-1", "wf", "{}", 1.0)
    except RuntimeError:
        created = False
    monkeypatch.undo()
    found = await state.get_run("listed-1")
    listed = [r.id for r in await state.list_runs()]
    assert (found is not None) == created == ("listed-1" in listed), (found, listed)
    assert created is True
    assert await state.create_run("listed-1", "wf", "{}", 2.0) is False
    assert [r.id for r in await state.list_runs()].count("listed-1") == 1
