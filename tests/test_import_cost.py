"""What the entry points import: only what they use, when they use it.

Cold start is paid per process (a Lambda execution environment, a Worker isolate), so
``import haze``, ``import haze_lambda`` and ``import haze_cloudflare`` load no driver,
database package, test helper or HTTP code until something uses it. These are
structural checks (which modules a fresh process has loaded), not timings: the timings
are in ``bench/import_time.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def loaded_after(code: str) -> set[str]:
    """The haze modules a fresh interpreter has loaded after running ``code``."""
    probe = (
        f"{code}\nimport json, sys\n"
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('haze', 'haze_lambda', 'haze_cloudflare'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_import_haze_loads_only_the_package_and_its_errors() -> None:
    assert loaded_after("import haze") <= {
        "haze",
        "haze._base",
        "haze._base.errors",
        "haze._base.hints",
        "haze._base.version",
    }


@pytest.mark.parametrize(
    "statement",
    [
        "from haze import define_job, JobContext",
        "from haze import define_queue_config, env",
        "from haze import App",
    ],
)
def test_what_an_app_imports_loads_no_test_helper_or_database(statement: str) -> None:
    loaded = loaded_after(statement)
    assert "haze.testing" not in loaded
    # the haze.connectors package (its protocols and registry) is light; no connector loads
    assert not {m for m in loaded if m.startswith("haze.connectors.")}
    assert not {m for m in loaded if m.startswith("haze.drivers.")}


def test_lazy_names_are_the_modules_own() -> None:
    import haze
    from haze._app.app import App
    from haze._jobs.definition import define_job
    from haze.api.facade import Queue

    assert haze.App is App
    assert haze.Queue is Queue
    assert haze.define_job is define_job
    assert haze.testing.__name__ == "haze.testing"  # submodules too, on first use
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        haze.nope  # noqa: B018


def test_import_haze_lambda_loads_no_driver_worker_or_http_code() -> None:
    loaded = loaded_after("import haze_lambda")
    assert loaded <= {
        "haze",
        "haze._base",
        "haze._base.errors",
        "haze._base.hints",
        "haze._base.version",
        "haze_lambda",
    }, sorted(loaded)
    handlers = loaded_after("from haze_lambda import sqs_handler, http_handler, schedule_handler")
    for heavy in (
        "haze._app.app",
        "haze._app.config",
        "haze.drivers.sqs",
        "haze._workers.worker",
        "haze.integrations.http_dispatch",
    ):
        assert heavy not in handlers, heavy


def test_import_haze_cloudflare_loads_no_driver_d1_or_httpx_code() -> None:
    loaded = loaded_after("import haze_cloudflare")
    assert loaded <= {
        "haze",
        "haze._base",
        "haze._base.errors",
        "haze._base.hints",
        "haze._base.version",
        "haze_cloudflare",
    }, sorted(loaded)
    entry = loaded_after(
        "from haze_cloudflare import QueueWorker\nclass Default(QueueWorker): pass"
    )
    for heavy in (
        "haze._app.app",
        "haze._app.config",
        "haze.drivers.cloudflare",
        "haze.connectors",
        "haze.connectors.d1",
        "haze._base.http",
        "haze.testing",
        "haze_cloudflare.d1",
        "haze_cloudflare.driver",
    ):
        assert heavy not in entry, heavy


def test_a_queue_worker_entry_loads_no_envelope_or_plugin_table_code() -> None:
    # What a Worker isolate's cold start pays for ``from haze_cloudflare import
    # QueueWorker``: the adapter's own modules, the package, its errors and the
    # driver_api names. The envelope (message, its fields' dataclasses, JSON, durations)
    # and the plugin registry load with the first invocation, which uses them.
    entry = loaded_after(
        "from haze_cloudflare import QueueWorker\nclass Default(QueueWorker): pass"
    )
    assert entry <= {
        "haze",
        "haze._base",
        "haze._base.errors",
        "haze._base.hints",
        "haze._base.version",
        "haze._base.id_prefix",
        "haze.driver_api",
        "haze_cloudflare",
        "haze_cloudflare._js",
        "haze_cloudflare._plugins",
        "haze_cloudflare.worker",
    }, sorted(entry)
