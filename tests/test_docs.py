"""The README's and the docs' Python blocks run as shown (``tests/docs_blocks.py``), and
the example app (``examples/main.py``, the README's first command) runs end to end.

Each document runs in its own process in an empty folder, so the blocks must carry
their own imports and files. A block that cannot run here is marked in the Markdown
with ``<!-- docs-test: skip REASON -->``; the reasons are checked to exist, and the
number of skips is pinned so a new one is a deliberate change.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from docs_blocks import blocks
from haze import App, define_queue_config
from haze.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Values the blocks read from the environment, as a deployed app would have them.
DOC_ENV = {
    "HAZE_HTTP_SECRET": "docs-test-secret",
    "SQS_URL": "https://sqs.eu-west-1.amazonaws.com/000000000000/docs-{queue}",
}


def run_doc(doc: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAZE_", "QUEUE_"))}
    env.update(DOC_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(REPO / "tests" / "docs_blocks.py"), str(doc), str(workdir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_python_blocks_run(doc: Path, tmp_path: Path) -> None:
    found = blocks(doc.read_text(encoding="utf-8"))
    if not found:
        pytest.skip(f"{doc.name} has no Python blocks")
    result = run_doc(doc, tmp_path / "app")
    assert result.returncode == 0, f"{doc.name}\n{result.stdout}\n{result.stderr}"
    done = [
        ln for ln in result.stdout.splitlines() if ln.startswith(("ran ", "wrote ", "skipped "))
    ]
    assert len(done) == len(found), result.stdout


def test_skips_are_few_and_explained() -> None:
    skipped = {
        doc.name: [b.skip for b in blocks(doc.read_text(encoding="utf-8")) if b.skip is not None]
        for doc in DOCS
    }
    for name, reasons in skipped.items():
        assert all(reasons), f"{name}: a skip marker without a reason"
    counts = {name: len(reasons) for name, reasons in skipped.items() if reasons}
    # Pulumi programs need the Pulumi engine and a cloud account; framework recipes
    # need frameworks the workspace does not install; one block calls a live server.
    assert counts == {
        "aws-lambda.md": 1,
        "container.md": 1,
        "frameworks.md": 2,
        "infra.md": 5,
    }, counts


def test_no_document_cites_the_spec_or_the_seed() -> None:
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for word in ("SPEC", "the seed", "seed's", "hazejs docs", "§"):
            assert word not in text, f"{doc.name} mentions {word!r}"


def test_the_example_app_runs_end_to_end(tmp_path: Path) -> None:
    """``examples/main.py`` (``scripts/demo``) on a copy of examples/: the README's demo."""
    import shutil

    copy = tmp_path / "examples"
    shutil.copytree(
        REPO / "examples", copy, ignore=shutil.ignore_patterns("storage", "__pycache__", "dist")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAZE_", "QUEUE_"))}
    env["COLUMNS"] = "100"
    result = subprocess.run(
        [sys.executable, str(copy / "main.py")],
        cwd=copy,
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "batch    customers.csv: 60/60 processed, 0 failed, finished=True" in out, out
    assert "failed   charge_card: ValueError: card 4000-0000-0000-0002 declined" in out
    assert "left     0 queued jobs" in out
    assert "publish_post    │ 2 " in out, "the chain's middle link succeeded on its retry"


def test_getting_started_shows_the_files_haze_init_writes() -> None:
    from haze.cli.init import _JOB, _MAIN

    code = {b.code for b in blocks((REPO / "docs" / "getting-started.md").read_text())}
    assert "# app/job/example.py\n" + _JOB in code
    assert "# main.py\n" + _MAIN in code


# --------------------------------------------------------------------------- switch backends


def _section(title: str, following: str) -> str:
    text = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    return text[text.index(title) : text.index(following)]


def _fenced(text: str, lang: str) -> list[str]:
    """The bodies of the ``lang`` fenced blocks of ``text``, in order."""
    parts = text.split(f"```{lang}\n")[1:]
    return [p.split("```", 1)[0] for p in parts]


def _shell(app: Path, block: str, env: dict[str, str], extra: str) -> str:
    """Each line of a ``bash`` block as a reader types it, in ``app``: ``export`` sets
    the environment of the next lines; ``pip install`` names the extra the workspace
    has installed already; the rest runs and must succeed."""
    out = ""
    for line in (ln.split("  #")[0].strip() for ln in block.splitlines()):
        if not line:
            continue
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value
            continue
        if line.startswith("pip install "):
            assert line == f"pip install './runtime[cli,{extra}]'", line
            continue
        proc = subprocess.run(
            ["bash", "-c", line], cwd=app, env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr
        out += proc.stdout
    return out


def _reader_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAZE_", "QUEUE_"))}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    # `haze` and `python` are the workspace's, as in an activated virtualenv
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _new_app(tmp_path: Path, env: dict[str, str]) -> Path:
    subprocess.run(
        ["haze", "init", "myapp"], cwd=tmp_path, env=env, check=True, capture_output=True
    )
    return tmp_path / "myapp"


def _apply(app: Path, printed: str) -> None:
    """Make the edits ``haze init --redis`` printed, as a reader pastes them."""
    anchors = {
        "in connections={...}:": ("connections={", None),
        "in stores={...}:": ("stores={", None),
        "set its default:": (None, "default="),
        "its store:": (None, "store="),
    }
    file = ""
    lines = printed.splitlines()
    for i, line in enumerate(lines):
        if not line.endswith(":") or line.startswith(" "):
            continue
        if line.startswith("Add to "):
            file = line.removeprefix("Add to ").split(",")[0]
        after, replace = next(v for k, v in anchors.items() if line.endswith(k))
        path = app / file
        text = path.read_text().splitlines()
        if after is not None:
            at = next(n for n, t in enumerate(text) if t.rstrip().endswith(after))
            text.insert(at + 1, lines[i + 1])
        else:
            at = next(n for n, t in enumerate(text) if t.strip().startswith(replace))
            text[at] = lines[i + 1]
        path.write_text("\n".join(text) + "\n")


def test_switching_to_postgres_as_the_docs_say(tmp_path: Path) -> None:
    """getting-started's PostgreSQL steps, typed as written, on the real server (the
    database named ``myapp_<pid>`` instead of ``myapp``: another run may be at it)."""
    psycopg = pytest.importorskip("psycopg")
    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    try:
        psycopg.connect(admin, autocommit=True).close()
    except psycopg.OperationalError as e:
        from services import server_missing

        server_missing("PostgreSQL", admin, str(e))
    section = _section("**PostgreSQL.**", "**Redis.**")
    (block,) = _fenced(section, "bash")
    name = f"myapp_{os.getpid()}"
    assert block.count(" myapp\n") == 1 and block.count("5432/myapp\n") == 1, block
    block = block.replace(" myapp\n", f" {name}\n").replace("5432/myapp\n", f"5432/{name}\n")

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    drop()
    try:
        env = _reader_env()
        out = _shell(_new_app(tmp_path, env), block, env, "postgres")
        assert " DONE " in out and "Worker stopped after 1 job(s)." in out, out
    finally:
        drop()


def test_switching_to_redis_as_the_docs_say(tmp_path: Path) -> None:
    """getting-started's Redis steps: `haze init --redis` prints the lines the docs show,
    pasted in they make a Redis app, and the job runs on the real server (in a database
    of its own: the app's keys have no prefix)."""
    redis = pytest.importorskip("redis")
    from services import leased_redis_db, server_missing

    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        client.ping()
    except redis.ConnectionError as e:
        server_missing("Redis", "redis://127.0.0.1:6379", str(e))
    finally:
        client.close()
    section = _section("**Redis.**", "## 8. The first deploy")
    init_block, run_block = _fenced(section, "bash")
    (printed,) = _fenced(section, "text")
    with leased_redis_db() as url:
        env = _reader_env()
        app = _new_app(tmp_path, env)
        env["REDIS_URL"] = url
        out = _shell(app, init_block, env, "redis")
        assert printed in out, out
        _apply(app, printed)
        out = _shell(app, run_block, env, "redis")
        assert " DONE " in out and "Worker stopped after 1 job(s)." in out, out
        assert 'Working connection "redis"' in out
        with redis.Redis.from_url(url) as client:
            assert client.keys("haze:default:*"), "the job went through Redis"


_DOC_IMPORT = re.compile(
    r"^\s*from\s+(haze[\w.]*|haze_\w+[\w.]*)\s+import\s+(\([^)]*\)|[^\n#]+)", re.M
)


def _documented_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) of every ``from haze... import name`` in the user docs."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if path.name == "architecture.md":
            continue  # the contributor's map names private modules on purpose
        for module, names in _DOC_IMPORT.findall(path.read_text()):
            for name in names.strip("()").replace("\n", " ").split(","):
                name = name.split(" as ")[0].strip()
                if name and name != "*":
                    found.append((path.name, module, name))
    return found


def test_every_documented_import_is_a_public_name_that_imports() -> None:
    """The user docs name only public modules, and each name they import exists: a
    restructure that moves a private module can never break a documented import."""
    import importlib

    imports = _documented_imports()
    assert len(imports) > 40, "the docs' imports were not found"
    wrong = []
    for file, module, name in imports:
        if any(part.startswith("_") for part in module.split(".")):
            wrong.append(f"{file}: from {module} import {name} (a private module)")
            continue
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            wrong.append(f"{file}: from {module} import {name} ({e})")
    assert not wrong, "\n".join(wrong)


def test_the_native_engine_connections_in_workflows_md_are_valid(tmp_path: Path) -> None:
    """The two connection lines of "Store engine and native engines" are what a user
    copies into config/queue.py: each must pass the config check as written."""
    text = (REPO / "docs" / "workflows.md").read_text()
    section = text.split("## Store engine and native engines", 1)[1].split("```", 2)[1]
    rows = [ln for ln in section.splitlines() if ln.startswith('"')]
    assert len(rows) == 2, section
    (tmp_path / "config").mkdir()
    for row in rows:
        name, options = next(iter(ast.literal_eval("{" + row.rstrip(",") + "}").items()))
        config = define_queue_config(connections={name: options}, store="memory")
        try:
            App(root=tmp_path, queue=config)
        except ConfigError as e:
            pytest.fail(f"{row}: {e}")
