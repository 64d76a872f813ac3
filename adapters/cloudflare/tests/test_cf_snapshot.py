"""Isolates started from one memory snapshot, as Cloudflare starts a deployed Python Worker.

Real: Pyodide's own memory snapshot (``makeMemorySnapshot`` / ``_loadSnapshot``; the npm
pyodide of tests/pyodide, or of $HAZE_PYODIDE_HOME; offline): the generated entry's top
level runs once, the snapshot is taken, and two fresh Pyodides are started from it, each
serving one ``fetch()`` dispatch (cf_snapshot.mjs). Not Cloudflare's: the snapshot is taken
by Pyodide here, not by Cloudflare's upload pipeline, and the Queue binding is a stub
whose ``send`` accepts anything (the dispatch answer carries the id that is checked).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from cf_build import haze_wheels, tool_missing
from test_cf_pyodide import _app_wheel

pytestmark = pytest.mark.pyodide

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
#: Where cf_snapshot.mjs loads Pyodide from (tests/test_pyodide.py: HAZE_PYODIDE_HOME).
PYODIDE_DIR = ROOT / os.environ.get("HAZE_PYODIDE_HOME", "tests/pyodide")

SETUP = """
import sys
from cf_pyo_app.entry import Default  # the generated entry: Default.preload() at the top
from haze._base.message import new_id
before = sorted(m for m in sys.modules if m.startswith("app.job"))
drawn = new_id() if DRAW_AT_TOP_LEVEL else None  # an id drawn before the snapshot
{"jobs": before, "drawn": drawn, "runtime_loaded": "haze._engine.manager" in sys.modules}
"""

REQUEST = """
import json
import sys
import js
from pyodide.code import run_js
from pyodide.ffi import to_js
from cf_pyo_app.entry import Default
from haze._base.message import new_id

discovered = sorted(m for m in sys.modules if m.startswith("app.job"))
env = run_js(
    "({QUEUE: {send: async () => undefined, sendBatch: async () => undefined},"
    " KV: new Map(), HAZE_HTTP_SECRET: 's'})"
)
init = {
    "method": "POST",
    "headers": {"authorization": "Bearer s"},
    "body": json.dumps({"job": "cf_pyo_ok", "payload": {"key": "snapshot"}}),
}
request = js.Request.new("https://worker.example/", to_js(init, dict_converter=js.Object.fromEntries))
response = await Default(None, env).fetch(request, env)
{"discovered": discovered, "status": response.status, "id": response.json().get("id"),
 "next": new_id()}
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("node") is None:
        tool_missing("Node.js is not installed")
    if not (PYODIDE_DIR / "node_modules" / "pyodide").is_dir():
        pytest.skip(f"{PYODIDE_DIR} has no node_modules (npm ci there)")
    out = tmp_path_factory.mktemp("cf-snapshot-bundle")
    wheels = [*haze_wheels(tmp_path_factory), _app_wheel(tmp_path_factory.mktemp("cf-app"))]
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            z.extractall(out)
    return out


def isolates(bundle: Path, tmp_path: Path, draw_at_top_level: bool) -> dict[str, Any]:
    setup = tmp_path / "setup.py"
    setup.write_text(f"DRAW_AT_TOP_LEVEL = {draw_at_top_level}\n" + SETUP)
    request = tmp_path / "request.py"
    request.write_text(REQUEST)
    proc = subprocess.run(
        ["node", str(HERE / "cf_snapshot.mjs"), "--bundle", str(bundle), str(setup), str(request)],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_the_entry_imports_and_discovers_jobs_before_the_snapshot(
    bundle: Path, tmp_path: Path
) -> None:
    out = isolates(bundle, tmp_path, draw_at_top_level=False)
    assert out["setup"]["jobs"] == ["app.job", "app.job.cf_pyo_jobs"]
    assert out["setup"]["runtime_loaded"]
    for isolate in out["isolates"]:
        # restored with the job modules imported: the request did not discover them
        assert isolate["discovered"] == ["app.job", "app.job.cf_pyo_jobs"]
        assert isolate["status"] == 202


@pytest.mark.parametrize("draw_at_top_level", [False, True], ids=["lazy", "drawn-at-import"])
def test_isolates_from_one_snapshot_draw_different_ids(
    bundle: Path, tmp_path: Path, draw_at_top_level: bool
) -> None:
    out = isolates(bundle, tmp_path, draw_at_top_level)
    a, b = out["isolates"]
    assert a["status"] == b["status"] == 202
    assert a["id"] != b["id"]
    assert a["id"][:16] != b["id"][:16], "each isolate draws its own id prefix"
    assert a["next"][:16] == a["id"][:16]  # one prefix per isolate, then its counter
    if draw_at_top_level:
        assert out["setup"]["drawn"][:16] not in {a["id"][:16], b["id"][:16]}
