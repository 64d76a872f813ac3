"""``haze build --preset cloudflare``, tested by running what it writes.

Real: the build (``haze build`` through its CLI), Pyodide (npm ``pyodide`` under
Node.js, offline: ``tests/pyodide/run.mjs``), the generated
``dist/cloudflare/src/entry.py`` and the vendored ``haze`` and ``haze_cloudflare`` copies,
installed from wheels made of the build output with ``pyodide.loadPackage``, and
wrangler itself (``wrangler deploy --dry-run``, offline, with the npm ``wrangler`` of
``tests/cloudflare``) reading ``dist/wrangler.json`` and the top-level ``wrangler.toml``.

Stand-in: Cloudflare Queues and KV, as ``cf_queue_sim.js`` (see test_cf_pyodide.py),
configured from the consumer the build derived (``max_retries``, dead-letter queue,
batch size), so the derived values are what the batch runs under.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from cf_build import npm_ci, pure_wheel, pyodide_node, run_pyodide, tool_missing
from click.testing import CliRunner
from haze._base.errors import ConfigError
from haze.cli import get_cli

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WRANGLER_DIR = ROOT / "tests" / "cloudflare"

QUEUE_PY = """\
from haze import define_queue_config

config = define_queue_config(
    default="cloudflare",
    connections={
        "cloudflare": {"driver": "cloudflare", "binding": "QUEUE", "failed_store": "kv"},
        "memory": {"driver": "memory"},
    },
    store="kv",
    batches={"store": "kv", "ttl": "1d"},
)
"""

CACHE_PY = """\
from haze import define_cache_config

config = define_cache_config(default="kv", stores={"kv": {"driver": "kv", "binding": "KV"}})
"""

JOBS_PY = """\
from haze import JobContext, define_job

RUNS: list = []


@define_job(tries=1)
async def bld_cf_ok(payload: dict, job: JobContext) -> None:
    RUNS.append(["ok", payload["key"], job.attempt])


@define_job(tries=3, backoff=[2, 5])
async def bld_cf_flaky(payload: dict, job: JobContext) -> None:
    RUNS.append(["flaky", payload["key"], job.attempt])
    if job.attempt < payload["ok_at"]:
        raise RuntimeError(f"flaky {payload['key']} attempt {job.attempt}")


@define_job(tries=2, backoff=1)
async def bld_cf_dead(payload: dict, job: JobContext) -> None:
    RUNS.append(["dead", payload["key"], job.attempt])
    raise ValueError(f"dead {payload['key']}")
"""

HAZE_CONFIG_PY = """\
from haze import define_haze_config

config = define_haze_config(
    cloudflare={
        "wrangler": {
            "name": "bld-cf",
            "queues": {
                "producers": [{"binding": "QUEUE", "queue": "bld-jobs"}],
                "consumers": [
                    {"queue": "bld-jobs", "max_batch_size": 5},
                    {"queue": "bld-other", "max_batch_size": 1},
                ],
            },
            "kv_namespaces": [{"binding": "KV", "id": "0123456789abcdef0123456789abcdef"}],
            "compatibility_flags": ["nodejs_compat"],
            "vars": {"HAZE_ENV": "test"},
            "observability": {"enabled": True},
        }
    }
)
"""


def write_app(root: Path, *, haze_config: bool = True) -> Path:
    (root / "config").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(QUEUE_PY)
    (root / "config" / "cache.py").write_text(CACHE_PY)
    (root / "app" / "job").mkdir(parents=True)
    (root / "app" / "__init__.py").write_text("")
    (root / "app" / "job" / "__init__.py").write_text("")
    (root / "app" / "job" / "bld_cf_jobs.py").write_text(JOBS_PY)
    if haze_config:
        (root / "haze.config.py").write_text(HAZE_CONFIG_PY)
    return root


def build_in_subprocess(root: Path, out: Path) -> str:
    """``haze build --preset cloudflare`` in a process of its own: an app's job package is
    ``app``, which only one app per process can own."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "haze.cli", "--root", str(root)),
            *("build", "--preset", "cloudflare", "--out", str(out)),
        ],
        env={**os.environ, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test app built with ``haze build --preset cloudflare --out DIST``."""
    root = write_app(tmp_path_factory.mktemp("bld_cf") / "bldapp")
    dist = root.parent / "dist"
    output = build_in_subprocess(root, dist)
    assert "wrangler.json" in output
    assert "npx wrangler queues create bld-jobs; npx wrangler queues create bld-jobs-dlq" in output
    return dist


# --------------------------------------------------------------------------- wrangler.json


def test_wrangler_json_is_derived_then_merged_with_haze_config(built: Path) -> None:
    w = json.loads((built / "wrangler.json").read_text())
    assert w["name"] == "bld-cf"
    assert w["main"] == "cloudflare/src/entry.py"
    assert (built / w["main"]).is_file()
    assert w["compatibility_date"]
    # derived python_workers first, the app's flag added
    assert w["compatibility_flags"] == ["python_workers", "nodejs_compat"]
    assert w["queues"]["producers"] == [{"binding": "QUEUE", "queue": "bld-jobs"}]
    # bld-jobs: derived settings (max tries 3 -> max_retries 2, DLQ) with the app's
    # batch size merged in; bld-other: only in haze.config.py, kept as given
    assert w["queues"]["consumers"] == [
        {
            "queue": "bld-jobs",
            "max_batch_size": 5,
            "max_batch_timeout": 5,
            "max_retries": 2,
            "dead_letter_queue": "bld-jobs-dlq",
        },
        {"queue": "bld-other", "max_batch_size": 1},
    ]
    # the kv store's binding, with the namespace id from haze.config.py
    assert w["kv_namespaces"] == [{"binding": "KV", "id": "0123456789abcdef0123456789abcdef"}]
    assert w["vars"] == {"HAZE_ENV": "test"}
    assert w["observability"] == {"enabled": True}
    assert "d1_databases" not in w


def test_bundle_layout(built: Path) -> None:
    src = built / "cloudflare" / "src"
    entry = (src / "entry.py").read_text()
    assert "class Default(QueueWorker):" in entry
    for path in (
        "haze/__init__.py",
        "haze/drivers/sql/sqlite.sql",
        "haze_cloudflare/worker.py",
        "config/queue.py",
        "app/job/bld_cf_jobs.py",
        "haze.config.py",
    ):
        assert (src / path).is_file(), path
    assert not list(src.rglob("__pycache__"))


def _wrangler() -> Path:
    if shutil.which("node") is None:
        tool_missing("Node.js is not installed")
    npm_ci(WRANGLER_DIR, "wrangler")
    exe = WRANGLER_DIR / "node_modules" / ".bin" / "wrangler"
    if not exe.exists():
        pytest.skip("wrangler is not installed in tests/cloudflare")
    return exe


def _dry_run(config: Path, outdir: Path, cwd: Path) -> str:
    env = {
        **os.environ,
        "CI": "1",
        "WRANGLER_SEND_METRICS": "false",
        "WRANGLER_LOG_PATH": str(outdir.parent / "wrangler-logs"),
        "XDG_CONFIG_HOME": str(outdir.parent / "xdg"),
    }
    proc = subprocess.run(
        [str(_wrangler()), "deploy", "--dry-run", "--outdir", str(outdir), "-c", str(config)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def test_wrangler_accepts_the_generated_config(built: Path, tmp_path: Path) -> None:
    out = _dry_run(built / "wrangler.json", tmp_path / "out", built)
    # wrangler found the entry, uploads the vendored packages as the Worker's modules
    # and binds what the config names
    assert (tmp_path / "out" / "entry.py").read_text() == (
        built / "cloudflare" / "src" / "entry.py"
    ).read_text()
    for path in ("haze/__init__.py", "haze_cloudflare/worker.py", "app/job/bld_cf_jobs.py"):
        assert (tmp_path / "out" / path).is_file(), path
    assert (tmp_path / "out" / "haze/stores/redis_increment.lua").is_file()  # the Lua rule
    assert "env.QUEUE (bld-jobs)" in out
    assert "env.KV (0123456789abcdef0123456789abcdef)" in out
    assert "env.HAZE_ENV" in out


def test_top_level_wrangler_toml_deploys_the_example(tmp_path: Path) -> None:
    toml_path = ROOT / "wrangler.toml"
    text = toml_path.read_text()
    toml = tomllib.loads(text)
    # build the example where the toml expects it, then let wrangler read a copy of the
    # toml without its [build] step (which would rebuild into the repository)
    project = tmp_path / "project"
    shutil.copytree(
        ROOT / "examples",
        project / "examples",
        ignore=shutil.ignore_patterns("dist", "storage", "__pycache__", "*.db"),
    )
    build_in_subprocess(project / "examples", project / "dist")
    assert toml["main"] == "dist/cloudflare/src/entry.py"
    assert toml["build"]["command"].endswith("build --preset cloudflare --out dist")
    copy = dict(toml)
    del copy["build"]
    (project / "wrangler.json").write_text(json.dumps(copy))
    out = _dry_run(project / "wrangler.json", tmp_path / "out", project)
    assert (tmp_path / "out" / "haze" / "__init__.py").is_file()
    assert "env.QUEUE (haze-example-cloudflare)" in out
    assert "env.DB (haze-example)" in out
    # the toml and the derived dist/wrangler.json describe the same Worker
    derived = json.loads((project / "dist" / "wrangler.json").read_text())
    for key in ("name", "compatibility_date", "compatibility_flags", "queues", "vars"):
        assert toml[key] == derived[key], key
    # the same D1 database, each config naming the same migrations from where it is
    (ours,), (theirs,) = toml["d1_databases"], derived["d1_databases"]
    assert {**ours, "migrations_dir": None} == {**theirs, "migrations_dir": None}
    assert sorted(p.name for p in (ROOT / ours["migrations_dir"]).glob("*.sql")) == sorted(
        p.name for p in (project / "dist" / theirs["migrations_dir"]).glob("*.sql")
    )
    consumer = toml["queues"]["consumers"][0]
    assert consumer["max_retries"] == 2  # publish_post: 3 tries
    assert consumer["dead_letter_queue"] == "haze-example-cloudflare-dlq"


# --------------------------------------------------------------------------- errors


def test_an_app_without_a_cloudflare_connection_is_told_what_to_add(tmp_path: Path) -> None:
    from haze.build import build

    root = write_app(tmp_path / "app", haze_config=False)
    (root / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(default='memory', connections={'memory': "
        "{'driver': 'memory'}})\n"
    )
    (root / "config" / "cache.py").unlink()
    (root / "app" / "job" / "bld_cf_jobs.py").unlink()  # its job names are taken here
    with pytest.raises(ConfigError) as e:
        build(root, "cloudflare", tmp_path / "dist")
    message = str(e.value)
    assert str(root / "config" / "queue.py") in message
    assert "connections" in message
    assert '"driver": "cloudflare"' in message
    assert not (tmp_path / "dist" / "wrangler.json").exists()
    result = CliRunner().invoke(get_cli(), ["--root", str(root), "build", "--preset", "cloudflare"])
    assert result.exit_code == 1
    assert "no connection uses the cloudflare driver" in result.output


def test_the_notes_name_the_apps_requirements_txt_only_when_it_has_one(tmp_path: Path) -> None:
    root = write_app(tmp_path / "app")
    (root / "app" / "job" / "bld_cf_cron.py").write_text(
        "from haze import define_job, schedule\n"
        "@define_job(name='bld_cf_cron')\n"
        "async def bld_cf_cron() -> None: ...\n"
        "schedule(bld_cf_cron, cron='* * * * *')\n"
    )  # a schedule vendors cronsim beside haze: pinned in pyproject.toml, not the app's
    without = build_in_subprocess(root, tmp_path / "dist1")
    assert "cronsim==" in (tmp_path / "dist1" / "cloudflare" / "pyproject.toml").read_text()
    assert "requirements.txt" not in without, without
    (root / "requirements.txt").write_text("humanize>=4\n")
    with_one = build_in_subprocess(root, tmp_path / "dist2")
    assert "the app's requirements.txt (humanize>=4) is in" in " ".join(with_one.split())


# --------------------------------------------------------------------------- Pyodide


def bundle_wheels(src: Path, out: Path) -> list[Path]:
    """Wheels of the build output: the vendored haze and haze_cloudflare, and the rest of
    ``src/`` (entry.py, config/, app/) as the app, installed at the top level as the
    Workers runtime puts the Worker's modules on ``sys.path``."""
    groups: dict[str, dict[str, bytes]] = {"haze": {}, "haze_cloudflare": {}, "bld_cf_app": {}}
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        arc = path.relative_to(src).as_posix()
        top = arc.split("/", 1)[0]
        groups[top if top in groups else "bld_cf_app"][arc] = path.read_bytes()
    assert "entry.py" in groups["bld_cf_app"]
    return [pure_wheel(out, name, files) for name, files in groups.items()]


@pytest.fixture(scope="module")
def pyodide_run(built: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = pyodide_node()
    work = tmp_path_factory.mktemp("bld_cf_pyodide")
    wheels = bundle_wheels(built / "cloudflare" / "src", work)
    wrangler = json.loads((built / "wrangler.json").read_text())
    (consumer,) = [c for c in wrangler["queues"]["consumers"] if c["queue"] == "bld-jobs"]
    script = work / "cf_build_scenarios.py"
    script.write_text(
        f"SIM_JS = {json.dumps((HERE / 'cf_queue_sim.js').read_text())}\n"
        f"CONSUMER = {json.dumps(consumer)}\n" + (HERE / "cf_build_scenarios.py").read_text()
    )
    result: dict[str, Any] = run_pyodide(node, script, 240, wheels)
    return result


def _calls(v: dict[str, Any], job_id: str) -> list[list[Any]]:
    (send,) = [s for s in v["sends"] if s["body"]["id"] == job_id]
    return [c[1:] for c in v["calls"] if c[0] == send["id"]]


@pytest.mark.pyodide
def test_generated_entry_loads_from_wheels_in_pyodide(pyodide_run: dict[str, Any]) -> None:
    env = pyodide_run["environment"]
    assert env["platform"] == "emscripten"
    for key in ("haze_file", "adapter_file", "entry_file", "jobs_file"):
        assert "site-packages" in env[key], (key, env[key])
    assert env["is_queue_worker"]
    assert env["default_mro"][:2] == ["entry.Default", "haze_cloudflare.worker.QueueWorker"]
    # the bundled app is the one beside entry.py
    assert env["app_root"] == env["entry_dir"] == env["app_root_used"]
    assert env["config_source"] == f"{env['entry_dir']}/config/queue.py"


@pytest.mark.pyodide
def test_generated_entry_acks_retries_and_counts_attempts(pyodide_run: dict[str, Any]) -> None:
    v = pyodide_run
    ids = v["ids"]
    assert all(s["via"] == "send" for s in v["sends"])
    assert _calls(v, ids["ok"]) == [["ack"]]
    # retry(delaySeconds=haze backoff) until the third delivery succeeds; the job sees
    # Cloudflare's attempts counter
    assert _calls(v, ids["flaky"]) == [["retry", 2], ["retry", 5], ["ack"]]
    assert [r[2] for r in v["runs"] if r[0] == "flaky"] == [1, 2, 3]
    # tries=2: one retry, then haze's own final failure (failed store, ack) comes before
    # the queue's derived max_retries would dead-letter it
    assert _calls(v, ids["dead"]) == [["retry", 1], ["ack"]]
    assert [r[2] for r in v["runs"] if r[0] == "dead"] == [1, 2]
    (failed,) = v["failed"]
    assert failed["id"] == ids["dead"]
    assert failed["name"] == "bld_cf_dead"
    assert failed["connection"] == "cloudflare"
    assert "dead d" in failed["exception"]
    assert v["dead"] == [] and v["dlq"] == []
    assert v["size"] == 0
    assert sorted(v["outcomes"]).count("failed") == 1


# --------------------------------------------------------------------------- the Worker's view


def _app(
    queue: dict[str, Any], cache: dict[str, Any] | None = None, db: dict[str, Any] | None = None
) -> Any:
    from haze import App, define_cache_config, define_database_config, define_queue_config

    return App(
        queue=define_queue_config(**queue),
        cache=define_cache_config(**(cache or {"stores": {}})),
        database=define_database_config(**(db or {"connections": {}})),
    )


CF = {"driver": "cloudflare", "binding": "QUEUE"}
SQLITE = {"default": "main", "connections": {"main": {"url": "sqlite:///storage/app.db"}}}
D1 = {"default": "main", "connections": {"main": {"url": "d1://acct/db"}}}


@pytest.mark.parametrize(
    ("queue", "cache", "db", "expected"),
    [
        pytest.param(  # the example app's laptop config, read without the Worker's vars
            {
                "default": "database",
                "connections": {"database": {"driver": "database"}, "cloudflare": CF},
            },
            None,
            SQLITE,
            [
                "the default connection 'database' is a SQLite file",
                "the lock and batch store 'database' (config/queue.py store/batches) is a SQLite file",
                "connection 'cloudflare' has no failed_store",
            ],
            id="sqlite",
        ),
        pytest.param(
            {
                "default": "cloudflare",
                "connections": {"cloudflare": {**CF, "failed_store": "pg"}},
                "store": "mem",
            },
            {"stores": {"mem": {"driver": "memory"}}},
            {"default": "pg", "connections": {"pg": {"url": "postgresql://db.internal/app"}}},
            [
                "the lock and batch store 'mem' (config/queue.py store/batches) is a memory store",
                "connection 'cloudflare': failed_store 'pg' is a postgres server over TCP",
            ],
            id="memory-store-tcp-failed-store",
        ),
        pytest.param(  # the prefixed form resolves as the driver resolves it
            {
                "default": "cloudflare",
                "connections": {"cloudflare": {**CF, "failed_store": "database:pg"}},
            },
            None,
            {
                "default": "main",
                "connections": {
                    "main": {"url": "d1://acct/db"},
                    "pg": {"url": "postgresql://db.internal/app"},
                },
            },
            [
                "the lock and batch store 'database' (config/queue.py store/batches) is a "
                "postgres server over TCP",
                "connection 'cloudflare': failed_store 'database:pg' is a postgres server over TCP",
            ],
            id="prefixed-tcp-failed-store",
        ),
        pytest.param(
            {
                "default": "redis",
                "connections": {
                    "redis": {"driver": "redis"},
                    "cloudflare": {**CF, "failed_store": "main"},
                },
                "store": "kv",
                "batches": {"store": "mem"},
            },
            {"stores": {"kv": {"driver": "kv", "binding": "KV"}, "mem": {"driver": "memory"}}},
            D1,
            [
                "the default connection 'redis' is Redis over TCP",
                "the batch store 'mem' (config/queue.py store/batches) is a memory store",
            ],
            id="redis-default-memory-batches",
        ),
        pytest.param(  # what a Worker can use: Queues, D1 (locks, batches, failed jobs)
            {
                "default": "cloudflare",
                "connections": {"cloudflare": {**CF, "failed_store": "main"}},
            },
            None,
            D1,
            [],
            id="worker-ready",
        ),
    ],
)
def test_worker_warnings_name_what_a_worker_cannot_reach(
    queue: dict[str, Any], cache: Any, db: Any, expected: list[str]
) -> None:
    from haze.build.cloudflare import worker_warnings

    warnings = worker_warnings(_app(queue, cache, db))
    assert len(warnings) == len(expected), warnings
    for warning, start in zip(warnings, expected, strict=True):
        assert warning.startswith(start), (warning, start)


def _example_copy(root: Path) -> Path:
    shutil.copytree(
        ROOT / "examples",
        root,
        ignore=shutil.ignore_patterns("dist", "storage", "__pycache__", "*.db"),
    )
    return root


def test_the_build_reads_the_config_with_the_workers_vars(tmp_path: Path) -> None:
    # the example as shipped: its cloudflare environment (vars) makes the Worker's
    # default connection cloudflare and its database D1, so nothing to warn about
    example = _example_copy(tmp_path / "example")
    out = build_in_subprocess(example, tmp_path / "dist")
    assert "warning" not in out, out
    w = json.loads((tmp_path / "dist" / "wrangler.json").read_text())
    assert w["vars"] == {"QUEUE_CONNECTION": "cloudflare", "DATABASE_URL": "d1://DB"}
    (d1,) = w["d1_databases"]
    assert d1["binding"] == "DB"
    assert d1["migrations_dir"] == "cloudflare/src/database/migrations"
    migrations = tmp_path / "dist" / d1["migrations_dir"]
    assert sorted(p.name for p in migrations.glob("*.sql")) == sorted(
        p.name for p in (ROOT / "examples" / "database" / "migrations").glob("*.sql")
    )
    assert "npx wrangler d1 migrations apply haze-example --remote" in out
    # without the vars, the same files configure a SQLite app: the build says what fails
    config = example / "haze.config.py"
    text = config.read_text()
    start = text.index('            "vars"')
    config.write_text(text[:start] + text[text.index("\n", start) + 1 :])
    out = build_in_subprocess(example, tmp_path / "dist2")
    assert "warning: the default connection 'database' is a SQLite file" in out
    assert "warning: the lock and batch store 'database'" in out
    assert 'QUEUE_CONNECTION = "cloudflare"' in out


def test_a_python_migration_is_rendered_as_d1_sql(tmp_path: Path) -> None:
    # `haze make:queue-tables` writes a .py migration (its SQL chosen when applied);
    # `wrangler d1 migrations apply` reads .sql files only, so the build renders it for D1
    example = _example_copy(tmp_path / "example")
    migrations = example / "database" / "migrations"
    (old,) = migrations.glob("*_create_jobs_and_failed_jobs_tables.sql")
    old.unlink()
    old.with_suffix(".py").write_text(
        "from haze.connectors.migrations import queue_tables\n\nup = queue_tables()\n"
    )
    build_in_subprocess(example, tmp_path / "dist")
    (d1,) = json.loads((tmp_path / "dist" / "wrangler.json").read_text())["d1_databases"]
    rendered = (tmp_path / "dist" / d1["migrations_dir"] / f"{old.stem}.sql").read_text()
    assert "id INTEGER PRIMARY KEY AUTOINCREMENT" in rendered
    assert "CREATE INDEX IF NOT EXISTS failed_jobs_failed_at_idx" in rendered


def test_the_compatibility_date_runs_a_pyodide_the_tests_cover(built: Path, tmp_path: Path) -> None:
    from haze.build.cloudflare import TESTED_PYODIDE, pyodide_of

    w = json.loads((built / "wrangler.json").read_text())
    assert pyodide_of(w["compatibility_date"]) == ("3.13", "0.28.2")
    pins = {
        json.loads((ROOT / d / "package.json").read_text())["dependencies"]["pyodide"]
        for d in ("tests/pyodide", "tests/pyodide-0.28")
    }
    assert "0.28.2" in pins and any(p.startswith("314.") for p in pins)
    assert {"0.28.2", "314"} == set(TESTED_PYODIDE)
    assert pyodide_of("2026-10-01") == ("3.14", "314")
    assert pyodide_of("2025-01-01") is None  # Python 3.12: not tested
    # a date the tests do not cover is a warning of the build
    root = write_app(tmp_path / "app")
    config = root / "haze.config.py"
    config.write_text(
        config.read_text().replace(
            '"name": "bld-cf",', '"name": "bld-cf", "compatibility_date": "2025-01-01",'
        )
    )
    out = build_in_subprocess(root, tmp_path / "dist")
    assert "warning: compatibility_date '2025-01-01' runs a Python haze is not tested on" in out


# --------------------------------------------------------------------------- pywrangler


def test_dist_cloudflare_is_a_pywrangler_project(built: Path) -> None:
    import zipfile

    project = built / "cloudflare"
    py = tomllib.loads((project / "pyproject.toml").read_text())
    assert py["project"]["requires-python"] == ">=3.13"
    assert py["project"]["dependencies"] == ["haze-jobs", "haze-cloudflare"]
    assert sorted(py["dependency-groups"]["dev"]) == ["workers-py", "workers-runtime-sdk"]
    sources = py["tool"]["uv"]["sources"]
    assert sorted(sources) == ["haze-cloudflare", "haze-jobs"]
    for dist, package in (("haze-jobs", "haze"), ("haze-cloudflare", "haze_cloudflare")):
        wheel = project / sources[dist]["path"]
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
        assert f"{package}/__init__.py" in names
        # the wheel holds the runtime vendored under src/: one haze, two ways to ship it
        for name in (n for n in names if n.startswith(f"{package}/")):
            assert (project / "src" / name).is_file(), name
    # pywrangler reads wrangler.jsonc/wrangler.toml beside pyproject.toml
    jsonc = json.loads((project / "wrangler.jsonc").read_text())
    assert jsonc["main"] == "src/entry.py" and (project / jsonc["main"]).is_file()
    dist = json.loads((built / "wrangler.json").read_text())
    assert {k: v for k, v in jsonc.items() if k != "main"} == {
        k: v for k, v in dist.items() if k != "main"
    }


@pytest.fixture(scope="module")
def pywrangler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cloudflare's pywrangler (PyPI ``workers-py``) in a virtualenv of its own: it brings
    ``workers-runtime-sdk``, whose top-level modules (``webbrowser``, ``asgi``) must not
    shadow the standard library of the workspace's environment."""
    uv = shutil.which("uv")
    if uv is None:
        tool_missing("uv is not installed")
    venv = tmp_path_factory.mktemp("pywrangler") / "venv"
    for cmd in (
        [uv, "venv", "-q", "-p", sys.executable, str(venv)],
        [uv, "pip", "install", "-q", "-p", str(venv / "bin" / "python"), "workers-py==1.17.9"],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            pytest.skip(f"cannot install workers-py (offline?): {proc.stderr[-1000:]}")
    return venv / "bin" / "pywrangler"


def test_pywrangler_sync_reads_the_project(built: Path, pywrangler: Path, tmp_path: Path) -> None:
    """Real ``pywrangler sync`` in the built project: it must accept the project and derive
    Python 3.13 from the pinned compatibility date. Its next steps have uv download
    interpreters from GitHub (CPython 3.13 when none is installed, and the Pyodide one)
    and resolve against index.pyodide.org: uv runs offline here, with a cache of its own,
    so the step ends in seconds whatever the network does (a download that hangs, or
    another uv holding the shared cache's lock, once took it past 300 s on a loaded box).
    The vendoring it would do is done by test_synced_python_modules_load_under_pyodide
    with the same uv commands."""
    project = tmp_path / "cloudflare"
    shutil.copytree(built / "cloudflare", project)
    offline = {"UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
    proc = subprocess.run(
        [str(pywrangler), "--debug", "sync"],
        cwd=project,
        env={
            **os.environ,
            **offline,
            "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
            "COLUMNS": "200",  # its log lines unwrapped
            "PATH": f"{pywrangler.parent}{os.pathsep}{os.environ['PATH']}",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    read = "pyproject.toml" in out and "Sync needed - proceeding with installation" in out
    assert read and "not found in " not in out, out[-3000:]  # its project files
    assert "Using python version from wrangler config: 3.13" in out, out[-3000:]
    if proc.returncode == 0:
        assert (project / "python_modules" / "haze" / "__init__.py").is_file()
        assert (project / "python_modules" / "haze_cloudflare" / "worker.py").is_file()
    else:
        # the project was read; what failed is a uv step that needs an interpreter or
        # a package this machine does not have offline
        assert "Error running command: uv " in out, out[-3000:]


def pywrangler_vendor(project: Path) -> Path:
    """What ``pywrangler sync`` does after creating its Pyodide interpreter: resolve
    pyproject.toml (its [tool.uv.sources] included) plus ``workers-runtime-sdk`` for
    Pyodide with prebuilt wheels only, and install the result into python_modules/
    (here with uv's wasm32-pyodide2024 platform target instead of that interpreter, and a
    requirements file instead of its pylock.toml)."""
    uv = shutil.which("uv")
    if uv is None:
        tool_missing("uv is not installed")
    target = ["--python-platform", "wasm32-pyodide2024", "--python-version", "3.13"]
    extra = project / "sdk.txt"
    extra.write_text("workers-runtime-sdk\n")
    lock = subprocess.run(
        [
            uv,
            "pip",
            "compile",
            "pyproject.toml",
            str(extra),
            *target,
            "--no-build",
            "-o",
            "resolved.txt",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if (
        lock.returncode != 0
        and "workers-runtime-sdk" in lock.stderr
        and "network" in lock.stderr.lower()
    ):
        pytest.skip(f"PyPI unreachable: {lock.stderr[-1000:]}")
    assert lock.returncode == 0, lock.stderr
    install = subprocess.run(
        [
            *(uv, "pip", "install", "--target", "python_modules", *target),
            *("--only-binary", ":all:", "-r", "resolved.txt"),
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    return project / "python_modules"


@pytest.mark.pyodide
def test_synced_python_modules_load_under_pyodide(built: Path, tmp_path: Path) -> None:
    """The project as pywrangler leaves it (python_modules/ from the pyproject.toml), with
    the runtime taken from python_modules/ only (the copy under src/ removed), loads in
    Pyodide and runs a queue() batch the way test_generated_entry_* do."""
    node = pyodide_node()
    project = tmp_path / "cloudflare"
    shutil.copytree(built / "cloudflare", project)
    modules = pywrangler_vendor(project)
    assert (modules / "haze" / "__init__.py").is_file()
    assert (modules / "workers" / "__init__.py").is_file()  # the SDK pywrangler adds
    for package in ("haze", "haze_cloudflare"):
        shutil.rmtree(project / "src" / package)
    wrangler = json.loads((project / "wrangler.jsonc").read_text())
    (consumer,) = [c for c in wrangler["queues"]["consumers"] if c["queue"] == "bld-jobs"]
    script = tmp_path / "synced.py"
    # the Workers runtime puts the Worker's modules (src/) and python_modules/ on sys.path
    script.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(project / 'src')!r}, {str(modules)!r}]\n"
        f"SIM_JS = {json.dumps((HERE / 'cf_queue_sim.js').read_text())}\n"
        f"CONSUMER = {json.dumps(consumer)}\n" + (HERE / "cf_build_scenarios.py").read_text()
    )
    v = run_pyodide(node, script, 240, mount=project)
    env = v["environment"]
    assert env["haze_file"] == str(modules / "haze" / "__init__.py")
    assert env["adapter_file"] == str(modules / "haze_cloudflare" / "__init__.py")
    assert env["entry_file"] == str(project / "src" / "entry.py")
    assert env["is_queue_worker"]
    # python_modules/workers (workers-runtime-sdk) needs the Workers runtime's own JS
    # modules to import; outside it the adapter falls back to its local base class
    assert env["default_mro"][1:3] == [
        "haze_cloudflare.worker.QueueWorker",
        "haze_cloudflare.worker._Base",
    ]
    assert _calls(v, v["ids"]["ok"]) == [["ack"]]
    assert _calls(v, v["ids"]["flaky"]) == [["retry", 2], ["retry", 5], ["ack"]]
    (failed,) = v["failed"]
    assert failed["name"] == "bld_cf_dead"


def test_packages_vendored_beside_haze_are_pinned_in_the_project() -> None:
    from importlib import metadata

    from haze.build.cloudflare import _pins, pyproject_source

    pins = _pins(["click", "not_an_installed_package"])
    assert pins == [f"click=={metadata.version('click')}"]
    text = pyproject_source("w", {"haze": "wheels/haze.whl"}, [*pins, "httpx>=0.27"])
    project = tomllib.loads(text)["project"]
    assert project["dependencies"] == ["haze", pins[0], "httpx>=0.27"]


def test_wrangler_deploys_the_synced_project(built: Path, tmp_path: Path) -> None:
    """``pywrangler deploy`` is sync, then wrangler with the project's wrangler.jsonc:
    wrangler's dry run of the synced project uploads the entry, the app and
    python_modules/ (the runtime as pywrangler vendored it, the SDK's JS modules)."""
    project = tmp_path / "cloudflare"
    shutil.copytree(built / "cloudflare", project)
    pywrangler_vendor(project)
    out = _dry_run(project / "wrangler.jsonc", tmp_path / "out", project)
    bundle = tmp_path / "out"
    assert (bundle / "entry.py").read_text() == (project / "src" / "entry.py").read_text()
    for path in (
        "app/job/bld_cf_jobs.py",
        "python_modules/haze/__init__.py",
        "python_modules/haze_cloudflare/worker.py",
        "python_modules/workers/__init__.py",
    ):
        assert (bundle / path).is_file(), path
    assert "env.QUEUE (bld-jobs)" in out


def test_a_long_app_name_gives_queue_names_cloudflare_accepts(tmp_path: Path) -> None:
    """Queue names are at most 63 characters: the dead-letter queue too, and two
    connections must not be cut to one name."""
    root = write_app(tmp_path / ("a" * 80), haze_config=False)
    (root / "config" / "queue.py").write_text(
        QUEUE_PY.replace(
            '"memory": {"driver": "memory"},',
            '"cloudflare2": {"driver": "cloudflare", "binding": "OTHER", "failed_store": "kv"},',
        )
    )
    build_in_subprocess(root, tmp_path / "dist")
    config = json.loads((tmp_path / "dist" / "wrangler.json").read_text())
    queues = config["queues"]
    names = [p["queue"] for p in queues["producers"]]
    dlqs = [c["dead_letter_queue"] for c in queues["consumers"]]
    assert len(set(names)) == 2, names
    for name in [*names, *dlqs, config["name"]]:
        assert len(name) <= 63, name
