"""Workflows of a ``"workflows": "native"`` cloudflare connection on Miniflare's REAL
local Workflows engine (wrangler@4.86.0, in workerd), against the same definitions on
haze's own engine (SQLite).

Real: the engine (it keeps each step's result, retries a step with the retries config
haze gives it, sleeps, keeps an event sent before the wait, replays run() from the top
after a pause and resume, and reports the instance's status), the built app's
``wrangler.json`` workflows entries (binding, name, class) that the harness configures,
the relay classes it runs (tests/cloudflare/workflow-worker.mjs) and the bindings'
create/get/status/sendEvent/pause/resume calls made inside that Worker; haze's code
(``haze_cloudflare.workflows``) in real Pyodide. The one model: the Python Workflows
SDK's ``step`` wrapper (cf_miniflare_native.py's ``RelayStep``), since workerd's Python
runtime cannot be loaded offline; each of its calls is carried out by the engine's step.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, miniflare_node

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "workflows"))

import cf_native_flows
import recipes
from haze import App, Workflow, define_cache_config, define_database_config, define_queue_config
from haze._workflows.definition import find_workflow
from haze._workflows.engine import set_clock, workflow_state

pytestmark = pytest.mark.pyodide

RECIPES = ROOT / "tests" / "workflows" / "recipes.py"
NAMES = ["signup", "payment", "import", "cf_replay", "cf_nondet"]
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("signup", {"email": "ada@example.com"}, {}),
    ("payment", {"order_id": "A-1", "cents": 1200}, {"paid": {"amount": 1200}}),
    ("import", {"source": "c.csv", "chunks": 4}, {}),
]


def built_classes() -> list[dict[str, str]]:
    from haze.build._cloudflare_workflows import workflow_binding, workflow_class

    return [
        {"binding": workflow_binding(n), "name": n, "class_name": workflow_class(n)}
        for n in NAMES
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import subprocess

    from cf_build import CF_DIR

    node = miniflare_node()
    wheels = haze_wheels(tmp_path_factory)
    script = tmp_path_factory.mktemp("cf-mf-native") / "cf_miniflare_native.py"
    classes = built_classes()
    script.write_text(
        f"RECIPES_SRC = {RECIPES.read_text()!r}\n"
        f"FLOWS_SRC = {(HERE / 'cf_native_flows.py').read_text()!r}\n"
        f"CLASSES = {classes!r}\n" + (HERE / "cf_miniflare_native.py").read_text()
    )
    args = [node, str(CF_DIR / "miniflare-harness.mjs")]
    for w in wheels:
        args += ["--wheel", str(w)]
    args += ["--workflows", json.dumps(classes), str(script)]
    proc = subprocess.run(
        args, cwd=CF_DIR, capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"miniflare harness failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)["python"]
    if "error" in result:
        pytest.fail(f"the scenario raised inside Pyodide:\n{result['error']}")
    return result


def test_smoke(run: dict[str, Any]) -> None:
    print(json.dumps(run, indent=1)[:20000])
    assert False
