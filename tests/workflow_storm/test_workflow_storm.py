"""Durable workflows under a SIGKILL storm: every run finishes, every step result is
kept once, no run is lost.

300 runs of a workflow with five steps, a sleep and a gather
(``app/job/wst_flows.py``) go through 3 real ``haze queue:work`` processes (concurrency
8) on PostgreSQL, Redis and SQLite, with the run state in the same backend's shared
store. A random worker that is running steps is SIGKILLed every 1 to 2 seconds and a
fresh one started. Steps and the workflow append lines to an O_APPEND runs file; the
test then checks that every run is ``done`` in the store, that every replay of a run saw
the same token for each step (a result is recorded once and never replaced), that the
run's output is the kept tokens, and that each kept token came from a step execution
that really ended. Re-executions of steps whose worker was killed between the call and
the record (at least once) are counted and printed. Bounded: about two minutes each.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backend_procs import BackendProcs, backend_run
from haze import Workflow
from services import require_server, throwaway_pg_database

pytestmark = [pytest.mark.slow, pytest.mark.storm, pytest.mark.timeout(300)]

APP = Path(__file__).parent
PG_ADMIN_URL = os.environ.get(
    "HAZE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("HAZE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

RUNS, WORKERS, CONCURRENCY = 300, 3, 8
STEPS = ("one", "two", "three", "four", "five")
#: Storm phase: the run stops killing after this long, and fails if not done by DEADLINE.
STORM_SECONDS, DEADLINE = 60.0, 140.0
MIN_KILLS = 5

_spec = importlib.util.spec_from_file_location(
    "wst_flows_in_tests", APP / "app" / "job" / "wst_flows.py"
)
assert _spec is not None and _spec.loader is not None
flows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flows)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    require_server("PostgreSQL", PG_ADMIN_URL)
    with throwaway_pg_database(
        PG_ADMIN_URL, f"wst_{os.getpid()}", "synchronous_commit = off"
    ) as url:
        yield url


class Storm(BackendProcs):
    def __init__(self, tmp: Path, backend: str, url: str) -> None:
        super().__init__(
            tmp,
            APP,
            backend,
            url,
            name="wst",
            redis_url=REDIS_URL,
            db_options={"retry_after": "3s"},
            redis_options={"queues": ["default"], "retry_after": "3s"},
        )

    def start_worker(self) -> subprocess.Popen[bytes]:
        args = ["--concurrency", str(CONCURRENCY), "--sleep", "0.2"]
        return self.spawn(self.connection, "default", args, self.env("WST"))

    def lines(self) -> list[tuple[str, str, str, int, float]]:
        if not self.runs_file.exists():
            return []
        out = []
        for line in self.runs_file.read_text().splitlines():
            event, key, token, pid, at = line.split()
            out.append((event, key, token, int(pid), float(at)))
        return out


def _url(request: pytest.FixtureRequest, backend: str, tmp: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp}/wst.db"
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))
    require_server("Redis", REDIS_URL)
    return REDIS_URL


async def _kill_loop(s: Storm, rng: random.Random, live: list[subprocess.Popen[bytes]]) -> int:
    """Kill a busy worker every 1-2 s until every run wrote ``done``; the kill count."""
    started = time.monotonic()
    kills = 0
    next_kill = started + rng.uniform(1.0, 2.0)
    while True:
        lines = s.lines()
        if len({k for e, k, *_ in lines if e == "done"}) == RUNS:
            return kills
        now = time.monotonic()
        left = RUNS - len({k for e, k, *_ in lines if e == "done"})
        assert now - started < DEADLINE, (
            f"not done after {DEADLINE:.0f}s: {left} runs unfinished; worker logs:\n"
            + "\n".join(s.log(p)[-3000:] for p in live)
        )
        for p in live:
            assert p.poll() is None, f"worker {p.pid} died on its own:\n{s.log(p)}"
        recent = {pid for e, _, _, pid, at in lines[-400:] if e == "start" and at > now - 2}
        busy = [p for p in live if p.pid in recent]
        if now - started < STORM_SECONDS and now >= next_kill and busy:
            victim = busy[rng.randrange(len(busy))]
            live.remove(victim)
            victim.send_signal(signal.SIGKILL)
            await s.wait_exit(victim)
            kills += 1
            live.append(s.start_worker())
            next_kill = time.monotonic() + rng.uniform(1.0, 2.0)
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("backend", ["postgres", "redis", "sqlite"])
async def test_workflow_runs_survive_sigkills(
    request: pytest.FixtureRequest,
    backend: str,
    tmp_path: Path,
    record_property: Any,
    capsys: Any,
) -> None:
    rng = random.Random(20261207)
    async with backend_run(Storm(tmp_path, backend, _url(request, backend, tmp_path))) as s:
        ids = {}
        for n in range(RUNS):
            ids[n] = await Workflow.start(flows.wst_flow, n=n, nap=rng.uniform(1.0, 2.0))
        live = [s.start_worker() for _ in range(WORKERS)]
        for p in live:
            await s.wait_ready(p)
        started = time.monotonic()
        kills = await _kill_loop(s, rng, live)
        elapsed = time.monotonic() - started
        await asyncio.sleep(4)  # a late redelivery would show as a second token
        for p in live:
            p.send_signal(signal.SIGTERM)
        codes = [await s.wait_exit(p) for p in live]

        lines = s.lines()
        seen: dict[str, set[str]] = collections.defaultdict(set)
        ended: dict[str, set[str]] = collections.defaultdict(set)
        runs_of_step = collections.Counter(k for e, k, *_ in lines if e == "start")
        for event, key, token, *_ in lines:
            if event == "seen":
                seen[key].add(token)
            elif event == "end":
                ended[key].add(token)
        not_done, wrong_output, not_from_an_end = [], [], []
        for n, rid in ids.items():
            st = await Workflow.status(rid)
            if st is None or st.state != "done":
                not_done.append((n, None if st is None else (st.state, st.error)))
                continue
            kept = [next(iter(seen[f"{n}.{step}"]), None) for step in STEPS]
            if st.result != kept:
                wrong_output.append((n, st.result, kept))
            not_from_an_end += [
                f"{n}.{step}"
                for step, token in zip(STEPS, st.result, strict=True)
                if token not in ended[f"{n}.{step}"]
            ]
        steps = [f"{n}.{step}" for n in range(RUNS) for step in STEPS]
        data = {
            "backend": backend,
            "runs": RUNS,
            "workers": WORKERS,
            "concurrency": CONCURRENCY,
            "kills": kills,
            "seconds": round(elapsed, 1),
            "lost": len(not_done),
            "steps_seen_with_two_results": sum(1 for k in steps if len(seen[k]) > 1),
            "steps_never_seen": sum(1 for k in steps if not seen[k]),
            "step_reexecutions": sum(max(0, runs_of_step[k] - 1) for k in steps),
        }
        for k, v in data.items():
            record_property(k, v)
        (tmp_path / "workflow_storm_report.json").write_text(json.dumps(data, indent=2))
        with capsys.disabled():
            print(f"\n[workflow storm] {json.dumps(data)}")

        assert not not_done, f"every run finishes: {not_done[:5]}"
        assert data["steps_seen_with_two_results"] == 0, "a step result is kept once"
        assert data["steps_never_seen"] == 0, data
        assert not wrong_output, f"the output is the kept results: {wrong_output[:3]}"
        assert not not_from_an_end, f"kept results come from real runs: {not_from_an_end[:5]}"
        assert codes == [0] * WORKERS, "SIGTERM: clean exits"
        assert kills >= MIN_KILLS, f"the storm killed too few workers to mean anything: {data}"
