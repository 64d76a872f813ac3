"""The public surface: ``haze.__all__`` is complete, sorted, and every name imports."""

from __future__ import annotations
import __future__

import importlib
import subprocess
import sys
import types

import haze


def test_all_is_sorted_and_unique() -> None:
    assert haze.__all__ == sorted(haze.__all__)
    assert len(set(haze.__all__)) == len(haze.__all__)


def test_every_name_in_all_imports() -> None:
    for name in haze.__all__:
        assert hasattr(haze, name), name
    namespace: dict[str, object] = {}
    exec("from haze import *", namespace)
    assert set(haze.__all__) <= set(namespace)


def test_all_is_complete() -> None:
    public = {
        name
        for name, value in vars(haze).items()
        if not name.startswith("_")
        and not isinstance(value, (types.ModuleType, __future__._Feature))
    }
    assert public <= set(haze.__all__), sorted(public - set(haze.__all__))


def test_spec_names_are_exported() -> None:
    expected = {
        # §2 the app
        "App",
        "define_queue_config",
        "use_app",
        "run_in_app",
        # §3–§5 jobs, context, dispatch
        "define_job",
        "JobContext",
        "JobDefinition",
        "PendingDispatch",
        "DispatchResult",
        "AbortSignal",
        "Queue",
        "FailedJob",
        # §7 config
        "define_cache_config",
        "define_database_config",
        "define_redis_config",
        "env",
        # §9 orchestration
        "Batch",
        "PendingBatch",
        "PendingChain",
        "rate_limited",
        "without_overlapping",
        "throttles_exceptions",
        "skip_if",
        "tenant",
        "current_tenant",
        "after_commit",
        # §13 errors
        "HazeError",
        "ConfigError",
        "DuplicateJobError",
        "UnknownJobError",
        "BatchFinishedError",
        "JobTimeoutError",
        # §17 the job lifecycle
        "limit_concurrency",
    }
    assert expected <= set(haze.__all__), sorted(expected - set(haze.__all__))


def test_every_error_derives_from_haze_error() -> None:
    from haze import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, haze.HazeError), name
        assert getattr(haze, name) is cls
    assert issubclass(haze.ConfigError, ValueError)
    assert issubclass(haze.UnknownJobError, LookupError)
    assert issubclass(haze.JobTimeoutError, TimeoutError)


def test_version() -> None:
    assert isinstance(haze.__version__, str)
    assert haze.__version__.count(".") == 2


def test_core_modules_import() -> None:
    for mod in (
        "_app.app",
        "_app.config",
        "_base.durations",
        "_jobs.definition",
        "_jobs.context",
        "_base.message",
        "_engine.manager",
        "api.facade",
        "testing",
        "_base.blocking",
        "errors",
        "drivers.memory",
        "drivers.sync",
        "stores.memory",
        "testing.pytest_plugin",
    ):
        importlib.import_module(f"haze.{mod}")


def test_import_haze_loads_no_heavy_dependency() -> None:
    """The runtime must load inside Pyodide and small Lambda bundles (SPEC §1)."""
    code = (
        "import sys, haze\n"
        "heavy = {'pydantic', 'redis', 'bullmq', 'boto3', 'httpx', 'sqlalchemy', 'psycopg',\n"
        "         'cryptography', 'click', 'rich', 'pytest', 'aiomysql'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_files_haze_init_writes_import_only_public_names() -> None:
    """A new app's code is what users copy: it must not reach into haze's private
    modules (``haze._base``...), which may change under it."""
    import ast

    from haze.cli.init import _JOB, _MAIN
    from haze.cli.make import JOB_TEMPLATE

    for source in (_MAIN, _JOB, JOB_TEMPLATE.format(function="f", name="")):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("haze"):
                assert not any(part.startswith("_") for part in node.module.split(".")), source
                if node.module == "haze":
                    assert {a.name for a in node.names} <= set(haze.__all__), source
    assert haze.short_id.__doc__, "a public name says what it is"
