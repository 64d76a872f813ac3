"""The example app as built for Cloudflare, run with only what its wrangler.json declares.

``haze build --preset cloudflare`` of ``examples/`` (a copy), its output installed in
real Pyodide, inside the Miniflare harness (tests/cloudflare/miniflare-harness.mjs: real
local Queues and D1 in workerd, see test_cf_miniflare.py for what is real in it). The
Worker's env holds Miniflare's Queue producer and D1 bindings under the names the
generated wrangler.json binds (QUEUE, DB), the wrangler.json ``vars`` as env properties
(as workerd passes them, not in ``os.environ``) and the HAZE_HTTP_SECRET secret.
Nothing else is configured: the app's own config files, read with those vars, must make
it dispatch (fetch() and from inside jobs) and consume through the ``cloudflare``
connection and keep its locks, batches, failed jobs and the jobs' outcomes in D1.

Stand-in: the consumer side of the queue is a JavaScript Worker relaying each delivery
to Default.queue() in Pyodide (Python Workers need a network download to run in local
workerd), with the harness's consumer settings (max_retries 2 = the example's derived
value, a dead-letter queue).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cf_build import miniflare_node
from test_build_cloudflare import build_in_subprocess, bundle_wheels

pytestmark = pytest.mark.pyodide

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CF_DIR = ROOT / "tests" / "cloudflare"
PYODIDE_DIR = ROOT / "tests" / "pyodide"


@pytest.fixture(scope="module")
def built_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("example-worker")
    example = work / "examples"
    shutil.copytree(
        ROOT / "examples",
        example,
        ignore=shutil.ignore_patterns("dist", "storage", "__pycache__", "*.db"),
    )
    output = build_in_subprocess(example, work / "dist")
    assert "warning" not in output, output  # the Worker's config: nothing it cannot reach
    return work / "dist"


@pytest.fixture(scope="module")
def run(built_example: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = miniflare_node()
    work = tmp_path_factory.mktemp("example-worker-run")
    wheels = bundle_wheels(built_example / "cloudflare" / "src", work)
    wrangler = json.loads((built_example / "wrangler.json").read_text())
    script = work / "cf_example_worker.py"
    script.write_text(f"WRANGLER = {wrangler!r}\n" + (HERE / "cf_example_worker.py").read_text())
    # Run here, not with cf_build.run_miniflare: a failure inside Pyodide shows the
    # harness's stderr too (the example's own logs).
    args = [node, str(CF_DIR / "miniflare-harness.mjs")]
    for w in wheels:
        args += ["--wheel", str(w)]
    args.append(str(script))
    proc = subprocess.run(
        args, cwd=CF_DIR, capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"miniflare harness failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    out: dict[str, Any] = json.loads(proc.stdout)
    result: dict[str, Any] = out["python"]
    if "error" in result:
        pytest.fail(f"the run raised inside Pyodide:\n{result['error']}\n{proc.stderr[-3000:]}")
    result["harness"] = {"events": out["events"], "dlq": out["dlq"]}
    return result


def test_the_build_binds_what_the_config_uses(built_example: Path) -> None:
    w = json.loads((built_example / "wrangler.json").read_text())
    assert w["vars"] == {"QUEUE_CONNECTION": "cloudflare", "DATABASE_URL": "d1://DB"}
    assert [p["binding"] for p in w["queues"]["producers"]] == ["QUEUE"]
    assert [d["binding"] for d in w["d1_databases"]] == ["DB"]
    assert w["d1_databases"][0]["migrations_dir"].endswith("database/migrations")


def test_the_worker_boots_on_its_vars(run: dict[str, Any]) -> None:
    assert run["migrations"] == sorted(
        p.name for p in (ROOT / "examples" / "database" / "migrations").glob("*.sql")
    )
    assert run["app"] == {
        "default": "cloudflare",
        "database": "D1Connector",
        "lock_store": "DatabaseStore",
        "batch_store": "DatabaseStore",
    }
    # the vars reached env() without os.environ, and SQLite was never loaded
    assert run["modules"] == {"sqlite": False, "os_environ": []}


def test_fetch_dispatches_through_the_queue(run: dict[str, Any]) -> None:
    first, second, card = run["fetch"]
    assert first["status"] == 202 and not first["answer"]["skipped"]
    assert second["status"] == card["status"] == 202
    # sync_feed is unique while queued, its lock in D1: the second dispatch is skipped
    # unless the queue delivered and ran the first in between (a real queue, no pause)
    runs = [o for o in run["outcomes"] if o["job"] == "sync_feed"]
    assert len(runs) == (1 if second["answer"]["skipped"] else 2), (second, runs)
    events = run["harness"]["events"]
    delivered = {m["job"] for e in events for m in e.get("messages", [])}
    assert {"sync_feed", "charge_card", "resize_image", "publish_post"} <= delivered


def test_jobs_ran_and_dispatched_from_inside_jobs(run: dict[str, Any]) -> None:
    outcomes = [(o["job"], o["attempt"]) for o in run["outcomes"]]
    assert ("sync_feed", 1) in outcomes
    # the chain: each link dispatched by the job before it, publish_post on its retry
    chain = [o for o in outcomes if o[0] in ("resize_image", "publish_post", "notify_author")]
    assert chain == [("resize_image", 1), ("publish_post", 2), ("notify_author", 1)]
    # the batch's then() callback, dispatched when the last member finished
    assert outcomes.count(("import_finished", 1)) == 1
    assert run["batch"] == {"total": 4, "pending": 0, "failed": 0, "finished": True}
    # the batch and the unique lock live in D1 (the database store's table)
    assert any("batch" in k for k in run["haze_cache_keys"]), run["haze_cache_keys"]


def test_a_final_failure_lands_in_d1(run: dict[str, Any]) -> None:
    (failed,) = run["failed_jobs"]
    assert failed["connection"] == "cloudflare"
    assert failed["payload"]["job"] == "charge_card"
    assert "card 4000-0000-0000-0002 declined" in failed["exception"]
    assert run["harness"]["dlq"] == []  # haze's own failure came before Cloudflare's
