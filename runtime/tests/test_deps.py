"""``haze._deps`` (optional imports) and ``haze._http`` (the loop-bound httpx client)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from haze._base.deps import import_if_present, load_by_name, require
from haze._base.errors import ConfigError, MissingDependencyError
from haze._base.hints import install_hint
from haze._base.http import LoopClient


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two installed but broken modules: one misses a dependency, one a native library."""
    (tmp_path / "haze_t_needs_dep.py").write_text("import haze_t_no_such_dep\n")
    (tmp_path / "haze_t_bad_native.py").write_text("raise ImportError('libfoo.so: no such file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_require_names_the_extra_of_a_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "json", None)
    with pytest.raises(MissingDependencyError) as info:
        require("json", what="the X backend", extra="x")
    assert str(info.value) == (
        "the X backend needs the 'json' package, which is not installed. "
        f"Install it with: {install_hint('x')}"
    )
    assert info.value.extra == "x"
    assert info.value.__cause__ is None


def test_require_names_the_package_of_a_missing_submodule() -> None:
    with pytest.raises(MissingDependencyError, match=r"'haze_t_nothing' package.*\[e\]'$"):
        require("haze_t_nothing.sub.mod", what="it", extra="e")
    with pytest.raises(MissingDependencyError, match=r"'dist-name' package"):
        require("haze_t_nothing", what="it", extra="e", package="dist-name")


@pytest.mark.usefixtures("modules")
def test_require_lets_a_broken_install_say_what_is_wrong() -> None:
    with pytest.raises(ModuleNotFoundError) as info:
        require("haze_t_needs_dep", what="the X backend", extra="x")
    assert not isinstance(info.value, MissingDependencyError)
    assert info.value.name == "haze_t_no_such_dep"
    assert info.value.__notes__ == [f"the X backend needs 'haze_t_needs_dep': {install_hint('x')}"]
    with pytest.raises(ImportError, match=r"libfoo\.so") as native:
        require("haze_t_bad_native", what="the X backend", extra="x")
    assert install_hint("x") in native.value.__notes__[0]


@pytest.mark.usefixtures("modules")
def test_import_if_present() -> None:
    assert import_if_present("json") is sys.modules["json"]
    assert import_if_present("haze_t_nothing") is None
    assert import_if_present("haze_t_nothing.sub") is None
    with pytest.raises(ModuleNotFoundError):  # it exists: its own failure is not hidden
        import_if_present("haze_t_needs_dep")


def test_loop_client_needs_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(
        MissingDependencyError, match=r"the D1 thing needs the 'httpx'.*(haze-jobs|runtime)\[cf\]"
    ):
        LoopClient(what="the D1 thing", extra="cf", timeout=1, headers={})


def test_loop_client_is_per_loop_and_closes() -> None:
    pytest.importorskip("httpx")
    http = LoopClient(what="t", extra="t", timeout=5, headers={"x-t": "1"})
    seen = []

    async def use(close: bool) -> None:
        client = http.get()
        assert http.get() is client, "one client per loop"
        assert client.headers["x-t"] == "1" and client.timeout.read == 5
        seen.append(client)
        if close:
            await http.close()
            assert client.is_closed
            assert http.get() is not client, "a closed client is replaced"
            await http.close()

    asyncio.run(use(close=False))
    asyncio.run(use(close=True))  # a new loop: a new client, not the finished loop's
    assert seen[0] is not seen[1]
    assert not seen[0].is_closed, "a finished loop's client is dropped, not closed"
    asyncio.run(http.close())  # nothing open: a no-op


def test_load_by_name() -> None:
    assert load_by_name("json", "dumps", what="x", source="s", key="k") is json.dumps
    with pytest.raises(
        ConfigError, match="the 'kv' store is not available in this version of haze"
    ):
        load_by_name("haze_t_nothing.kv", "KV", what="the 'kv' store", source="s", key="k")
