"""haze_cloudflare reaches haze by name only: entry points, and the same table registered
in-process for a Worker bundle (vendored without .dist-info)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from haze import App, ConfigError, define_cache_config
from haze._base import plugins
from haze_cloudflare import _plugins

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_entry_points_are_the_registered_table() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]
    flat = {
        (group, name): target for group, eps in declared.items() for name, target in eps.items()
    }
    assert flat == _plugins.PLUGINS


def test_every_target_resolves() -> None:
    for (group, name), target in _plugins.PLUGINS.items():
        module, _, attr = target.partition(":")
        found = plugins.find(group, name)
        assert found is getattr(__import__(module, fromlist=[attr]), attr)


def test_the_runtime_finds_them_without_importing_the_adapter() -> None:
    # A fresh interpreter: nothing of haze_cloudflare imported, the entry points alone.
    code = (
        "import sys\n"
        "from haze.stores import store_class\n"
        "from haze._base import plugins\n"
        "assert 'haze_cloudflare' not in sys.modules\n"
        "print(store_class('kv').__module__)\n"
        "print(plugins.find('haze.bindings', 'd1').__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["haze_cloudflare.kv", "haze_cloudflare.d1"]


@pytest.mark.parametrize(
    "first_request",
    [
        "haze_cloudflare.bind_env(object())",
        "W = type('W', (QueueWorker,), {'haze_app': 1}); W.__new__(W).create_app()",
    ],
)
def test_the_worker_path_registers_them_without_metadata(first_request: str) -> None:
    # As in a Worker bundle: the entry points are hidden. The entry's import registers
    # nothing (a cold start does not load the registry); its first request does, and
    # so does the app a QueueWorker builds.
    code = (
        "import importlib.metadata as m, sys\n"
        "m.entry_points = lambda **kw: []\n"
        "import haze_cloudflare\n"
        "from haze_cloudflare import QueueWorker\n"
        "assert 'haze._base.plugins' not in sys.modules\n"
        f"{first_request}\n"
        "from haze._base import plugins\n"
        "print(plugins.find('haze.stores', 'kv').__name__)\n"
        "print(plugins.find('haze.bindings', 'cloudflare').__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["KVStore", "binding_producer"]


def test_the_kv_store_checks_the_options_its_class_declares() -> None:
    # The core has no table for kv: the store's class says what it takes.
    good = define_cache_config(stores={"kv": {"driver": "kv", "binding": "CACHE", "prefix": "p"}})
    assert App(cache=good).cache_config.stores["kv"]["binding"] == "CACHE"
    bad = define_cache_config(stores={"kv": {"driver": "kv", "bindings": "CACHE"}})
    with pytest.raises(ConfigError, match=r"stores\.kv\.bindings.*allowed here: binding"):
        App(cache=bad)
