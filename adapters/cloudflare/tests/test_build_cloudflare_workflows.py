"""``haze build --preset cloudflare`` for an app with ``"workflows": "native"``: one
``WorkflowEntrypoint`` class per workflow in ``src/entry.py`` and its ``workflows`` entry
in ``wrangler.json``; a workflow Cloudflare cannot run as written is refused with one line.

Real: the build (``haze build`` through its CLI, in a process of its own) and the
generated ``entry.py``, imported by CPython from the bundle with the vendored ``haze``
and ``haze_cloudflare`` first on ``sys.path``. Not run here: the classes on Miniflare's
Workflows engine (test_cf_miniflare_native.py runs them there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

QUEUE_PY = """\
from haze import define_queue_config

config = define_queue_config(
    default="edge",
    connections={{"edge": {{"driver": "cloudflare", "binding": "QUEUE"{native}}}}},
    store="kv",
)
"""
CACHE_PY = """\
from haze import define_cache_config

config = define_cache_config(default="kv", stores={"kv": {"driver": "kv", "binding": "KV"}})
"""
FLOWS_PY = """\
from haze import workflow


def hello(name):
    return "hello " + name


@workflow(name="signup")
async def signup(run, email: str):
    return await run.step("greet", hello, email)


@workflow(name="send-receipt")
async def send_receipt(run):
    return None


@workflow(name={extra!r}{options})
async def extra(run):
    return None
"""
CHECK_ENTRY = """\
import json, sys
sys.path.insert(0, sys.argv[1])
import entry
from haze_cloudflare.workflows import HazeWorkflow
out = {name: {"workflow": cls.workflow, "base": issubclass(cls, HazeWorkflow),
              "root": cls.app_root == entry.APP_ROOT}
       for name, cls in vars(entry).items()
       if isinstance(cls, type) and name.endswith("Workflow") and cls is not HazeWorkflow}
import haze, haze_cloudflare
out["_from"] = [haze.__file__, haze_cloudflare.__file__]
print(json.dumps(out))
"""


def write_app(root: Path, *, native: bool = True, extra: str = "import", options: str = "") -> Path:
    files = {
        "config/queue.py": QUEUE_PY.format(native=', "workflows": "native"' if native else ""),
        "config/cache.py": CACHE_PY,
        "app/job/bld_cf_flows.py": FLOWS_PY.format(extra=extra, options=options),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def build(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "haze.cli", "--root", str(root)),
            *("build", "--preset", "cloudflare", "--out", str(out)),
        ],
        env={**os.environ, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_one_workflow_class_and_wrangler_entry_per_workflow(tmp_path: Path) -> None:
    root = write_app(tmp_path / "src")
    proc = build(root, tmp_path / "dist")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wrangler = json.loads((tmp_path / "dist" / "wrangler.json").read_text())
    assert wrangler["workflows"] == [
        {"name": "import", "binding": "HAZE_WF_IMPORT", "class_name": "ImportWorkflow"},
        {
            "name": "send-receipt",
            "binding": "HAZE_WF_SEND_RECEIPT",
            "class_name": "SendReceiptWorkflow",
        },
        {"name": "signup", "binding": "HAZE_WF_SIGNUP", "class_name": "SignupWorkflow"},
    ]
    src = tmp_path / "dist" / "cloudflare" / "src"
    ran = subprocess.run(
        [sys.executable, "-c", CHECK_ENTRY, str(src)],
        env={k: v for k, v in os.environ.items() if k != "HAZE_APP_ROOT"},
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    classes = json.loads(ran.stdout.strip().splitlines()[-1])
    assert all(path.startswith(str(src)) for path in classes.pop("_from"))
    assert classes == {
        "ImportWorkflow": {"workflow": "import", "base": True, "root": True},
        "SendReceiptWorkflow": {"workflow": "send-receipt", "base": True, "root": True},
        "SignupWorkflow": {"workflow": "signup", "base": True, "root": True},
    }
    assert "Cloudflare Workflows: import, send-receipt, signup" in proc.stdout


def test_a_store_engine_app_gets_no_workflow_classes(tmp_path: Path) -> None:
    proc = build(write_app(tmp_path / "src", native=False), tmp_path / "dist")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "workflows" not in json.loads((tmp_path / "dist" / "wrangler.json").read_text())
    entry = (tmp_path / "dist" / "cloudflare" / "src" / "entry.py").read_text()
    assert "HazeWorkflow" not in entry


def refused(tmp_path: Path, **app: str) -> str:
    proc = build(write_app(tmp_path / "src", **app), tmp_path / "dist")  # type: ignore[arg-type]
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert not (tmp_path / "dist" / "wrangler.json").exists()
    return lines[0]


def test_a_name_cloudflare_cannot_take_is_one_line(tmp_path: Path) -> None:
    line = refused(tmp_path, extra="billing.monthly")
    assert 'workflow "billing.monthly"' in line and "1-64 of A-Z a-z 0-9 _ -" in line


def test_whole_run_tries_are_one_line(tmp_path: Path) -> None:
    line = refused(tmp_path, extra="nightly", options=", tries=2")
    assert 'workflow "nightly"' in line and "tries=2" in line and "Cloudflare Workflows" in line


def test_two_names_making_one_class_are_one_line(tmp_path: Path) -> None:
    line = refused(tmp_path, extra="send_receipt")
    assert "SendReceiptWorkflow" in line
