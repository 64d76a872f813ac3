"""Shared by every test directory below: this folder is on ``sys.path`` (pytest puts a
rootdir-level conftest's folder there), so ``import worker_procs`` works everywhere."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from services import check_marked_servers


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_server(server, url): skips when the server is down; fails under CI=true "
        "(services.needs_server)",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_marked_servers(item)


@pytest.fixture(autouse=True)
def _piped_output_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test reads the CLI's output as a script piping ``haze`` does: 200 columns
    wide, unless the test sets ``COLUMNS`` itself (``haze.cli._core.console``). A
    pytest-xdist worker's environment gains ``COLUMNS=80`` and ``LINES=24`` before its
    first test (the no-terminal default readline exports), and a developer's shell may
    export its own: tables then wrapped only there."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


def _weight(item: pytest.Item) -> int:
    if item.get_closest_marker("slow") is not None:
        return 2
    return 1 if _in_node_lane(item) else 0


def _in_node_lane(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in ("pyodide", "workerd"))


#: Lanes of the slow (fault, storm, soak) modules under xdist: one storm at a time (each is
#: bounded to about two minutes on a box that runs nothing else heavy).
SLOW_LANES = 1


def _group_for_xdist(
    config: pytest.Config, items: list[pytest.Item], heaviest: dict[str, int]
) -> None:
    """Under ``pytest -n N --dist loadgroup --no-loadscope-reorder`` (scripts/test): each
    module goes to one worker as a whole, so its module-scoped fixtures (a database, a
    Miniflare scenario) are set up once. Every module that starts Node.js heavily (a
    ``pyodide`` test boots Pyodide, a ``workerd`` test starts Miniflare's workerd or
    wrangler) is in the one Node lane, one module after the other: two of them at once
    on two cores run out of their time limits. The slow modules share ``SLOW_LANES``
    workers (a storm has the CPU it was bounded on, more or less). Workers take groups in
    this order: the Node lane, the slow lanes, then the other modules, biggest first, so
    the long ones do not start last."""
    if config.getoption("dist", "no") != "loadgroup" and not getattr(
        config.option, "loadgroup", False
    ):
        return
    node = {i.nodeid.split("::")[0] for i in items if _in_node_lane(i)}
    slow = sorted(m for m, w in heaviest.items() if w == 2 and m not in node)
    size: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        size[module] = size.get(module, 0) + 1
    # module -> (rank, group name, tie-break): the order in which workers take them
    order = {m: (2, m, -n) for m, n in size.items()}
    order.update({m: (1, f"slow-{n % SLOW_LANES}", 0) for n, m in enumerate(slow)})
    order.update(dict.fromkeys(node, (0, "node", 0)))
    items.sort(key=lambda item: _lane_key(order[item.nodeid.split("::")[0]]))
    for item in items:
        group = order[item.nodeid.split("::")[0]][1]
        item.add_marker(pytest.mark.xdist_group(group))
        _tag_group(config, item, group)


def _tag_group(config: pytest.Config, item: pytest.Item, group: str) -> None:
    """xdist's scheduler reads a test's group from an ``@group`` suffix of its id, which
    xdist 3.8 writes to ``item._nodeid``; pytest 9.2 builds the id from ``item._id``, so
    the suffix was lost and every test went to any worker. Only in a worker (the ids
    it sends to the scheduler); xdist adding its own suffix too still gives the group."""
    node_id = getattr(item, "_id", None)
    if hasattr(config, "workerinput") and node_id is not None and hasattr(node_id, "parse"):
        item._id = type(node_id).parse(f"{item.nodeid}@{group}")


def _lane_key(entry: tuple[int, str, int]) -> tuple[int, int, str]:
    rank, name, minus_size = entry
    return rank, minus_size, name


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fast tests first, then the Pyodide ones, then the slow (fault, storm, soak) ones,
    so ``scripts/test -x`` meets a simple failure early. A module moves as a whole (its
    heaviest test decides), so its module-scoped fixtures are set up once; the order
    inside each group is pytest's."""
    heaviest: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        heaviest[module] = max(heaviest.get(module, 0), _weight(item))
    items.sort(key=lambda item: heaviest[item.nodeid.split("::")[0]])
    _group_for_xdist(config, items, heaviest)
    # CI reruns a failed test (a shared 2-core box makes some timing tests flaky); a
    # storm or exactly-once test never gets a rerun: a pass on the second try would hide
    # the race it hunts.
    # (only where pytest-rerunfailures runs: Pyodide's pytest has no `flaky` marker)
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return
    for item in items:
        if item.get_closest_marker("storm"):
            item.add_marker(pytest.mark.flaky(reruns=0))


#: Node-lane tests this process has still to run; when they are done it creates the file
#: HAZE_NODE_LANE_DONE names: .ci/run then starts its Pyodide 0.28.2 pass, next to the
#: rest of the tests but never next to this lane (two Node.js runs at once on two cores
#: run out of their time limits).
_node_lane_left = pytest.StashKey[int]()


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_node_lane_left] = sum(map(_in_node_lane, session.items))
    _node_lane_done(session.config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    yield  # the test with its reruns
    if _in_node_lane(item):
        item.config.stash[_node_lane_left] -= 1
        _node_lane_done(item.config)


def _node_lane_done(config: pytest.Config) -> None:
    done = os.environ.get("HAZE_NODE_LANE_DONE")
    # One process runs the slow storms right after this lane: the pass waits for them
    # (it starts when the tests end), as storms are timed.
    lanes = "PYTEST_XDIST_WORKER" in os.environ
    if done and lanes and config.stash.get(_node_lane_left, 1) == 0:
        Path(done).touch()
